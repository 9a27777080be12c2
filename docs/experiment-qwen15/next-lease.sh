#!/usr/bin/env bash
# The next H200 lease for issues 60 and 62, as prepared 2026-12-05 (tenth session). The ninth session's lease ran
# detbench and lost plan-throughput2.yaml's rows (docs/performance/h200-2026-12-05/lease.sh); this one runs
# plan-throughput3.yaml, the 1.5B lease figure that the experiment's plan.yaml waits for.
# One part per device call, from the repository root, back to back: a machine is given back 30 s after a call ends.
# Here, before the lease (the tree's size sets each call's share, so split after the last commit):
#   make real-base MODEL=qwen2.5-coder-1.5b     # artifacts/qwen2.5-coder-1.5b.gguf and artifacts/real/gsm_symbolic.tasks.json
#   cp ../shared/data/math500.jsonl artifacts/real/   # sha256 ccdf8777...16f2fe (ignored path: not committed)
#   .whl/: trl datasets dill multiprocess evaluate math-verify latex2sympy2_extended antlr4-python3-runtime gguf at the
#     lock's versions (pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl)
#   python tools/carry.py split .whl/*.whl --name whl        # one call
#   python tools/carry.py split artifacts/qwen2.5-coder-1.5b.gguf artifacts/real/gsm_symbolic.tasks.json \
#     artifacts/real/math500.jsonl --name q15        # ~26 calls
# Calls, each with CAPGRPO_COMMIT set to the commit the tree is at:
#   begin        starts the machine; the wheels; the MPS probe detached (docs/performance/h200-2026-12-05/probe.sh)
#   receive K    every q15 part but the last, while the probe runs
#   start LAST   the last part, join; waits for the probe; the trial detached (two 1.5B runs under MPS, 0.45 each)
#   watch [S]    until the trial ends;   pack   its rows, lease timeline and the probe's JSON into $OUT
#   alone        S2 of seed 913 again, by itself (no MPS neighbour), from the trial's converted base
#   compare      issue 60's exactness check: that run under the setup against it alone, bitwise
#   pack-alone   the alone run's rows
# Lease figure afterwards, here: unpack, lease.json from the calls' replies, `make launch
# PLAN=docs/experiment-qwen15/plan-throughput3.yaml STAGE=report`, then docs/PERFORMANCE.md and plan.yaml's seed count.
# Kill by a pattern that cannot match the calling shell: pkill -9 -f '^[^ ]*python3? -m trainer[.]train'.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "t0 $(date +%s)"; trap 'echo "t1 $(date +%s)"' EXIT
PLAN=docs/experiment-qwen15/plan-throughput3.yaml W=/tmp/q15w A=/tmp/q15a P=/tmp/probe
left() { echo $((570 - SECONDS)); }
case ${1:-} in
begin)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 tools/carry.py receive .carry/whl/call01 && python3 tools/carry.py join whl --out /tmp/cw > $OUT/joinw.log 2>&1 || { cat $OUT/joinw.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps /tmp/cw/*.whl > $OUT/wheels.log 2>&1 || { cat $OUT/wheels.log; exit 1; }
  mkdir -p $P/repo && tar --exclude=./.carry -cf - . | tar -xf - -C $P/repo
  (cd $P/repo && PYTHONPATH=$P/repo setsid bash docs/performance/h200-2026-12-05/probe.sh > $P/probe.log 2>&1 < /dev/null &)
  sleep 3; ls $P ;;
receive)  # receive K
  python3 tools/carry.py receive .carry/q15/call$(printf %02d $2); cat $P/done 2>/dev/null | tr '\n' ' ' ;;
start)  # start LAST
  python3 tools/carry.py receive .carry/q15/call$(printf %02d $2) && python3 tools/carry.py join q15 --out /tmp/c15 > $OUT/join.log 2>&1 || { cat $OUT/join.log; exit 1; }
  mkdir -p artifacts/real && cp /tmp/c15/gsm_symbolic.tasks.json /tmp/c15/math500.jsonl artifacts/real/
  for _ in $(seq 240); do grep -q '^slice2 ' $P/done 2>/dev/null && break; sleep 1; done  # the probe holds the GPU
  cat $P/done; pkill -9 -f 'bench[.]generation'; echo quit | CUDA_MPS_PIPE_DIRECTORY=$P/mps/pipe nvidia-cuda-mps-control 2>/dev/null
  python3 -m launch $PLAN train --work $W --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --detach
  sleep 20; python3 -m launch $PLAN watch --work $W --for-s 1 ;;
watch)  # watch [S]
  python3 -m launch $PLAN watch --work $W --for-s ${2:-$(left)}
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
pack)
  python3 -m launch $PLAN pack --work $W --out $OUT
  mkdir -p /tmp/pj && for f in $P/*/generation.json; do cp $f /tmp/pj/$(basename $(dirname $f)).json; done
  tar -C /tmp/pj -czf $OUT/probe.tar.gz . && grep -h '^compiled' $P/*.log | cut -c1-200; cat $P/done ;;
alone)  # S2 of seed 913 by itself, from the trial's converted base (not converted again)
  mkdir -p $A && ln -sfn $W/qwen2.5-coder-1.5b $A/qwen2.5-coder-1.5b
  python3 -m launch $PLAN train --work $A --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --seeds 913 --arms S2 --parallel 1 \
    --budget-s $(left) > $OUT/alone.log 2>&1; tail -5 $OUT/alone.log ;;
compare)
  python3 -m bench.resume_check --compare $W/runs/qwen15-S2-s913 $A/runs/qwen15-S2-s913 --report $OUT/compare-S2.json ;;
pack-alone)
  python3 -m launch $PLAN pack --work $A --out $OUT ;;
*) echo "unknown part ${1:-}"; exit 2 ;;
esac

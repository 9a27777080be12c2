#!/usr/bin/env bash
# The next H200 lease for issues 60 and 62, prepared 2026-12-04 and 05. Its first run (2026-12-05,
# docs/performance/h200-2026-12-05/lease.sh) did detbench and started plan-throughput2.yaml's trial, whose 0.3 share
# could not hold a 1.5B run; the machine was then released with the rows on it. Next time the same calls run
# plan-throughput3.yaml (two runs at a time, 0.45 each) and skip detbench (done: deterministic_kv_writes true).
# One part per device call, from the repository root, back to back (the machine keeps /tmp ~30 s after a call).
# Here, before the lease (the tree's size sets each call's share, so split after the last commit):
#   make real-base MODEL=qwen2.5-coder-1.5b     # artifacts/qwen2.5-coder-1.5b.gguf and artifacts/real/gsm_symbolic.tasks.json
#   cp ../shared/data/math500.jsonl artifacts/real/   # sha256 ccdf8777...16f2fe (ignored path: not committed)
#   .whl/: trl datasets dill multiprocess evaluate math-verify latex2sympy2_extended antlr4-python3-runtime gguf at the
#     lock's versions (pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl)
#   python tools/carry.py split .whl/*.whl --name whl        # one call (a few MB): detbench needs trl and datasets
#   python tools/carry.py split artifacts/qwen2.5-coder-1.5b.gguf artifacts/real/gsm_symbolic.tasks.json \
#     artifacts/real/math500.jsonl --name q15        # ~26 calls
# Calls: first `detbench` (it starts the machine, receives and installs the wheels, and returns: four processes of bench.generation at the
# 1.5B's decode shape, ~100 s each, one after the other, detached: deterministic: true as launch 2 ran it, with
# deterministic_kv_writes, without the flag, and with kv writes and no memory fill); then `receive K` for every q15
# call but the last while they run; `detbench-out` when they end. Rule, set 2026-12-05 before it runs: if the
# kv-writes variant's step_ms is >= 5% below the plain deterministic one's, plan-throughput2.yaml gets
# `deterministic_kv_writes: true` in its gpu run_args by a dated amendment (committed here) before the trial's first
# run, else it runs as registered. Then `start LAST` (join, install, the trial detached: two 1.5B
# runs under MPS, each sized for 0.45 of the GPU, plan-throughput3.yaml); `watch` until it ends; `pack`; then `alone`
# (seed 913 of both arms, one run at a time, no MPS neighbours) and `compare` (issue 60's bitwise check of a run
# under the chosen setup against the same run alone, with deterministic: true); `pack` again for the alone runs.
# Lease figure afterwards, here: unpack, then `make launch PLAN=docs/experiment-qwen15/plan-throughput3.yaml
# STAGE=report` with a `lease` section, and into docs/PERFORMANCE.md and PLAN.md's seed count.
# Kill by a pattern that cannot match the calling shell: pkill -9 -f '^[^ ]*python3? -m trainer[.]train'.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "t0 $(date +%s)"; trap 'echo "t1 $(date +%s)"' EXIT
PLAN=docs/experiment-qwen15/plan-throughput3.yaml W=/tmp/q15w A=/tmp/q15a
left() { echo $((570 - SECONDS)); }
case ${1:-} in
receive)  # receive K
  python3 tools/carry.py receive .carry/q15/call$(printf %02d $2) ;;
start)  # start LAST: the last part, join, the trial detached (the wheels came with detbench)
  python3 tools/carry.py receive .carry/q15/call$(printf %02d $2) && python3 tools/carry.py join q15 --out /tmp/c15 > $OUT/join.log 2>&1 || { cat $OUT/join.log; exit 1; }
  mkdir -p artifacts/real && cp /tmp/c15/gsm_symbolic.tasks.json /tmp/c15/math500.jsonl artifacts/real/
  python3 -m launch $PLAN train --work $W --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --detach
  sleep 30; python3 -m launch $PLAN watch --work $W --for-s 1 ;;
detbench)  # the wheels, then detached: the cost of deterministic: true on the 1.5B's decode step, and what position writes take back
  python3 tools/carry.py receive .carry/whl/call01 && python3 tools/carry.py join whl --out /tmp/cw > $OUT/joinw.log 2>&1 || { cat $OUT/joinw.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps /tmp/cw/*.whl > $OUT/wheels.log 2>&1 || { cat $OUT/wheels.log; exit 1; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  mkdir -p /tmp/detbench && setsid bash -c '
    B="python3 -m bench.generation --config-dir bench/configs/qwen2.5-1.5b --batch 128 --prompt 192 --new 64,384 --backends compiled --profile 64"
    for v in "det:--deterministic --kv-writes false" "det-kv:--deterministic --kv-writes" "free:" "det-kv-nofill:--deterministic --kv-writes --no-fill-memory"; do
      name=${v%%:*}; timeout 300 $B ${v#*:} --out /tmp/detbench/$name > /tmp/detbench/$name.log 2>&1; echo "$name rc $?" >> /tmp/detbench/done
    done' > /dev/null 2>&1 < /dev/null &
  sleep 5; ls /tmp/detbench ;;
detbench-out)  # detbench-out [S]: wait for the four at most S s, then their figures into $OUT
  for _ in $(seq ${2:-$(( $(left) - 20 ))}); do [ "$(wc -l < /tmp/detbench/done 2>/dev/null || echo 0)" -ge 4 ] && break; sleep 1; done
  cat /tmp/detbench/done; for f in /tmp/detbench/*/generation.json; do n=$(basename $(dirname $f)); cp $f $OUT/detbench-$n.json; done
  for n in det det-kv free det-kv-nofill; do echo $n; grep -E '^(compiled|profile) ' /tmp/detbench/$n.log | cut -c1-400; done ;;
watch)  # watch [S]
  python3 -m launch $PLAN watch --work ${3:-$W} --for-s ${2:-$(left)}
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
pack)  # pack [WORK]
  python3 -m launch $PLAN pack --work ${2:-$W} --out $OUT ;;
alone)  # seed 913 of both arms again, one run at a time, the converted base and step-0 sharing as in the trial
  mkdir -p $A && ln -sfn $W/qwen2.5-coder-1.5b $A/qwen2.5-coder-1.5b  # the trial's converted base, not converted again
  python3 -m launch $PLAN train --work $A --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --seeds 913 --parallel 1 \
    --budget-s $(left) > $OUT/alone.log 2>&1; tail -5 $OUT/alone.log ;;
compare)  # issue 60's exactness check: the same run under the chosen setup and alone, bitwise
  for arm in S0 S2; do
    python3 -m bench.resume_check --compare $W/runs/qwen15-$arm-s913 $A/runs/qwen15-$arm-s913 --report $OUT/compare-$arm.json
  done ;;
*) echo "unknown part ${1:-}"; exit 2 ;;
esac

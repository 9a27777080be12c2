#!/usr/bin/env bash
# The ninth lease (2026-12-05, thirteenth session, H200): the calls as they ran, a record, not a script to rerun.
# Eight starts were refused before it (issue 62's pairs lease, docs/experiment-qwen15/next-lease.sh begin); when the
# machine came, 957 s were left, less than a seed pair needs (~1,085 s), so the lease ran issue 60's bare-machine
# lease A and what it could measure on the same machine. Files: this folder (docs/PERFORMANCE.md, "Ninth lease").
# 1 (bb97725) carry [".carry/fla/call01"]: bash docs/performance/bare-machine.sh receive 1
# 2 (bb97725) carry [".carry/fla/call02"]: bash docs/performance/bare-machine.sh warm
#     -> warm.json, warm.log, join.log; compile-caches.tar.gz (15.0 MiB, kept out of the tree: .carry/c182a/)
# 3-5 (bb97725) carry [".carry/c182a"] (call 2's archive): the same benchmark in a fresh process whose cache folders
#     hold only the archive, unpacked into a new folder each time ($C below: /tmp/c182b, /tmp/c182c, /tmp/c182d).
#     Call 3 first moved lease A's home caches aside (~/.tilelang, ~/.cache, ~/.triton, ~/.nv -> *.leaseA);
#     call 4 copied ~/.tilelang.leaseA and ~/.cache.leaseA back; call 5 removed them again and packed ~/.tilelang
#     (tilelang-cache.tar.gz, 80 KB, kept out of the tree: .carry/c182a/).
#   export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/flasite:$PWD \
#     TORCHINDUCTOR_CACHE_DIR=$C/cache/inductor TRITON_CACHE_DIR=$C/cache/triton TRITON_CACHE_AUTOTUNING=1
#   python3 -c "from pathlib import Path; from launch.pack import unpack_caches; \
#     print(unpack_caches(Path('.carry/c182a/compile-caches.tar.gz'), Path('$C')))"
#   python3 -m bench.grpo_step --steps 2 --p-ended 0 --no-plain --compile-norms-mlp --out $OUT/carried
#     -> carried-1.json (call 3), carried-tilelang.json (call 4), carried-2.json (call 5), with their logs
# 6 (bb97725) no carry: probe-bf16.sh's first part alone (its second did not fit the lease)
#   TORCHINDUCTOR_CACHE_DIR=/tmp/probe/cache/inductor TRITON_CACHE_DIR=/tmp/probe/cache/triton \
#   TRITON_CACHE_AUTOTUNING=1 python3 -m bench.generation --config-dir bench/configs/qwen2.5-1.5b --backends compiled \
#     --deterministic --kv-writes --dtype bfloat16 --profile 64 --batch 128 --prompt 192 --new 64,384 --repeats 4 \
#     --out $OUT/rollout-bf16      -> rollout-bf16.json, rollout-bf16.log

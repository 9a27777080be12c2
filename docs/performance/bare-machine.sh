#!/usr/bin/env bash
# Issue 60's bare-machine bar: a bare H200 with the caches an earlier lease carried reaches step 1 of the 1.82B
# benchmark in <= 2x its step-2 time (an outside run: 226 s against 13.4 s, fla installed, nothing carried). Two
# leases; one part per device call, from the repository root, back to back.
# Lease A ran 2026-12-05 (ninth lease, docs/performance/h200-2026-12-05c: `receive 1`, `warm` at bb97725). The same
# machine then ran the benchmark in fresh processes given only the carried archive (3.2x, 3.4x) and with TileLang's
# own cache (~/.tilelang) carried too (1.87x): fla's Hopper backward is JIT-compiled by TileLang, which Inductor's and
# Triton's caches do not hold, so TILELANG_CACHE_DIR is now one of the carried folders (launch/pack.py CACHES). Here,
# lease A's two archives (.carry/c182a/: compile-caches.tar.gz, tilelang-cache.tar.gz) were merged into
# .carry/c182src/compile-caches.tar.gz by hand: A's key.json with "tilelang": "0.1.9" (the version lease A installed),
# A's members, then .tilelang/cache/* renamed cache/tilelang/*; `launch.pack.unpack_caches` takes it (2,635 entries).
# Split: `python tools/carry.py split .carry/c182src/compile-caches.tar.gz --name c182`, one call.
# That archive was an ignored file: a later checkout (2026-12-05, fifteenth session) does not hold it, so lease B
# needs a lease A again first: `warm` now packs TileLang's folder with the others (one compile-caches.tar.gz, in parts
# when over 16 MiB: cat them here), so nothing is merged by hand. A and B may share a session: A on one machine, give
# it back, split A's archive here as c182, then B on a fresh machine. The fla carry is rebuilt as below too.
# Both ran on H100s 2026-12-06 (fourteenth lease, docs/performance/h100-2026-12-06c, at e7fbf72): A on a fresh machine
# (`receive 1`, `warm`: step 1 / step 2 = 10.7x), A's archive split here as c182 (one call), then B on another fresh
# machine (`receive 1`, `receive 2`, `carried 1`: 1.75x). An H200 lease A and B would give the H200's figures.
# Lease B: a fresh machine, `receive 1`, `receive 2`, then `carried 1` carrying c182's call alone (fla's
# call02 with c182's call01 and the tree come to 73 MB, over a call's 64 MiB; `install` takes call02 when it was carried
# in an earlier call of the same machine).
# Here, before either: fla 0.6.0 + tilelang 0.1.9 and the trainer's wheels, split as in h200-2026-12-04d/lease.sh's
# header (`python tools/carry.py split ... --name fla`, two calls).
#   Lease A (any lease with time left):  receive 1; warm   (the 1.82B benchmark, 2 steps, its caches into $OUT)
#   Here: python tools/carry.py split <A's compile-caches.tar.gz> --name c182
#   Lease B, first calls of a fresh machine:  receive 1; receive 2; receive-caches K (all but the last c182 call);
#     carried LAST   (the same benchmark with A's caches unpacked first: step 1 against step 2)
# The caches are keyed by torch, Triton, GPU and CUDA (launch/pack.py); a machine of another key refuses them in one
# line and compiles anew, and then `carried` measures a cold start.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
FLA_SITE=/tmp/flasite C=/tmp/c182
# one cache folder for Inductor, Triton, Triton's autotuning and TileLang, as a launch's runs have (launch/runs.py cache_env)
export TORCHINDUCTOR_CACHE_DIR=$C/cache/inductor TRITON_CACHE_DIR=$C/cache/triton TRITON_CACHE_AUTOTUNING=1 \
  TILELANG_CACHE_DIR=$C/cache/tilelang
B="--steps 2 --p-ended 0 --no-plain --compile-norms-mlp"
echo "t0 $(date +%s)"; trap 'echo "t1 $(date +%s)"' EXIT
install() {  # the fla call's wheels: the trainer's into the interpreter, fla and tilelang under $FLA_SITE
  if [ -d .carry/fla/call02 ]; then python3 tools/carry.py receive .carry/fla/call02 || exit 1; fi  # else `receive 2` took it
  python3 tools/carry.py join fla --out /tmp/fla > $OUT/join.log 2>&1 || { cat $OUT/join.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps /tmp/fla/trl-*.whl /tmp/fla/datasets-*.whl /tmp/fla/dill-*.whl \
    /tmp/fla/multiprocess-*.whl /tmp/fla/evaluate-*.whl /tmp/fla/math_verify-*.whl /tmp/fla/latex2sympy2_extended-*.whl \
    /tmp/fla/antlr4_python3_runtime-*.whl /tmp/fla/gguf-*.whl > $OUT/wheels.log 2>&1
  python3 -m pip install -q --no-index --no-deps --target $FLA_SITE /tmp/fla/tilelang-*.whl /tmp/fla/z3_solver-*.whl \
    /tmp/fla/torch_c_dlpack_ext-*.whl /tmp/fla/cloudpickle-*.whl /tmp/fla/ml_dtypes-*.whl /tmp/fla/psutil-*.whl \
    /tmp/fla/einops-*.whl /tmp/fla/fla_core-*.whl /tmp/fla/flash_linear_attention-*.whl /tmp/fla/apache_tvm_ffi-*.whl \
    > $OUT/fla-install.log 2>&1 || exit 1
  export PYTHONPATH=$FLA_SITE:$PWD
}
steps() {  # each step's wall seconds, from the benchmark's JSON
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs']['ours']; print([(s['step'], s['seconds']['total']) for s in r['steps']])" "$1"
}
case ${1:-} in
receive)  # receive K: a part of the fla wheels
  python3 tools/carry.py receive .carry/fla/call0$2 ;;
receive-caches)  # receive-caches K: a part of lease A's compile-caches.tar.gz
  python3 tools/carry.py receive .carry/c182/call$(printf %02d $2) ;;
warm)  # lease A: the benchmark compiling and autotuning into $C, then those caches packed into $OUT
  install
  timeout 450 python3 -m bench.grpo_step $B --out $OUT/warm > $OUT/warm.log 2>&1; echo "rc $?"; steps $OUT/warm/grpo_step.json
  python3 -c "from pathlib import Path; from launch.pack import pack_caches; pack_caches(Path('$C'), Path('$OUT'))"
  # a file from a call is at most 16 MiB: larger caches come back in parts (cat compile-caches.tar.gz.part* here)
  A=$OUT/compile-caches.tar.gz; [ "$(stat -c %s $A)" -le 16000000 ] || { split -b 16000000 -d $A $A.part && rm $A; }
  ls -l $OUT ;;
carried)  # carried LAST: lease B on a bare machine: A's caches unpacked, then the same benchmark
  install
  python3 tools/carry.py receive .carry/c182/call$(printf %02d $2) && python3 tools/carry.py join c182 --out /tmp/c182in > $OUT/joinc.log 2>&1 || { cat $OUT/joinc.log; exit 1; }
  python3 -c "from pathlib import Path; from launch.pack import unpack_caches; unpack_caches(next(Path('/tmp/c182in').glob('*.tar.gz')), Path('$C'))"
  timeout 450 python3 -m bench.grpo_step $B --out $OUT/carried > $OUT/carried.log 2>&1; echo "rc $?"; steps $OUT/carried/grpo_step.json ;;
*) echo "unknown part ${1:-}"; exit 2 ;;
esac

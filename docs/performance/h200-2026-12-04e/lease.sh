#!/usr/bin/env bash
# One H200 lease (2026-12-04, fifth): the commands behind docs/performance/h200-2026-12-04e/, one part per device
# call, run from the repository root, back to back (the machine keeps /tmp about 30 s after a call).
# fla 0.6.0 + tilelang 0.1.9 and the trainer's wheels travel as in the fourth lease (h200-2026-12-04d/lease.sh's
# header: the download and split commands), in two calls:
#   bash docs/performance/h200-2026-12-04e/lease.sh receive 1   # carry [".carry/fla/call01"]
#   bash docs/performance/h200-2026-12-04e/lease.sh pass        # carry [".carry/fla/call02"]
#   bash docs/performance/h200-2026-12-04e/lease.sh suite       # carry [".whl"]
#   bash docs/performance/h200-2026-12-04e/lease.sh cap8192     # carry [".whl"]
# Each part writes under $OUT and stops itself before the call's 600 s limit; JSON files go to $OUT's top level
# (a call brings back a limited number of files).
# What ran (code at 4360900; call 8 at 74896cd), 8 calls, 1,541 of 1,800 s of device time:
#   1 receive 1; 2 pass (575 s: its first process met fla's first-call autotuning and ran out of its 120 s, and so
#   did pass_conv_mb32; only 8 files came back: a call returns 8, pass_noconv and q35_conv* were left out);
#   3 `ls` (is /tmp/flasite still there: yes; $OUT is emptied per call); 4 suite (306 s: 862 passed, 0 failed
#   without fla; with fla 18 passed, 7 failed, see docs/PERFORMANCE.md); 5 by hand, packed in one file:
#     python3 bench/training_pass.py --rule fla --compile-norms-mlp --repeats 2 --out /tmp/o/pass_noconv
#     python3 bench/grpo_step.py --steps 2 --p-ended 0 --no-plain --compile-norms-mlp --out /tmp/o/q35_conv
#   (the first timed out writing its JSON after printing its figures: read from its log);
#   6 cap 8192 on a fresh machine (the warm one had been released): no wheels there, nothing ran;
#   7 receive 1; 8 pass2 with left() set to 420 s (the lease's remaining budget) by sed at the call's start.
# Logs of calls 2, 4, 5 and 8 are in rows.tar.xz beside this script (callN/; python -m rundir.archive unpack).
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
part=$1
left() { echo $((575 - SECONDS)); }  # seconds this call has left, with a margin for the copy back
wheels() { python3 -m pip install -q --no-index --no-deps .whl/*.whl > $OUT/wheels.log 2>&1; }
FLA_SITE=/tmp/flasite  # fla and tilelang, on PYTHONPATH only where a command is to run with them
flat() { find $OUT -mindepth 2 -name '*.json' | while read -r f; do mv "$f" "$OUT/$(basename "$(dirname "$f")").json"; done; }

case $part in
receive)
  python3 tools/carry.py receive .carry/fla/call0$2 ;;
pass)  # issue 48: fla's causal conv (trainer/fla_conv.py) in the training pass, against the same pass without it
  # in this call; what fla's rule and conv keep for the backward (the micro-batch estimate counts ours'); the
  # 1.82B step with fla's conv (the trainer's default with fla), at the trainer's micro-batch and at 16 rows
  python3 tools/carry.py receive .carry/fla/call02 && python3 tools/carry.py join fla --out /tmp/fla > $OUT/join.log 2>&1 || exit 1
  python3 -m pip install -q --no-index --no-deps /tmp/fla/trl-*.whl /tmp/fla/datasets-*.whl /tmp/fla/dill-*.whl \
    /tmp/fla/multiprocess-*.whl /tmp/fla/evaluate-*.whl /tmp/fla/math_verify-*.whl /tmp/fla/latex2sympy2_extended-*.whl \
    /tmp/fla/antlr4_python3_runtime-*.whl /tmp/fla/gguf-*.whl > $OUT/wheels.log 2>&1
  python3 -m pip install -q --no-index --no-deps --target $FLA_SITE /tmp/fla/tilelang-*.whl /tmp/fla/z3_solver-*.whl \
    /tmp/fla/torch_c_dlpack_ext-*.whl /tmp/fla/cloudpickle-*.whl /tmp/fla/ml_dtypes-*.whl /tmp/fla/psutil-*.whl \
    /tmp/fla/einops-*.whl /tmp/fla/fla_core-*.whl /tmp/fla/flash_linear_attention-*.whl /tmp/fla/apache_tvm_ffi-*.whl \
    > $OUT/fla-install.log 2>&1 || exit 1
  export PYTHONPATH=$FLA_SITE:$PWD
  P="--rule fla --compile-norms-mlp --repeats 2"
  timeout 120 python3 bench/training_pass.py $P --fla-conv --profile --out $OUT/pass_conv > $OUT/pass_conv.log 2>&1
  timeout 100 python3 bench/training_pass.py $P --out $OUT/pass_noconv > $OUT/pass_noconv.log 2>&1
  timeout 100 python3 bench/training_pass.py $P --fla-conv --micro-batch 32 --out $OUT/pass_conv_mb32 > $OUT/pass_conv_mb32.log 2>&1
  for c in "" --fla-conv; do  # 1 row x 1152 tokens of the 1.82B layers (3 linear + 1 full attention)
    timeout 60 python3 bench/activation_memory.py --device cuda $c --out $OUT/act${c:+_conv} > $OUT/act${c:+_conv}.log 2>&1
  done
  B="--steps 2 --p-ended 0 --no-plain --compile-norms-mlp"
  timeout 150 python3 bench/grpo_step.py $B --out $OUT/q35_conv > $OUT/q35_conv.log 2>&1
  timeout $(left) python3 bench/grpo_step.py $B --ours-batch 16 --out $OUT/q35_conv_mb16 > $OUT/q35_conv_mb16.log 2>&1
  flat ;;
suite)  # issue 48's bar: the whole suite on the H200, 0 failed, without fla (as CI's tests expect); then the tests
  # that need fla on CUDA, with it
  wheels
  timeout 420 python3 -m pytest -q -n 12 --dist loadgroup -p no:cacheprovider --durations=20 > $OUT/pytest-suite.log 2>&1
  tail -3 $OUT/pytest-suite.log
  [ -d $FLA_SITE ] || { echo "no $FLA_SITE: the pass part's call was not just before"; exit 1; }
  PYTHONPATH=$FLA_SITE:$PWD timeout $(left) python3 -m pytest -q -p no:cacheprovider -rs tests/test_fla_conv.py \
    tests/test_run_settings.py > $OUT/pytest-fla.log 2>&1
  tail -3 $OUT/pytest-fla.log ;;
cap8192)  # the users' cap with fla's rule and conv, norms compiled, two steps (step 2 past the first-call costs)
  wheels
  [ -d $FLA_SITE ] || { echo "no $FLA_SITE: the pass part's call was not just before"; exit 1; }
  export PYTHONPATH=$FLA_SITE:$PWD
  timeout $(left) python3 bench/grpo_step.py --cap 8192 --groups 4 --steps 2 --p-ended 0 --no-plain \
    --compile-norms-mlp --out $OUT/c8192 > $OUT/c8192.log 2>&1
  flat ;;
pass2)  # the second lease: fla's conv in the pass alone, one process given the time for fla's first-call
  # autotuning (the first lease's pass ran out of its 120 s there); everything packed in one file
  python3 tools/carry.py receive .carry/fla/call02 && python3 tools/carry.py join fla --out /tmp/fla > $OUT/join.log 2>&1 || exit 1
  python3 -m pip install -q --no-index --no-deps /tmp/fla/*.whl --target $FLA_SITE > $OUT/fla-install.log 2>&1 || exit 1
  export PYTHONPATH=$FLA_SITE:$PWD
  mkdir -p /tmp/o
  timeout $(left) python3 bench/training_pass.py --rule fla --compile-norms-mlp --repeats 2 --fla-conv --profile \
    --out /tmp/o/pass_conv > /tmp/o/pass_conv.log 2>&1
  tar -C /tmp -cJf $OUT/pass2.tar.xz o ;;
esac
echo "part $part done at ${SECONDS}s"

#!/usr/bin/env bash
# One H200 lease (2026-12-04, fourth): the commands behind docs/performance/h200-2026-12-04d/, one part per device
# call, run from the repository root, back to back (the machine keeps /tmp about 30 s after a call).
# flash-linear-attention 0.6.0 with tilelang 0.1.9 (the version vLLM 0.25.0 pins): fla refuses its gated backward
# kernel on Hopper with the image's Triton 3.6 unless tilelang and nvcc are there (fla #640). The wheels the image
# lacks, made here (this CPU) and carried in two calls with the trainer's wheels (.whl/, docs/gpu.md):
#   pip download --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 -d /tmp/tl \
#     tilelang==0.1.9 "z3-solver<4.15.5,>=4.13.0" torch-c-dlpack-ext cloudpickle ml-dtypes psutil einops \
#     fla-core==0.6.0 flash-linear-attention==0.6.0 apache-tvm-ffi==0.1.9
#   python tools/carry.py split /tmp/tl/*.whl .whl/*.whl --name fla
#   bash docs/performance/h200-2026-12-04d/lease.sh receive 1   # carry [".carry/fla/call01"]
#   bash docs/performance/h200-2026-12-04d/lease.sh fla         # carry [".carry/fla/call02"]
#   bash docs/performance/h200-2026-12-04d/lease.sh levers fla  # carry [".whl"] (or `levers ours`)
#   bash docs/performance/h200-2026-12-04d/lease.sh suite       # carry [".whl"]
# Each part writes under $OUT and stops itself before the call's 600 s limit.
# What ran (code at 0847635; calls 7-9 at 1a90e5c, its test fix), 9 calls, 1,734 of 1,800 s of device time:
#   1 receive 1; 2 fla (511 s; its run folders' three files were not copied back, over the call's file count:
#   pass_fla and q35_fla are read from their logs); 3 levers fla (240 s); 4 suite (259 s: 1 failed, 850 passed);
#   5 test_compiled_parts.py under TORCH_LOGS=recompiles (67 s); 6 its graph counts at 8 lengths (call6/g.log, the
#   loop of tests/test_compiled_parts.py printing torch._dynamo's unique_graphs per length); 7 after the test's fix:
#   pytest -n 3 tests/test_compiled_parts.py tests/test_bench_training_pass.py tests/test_run_settings.py (18 passed);
#   8 receive 1; 9 the fla part's install, then by hand
#   python3 bench/grpo_step.py --cap 8192 --groups 4 --steps 1 --p-ended 0 --no-plain   # c8192_fla.json
# Logs of calls 2-4, 6 and 9 are in rows.tar.xz beside this script (callN/; python -m rundir.archive unpack).
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
part=$1
left() { echo $((575 - SECONDS)); }  # seconds this call has left, with a margin for the copy back
wheels() { python3 -m pip install -q --no-index --no-deps .whl/*.whl > $OUT/wheels.log 2>&1; }
FLA_SITE=/tmp/flasite  # fla and tilelang, on PYTHONPATH only where a command is to run with them

case $part in
receive)
  python3 tools/carry.py receive .carry/fla/call0$2 ;;
fla)  # issue 48's lever: fla's kernels for the training pass's gated delta rule, against transformers' torch
  # reference and ours, alone and in the pass; then the 1.82B step with fla (the trainer defers to it by itself)
  python3 tools/carry.py receive .carry/fla/call02 && python3 tools/carry.py join fla --out /tmp/fla > $OUT/join.log 2>&1 || exit 1
  python3 -m pip install -q --no-index --no-deps /tmp/fla/trl-*.whl /tmp/fla/datasets-*.whl /tmp/fla/dill-*.whl \
    /tmp/fla/multiprocess-*.whl /tmp/fla/evaluate-*.whl /tmp/fla/math_verify-*.whl /tmp/fla/latex2sympy2_extended-*.whl \
    /tmp/fla/antlr4_python3_runtime-*.whl /tmp/fla/gguf-*.whl > $OUT/wheels.log 2>&1
  python3 -m pip install -q --no-index --no-deps --target $FLA_SITE /tmp/fla/tilelang-*.whl /tmp/fla/z3_solver-*.whl \
    /tmp/fla/torch_c_dlpack_ext-*.whl /tmp/fla/cloudpickle-*.whl /tmp/fla/ml_dtypes-*.whl /tmp/fla/psutil-*.whl \
    /tmp/fla/einops-*.whl /tmp/fla/fla_core-*.whl /tmp/fla/flash_linear_attention-*.whl /tmp/fla/apache_tvm_ffi-*.whl \
    > $OUT/fla-install.log 2>&1 || exit 1
  export PYTHONPATH=$FLA_SITE:$PWD
  (nvcc --version; which nvcc; python3 -c "from bench.training_pass import fla_versions; print(fla_versions())") > $OUT/fla-probe.log 2>&1
  timeout 220 python3 bench/gated_delta_rule.py --rows 16 --length 1152 --variants eager,ours-compiled-terms,fla --profile --out $OUT/gdr > $OUT/gdr.log 2>&1
  timeout 150 python3 bench/training_pass.py --rule fla --repeats 1 --out $OUT/pass_fla > $OUT/pass_fla.log 2>&1
  timeout $(left) python3 bench/grpo_step.py --steps 2 --p-ended 0 --no-plain --out $OUT/q35_fla > $OUT/q35_fla.log 2>&1 ;;
levers)  # RULE = fla (needs the fla part's install, back to back) or ours (compiled chunk terms): norms and MLPs
  # compiled (compile_norms_mlp) in the pass, then in the step, then the step with TF32 products as well
  wheels
  if [ "$2" = fla ]; then
    [ -d $FLA_SITE ] || { echo "no $FLA_SITE: the fla part's call was not just before"; exit 1; }
    export PYTHONPATH=$FLA_SITE:$PWD; R="--rule fla"; T=""
  else
    R="--rule ours-compiled-terms"; T="--compile-gated-delta-terms"
  fi
  timeout 150 python3 bench/training_pass.py $R --compile-norms-mlp --repeats 1 --out $OUT/pass_norms_$2 > $OUT/pass_norms_$2.log 2>&1
  B="--steps 2 --p-ended 0 --no-plain $T --compile-norms-mlp"
  timeout 190 python3 bench/grpo_step.py $B --out $OUT/q35_norms_$2 > $OUT/q35_norms_$2.log 2>&1
  timeout $(left) python3 bench/grpo_step.py $B --tf32 --out $OUT/q35_norms_tf32_$2 > $OUT/q35_norms_tf32_$2.log 2>&1 ;;
suite)  # issue 48's bar: the whole suite on the H200, 0 failed (docs/gpu.md "The test suite on the GPU"), without fla
  wheels
  timeout 480 python3 -m pytest -q -n 12 --dist loadgroup -p no:cacheprovider --durations=20 > $OUT/pytest-suite.log 2>&1
  tail -5 $OUT/pytest-suite.log ;;
next)  # not run (the lease's time was spent), for the next lease after `receive 1` and the fla part's install
  # lines (carry [".carry/fla/call02"]): fla's causal conv in the pass (trainer/fla_conv.py), then the users' cap with
  # fla over two steps, so that step 2 is past every first-call cost
  export PYTHONPATH=$FLA_SITE:$PWD
  timeout 150 python3 bench/training_pass.py --rule fla --compile-norms-mlp --fla-conv --repeats 1 --out $OUT/pass_conv > $OUT/pass_conv.log 2>&1
  timeout $(left) python3 bench/grpo_step.py --cap 8192 --groups 4 --steps 2 --p-ended 0 --no-plain --out $OUT/c8192_fla2 > $OUT/c8192_fla2.log 2>&1 ;;
esac
echo "part $part done at ${SECONDS}s"

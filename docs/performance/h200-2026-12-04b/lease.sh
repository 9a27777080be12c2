#!/usr/bin/env bash
# One H200 lease (2026-12-04, second): the commands behind docs/performance/h200-2026-12-04b/, one part per
# device call, run from the repository root after the carry calls of docs/gpu.md (tools/vllm_bundle.py with
# --smollm2, then tools/carry.py for the Qwen2.5 GGUF and its snapshot as `q05`):
#   bash docs/performance/h200-2026-12-04b/lease.sh PART  # det-smollm2 vllm-qwen plain-vllm levers det-smollm2-eager (ran,
#   in this order), det-q35 (not run)
# Each part writes under $OUT and stops itself before the call's 600 s limit.
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CAPGRPO_COMMIT=${CAPGRPO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
part=$1
left() { echo $((575 - SECONDS)); }  # seconds this call has left, with a margin for the copy back
keep() { tar -C "$1" -cJf "$OUT/$2.tar.xz" --exclude='step[0-9]*' --exclude='state[0-9]*' . ; }  # rows only

case $part in
det-smollm2)  # issue 47: two deterministic runs of one command, and one without (the step-time cost)
  test -d artifacts/smollm2 || python3 -m bases.packaged smollm2 --out artifacts/smollm2 > $OUT/base.log 2>&1
  python3 -m data.synthetic --n 1200 --seed 0 --families sum --levels 1 --out artifacts/real/sum1.tasks.json
  ARGS="--config configs/smollm2.yaml --arm S2 --max_steps 5 --checkpoint_steps 5 --eval_every 5 --heldout_size 100 --fixed_size 8 --fixed_samples 4 --report_to none"
  timeout $(left) python3 bench/resume_check.py --twice --out /tmp/det/twice --report $OUT/smollm2_twice.json -- $ARGS --deterministic true > $OUT/smollm2_twice.log 2>&1
  timeout $(left) python3 -m trainer.train $ARGS --deterministic false --output_dir /tmp/det/free > $OUT/smollm2_free.log 2>&1
  keep /tmp/det smollm2_runs ;;
det-smollm2-eager)  # the same with eager generation (the call after vllm-qwen/plain-vllm/levers; compiled failed above)
  ARGS="--config configs/smollm2.yaml --arm S2 --max_steps 5 --checkpoint_steps 5 --eval_every 5 --heldout_size 100 --fixed_size 8 --fixed_samples 4 --report_to none --compiled_generation false"
  timeout 300 python3 bench/resume_check.py --twice --out /tmp/det2/twice --report $OUT/smollm2_eager_twice.json -- $ARGS --deterministic true > $OUT/smollm2_eager_twice.log 2>&1
  timeout $((400 - SECONDS)) python3 -m trainer.train $ARGS --deterministic false --output_dir /tmp/det2/free > $OUT/smollm2_eager_free.log 2>&1
  keep /tmp/det2 smollm2_eager_runs ;;  # then, here: bench/resume_check.py --compare twice/first twice/second
det-q35)  # issue 47 at the 1.82B Qwen3.5 shape (random weights): 8 groups x 8, cap 1024, 5 steps (not run: the lease
  # ended; deterministic runs now generate eagerly, compiled generation being refused under the flag)
  A="--groups 8 --steps 5 --p-ended 0 --no-plain"
  timeout $(left) python3 bench/grpo_step.py $A --deterministic --out $OUT/q35_det1 > $OUT/q35_det1.log 2>&1
  timeout $(left) python3 bench/grpo_step.py $A --deterministic --compare-with $OUT/q35_det1/grpo_step.json --rtol 0 --out $OUT/q35_det2 > $OUT/q35_det2.log 2>&1
  timeout $(left) python3 bench/grpo_step.py $A --out $OUT/q35_free > $OUT/q35_free.log 2>&1 ;;
vllm-qwen)  # issue 46: CapGRPOTrainer on vLLM with Qwen2.5-Coder-0.5B's real weights; evaluation through vLLM
  python3 tools/carry.py join q05 --out /tmp/q05 > $OUT/join.log 2>&1 || exit 1
  python3 -m bases.packaged qwen2.5-coder-0.5b --out /tmp/qwen05 --gguf /tmp/q05/qwen2.5-coder-0.5b.gguf > $OUT/base.log 2>&1 || exit 1
  # the base is float32 (fp32 masters, bf16 autocast); vLLM loads config.json's dtype, and its bf16 kernels are the fast ones
  sed -i 's/"dtype": "float32"/"dtype": "bfloat16"/' /tmp/qwen05/config.json
  timeout $(left) python3 -m trainer.train --config docs/experiment-qwen/recipe.yaml --arm S2 --seed 0 --output_dir /tmp/qv/S2-vllm \
    --model_name_or_path /tmp/qwen05 --snapshot_path /tmp/q05/gsm_symbolic.tasks.json --temperature 0.7 --max_completion_length 320 \
    --max_steps 3 --eval_every 3 --checkpoint_every 0 --per_device_train_batch_size 8 --gradient_checkpointing false \
    --nonfinite_gradient skip --report_to none --use_vllm true --vllm_mode colocate > $OUT/qwen_vllm.log 2>&1
  keep /tmp/qv qwen_vllm_runs ;;
plain-vllm)  # issue 46: plain TRL + vLLM colocate at the 1.82B shape (32 x 8, cap 1024, every rollout to the cap)
  timeout $(left) python3 bench/grpo_step.py --steps 2 --p-ended 0 --no-plain --vllm --only plain-vllm --out $OUT/plain_vllm > $OUT/plain_vllm.log 2>&1 ;;
levers)  # issue 48: the optimizer's state on the GPU, the rule's chunk-parallel part compiled, then whole steps
  timeout 120 python3 -m pytest -q tests/test_cpu_adamw.py tests/test_chunked_gated_delta.py > $OUT/pytest_cuda.log 2>&1
  python3 bench/cpu_adamw.py --device cuda --params 1.8e9 --no-state --chunk-elems 67108864 --on-device > $OUT/adamw.log 2>&1
  python3 bench/cpu_adamw.py --device cuda --params 1.8e9 --no-state --no-adamw >> $OUT/adamw.log 2>&1
  timeout 150 python3 bench/gated_delta_rule.py --rows 16 --length 1152 --variants ours,ours-compiled-terms --out $OUT/gdr > $OUT/gdr.log 2>&1
  timeout $(left) python3 bench/grpo_step.py --steps 2 --p-ended 0 --no-plain --compile-gated-delta-terms --out $OUT/q35_levers > $OUT/q35_levers.log 2>&1 ;;
esac
echo "part $part done at ${SECONDS}s"

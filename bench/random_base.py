"""A seeded random-init Qwen3.5 base directory (config, bf16 safetensors, the step benchmark's padded tokenizer) for
`trainer.train` at shapes whose weights cannot be downloaded here: issue 50's MiMo-9B-sized run (the 9.5B benchmark
shape of docs/PERFORMANCE.md) under FSDP2 with vLLM. It samples near-uniformly: `--p-ended` makes that share of
rollouts end before `--cap` (stop tokens at the top of the padded vocabulary, in generation_config's EOS list), the
rest run to the cap. It never answers correctly; docs/gpu.md says which arm still trains on it.

    python -m bench.random_base --out artifacts/random-9b5 --hidden 4096 --layers 28 --intermediate 12288 \
        --p-ended 0.5 --cap 8192
    python -m bench.random_base --out /tmp/rb --hidden 64 --layers 4 --intermediate 128 --vocab 600   # CPU test size
"""

import argparse
from pathlib import Path

import torch

from bench.models import padded_tokenizer, random_qwen35


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--p-ended", type=float, default=0.0, help="share of rollouts ending before --cap")
    ap.add_argument("--cap", type=int, default=1024, help="the run's max_completion_length")
    a = ap.parse_args(argv)
    if a.out.exists():
        raise SystemExit(f"error: {a.out}: exists; a base is written into a new directory only")
    tokenizer = padded_tokenizer(a.vocab)
    model = random_qwen35(a, tokenizer, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(torch.bfloat16).save_pretrained(a.out)  # bf16 on disk, as a released checkpoint
    tokenizer.save_pretrained(a.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{a.out}: random Qwen3.5, {params:,} parameters, seed {a.seed}")
    return a.out


if __name__ == "__main__":
    main()

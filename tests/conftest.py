"""Shared fixtures: one tiny base model per test run, reused by every slow test."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
# Enough warm start for the model to emit the chat format often; far from `make base`'s quality.
TEST_BUILD = {"sft_steps": 30, "sft_batch_size": 8, "sft_pool_size": 400}


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A saved tiny base model directory: `artifacts/base` when `make base` has completed it, else a
    short build (seed 0) in a temporary directory. Treat it as read-only: other tests share it."""
    from trainer.tiny_base import EMBEDDED_BASE, BuildConfig, build_base, is_complete

    built = REPO / EMBEDDED_BASE
    if is_complete(built, BuildConfig(seed=0)):
        return built
    out = tmp_path_factory.mktemp("tiny_base")
    build_base(out, BuildConfig(seed=0, **TEST_BUILD))
    return out

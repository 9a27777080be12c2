"""Shared fixtures: one tiny base model per test run, reused by every slow test, and its task snapshot."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_base() -> Path:
    """The embedded base model, `artifacts/base`, exactly as `make base` builds it (and only built when it is
    missing or stale, so `make test` and `make train` share one build). Treat it as read-only.

    Slow tests need the real warm start: with a shorter one no group qualifies and training never moves."""
    from trainer.tiny_base import EMBEDDED_BASE, BuildConfig, is_complete, main

    built = REPO / EMBEDDED_BASE
    if not is_complete(built, BuildConfig(seed=0)):
        cwd = Path.cwd()
        os.chdir(REPO)  # `make base`'s relative default paths
        try:
            main([])
        finally:
            os.chdir(cwd)
    return built


@pytest.fixture(scope="session")
def embedded_snapshot(tmp_path_factory) -> Path:
    """The embedded default's synthetic tasks, as a snapshot file."""
    from data.snapshot import write_snapshot
    from trainer.tiny_base import embedded_tasks

    path = tmp_path_factory.mktemp("snap") / "synthetic.tasks.json"
    write_snapshot(embedded_tasks(), path)
    return path

"""Shared fixtures: one tiny base model per test run, reused by every slow test, its task snapshot, and one
embedded short run (tests/short_run.py) for the end-to-end tests that read a finished run."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test`'s two workers share the cores with each other and with the runs they start: waiting OpenMP
# threads sleep instead of spinning (as `trainer.train` sets for itself), and a worker's own torch runs on one
# intra-op thread (its core); tests of thread counts and runs with `cpu_threads` set theirs explicitly.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """The shipped base's weights and snapshot, tracked as .xz, unpacked before any test reads them (a bare
    `pytest` in a fresh clone too): the controller unpacks before pytest-xdist starts the workers, which check."""
    from embedded.shipped import ShippedError, unpack

    try:
        unpack()
    except ShippedError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.fixture(scope="session")
def tiny_base() -> Path:
    """The embedded base model shipped in the repo (`embedded/base`), the one `make train` uses: every slow
    test shares it and none builds a model. Treat it as read-only.

    Slow tests need the real warm start: GRPO only moves a model that answers some problems."""
    from embedded.build import SHIPPED_BASE, BuildConfig, is_complete

    shipped = REPO / SHIPPED_BASE
    assert is_complete(shipped, BuildConfig()), f"{shipped}: not a complete build of the default BuildConfig"
    return shipped


@pytest.fixture(scope="session")
def embedded_snapshot(tmp_path_factory) -> Path:
    """The embedded default's synthetic tasks, as a snapshot file (written anew: tests/test_tiny_base.py
    checks that it is byte for byte the shipped embedded/synthetic.tasks.json)."""
    from data.snapshot import write_snapshot
    from embedded.build import embedded_tasks

    path = tmp_path_factory.mktemp("snap") / "synthetic.tasks.json"
    write_snapshot(embedded_tasks(), path)
    return path


@pytest.fixture(scope="session")
def short_run(tiny_base, embedded_snapshot, tmp_path_factory) -> Path:
    """The embedded short run of tests/short_run.py (S4, 3 steps, BEMA, a stop that never fires, a hook log
    at ../hooks.jsonl), trained once per session by `python -m trainer.train`. Treat it as read-only."""
    from short_run import build

    return build(tiny_base, embedded_snapshot, tmp_path_factory.mktemp("short") / "S4")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """`make test` runs on two workers (pytest-xdist, `--dist loadgroup`): the slow tests first, so that the
    short ones fill both cores at the end; the tests that read the shared short run on one worker (it is
    built once). Two-process launches take a free port each (tests/free_port.py)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first, else as found
    for item in items:
        if "short_run" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("short_run"))

import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from data.atomic import DiskFullError
from rundir import state as state_shard
from rundir.state import (
    StateError,
    capture_rng_state,
    latest_state,
    load_state,
    restore_rng_state,
    save_state,
    verify_state,
)

ROOT = Path(__file__).resolve().parents[1]
META = {
    "step": 1,
    "checkpoint_id": "S2-step001",
    "arm": "S2",
    "policy_id": "affine-unresolved-zero-reward-active-v1",
}


def sample_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "master/embed": torch.randn(64, 40, generator=g),  # 10 KB: split over several 4 KB shards
        "exp_avg/embed": torch.randn(64, 40, generator=g),
        "master/norm": torch.randn(40, generator=g),
        "scalar": torch.tensor(3.5),
        "ids": torch.arange(300, dtype=torch.int64),
        "half": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "empty": torch.zeros(0, 4),
    }


TRAINER_STATE = {"global_step": 1, "log_history": [{"loss": 0.5, "grad_norm": float("nan")}]}


def saved(tmp_path, name="state001", seed=0):
    return save_state(
        tmp_path / name,
        tensors=sample_tensors(seed),
        meta=META,
        extra_json={"trainer_state.json": TRAINER_STATE},
        shard_bytes=4096,
    )


def rewrite_descriptor(state: Path, edit) -> None:
    """Change descriptor.json and re-seal it, as a buggy writer would."""
    desc = json.loads((state / "descriptor.json").read_text())
    edit(desc)
    data = json.dumps(desc).encode()
    (state / "descriptor.json").write_bytes(data)
    (state / "descriptor.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def edit_meta_step(state: Path) -> None:
    """meta.json's step 1 -> 2: same size, valid JSON, only its hash tells."""
    path = state / "meta.json"
    path.write_text(path.read_text().replace('"step": 1', '"step": 2'))


def test_round_trip_bitwise_over_several_shards(tmp_path):
    state = saved(tmp_path)
    tensors, meta = load_state(state, expect={"arm": "S2", "policy_id": META["policy_id"]})
    original = sample_tensors()
    assert tensors.keys() == original.keys()
    for name, t in original.items():
        assert (
            tensors[name].dtype == t.dtype
            and tensors[name].shape == t.shape
            and torch.equal(tensors[name], t)
        )
    assert {k: meta[k] for k in META} == META

    desc = json.loads((state / "descriptor.json").read_text())
    assert len(desc["shards"]) > 3 and len(desc["tensors"]["master/embed"]["parts"]) > 1
    seal = (state / "descriptor.sha256").read_text().strip()
    assert seal == hashlib.sha256((state / "descriptor.json").read_bytes()).hexdigest()
    for s in desc["shards"]:
        data = (state / s["file"]).read_bytes()
        assert re.fullmatch(rf"shard-\d{{5}}-of-{len(desc['shards']):05d}\.safetensors", s["file"])
        assert len(data) == s["bytes"] and hashlib.sha256(data).hexdigest() == s["sha256"]
    assert desc["total_bytes"] == sum(s["bytes"] for s in desc["shards"])
    assert [f["file"] for f in desc["files"]] == ["meta.json", "trainer_state.json"]  # every file covered
    assert sorted(p.name for p in state.iterdir()) == sorted(
        [s["file"] for s in desc["shards"]]
        + ["meta.json", "trainer_state.json", "descriptor.json", "descriptor.sha256"]
    )
    assert json.loads((state / "trainer_state.json").read_text())["log_history"][0]["loss"] == 0.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state001"]  # no temp dir left behind


def test_save_replaces_an_existing_state(tmp_path):
    saved(tmp_path, seed=0)
    state = saved(tmp_path, seed=1)
    tensors, _ = load_state(state)
    assert torch.equal(tensors["master/norm"], sample_tensors(1)["master/norm"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state001"]


def test_save_refuses_bad_input_before_writing(tmp_path):
    with pytest.raises(TypeError):
        save_state(tmp_path / "state001", tensors=sample_tensors(), meta={"rng": torch.zeros(2)})
    with pytest.raises(ValueError):
        save_state(tmp_path / "state001", tensors=sample_tensors(), meta={"loss": float("nan")})
    with pytest.raises(ValueError, match="'a@1'"):
        save_state(tmp_path / "state001", tensors={"a@1": torch.ones(1)}, meta={})
    assert not any(tmp_path.iterdir())


def _delete(path):
    path.unlink()


def _append_byte(path):
    path.write_bytes(path.read_bytes() + b"\0")


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _extra_shard(desc):
    desc["shards"].append(
        {"file": "shard-00007-of-00007.safetensors", "bytes": 1, "sha256": "0", "tensors": []}
    )


def _collision(desc):
    desc["shards"][1]["tensors"].append(desc["shards"][0]["tensors"][0])


@pytest.mark.parametrize(
    "damage, culprit, message",
    [
        (lambda s: _delete(s / "meta.json"), "meta.json", "missing"),
        (lambda s: _delete(s / "descriptor.json"), "descriptor.json", "missing"),
        (lambda s: (s / "meta.json").write_text("{not json"), "meta.json", "size"),
        (edit_meta_step, "meta.json", "sha256 mismatch"),
        (lambda s: _delete(s / "descriptor.sha256"), "descriptor.sha256", "missing"),
        (lambda s: (s / "descriptor.sha256").write_text("0" * 64), "descriptor.json", "does not match"),
        (lambda s: (s / "notes.txt").write_text("x"), "notes.txt", "not listed"),
        (
            lambda s: _delete(s / "shard-00002-of-00007.safetensors"),
            "shard-00002-of-00007.safetensors",
            "missing",
        ),
        (
            lambda s: _append_byte(s / "shard-00001-of-00007.safetensors"),
            "shard-00001-of-00007.safetensors",
            "size",
        ),
        (
            lambda s: _flip_last_byte(s / "shard-00003-of-00007.safetensors"),
            "shard-00003-of-00007.safetensors",
            "sha256",
        ),
        (lambda s: _append_byte(s / "descriptor.json"), "descriptor.json", "tampered"),
        (lambda s: _flip_last_byte(s / "trainer_state.json"), "trainer_state.json", "sha256"),
        (lambda s: _delete(s / "trainer_state.json"), "trainer_state.json", "missing"),
        (lambda s: rewrite_descriptor(s, _extra_shard), "descriptor.json", "unexpected shard"),
        (lambda s: rewrite_descriptor(s, _collision), "descriptor.json", "listed in"),
        (
            lambda s: (s / "shard-00009-of-00009.safetensors").write_bytes(b"x"),
            "shard-00009-of-00009",
            "not listed",
        ),
    ],
)
def test_refusals_name_the_file(tmp_path, damage, culprit, message):
    state = saved(tmp_path)
    assert len(json.loads((state / "descriptor.json").read_text())["shards"]) == 7
    damage(state)
    for check in (verify_state, load_state):
        with pytest.raises(
            StateError, match=rf"{re.escape(culprit)}.*{message}|{message}.*{re.escape(culprit)}"
        ):
            check(state)


def test_expect_mismatch_names_field_and_values(tmp_path):
    state = saved(tmp_path)
    with pytest.raises(StateError, match=r"meta\.json: field 'arm' is 'S2', expected 'S0'"):
        load_state(state, expect={"arm": "S0", "policy_id": META["policy_id"]})
    with pytest.raises(StateError, match=r"meta\.json: field 'policy_id' is .*active-v1', expected 'p'"):
        load_state(state, expect={"policy_id": "p"})


def test_latest_state_skips_broken_and_temporary_dirs(tmp_path):
    assert latest_state(tmp_path) is None
    saved(tmp_path, "state001")
    saved(tmp_path, "state003")
    (saved(tmp_path, "state010") / "shard-00000-of-00007.safetensors").unlink()
    (tmp_path / ".state011.tmp-1").mkdir()
    (tmp_path / "state012-old").mkdir()
    assert latest_state(tmp_path) == tmp_path / "state003"


KILLED_SAVE = """
import os, sys, time
from pathlib import Path
import torch
from rundir import state as state_shard

run, target = Path(sys.argv[1]), sys.argv[2]
write_shard = state_shard._write_shard
def paused_write_shard(path, tensors, head):  # pause for good once a shard is written
    result = write_shard(path, tensors, head)
    print("paused", flush=True)
    time.sleep(600)
    return result
state_shard._write_shard = paused_write_shard
tensors = {"w": torch.full((64, 64), 2.0), "v": torch.arange(4096.0)}
state_shard.save_state(run / target, tensors=tensors, meta={"step": 2}, shard_bytes=4096)
"""


@pytest.mark.parametrize("target", ["state002", "state001"])  # a new state, and one replacing the existing
def test_killed_save_leaves_previous_state_loadable(tmp_path, target):
    run = tmp_path / "run"
    saved(run, "state001")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = textwrap.dedent(KILLED_SAVE)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(run), target], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().startswith("paused")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    leftovers = [p for p in run.iterdir() if p.name.startswith(".")]
    assert leftovers  # the kill really came mid-save
    assert latest_state(run) == run / "state001"
    tensors, meta = load_state(run / "state001")
    assert meta["step"] == 1 and torch.equal(tensors["master/norm"], sample_tensors()["master/norm"])
    for d in run.iterdir():
        if d.name != "state001":
            with pytest.raises(StateError):
                load_state(d)
    save_state(
        run / "state002", tensors={"x": torch.ones(3)}, meta={"step": 2}
    )  # cleans the dead save's temp dir
    assert sorted(p.name for p in run.iterdir()) == ["state001", "state002"]


def test_rng_state_round_trips_through_json():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    state = json.loads(json.dumps(capture_rng_state()))

    def draws():
        return [
            random.random(),
            random.gauss(0, 1),
            np.random.rand(3).tolist(),
            np.random.randn(),
            torch.rand(3).tolist(),
        ]

    first = draws()
    assert draws() != first  # the generators moved on
    restore_rng_state(state)
    assert draws() == first


# --- failed and interrupted saves (issue 15, item 7) ----------------------------------------------------
def tree_bytes(root: Path) -> dict:
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_disk_full_up_front_names_path_and_bytes_and_writes_nothing(tmp_path, monkeypatch):
    saved(tmp_path, "state001")
    before = tree_bytes(tmp_path)
    monkeypatch.setattr(
        "rundir.state.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(10**6, 10**6 - 100, 100)
    )
    with pytest.raises(
        DiskFullError,
        match=r"state002: not saved, the disk is full: it needs [\d,]+ bytes and 100 are free in ",
    ):
        saved(tmp_path, "state002")
    assert tree_bytes(tmp_path) == before


def test_disk_full_mid_save_removes_the_partial_state(tmp_path, monkeypatch):
    saved(tmp_path, "state001")
    before = tree_bytes(tmp_path)
    write_shard, calls = state_shard._write_shard, []

    def filling(path, tensors, head):  # the third shard hits a full disk halfway
        calls.append(path)
        if len(calls) == 3:
            path.write_bytes(b"\0" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_shard(path, tensors, head)

    monkeypatch.setattr(state_shard, "_write_shard", filling)
    with pytest.raises(
        DiskFullError, match=r"state002: not saved, the disk is full: it needs [\d,]+ bytes"
    ) as e:
        saved(tmp_path, "state002")
    assert e.value.errno == errno.ENOSPC
    assert tree_bytes(tmp_path) == before  # no .state002.tmp-* keeping the disk full, state001 untouched


def test_disk_full_counts_every_byte_of_the_state_and_reads_as_a_sentence(tmp_path, monkeypatch):
    """Issue 30, case 5: the bytes needed are what the state takes on disk (safetensors headers, JSON files,
    descriptor.json and seal included), and the message does not start with "[Errno 28]"."""
    saved(tmp_path, "state001")
    on_disk = sum(p.stat().st_size for p in (tmp_path / "state001").iterdir())
    monkeypatch.setattr(
        "rundir.state.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(10**6, 10**6 - 100, 100)
    )
    with pytest.raises(DiskFullError) as e:
        saved(tmp_path, "state001")  # the same state again: the same bytes
    assert str(e.value).startswith(
        f"{tmp_path / 'state001'}: not saved, the disk is full: it needs {on_disk:,} bytes"
    )


def test_atomic_writes_name_their_temp_file_for_the_cleanup(tmp_path, monkeypatch):
    from data.atomic import TEMP_FILE, write_atomic

    temps = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: temps.append(Path(a).name) or replace(a, b))
    write_atomic(tmp_path / "run.json", b"{}")
    m = TEMP_FILE.fullmatch(temps[0])
    assert m and m[1] == "run.json" and int(m[2]) == os.getpid()
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_interrupted_saves_are_removed_or_put_back(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # a process that has exited
    saved(tmp_path, "state001")
    saved(tmp_path, "state004")
    shutil.move(tmp_path / "state004", tmp_path / f".state004.old-{pid}")  # killed between the two renames
    for name in (
        f".state002.tmp-{pid}",
        f".step002.tmp-{pid}",
        f".state001.old-{pid}",
        f".step003.tmp-{os.getppid()}",
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_text("partial")
    (tmp_path / "run.json").write_text("{}")  # an atomic write of it killed mid-way, and one in progress
    for name in (f".run.json.tmp-{pid}-k3x9q", f".run.json.tmp-{os.getppid()}-a7b2c"):
        (tmp_path / name).write_text('{"half')
    removed = state_shard.remove_interrupted_saves(tmp_path)
    assert sorted(p.name for p in removed) == sorted(
        [f".state002.tmp-{pid}", f".step002.tmp-{pid}", f".state001.old-{pid}", f".run.json.tmp-{pid}-k3x9q"]
    )
    # the live parent's saves are left alone; the replaced state004 is back in place, complete
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".run.json.tmp-{os.getppid()}-a7b2c",
        f".step003.tmp-{os.getppid()}",
        "run.json",
        "state001",
        "state004",
    ]
    verify_state(tmp_path / "state004")

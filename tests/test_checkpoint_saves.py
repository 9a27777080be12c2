"""stepNNN/ saves (issue 15, item 7; issue 30, cases 2, 5, 6): installed like a state, hashed into a manifest,
shared like every other file, a full disk named with path and bytes, and a failed save leaves no temp dir and
the previous checkpoint untouched."""

import errno
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from data.atomic import DiskFullError
from rundir.step import MANIFEST, StepError, verify_step
from trainer.checkpoint import save_weights


class Tokenizer:
    def save_pretrained(self, path):
        (Path(path) / "tokenizer.json").write_text("{}")


@pytest.fixture
def trainer():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = LlamaForCausalLM(config)
    accelerator = SimpleNamespace(
        unwrap_model=lambda m: m, get_state_dict=lambda m: m.state_dict(), is_main_process=True
    )
    return SimpleNamespace(accelerator=accelerator, model=model, processing_class=Tokenizer())


def tree_bytes(root: Path) -> dict:
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_save_replaces_an_existing_checkpoint_only_when_complete(trainer, tmp_path):
    target = tmp_path / "step002"
    save_weights(trainer, target)
    first = (target / "model.safetensors").read_bytes()
    with torch.no_grad():
        trainer.model.lm_head.weight.add_(1.0)
    save_weights(trainer, target)
    assert (target / "model.safetensors").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step002"]  # no temp or old dir left


def test_disk_full_is_named_before_writing(trainer, tmp_path, monkeypatch):
    save_weights(trainer, tmp_path / "step001")
    before = tree_bytes(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10, 10))
    with pytest.raises(
        DiskFullError,
        match=r"step002: not saved, the disk is full: it needs [\d,]+ bytes and 10 are free in ",
    ):
        save_weights(trainer, tmp_path / "step002")
    assert tree_bytes(tmp_path) == before


def test_disk_full_mid_save_leaves_no_partial_checkpoint(trainer, tmp_path, monkeypatch):
    save_weights(trainer, tmp_path / "step002")
    before = tree_bytes(tmp_path)

    def filling(path, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 64)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer.model, "save_pretrained", filling)
    with pytest.raises(
        DiskFullError, match=r"step002: not saved, the disk is full: it needs [\d,]+ bytes"
    ) as e:
        save_weights(trainer, tmp_path / "step002")
    assert e.value.errno == errno.ENOSPC
    assert tree_bytes(tmp_path) == before  # the previous step002/ untouched, no .step002.tmp-* left


def test_the_bases_processor_files_travel_with_each_checkpoint(trainer, tmp_path):
    """vLLM builds Qwen3.5's image processor even for text prompts: a stepNNN/ without the base's processor
    files cannot be loaded there (make test-vllm found it)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "preprocessor_config.json").write_text('{"image_processor_type": "x"}')
    trainer.model.name_or_path = str(base)
    save_weights(trainer, tmp_path / "step001")
    assert (tmp_path / "step001" / "preprocessor_config.json").read_text() == '{"image_processor_type": "x"}'
    assert not (tmp_path / "step001" / "video_preprocessor_config.json").exists()  # the base has none


def test_a_checkpoint_is_hashed_at_save_and_a_damaged_one_is_named(trainer, tmp_path):
    """Issue 30, case 2: every file of stepNNN/ (but its card) is listed with size and sha256."""
    target = tmp_path / "step003"
    save_weights(trainer, target)
    listed = {e["file"] for e in json.loads((target / MANIFEST).read_text())["files"]}
    assert "model.safetensors" in listed and "config.json" in listed
    verify_step(target)
    (target / "README.md").write_text("a card, rewritten whenever cards are")
    verify_step(target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 2**10])
    with pytest.raises(
        StepError,
        match=r"step003/model.safetensors: size 1,024 bytes, manifest.json says [\d,]+ \(truncated\)",
    ):
        verify_step(target)


def test_weights_are_readable_by_others_like_every_file_of_the_run(trainer, tmp_path):
    """Issue 30, case 6: safetensors' writer left model.safetensors 0600."""
    save_weights(trainer, tmp_path / "step001")
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "step001").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}


def test_disk_full_counts_at_least_what_the_checkpoint_takes(trainer, tmp_path, monkeypatch):
    save_weights(trainer, tmp_path / "step001")
    on_disk = sum(p.stat().st_size for p in (tmp_path / "step001").iterdir())
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10, 10))
    with pytest.raises(DiskFullError) as e:
        save_weights(trainer, tmp_path / "step002")
    needed = int(str(e.value).split("it needs ")[1].split(" bytes")[0].replace(",", ""))
    assert needed >= on_disk and not str(e.value).startswith("[Errno")

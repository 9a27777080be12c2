"""LoRA through `trainer.setup.build_trainer` with configs/mimo9b-lora.yaml's adapter settings, on the tiny
random model: one step trains only the adapter, and stepNNN/ is an adapter with a card that says so."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import TrainerCallback
from trl import GRPOTrainer, ModelConfig

import trainer.setup as setup
from data.snapshot import write_snapshot
from data.synthetic import generate_tasks
from tests.scripted import TEXT, TextGrader, tiny_random_model
from trainer.config import CapGRPOConfig

G = 4
CAP = 24
RECIPE = Path(__file__).resolve().parent.parent / "configs/mimo9b-lora.yaml"


class GradRecorder(TrainerCallback):
    """Names of the parameters holding a non-zero gradient right before the optimizer step."""

    def __init__(self, model):
        self.model, self.with_grad = model, set()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.with_grad |= {
            n for n, p in self.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0
        }


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield train_one_step(tmp_path_factory.mktemp("lora"), monkeypatch)


def lora_trainer(tmp_path, monkeypatch, **fields):
    tok, model = tiny_random_model()
    base = tmp_path / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    snapshot = tmp_path / "tasks.tasks.json"
    write_snapshot(generate_tasks(12, seed=0), snapshot)

    # Every problem yields correct, wrong, correct, wrong (ended by EOS): every group qualifies under S2.
    rollouts = [tok(TEXT[c], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in "CWCW"]

    def scripted(self, prompt_ids, *args, **kwargs):
        return [rollouts[i % G] for i in range(len(prompt_ids))], None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    # the run's pool (setup.grader_pool) reads the outcome off the text
    monkeypatch.setattr(setup, "GraderPool", lambda **kw: TextGrader())
    args = CapGRPOConfig(
        output_dir=str(tmp_path / "run"),
        arm="S2",
        groups_per_step=2,
        num_generations=G,
        per_device_train_batch_size=2 * G,
        max_completion_length=CAP,
        max_steps=1,
        snapshot_path=str(snapshot),
        heldout_size=2,
        fixed_size=2,
        fixed_samples=1,
        eval_every=1,
        checkpoint_steps=[1],
        learning_rate=1e-2,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        seed=0,
        **fields,
    )
    recipe = yaml.safe_load(RECIPE.read_text())
    lora = {k: v for k, v in recipe.items() if k.startswith("lora_") or k == "use_peft"}
    model_args = ModelConfig(model_name_or_path=str(base), dtype="float32", **lora)
    return setup.build_trainer(args, model_args)


def train_one_step(tmp_path, monkeypatch):
    trainer = lora_trainer(tmp_path, monkeypatch)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    recorder = GradRecorder(trainer.model)
    trainer.add_callback(recorder)
    trainer.train()
    return trainer, before, recorder.with_grad, tmp_path / "run"


def test_only_adapter_parameters_train(lora_run):
    trainer, before, with_grad, _ = lora_run
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert trainable and all("lora_" in n and "language_model" in n for n in trainable)
    # lora_B starts at zero, so at the first step only the B matrices have a gradient: all of them, i.e.
    # every adapter sits on a layer the loss reaches (none on the vision tower)
    b_matrices = {n for n in trainable if "lora_B" in n}
    assert b_matrices and b_matrices <= with_grad <= trainable
    assert b_matrices <= changed <= trainable


def test_checkpoint_is_an_adapter_with_an_adapter_card(lora_run):
    trainer, _, _, run = lora_run
    step = run / "step001"
    config = json.loads((step / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == yaml.safe_load(RECIPE.read_text())["lora_r"]
    assert not (step / "model.safetensors").exists()
    weights = load_file(step / "adapter_model.safetensors")
    assert weights and all("lora_" in k for k in weights)
    trained = dict(trainer.model.named_parameters())
    some_b = next(k for k in weights if "lora_B" in k and "language_model" in k)
    assert weights[some_b].abs().sum() > 0  # lora_B starts at zero: the saved adapter holds the trained step
    assert any(n.endswith(some_b.removesuffix(".weight") + ".default.weight") for n in trained)
    card = (step / "README.md").read_text()
    assert "LoRA adapter" in card  # cards/checkpoint_card.py names the adapter (docs/gpu.md "LoRA")


def test_evaluation_loads_the_adapter_merged_into_its_base(lora_run):
    """`make eval` on a LoRA stepNNN/ (no config.json there): the base named in adapter_config.json with the
    stored adapter merged in, as the run's vLLM engine holds it (engine/lora_push.py)."""
    from peft import PeftModel

    from engine.lora_push import stored  # checkpoints hold bf16
    from trainer.eval_checkpoints import load_checkpoint

    _, _, _, run = lora_run
    model, tokenizer = load_checkpoint(run / "step001", "cpu")
    base = json.loads((run / "step001/adapter_config.json").read_text())["base_model_name_or_path"]
    plain, _ = load_checkpoint(Path(base), "cpu")
    merged = PeftModel.from_pretrained(
        load_checkpoint(Path(base), "cpu")[0], run / "step001"
    ).merge_and_unload()
    ours, theirs, untouched = model.state_dict(), merged.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], stored(theirs[k])) for k in ours)
    assert any(not torch.equal(ours[k], untouched[k]) for k in ours)  # the adapter is in
    assert tokenizer.eos_token_id is not None


def test_cpu_adamw_takes_an_adapter_whose_parameters_all_decay(tmp_path, monkeypatch):
    """A single-GPU LoRA run gets CPUAdamW: its adapter has no undecayed parameters (no biases or norms), and
    torch refused the empty group beside the named one (the whole LoRA file errored so on the H200)."""
    from engine.cpu_adamw import CPUAdamW

    trainer = lora_trainer(tmp_path, monkeypatch, cpu_adamw=True)
    optimizer = trainer.create_optimizer()
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert isinstance(optimizer, CPUAdamW) and len(optimizer.param_groups) == 1
    assert set(optimizer.param_groups[0]["param_names"]) == trainable and all("lora_" in n for n in trainable)

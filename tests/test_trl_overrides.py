"""The private TRL/transformers methods CapGRPOTrainer overrides or calls, pinned to the signatures they had
when docs/training.md's table ("Private TRL methods we rely on") was written: an installed TRL that changes
one fails here, naming the method, before a run trains on a silently different hook."""

import inspect

import pytest
import torch
from trl import GRPOTrainer

from engine.cpu_adamw import CPUAdamW
from trainer.grpo import CapGRPOTrainer

TRL = "trl.trainer.grpo_trainer.GRPOTrainer"
HF = "transformers.trainer.Trainer"
# method -> (the class that defines it in the installed stack, its parameters); recorded on trl 1.16.0 and
# transformers 5.24.0. Overridden ones first, then those we only call.
RECORDED = {
    "_generate_and_score_completions": (TRL, "(self, inputs)"),
    "_generate_single_turn": (
        TRL,
        "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)",
    ),
    "_calculate_rewards": (TRL, "(self, inputs, prompts, completions, completion_ids_list)"),
    "_get_per_token_logps_and_entropies": (
        TRL,
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, "
        "pixel_attention_mask=None, spatial_shapes=None, num_tiles=None, image_sizes=None, "
        "token_type_ids=None, mm_token_type_ids=None, image_position_ids=None)",
    ),
    "_compute_loss": (TRL, "(self, model, inputs)"),
    "_load_from_checkpoint": (HF, "(self, resume_from_checkpoint, model=None)"),
    "_load_optimizer_and_scheduler": (TRL, "(self, checkpoint)"),
    "_load_rng_state": (HF, "(self, checkpoint)"),
    "_tokenize_prompts": (TRL, "(self, prompts)"),
}


def parameters(fn) -> str:
    """Names, kinds and defaults, without annotations (a new type hint is no new contract)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(star + p.name + ("" if p.default is p.empty else f"={p.default!r}"))
    return "(" + ", ".join(out) + ")"


def owner(cls: type, name: str) -> str:
    c = next((c for c in cls.__mro__ if name in vars(c)), None)
    return f"{c.__module__}.{c.__qualname__}" if c else "nowhere"


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_private_trl_method_keeps_its_recorded_signature(name):
    where, shape = RECORDED[name]
    assert owner(GRPOTrainer, name) == where, (
        f"{name}: now defined in {owner(GRPOTrainer, name)}, not {where}"
    )
    now = parameters(getattr(GRPOTrainer, name))
    assert now == shape, f"{name}: the installed TRL has {now}, CapGRPOTrainer was written against {shape}"


def test_every_private_override_is_recorded():
    overridden = {n for n in vars(CapGRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    private_of_trl = {n for n in overridden if hasattr(GRPOTrainer, n)}
    assert private_of_trl <= set(RECORDED), f"unrecorded overrides: {sorted(private_of_trl - set(RECORDED))}"
    # CPUAdamW's helpers are its own, not overrides of torch's Optimizer internals
    clashes = {n for n in vars(CPUAdamW) if n.startswith("_") and not n.startswith("__")}
    assert not {n for n in clashes if hasattr(torch.optim.Optimizer, n)}


# TRL attributes CapGRPOTrainer reads (or, `_last_loaded_step`, also sets), with the assignment TRL 1.16's
# GRPOTrainer.__init__ makes: a release that renames or reshapes one fails here, naming it.
ATTRIBUTES = {
    "_metrics": 'self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}',  # our capgrpo/* join
    "_last_loaded_step": "self._last_loaded_step = -1",  # the step whose weights vLLM holds (synced_vllm_engine)
    "vllm_generation": "self.vllm_generation = VLLMGeneration(",  # its sync_weights() and llm
    "eos_token_ids": "self.eos_token_ids = eos_token_ids",
}


@pytest.mark.parametrize("name", sorted(ATTRIBUTES))
def test_trl_attribute_we_read_is_still_assigned_as_recorded(name):
    import sys

    source = inspect.getsource(sys.modules[GRPOTrainer.__module__])
    assert ATTRIBUTES[name] in source, f"TRL's GRPOTrainer no longer assigns {name} as {ATTRIBUTES[name]!r}"
    if name == "_last_loaded_step":  # and compares it before pushing weights, which our mark relies on
        assert "if self.state.global_step != self._last_loaded_step:" in source


# TRL's callbacks that trainer/callbacks.py subclasses or reads the state of: the private method overridden
# (FrozenSafeBEMACallback) and the attributes export_callback_state saves, as TRL 1.16 assigns them.
CALLBACK_ATTRIBUTES = {
    "BEMACallback": ["self.param_names = []", "self.theta0_params = []", "self.ema_params = []",
                     "self.running_model = None", "self.running_model.parameters()"],
    "SyncRefModelCallback": ["self.accelerator = accelerator", "self.ref_model = ref_model"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CALLBACK_ATTRIBUTES))
def test_trl_callback_internals_we_rely_on_are_as_recorded(name):
    import trl.trainer.callbacks

    cls = getattr(trl.trainer.callbacks, name)
    source = inspect.getsource(cls)
    for line in CALLBACK_ATTRIBUTES[name]:
        assert line in source, f"{name}: TRL no longer has {line!r}"
    if name == "BEMACallback":
        assert owner(cls, "_update_bema_weights") == "trl.trainer.callbacks.BEMACallback"
        assert parameters(cls._update_bema_weights) == "(self, step)"


def test_our_trainer_attributes_do_not_shadow_trls():
    """An attribute of ours named like one of TRL's or the Trainer's would silently replace theirs (TRL keeps
    its generation counter in `self._step`); `optimizer` (create_optimizer) and `_last_loaded_step`
    (synced_vllm_engine marks the step's weights pushed, as TRL does) are the ones we mean to set."""
    import re
    import sys

    import transformers.trainer

    import trainer.grpo

    assigned = re.compile(r"self\.(\w+)\s*(?::[^=\n]+)?=[^=]")
    ours = set(assigned.findall(inspect.getsource(trainer.grpo)))
    theirs = set()
    for module in (sys.modules[GRPOTrainer.__module__], transformers.trainer):
        theirs |= set(assigned.findall(inspect.getsource(module)))
    assert ours & theirs == {"optimizer", "_last_loaded_step"}, sorted(ours & theirs)

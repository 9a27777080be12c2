"""The cap policies inside the real `CapGRPOTrainer`, on hand-built groups.

Generation and grading are scripted (tests/scripted.py), so every number here is computed by hand:
rewards, advantages, which tokens carry loss, the loss normaliser, qualification, and the gradient
each rollout contributes.
"""

import math

import pytest
import torch
from scripted import G, generate, make_trainer, spelled_rows, tiny_random_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def grads(trainer, out) -> torch.Tensor:
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, out).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def expected_advantages(spelled: str) -> list[float]:
    """Reward 1 for correct, 0 otherwise; mean and (unbiased) std over the non-indeterminate rollouts."""
    r = [None if c == "X" else float(c == "C") for c in spelled]
    vals = [x for x in r if x is not None]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1))
    return [0.0 if x is None else (x - mean) / (std + 1e-4) for x in r]


@pytest.mark.parametrize("arm", ["S0", "S2", "S4"])
def test_rewards_advantages_loss_mask_and_normaliser(tiny, tmp_path, monkeypatch, arm):
    script = {"p0": "CWTX", "p1": "CFWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, arm, script)
    out = generate(trainer)
    order = trainer.step_record.task_ids_trained
    assert sorted(order) == ["p0", "p1"]
    spelled = spelled_rows(trainer, script)
    adv = out["advantages"].tolist()
    want = [a for t in order for a in expected_advantages(script[t])]
    assert adv == pytest.approx(want, abs=1e-5)
    active_rows = out["tool_mask"].amax(dim=1).tolist()
    unresolved_active = arm != "S0"
    want_active = [c in "CW" or (c in "TF" and unresolved_active) for c in spelled]
    assert [bool(a) for a in active_rows] == want_active
    lengths = out["completion_mask"].sum(dim=1).tolist()
    assert out["num_items_in_batch"].item() == sum(n for n, a in zip(lengths, want_active, strict=True) if a)
    rec = trainer.step_record
    assert rec.groups == {
        "sampled": 2,
        "qualified": 2,
        "trained": 2,
        "rounds": 1,
        "bound_hit": False,
        "rejected": {},
    }
    assert rec.outcomes_sampled == {
        "truncated": 1,
        "format_rejected": 1,
        "correct": 2,
        "wrong": 3,
        "indeterminate": 1,
    }


def test_v1_rejects_correct_plus_truncated_without_completed_wrong(tiny, tmp_path, monkeypatch):
    script = {"p0": "CTTT", "p1": "CWWW", "p2": "CTCT", "p3": "CCWW"}
    s2 = make_trainer(tiny, tmp_path, monkeypatch, "S2", script, problems_per_round=2)
    generate(s2)
    assert s2.step_record.groups["rejected"] == {"correct_unresolved_no_wrong": 2}
    assert s2.step_record.groups["rounds"] == 2 and s2.step_record.gate_stat == 0.5
    s4 = make_trainer(tiny, tmp_path, monkeypatch, "S4", script, problems_per_round=2)
    generate(s4)
    assert s4.step_record.groups["rejected"] == {} and s4.step_record.groups["rounds"] == 1


def test_bound_hit_trains_on_what_it_has_and_pads_without_loss(tiny, tmp_path, monkeypatch):
    script = {"p0": "CWWW", "p1": "WWWW", "p2": "CCCC"}
    trainer = make_trainer(
        tiny, tmp_path, monkeypatch, "S2", script, problems_per_round=1, max_sampling_rounds=3
    )
    out = generate(trainer)
    groups = trainer.step_record.groups
    assert groups["trained"] == 1 and groups["bound_hit"] and groups["rounds"] == 3
    assert out["tool_mask"][:G].all() and not out["tool_mask"][G:].any()  # the filler group carries no loss


def perturb(out, row: int):
    """Same rollout length, different tokens: only a row that carries loss can change the gradient."""
    changed = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in out.items()}
    n = int(out["completion_mask"][row].sum()) - 1
    changed["completion_ids"][row, :n] = (changed["completion_ids"][row, :n] + 7) % 200 + 10
    return changed


def test_s0_and_s2_identical_when_nothing_is_unresolved(tiny, tmp_path, monkeypatch):
    script = {"p0": "CWWC", "p1": "WCWW"}
    g0 = grads(t0 := make_trainer(tiny, tmp_path, monkeypatch, "S0", script), generate(t0))
    g2 = grads(t2 := make_trainer(tiny, tmp_path, monkeypatch, "S2", script), generate(t2))
    assert torch.equal(g0, g2) and g0.abs().sum() > 0


@pytest.mark.parametrize("arm, changes", [("S0", False), ("S2", True), ("S4", True)])
def test_truncated_rollout_gradient(tiny, tmp_path, monkeypatch, arm, changes):
    script = {"p0": "CWTW", "p1": "CWWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, arm, script)
    out = generate(trainer)
    row = spelled_rows(trainer, script).index("T")
    base = grads(trainer, out)
    assert (not torch.equal(base, grads(trainer, perturb(out, row)))) is changes


@pytest.mark.parametrize("arm", ["S0", "S2", "S4"])
def test_indeterminate_rollout_contributes_nothing(tiny, tmp_path, monkeypatch, arm):
    script = {"p0": "CWXF", "p1": "CWWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, arm, script)
    out = generate(trainer)
    row = spelled_rows(trainer, script).index("X")
    assert out["advantages"][row].item() == 0.0 and not out["tool_mask"][row].any()
    assert torch.equal(grads(trainer, out), grads(trainer, perturb(out, row)))

"""Gates, cap policies and dynamic group selection on hand-built outcomes (no model)."""

import pytest

from policy.arms import ARMS, GATES, POLICIES
from rewards.outcome import Outcome
from trainer.selection import Group, rejection_reason, select_groups, shows_gate_gap

C, W, T, F, X = (
    Outcome.CORRECT,
    Outcome.WRONG,
    Outcome.TRUNCATED,
    Outcome.FORMAT_REJECTED,
    Outcome.INDETERMINATE,
)
S0, S2, S4 = (ARMS[a].policy for a in ("S0", "S2", "S4"))


@pytest.mark.parametrize(
    "outcomes, v1, v2",
    [
        ([C, W, W, W], True, True),
        ([C, T, T, T], False, True),  # correct + truncated, no completed wrong
        ([C, F, C, C], False, True),
        ([C, C, C, C], False, False),
        ([W, T, F, W], False, False),
        ([C, X, X, X], False, False),  # indeterminate is not a failure
        ([C, W, X, T], True, True),
    ],
)
def test_gates(outcomes, v1, v2):
    assert S0.qualifies(outcomes) is v1
    assert S2.qualifies(outcomes) is v1
    assert S4.qualifies(outcomes) is v2
    assert GATES["all"](outcomes)  # no dynamic sampling


def test_gates_are_keyed_by_the_name_policies_record():
    assert all(name == gate.name for name, gate in GATES.items()) and sorted(GATES) == ["all", "v1", "v2"]


def test_policy_table_matches_spec():
    assert not S0.unresolved_active and S0.gate == "v1"
    assert S2.unresolved_active and S2.gate == "v1"
    assert S4.unresolved_active and S4.gate == "v2"
    assert {a: ARMS[a].groups_per_step for a in ARMS} == {"S0": 32, "S2": 32, "S4": 32}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=lambda p: p.id)
def test_which_rollouts_carry_loss(policy):
    assert policy.carries_loss(C) and policy.carries_loss(W)
    assert not policy.carries_loss(X)  # never, under any policy
    assert policy.carries_loss(T) is policy.unresolved_active
    assert policy.carries_loss(F) is policy.unresolved_active


def test_rejection_reasons():
    assert rejection_reason([C, C], S2) == "all_correct"
    assert rejection_reason([W, T], S2) == "no_correct"
    assert rejection_reason([C, T, C], S2) == "correct_unresolved_no_wrong"
    assert rejection_reason([C, T, C], S4) is None
    assert rejection_reason([X, X], S4) == "all_indeterminate"
    assert rejection_reason([C, X], S2) == "all_correct"
    assert shows_gate_gap([C, F]) and not shows_gate_gap([C, F, W]) and not shows_gate_gap([W, T])


def scripted(script: dict[str, list[Outcome]]):
    """A stand-in for generation + grading: each task id always yields the same outcomes."""
    seen: list[list[str]] = []

    def sample_round(task_ids):
        seen.append(list(task_ids))
        return [Group(t, script[t]) for t in task_ids]

    return sample_round, seen


def sampler_over(ids):
    pos = [0]

    def take(n):
        out = [ids[(pos[0] + i) % len(ids)] for i in range(n)]
        pos[0] += n
        return out

    return take


def test_selection_stops_at_exactly_groups_per_step():
    script = {f"q{i}": ([C, W] if i % 3 == 0 else [C, T]) for i in range(30)}
    sample_round, seen = scripted(script)
    ids = sorted(script, key=lambda s: int(s[1:]))
    sel = select_groups(
        sample_round, sampler_over(ids), S2, groups_per_step=4, problems_per_round=5, max_sampling_rounds=10
    )
    assert len(sel.groups) == 4 and sel.shortfall == 0
    assert all(S2.qualifies(g.outcomes) for g in sel.groups)
    # q0, q3, q6, q9 qualify; they come in rounds of 5 → 2 rounds suffice, the overshoot is counted.
    assert [g.task_id for g in sel.groups] == ["q0", "q3", "q6", "q9"]
    assert sel.rounds == 2 and len(sel.sampled) == 10 and sel.qualified == 4
    assert sel.rejected == {"correct_unresolved_no_wrong": 6}
    assert seen == [ids[:5], ids[5:10]]


def test_selection_v2_accepts_what_v1_rejects():
    script = {f"q{i}": [C, T] for i in range(8)}
    take = sampler_over(list(script))
    v1 = select_groups(
        scripted(script)[0], take, S2, groups_per_step=2, problems_per_round=2, max_sampling_rounds=3
    )
    take = sampler_over(list(script))
    v2 = select_groups(
        scripted(script)[0], take, S4, groups_per_step=2, problems_per_round=2, max_sampling_rounds=3
    )
    assert len(v1.groups) == 0 and v1.rounds == 3 and v1.shortfall == 2
    assert len(v2.groups) == 2 and v2.rounds == 1


def test_selection_bound_hit_keeps_only_qualifying_groups():
    script = {f"q{i}": ([C, W] if i == 1 else [W, W]) for i in range(20)}
    sel = select_groups(
        scripted(script)[0],
        sampler_over(list(script)),
        S0,
        groups_per_step=3,
        problems_per_round=2,
        max_sampling_rounds=2,
    )
    assert sel.rounds == 2 and len(sel.sampled) == 4
    assert [g.task_id for g in sel.groups] == ["q1"] and sel.shortfall == 2
    assert sel.rejected == {"no_correct": 3}

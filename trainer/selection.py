"""Dynamic group selection (SPEC §3): sample problems in rounds until exactly `groups_per_step` qualify.

Generation is injected (`sample_round`), so this module is pure bookkeeping and is tested on CPU with
hand-built outcomes. Every process runs it on the same global view, so the selection is global.
"""

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy.arms import CapPolicy
from rewards.outcome import UNRESOLVED, Outcome


@dataclass
class Group:
    """G graded rollouts of one problem; `rollouts` carries whatever the generator attached (ids, text)."""

    task_id: str
    outcomes: list[Outcome]
    rollouts: list[Any] = field(default_factory=list)


def shows_gate_gap(outcomes: Sequence[Outcome]) -> bool:
    """A correct answer and unresolved failures but no completed wrong: what gate v1 never trains on."""
    s = set(outcomes)
    return Outcome.CORRECT in s and bool(s & UNRESOLVED) and Outcome.WRONG not in s


def rejection_reason(outcomes: Sequence[Outcome], policy: CapPolicy) -> str | None:
    """Why a group does not enter training under `policy` (None when it qualifies)."""
    if policy.qualifies(outcomes):
        return None
    graded = [o for o in outcomes if o is not Outcome.INDETERMINATE]
    if not graded:
        return "all_indeterminate"
    if all(o is Outcome.CORRECT for o in graded):
        return "all_correct"
    if Outcome.CORRECT not in graded:
        return "no_correct"
    if shows_gate_gap(graded):
        return "correct_unresolved_no_wrong"
    return "other"


@dataclass
class Selection:
    groups: list[Group]  # qualifying, in sampling order, at most groups_per_step
    sampled: list[Group]  # every group generated this step, in sampling order
    rounds: int
    qualified: int  # may exceed len(groups): the last round can overshoot
    rejected: Counter
    target: int

    @property
    def shortfall(self) -> int:
        """Groups missing when `max_sampling_rounds` ran out; the step trains on what it has."""
        return self.target - len(self.groups)


def select_groups(
    sample_round: Callable[[list[str]], list[Group]],
    take_tasks: Callable[[int], list[str]],
    policy: CapPolicy,
    *,
    groups_per_step: int,
    problems_per_round: int,
    max_sampling_rounds: int,
) -> Selection:
    """Rounds of `take_tasks` → `sample_round` until `groups_per_step` groups qualify or the bound is hit."""
    kept: list[Group] = []
    sampled: list[Group] = []
    rejected: Counter = Counter()
    qualified = rounds = 0
    while len(kept) < groups_per_step and rounds < max_sampling_rounds:
        rounds += 1
        for group in sample_round(take_tasks(problems_per_round)):
            sampled.append(group)
            reason = rejection_reason(group.outcomes, policy)
            if reason is None:
                qualified += 1
                if len(kept) < groups_per_step:
                    kept.append(group)
            else:
                rejected[reason] += 1
    return Selection(kept, sampled, rounds, qualified, rejected, groups_per_step)

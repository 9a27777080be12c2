"""Cap policies, qualification gates and arms: the one place where S0, S2 and S4 differ (SPEC §3).

A cap policy decides two things about *unresolved* rollouts (truncated or format-rejected):
whether they carry loss, and which gate decides if a group enters training at all.
Reward is the same under every policy: correct = 1, any other gradeable outcome = 0.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from rewards.outcome import UNRESOLVED, Outcome


# --- gates: does a group of G graded rollouts enter training? -------------------------------------
def gate_v1(outcomes: Iterable[Outcome]) -> bool:
    """At least one correct and at least one completed-wrong; unresolved failures do not count."""
    s = set(outcomes)
    return Outcome.CORRECT in s and Outcome.WRONG in s


def gate_v2(outcomes: Iterable[Outcome]) -> bool:
    """At least one correct and at least one failure of any kind (wrong, truncated, format-rejected)."""
    s = set(outcomes)
    return Outcome.CORRECT in s and bool(s & ({Outcome.WRONG} | UNRESOLVED))


GATES = {"v1": gate_v1, "v2": gate_v2}


# --- cap policies ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CapPolicy:
    id: str
    unresolved_active: bool  # False: unresolved tokens leave the loss AND the token-count normaliser
    gate: str  # key of GATES

    def carries_loss(self, outcome: Outcome) -> bool:
        """Whether this rollout's tokens are in the loss (indeterminate never is)."""
        if outcome is Outcome.INDETERMINATE:
            return False
        return self.unresolved_active or outcome not in UNRESOLVED

    def qualifies(self, outcomes: Iterable[Outcome]) -> bool:
        return GATES[self.gate](outcomes)


POLICIES = {
    p.id: p
    for p in (
        CapPolicy("affine-unresolved-zero-reward-mask-all-v1", unresolved_active=False, gate="v1"),
        CapPolicy("affine-unresolved-zero-reward-active-v1", unresolved_active=True, gate="v1"),
        CapPolicy("affine-unresolved-failure-v2", unresolved_active=True, gate="v2"),
    )
}


# --- arms: named configurations; recipes may define more (see configs/*.yaml `arms:`) --------------
@dataclass(frozen=True)
class Arm:
    name: str
    policy_id: str
    groups_per_step: int
    note: str = ""

    @property
    def policy(self) -> CapPolicy:
        return POLICIES[self.policy_id]


ARMS = {
    a.name: a
    for a in (
        Arm("S0", "affine-unresolved-zero-reward-mask-all-v1", 32, "control: the live run's original policy"),
        Arm("S2", "affine-unresolved-zero-reward-active-v1", 32, "unresolved trained as failures, v1 gate"),
        Arm("S4", "affine-unresolved-failure-v2", 32, "v2 gate (the live run used 128 groups/step)"),
    )
}

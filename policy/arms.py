"""Cap policies, qualification gates and arms: the one place where arms differ (SPEC §3, docs/training.md).

A cap policy states, per kind of rollout, its reward (from the outcome and the completion length relative to
the cap), whether its tokens carry loss, whether they count in the token normaliser, whether its reward
enters the group baseline, and which gate admits a group. Correct and completed-wrong rollouts are always
trained, indeterminate ones never (SPEC §2). POLICIES/ARMS are the seed's; PEER_* reproduce other libraries.
Each gate and named treatment carries the cards' words for it (cards/policy_text.py reads them).
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace

from rewards.outcome import UNRESOLVED, Outcome


# --- gates: does a group of G graded rollouts enter training? -------------------------------------
@dataclass(frozen=True)
class Gate:
    """A qualification gate: its rule and the cards' words for it, declared together so that a new gate is
    one entry of GATES (cards/policy_text.py reads `text`)."""

    name: str  # what CapPolicy.gate, run.json and steps.jsonl record
    text: str  # the cards' words for the rule
    rule: Callable[[set[Outcome]], bool]  # over the set of the group's outcomes

    def __call__(self, outcomes: Iterable[Outcome]) -> bool:
        return self.rule(set(outcomes))


gate_v1 = Gate(  # unresolved failures do not count
    "v1",
    "a group trains iff it has at least one correct and at least one completed wrong",
    lambda s: Outcome.CORRECT in s and Outcome.WRONG in s,
)
gate_v2 = Gate(
    "v2",
    "a group trains iff it has at least one correct and at least one failure of any kind "
    "(wrong, truncated or format-rejected)",
    lambda s: Outcome.CORRECT in s and bool(s & ({Outcome.WRONG} | UNRESOLVED)),
)
gate_all = Gate(
    "all",
    "every group trains (no dynamic sampling; a group whose rewards are all equal has advantage 0)",
    lambda s: True,
)
GATES = {g.name: g for g in (gate_v1, gate_v2, gate_all)}


# --- what training does with one kind of rollout --------------------------------------------------
@dataclass(frozen=True)
class Treatment:
    loss: bool  # tokens carry loss
    normaliser: bool  # tokens count in the token normaliser (loss_type dapo)
    baseline: bool  # reward enters the group mean/std; if not, reward NaN → TRL gives advantage 0


TRAINED = Treatment(loss=True, normaliser=True, baseline=True)
MASKED = Treatment(loss=False, normaliser=False, baseline=True)
NO_REWARD = Treatment(loss=True, normaliser=True, baseline=False)
DROPPED = Treatment(loss=False, normaliser=False, baseline=False)  # indeterminate, every policy
# The cards' words for the treatments a policy can name ({reward}: the kind's reward), beside their flags so a
# new one is described where it is declared; the cards spell any other out flag by flag.
TREATMENT_TEXT = {
    TRAINED: "active in the loss with reward {reward:g} (trained as failures)",
    MASKED: "masked: their tokens leave the loss and the token-count normaliser",
    NO_REWARD: "given no reward (NaN): out of the group baseline, advantage 0, tokens kept in the loss normaliser",
}


# Where the seed's policies come from, as cards cite it: what their reader can open (the team's SPEC.md is in
# no clone and on no Hub repo)
SEED_SOURCE = "the experiment card sn120-exp019-S2, restated in capgrpo's docs/behaviour.md (Cap policies)"


@dataclass(frozen=True)
class CapPolicy:
    id: str
    truncated: Treatment
    format_rejected: Treatment
    gate: str  # key of GATES
    source: str = SEED_SOURCE
    failure_reward: float = 0.0  # of wrong and unresolved; correct earns 1 (DAPO scores failures -1)
    # DAPO's soft overlong punishment, added to every reward: -factor × (length - (cap - buffer)) / buffer
    # inside the last `buffer` tokens before the cap, 0 before them. Factor 0: off.
    overlong_penalty_factor: float = 0.0
    overlong_buffer_len: int | None = None  # None: a fifth of the cap (DAPO's 4096 of 20480)
    # A stop-properly penalty: a truncated rollout's fixed reward, below a wrong answer's; None: failure_reward.
    truncation_reward: float | None = None

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"policy {self.id}: unknown gate {self.gate!r}; known: {sorted(GATES)}")
        if any(k.loss and not k.normaliser for k in (self.truncated, self.format_rejected)):
            raise ValueError(f"policy {self.id}: tokens that carry loss must count in the normaliser")
        bad_buffer = self.overlong_buffer_len is not None and self.overlong_buffer_len < 1
        if self.overlong_penalty_factor < 0 or bad_buffer:
            raise ValueError(
                f"policy {self.id}: overlong_penalty_factor must be ≥ 0, overlong_buffer_len ≥ 1"
            )
        if self.truncation_reward is not None and not (
            self.truncation_reward < min(self.failure_reward, 0) and self.truncated == TRAINED
        ):
            raise ValueError(
                f"policy {self.id}: truncation_reward must be < 0 and below failure_reward "
                f"({self.failure_reward:g}), with truncated rollouts trained"
            )

    @property
    def unresolved_active(self) -> bool:
        """The seed's one switch: truncated and format-rejected rollouts both carry loss."""
        return self.truncated.loss and self.format_rejected.loss

    def treatment(self, outcome: Outcome) -> Treatment:
        kinds = {Outcome.TRUNCATED: self.truncated, Outcome.FORMAT_REJECTED: self.format_rejected}
        return DROPPED if outcome is Outcome.INDETERMINATE else kinds.get(outcome, TRAINED)

    def carries_loss(self, outcome: Outcome) -> bool:
        return self.treatment(outcome).loss

    def counts_in_normaliser(self, outcome: Outcome) -> bool:
        return self.treatment(outcome).normaliser

    def buffer_len(self, cap: int) -> int:
        return self.overlong_buffer_len if self.overlong_buffer_len is not None else max(cap // 5, 1)

    def reward(self, outcome: Outcome, length: int, cap: int) -> float:
        """The reward the group baseline sees; `length` counts completion tokens, EOS included."""
        if not self.treatment(outcome).baseline:
            return math.nan
        r = 1.0 if outcome is Outcome.CORRECT else self.failure_reward
        if outcome is Outcome.TRUNCATED and self.truncation_reward is not None:
            r = self.truncation_reward
        if self.overlong_penalty_factor:
            buffer = self.buffer_len(cap)
            r += min(-(length - (cap - buffer)) / buffer * self.overlong_penalty_factor, 0.0)
        return r

    def check(self, cap: int, loss_type: str) -> None:
        """Refuse, before anything is generated, what the trainer cannot honour."""
        if self.overlong_penalty_factor and self.buffer_len(cap) > cap:
            raise ValueError(f"policy {self.id}: overlong_buffer_len {self.buffer_len(cap)} > cap {cap}")
        split = any(k.normaliser and not k.loss for k in (self.truncated, self.format_rejected))
        if split and loss_type not in ("dapo", "cispo", "vespo"):  # the others normalise by the loss mask
            raise ValueError(f"policy {self.id}: a normaliser apart from the loss needs loss_type dapo")

    def qualifies(self, outcomes: Iterable[Outcome]) -> bool:
        return GATES[self.gate](outcomes)


# fmt: off
POLICIES = {p.id: p for p in (  # the seed's, unchanged (SPEC §3)
    #         id                                           truncated  format-rejected  gate
    CapPolicy("affine-unresolved-zero-reward-mask-all-v1", MASKED,    MASKED,          "v1"),
    CapPolicy("affine-unresolved-zero-reward-active-v1",   TRAINED,   TRAINED,         "v1"),
    CapPolicy("affine-unresolved-failure-v2",              TRAINED,   TRAINED,         "v2"),
)}
TRL, DAPO = "TRL 1.16 GRPOTrainer", "DAPO (arXiv 2503.14476), verl recipe/dapo"
STOP = "OpenRLHF stop_properly_penalty_coef; NeMo RL ProRLv2 'stop properly' penalty"
PEER_POLICIES = {p.id: p for p in (  # other libraries' rules; docs/training.md cites the code of each
    CapPolicy("trl-mask-truncated",      MASKED,    TRAINED,   "all", f"{TRL}: mask_truncated_completions=True"),
    CapPolicy("trl-none-reward",         NO_REWARD, NO_REWARD, "all", f"{TRL}: reward function returns None"),
    CapPolicy("dapo-soft-overlong-v1",   TRAINED,   TRAINED,   "v1",  f"{DAPO}: soft overlong punishment",
              failure_reward=-1.0, overlong_penalty_factor=1.0),
    CapPolicy("dapo-overlong-filter-v2", MASKED,    TRAINED,   "v2",  f"{DAPO}: overlong filtering + filter_groups",
              failure_reward=-1.0),
    CapPolicy("stop-properly-penalty-v1", TRAINED,   TRAINED,   "v1",  f"{STOP}: truncated rollouts get a fixed reward",
              truncation_reward=-0.5),
)}
# fmt: on
ALL_POLICIES = {**POLICIES, **PEER_POLICIES}


# --- arms: named configurations; recipes may define more (see configs/*.yaml `arms:`) --------------
@dataclass(frozen=True)
class Arm:
    name: str
    policy_id: str
    groups_per_step: int
    note: str = ""
    policy_params: dict = field(
        default_factory=dict
    )  # CapPolicy fields to override, e.g. overlong_buffer_len

    def __post_init__(self):
        known = {f.name for f in fields(CapPolicy)} - {"id", "source"}
        if unknown := sorted(set(self.policy_params) - known):
            raise ValueError(f"arm {self.name}: unknown policy_params {unknown}; known: {sorted(known)}")

    @property
    def policy(self) -> CapPolicy:
        params = {k: Treatment(**v) if isinstance(v, dict) else v for k, v in self.policy_params.items()}
        return replace(ALL_POLICIES[self.policy_id], **params)


# fmt: off
ARMS = {a.name: a for a in (
    Arm("S0", "affine-unresolved-zero-reward-mask-all-v1", 32, "control: the live run's original policy"),
    Arm("S2", "affine-unresolved-zero-reward-active-v1", 32, "unresolved trained as failures, v1 gate"),
    Arm("S4", "affine-unresolved-failure-v2", 32, "v2 gate (the live run used 128 groups/step)"),
)}
PEER_ARMS = {a.name: a for a in (
    Arm("TRL-MT", "trl-mask-truncated", 32, "TRL mask_truncated_completions=True, no dynamic sampling"),
    Arm("TRL-NONE", "trl-none-reward", 32, "TRL reward None for unresolved rollouts, no dynamic sampling"),
    Arm("DAPO-SOFT", "dapo-soft-overlong-v1", 32, "S2 plus DAPO's soft overlong punishment"),
    Arm("DAPO-FILTER", "dapo-overlong-filter-v2", 32, "DAPO overlong filtering + dynamic sampling"),
    Arm("S2-PEN", "stop-properly-penalty-v1", 32, "S2 with a fixed reward below a wrong answer's for truncation"),
)}
# fmt: on
ALL_ARMS = {**ARMS, **PEER_ARMS}


def resolve_arm(name: str, extra: dict | None = None) -> Arm:
    """The arm `name`, built in or from a recipe's `arms:` mapping {name: {policy_id, groups_per_step, ...}}."""
    arms = {**ALL_ARMS, **{n: Arm(name=n, **spec) for n, spec in (extra or {}).items()}}
    if name not in arms:
        raise ValueError(f"unknown arm {name!r}; known: {sorted(arms)} (add one under `arms:`)")
    if arms[name].policy_id not in ALL_POLICIES:
        known = sorted(ALL_POLICIES)
        raise ValueError(f"arm {name}: unknown policy_id {arms[name].policy_id!r}; known: {known}")
    return arms[name]

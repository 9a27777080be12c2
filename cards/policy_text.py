"""What the cards say about a cap policy: its treatment of unresolved rollouts, gate and reward, in words
derived from its row of the table in policy/arms.py (the words for a gate or a named treatment are declared
there with it), and how an arm differs from the control S0."""

import json

from policy.arms import (
    ALL_POLICIES,
    ARMS,
    GATES,
    MASKED,
    TRAINED,
    TREATMENT_TEXT,
    CapPolicy,
    Treatment,
    resolve_arm,
)
from rundir.files import Run, RunFileError

CONTROL_ARM = "S0"


def recorded_policy(run: Run) -> CapPolicy:
    """The policy as trained: the recorded arm's, with the policy_params of its recipe's `arms:`; a policy id
    this version does not know is refused by name (a card must not describe another policy)."""
    if run.policy_id not in ALL_POLICIES:
        known = sorted(ALL_POLICIES)
        raise RunFileError(f"{run.dir / 'run.json'}: unknown policy_id {run.policy_id!r}; known: {known}")
    extra = run.meta.get("config", {}).get("arms")
    try:
        arm = resolve_arm(run.arm, json.loads(extra) if isinstance(extra, str) else extra)
    except (ValueError, TypeError):  # an arm this version no longer defines: the bare policy
        return ALL_POLICIES[run.policy_id]
    return arm.policy if arm.policy_id == run.policy_id else ALL_POLICIES[run.policy_id]


def describe_treatment(t: Treatment, reward: float) -> str:
    if t in TREATMENT_TEXT:
        return TREATMENT_TEXT[t].format(reward=reward)
    return f"in the loss: {t.loss}, in the normaliser: {t.normaliser}, in the baseline: {t.baseline}"


def truncated_reward(policy: CapPolicy) -> float:
    return policy.failure_reward if policy.truncation_reward is None else policy.truncation_reward


def describe_policy(policy: CapPolicy) -> dict[str, str]:
    """The cards' prose for a policy, derived from its row of the table in policy/arms.py."""
    truncated = describe_treatment(policy.truncated, truncated_reward(policy))
    rejected = describe_treatment(policy.format_rejected, policy.failure_reward)
    unresolved = (
        truncated
        if truncated == rejected
        else f"split by kind — truncated: {truncated}; format-rejected: {rejected}"
    )
    reward = f"1 for correct, {policy.failure_reward:g} for any other gradeable outcome"
    if policy.truncation_reward is not None:
        reward = (
            f"1 for correct, {policy.truncation_reward:g} for a truncated rollout (a stop-properly penalty), "
            f"{policy.failure_reward:g} for any other gradeable outcome"
        )
    if policy.overlong_penalty_factor:
        b = "a fifth of the cap" if policy.overlong_buffer_len is None else f"{policy.overlong_buffer_len}"
        reward += (
            f", plus DAPO's soft overlong punishment: −{policy.overlong_penalty_factor:g} × (length − (cap − B)) / B "
            f"over the last B tokens before the cap (B = {b})"
        )
    return {
        "unresolved": unresolved,
        "gate": GATES[policy.gate].text,
        "reward": reward,
        "source": policy.source,
    }


def changes_from_control(run: Run) -> list[str]:
    """How this arm differs from the control arm S0 (policy/arms.py), in policy and groups per step."""
    control = ARMS[CONTROL_ARM]
    if run.arm == CONTROL_ARM:
        return [f"This is the control arm ({control.note})."]
    changes = []
    policy, base = recorded_policy(run), control.policy
    kinds = [
        ("Truncated", policy.truncated, base.truncated, truncated_reward(policy), truncated_reward(base)),
        (
            "Format-rejected",
            policy.format_rejected,
            base.format_rejected,
            policy.failure_reward,
            base.failure_reward,
        ),
    ]
    same = truncated_reward(policy) == policy.failure_reward
    if same and all(k[1:3] == kinds[0][1:3] for k in kinds):  # one treatment of both kinds
        kinds = kinds[:1]
        kinds[0] = ("Unresolved", *kinds[0][1:])
    for kind, now, was, r_now, r_was in kinds:
        if now == was and r_now == r_was:
            continue
        if {now, was} == {TRAINED, MASKED}:  # the seed's own switch, in its words
            trained = f"active (reward {r_now:g})"
            new, old = (trained, "masked") if now == TRAINED else ("masked", "active")
            change = f"{new} in the loss instead of {old}"
        else:
            now_text, was_text = (
                describe_treatment(now, r_now),
                describe_treatment(was, r_was),
            )
            change = f"{now_text}, instead of {was_text}"
        of = " (truncated or format-rejected)" if kind == "Unresolved" else ""
        changes.append(f"{kind} rollouts{of} are {change}.")
    if (policy.failure_reward, policy.overlong_penalty_factor, policy.truncation_reward) != (
        base.failure_reward,
        base.overlong_penalty_factor,
        base.truncation_reward,
    ):
        changes.append(f"Reward: {describe_policy(policy)['reward']}.")
    if policy.gate != base.gate:
        changes.append(
            f"Qualification gate {policy.gate} instead of {base.gate}: {describe_policy(policy)['gate']}."
        )
    if run.groups_per_step not in (None, control.groups_per_step):
        changes.append(f"{run.groups_per_step} groups per step instead of {control.groups_per_step}.")
    if not changes:
        return [f"Same cap policy and groups per step as the control arm {CONTROL_ARM}."]
    source = [] if policy.source == base.source else [f"Where the policy comes from: {policy.source}."]
    return [
        f"Cap policy `{run.policy_id}` instead of the control's `{control.policy_id}`.",
        *source,
        *changes,
    ]

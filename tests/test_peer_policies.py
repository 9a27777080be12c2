"""Other libraries' treatments of unresolved rollouts, as policies of the real `CapGRPOTrainer`.

Every group is hand-built (tests/scripted.py): cap 24 tokens, so a truncated rollout ("T") is 24 tokens long
and, with the scripted tokenizer, a correct ("C") or wrong ("W") one is 6 tokens (EOS included), a
format-rejected one ("F") 5 — `test_scripted_lengths` pins these, every hand-worked number below rests on
them. Advantages are TRL's: (r - group mean) / (unbiased group std + 1e-4) over the rewards that are not NaN,
0 for a NaN reward. Where the peer is TRL itself, the trainer is also checked against plain TRL 1.16 on the
same rollouts; DAPO's rules come from verl's code (cited per test), which is not installed here.
"""

import itertools
import json
import math

import pytest
import torch
from datasets import Dataset
from scripted import STEP_ARGS, G, generate, make_trainer, spelled_rows, tiny_random_model
from trl import GRPOConfig, GRPOTrainer

from data.prompt import prompt_messages
from policy.arms import GATES, MASKED, PEER_ARMS, TRAINED, CapPolicy, Treatment, resolve_arm
from rewards.outcome import Outcome

C, W, T, F = Outcome.CORRECT, Outcome.WRONG, Outcome.TRUNCATED, Outcome.FORMAT_REJECTED
LENGTH = {"C": 6, "W": 6, "F": 5, "T": 24}


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def advantages(rewards: list[float | None]) -> list[float]:
    """TRL's group advantage for one group of hand-worked rewards (None: NaN reward)."""
    vals = [r for r in rewards if r is not None]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((r - mean) ** 2 for r in vals) / (len(vals) - 1))
    return [0.0 if r is None else (r - mean) / (std + 1e-4) for r in rewards]


def rows(trainer, out, script):
    """Per row of the step, in batch order: its letter, whether it carries loss, its token count."""
    spelled = spelled_rows(trainer, script)
    active = [bool(a) for a in out["tool_mask"].amax(dim=1).tolist()]
    return spelled, active, out["completion_mask"].sum(dim=1).tolist()


def in_order(trainer, per_task: dict[str, list]) -> list:
    return [x for t in trainer.step_record.task_ids_trained for x in per_task[t]]


def test_scripted_lengths(tiny, tmp_path, monkeypatch):
    script = {"p0": "CWTF", "p1": "CWWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "S2", script)
    spelled, _, lengths = rows(trainer, generate(trainer), script)
    assert lengths == [LENGTH[c] for c in spelled]


# --- TRL: mask_truncated_completions=True ------------------------------------------------------------
def test_trl_mask_truncated_by_hand(tiny, tmp_path, monkeypatch):
    """TRL 1.16 `trl/trainer/grpo_trainer.py`, `_generate_and_score_completions`: with
    `mask_truncated_completions` a completion whose last token is not EOS/pad gets completion_mask 0 before
    `num_items_in_batch` is summed (out of the loss and the dapo normaliser), while its reward (0 here) stays
    in the group mean/std. Format-rejected completions are ordinary failures. No dynamic sampling: every group
    trains, an all-wrong group with advantage 0 and its tokens in the normaliser."""
    script = {"p0": "CWTF", "p1": "WWWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "TRL-MT", script)
    out = generate(trainer)
    # p0 rewards 1, 0, 0, 0: mean 0.25, std 0.5 → C 0.75 / 0.5001 = 1.49970, others -0.25 / 0.5001 = -0.49990.
    # p1 rewards 0, 0, 0, 0: std 0 → every advantage 0.
    want = in_order(trainer, {"p0": [1.4997000, -0.4999000, -0.4999000, -0.4999000], "p1": [0.0] * 4})
    assert out["advantages"].tolist() == pytest.approx(want, abs=1e-6)
    spelled, active, lengths = rows(trainer, out, script)
    assert active == [c != "T" for c in spelled]
    assert (
        out["num_items_in_batch"].item() == 6 + 6 + 5 + 4 * 6
    )  # C, W, F of p0 and all of p1; T's 24 left out
    assert trainer.step_record.groups["trained"] == 2 and trainer.step_record.groups["rejected"] == {}


def test_trl_none_reward_by_hand(tiny, tmp_path, monkeypatch):
    """TRL 1.16 `trl/trainer/grpo_trainer.py`: a reward function returning None gives NaN
    (`_calculate_rewards`); NaN rows are left out of the nan-aware group mean/std and their advantage is
    `nan_to_num`'d to 0, while completion_mask is untouched: their tokens stay in the loss mask and in
    `num_items_in_batch`. Here every unresolved rollout gets None. No dynamic sampling."""
    script = {"p0": "CWTF", "p1": "CTWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "TRL-NONE", script)
    out = generate(trainer)
    # p0 rewards 1, 0, NaN, NaN: mean 0.5, std 0.70711 → ±0.5 / 0.70721 = ±0.70701; T and F 0.
    # p1 rewards 1, NaN, 0, 0: mean 1/3, std 0.57735 → C 0.66667 / 0.57745 = 1.15450, W -0.33333 / 0.57745.
    p1 = [1.1545, 0.0, -0.5772500, -0.5772500]
    want = in_order(trainer, {"p0": [0.7070068, -0.7070068, 0.0, 0.0], "p1": p1})
    assert out["advantages"].tolist() == pytest.approx(want, abs=1e-4)
    assert want == pytest.approx(
        in_order(trainer, {"p0": advantages([1, 0, None, None]), "p1": advantages([1, None, 0, 0])}), abs=1e-4
    )
    _, active, _ = rows(trainer, out, script)
    assert all(active)  # advantage 0, but in the loss mask
    assert out["num_items_in_batch"].item() == (6 + 6 + 24 + 5) + (6 + 24 + 6 + 6)


def plain_trl(tiny, tmp_path, reward_fn, **config) -> GRPOTrainer:
    """TRL's own GRPOTrainer on the same scripted rollouts (make_trainer patched its generation)."""
    tok, model = tiny
    args = GRPOConfig(output_dir=str(tmp_path / "plain-trl"), **STEP_ARGS, **config)
    data = Dataset.from_dict({"prompt": [prompt_messages("")] * 2 * G})
    trainer = GRPOTrainer(model, [reward_fn], args=args, train_dataset=data, processing_class=tok)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def graded_by_text(none_for_unresolved: bool):
    """A TRL reward function: 1 for \\boxed{1}, 0 for \\boxed{2}; truncated or answer-less: 0 or None."""

    def reward(prompts, completions, completion_ids, **kwargs):
        out = []
        for text, ids in zip(completions, completion_ids, strict=True):
            text = text[0]["content"] if isinstance(text, list) else text
            unresolved = len(ids) == 24 or "boxed" not in text
            out.append((None if none_for_unresolved else 0.0) if unresolved else float("boxed{1}" in text))
        return out

    reward.__name__ = "graded_by_text"
    return reward


def grads(trainer, out) -> torch.Tensor:
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, out).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


@pytest.mark.parametrize(
    "arm, trl_config, none_for_unresolved",
    [("TRL-MT", {"mask_truncated_completions": True}, False), ("TRL-NONE", {}, True)],
)
def test_trl_arms_match_plain_trl(tiny, tmp_path, monkeypatch, arm, trl_config, none_for_unresolved):
    """The TRL arms reproduce TRL 1.16 itself: same advantages, loss rows, normaliser and gradient as
    GRPOTrainer(mask_truncated_completions=True), resp. a reward function returning None for unresolved."""
    script = {"p0": "CWTF", "p1": "CFTW"}
    ours = make_trainer(tiny, tmp_path, monkeypatch, arm, script)
    out = generate(ours)
    trl = plain_trl(tiny, tmp_path, graded_by_text(none_for_unresolved), **trl_config)
    order = ours.step_record.task_ids_trained
    ref = trl._generate_and_score_completions(
        [{"prompt": prompt_messages(f"problem {t}")} for t in order for _ in range(G)]
    )
    assert out["advantages"].tolist() == pytest.approx(ref["advantages"].tolist(), abs=1e-6)
    ref_mask = ref["completion_mask"] * ref.get("tool_mask", 1)
    assert out["tool_mask"].amax(dim=1).tolist() == ref_mask.amax(dim=1).tolist()
    assert out["num_items_in_batch"].item() == ref["num_items_in_batch"].item()
    assert torch.allclose(grads(ours, out), grads(trl, ref), atol=1e-6)


# --- DAPO: soft overlong punishment on top of S2 ---------------------------------------------------
def test_dapo_soft_reward_by_hand():
    """verl `verl/workers/reward_manager/dapo.py` (DAPORewardManager, overlong_buffer): expected_len =
    max_resp_len - buffer_len; reward += min(-(length - expected_len) / buffer_len * penalty_factor, 0), with
    `length` the response's attention-mask sum (EOS included); the score is verl
    `verl/utils/reward_score/math_dapo.py`'s 1 for correct, -1 otherwise. Default buffer here: a fifth of
    the cap (the DAPO recipe's 4096 of 20480)."""
    soft = PEER_ARMS["DAPO-SOFT"].policy
    # cap 20: buffer 4, expected_len 16.
    assert [soft.reward(W, n, 20) for n in (6, 16, 17, 18, 20)] == [-1.0, -1.0, -1.25, -1.5, -2.0]
    assert soft.reward(C, 18, 20) == 0.5 and soft.reward(T, 20, 20) == -2.0
    # The real run's cap 8192: buffer 1638, expected_len 6554; 7373 tokens are 819/1638 = half into it.
    assert soft.buffer_len(8192) == 1638 and soft.reward(C, 7373, 8192) == pytest.approx(0.5)
    tuned = resolve_arm(
        "D", {"D": {"policy_id": "dapo-soft-overlong-v1", "groups_per_step": 2,
                    "policy_params": {"overlong_buffer_len": 20, "overlong_penalty_factor": 0.5}}}
    ).policy  # fmt: skip
    # cap 24, buffer 20: expected_len 4; -0.5 × (length - 4) / 20.
    assert [tuned.reward(o, n, 24) for o, n in ((C, 6), (W, 6), (F, 5), (T, 24))] == pytest.approx(
        [0.95, -1.05, -1.025, -1.5]
    )


def test_dapo_soft_in_the_trainer_by_hand(tiny, tmp_path, monkeypatch):
    """DAPO-SOFT = S2 (unresolved trained as failures, gate v1) with verl's DAPO reward: 1 / -1 plus the
    soft overlong punishment (verl `verl/workers/reward_manager/dapo.py`). Cap 24, default buffer 4: only the
    truncated rollout (24 tokens) is inside the buffer, penalty -(24 - 20) / 4 = -1."""
    script = {"p0": "CWTW", "p1": "CWWF"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "DAPO-SOFT", script)
    out = generate(trainer)
    # p0 rewards 1, -1, -2, -1: mean -0.75, std 1.25831 → 1.75/1.25841, -0.25/1.25841, -1.25/1.25841.
    # p1 rewards 1, -1, -1, -1: mean -0.5, std 1 → 1.5 / 1.0001, -0.5 / 1.0001.
    p0 = [1.3906485, -0.1986641, -0.9933203, -0.1986641]
    want = in_order(trainer, {"p0": p0, "p1": [1.4998500, -0.4999500, -0.4999500, -0.4999500]})
    assert out["advantages"].tolist() == pytest.approx(want, abs=1e-6)
    assert p0 == pytest.approx(advantages([1, -1, -2, -1]), abs=1e-6)
    _, active, lengths = rows(trainer, out, script)
    assert all(active) and out["num_items_in_batch"].item() == sum(lengths) == 6 + 6 + 24 + 6 + 6 + 6 + 6 + 5
    # Without the penalty the truncated rollout would weigh like the wrong ones (S2: -0.5 each).
    assert trainer.step_record.groups == {
        "sampled": 2, "qualified": 2, "trained": 2, "rounds": 1, "bound_hit": False, "rejected": {},
    }  # fmt: skip


def test_dapo_soft_parameters_from_the_recipe(tiny, tmp_path, monkeypatch):
    """Both DAPO parameters (`overlong_buffer.len`, `overlong_buffer.penalty_factor` in verl's recipe) come
    from the arm: buffer 20 and factor 0.5 at cap 24 put every rollout inside the buffer (expected_len 4)."""
    arms = {"DAPO-SOFT-20": {"policy_id": "dapo-soft-overlong-v1", "groups_per_step": 2,
                             "policy_params": {"overlong_buffer_len": 20, "overlong_penalty_factor": 0.5}}}  # fmt: skip
    script = {"p0": "CWTF", "p1": "CWWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "DAPO-SOFT-20", script, arms=arms)
    out = generate(trainer)
    # rewards: C 1 - 0.5·2/20 = 0.95, W -1.05, T -1 - 0.5·20/20 = -1.5, F -1 - 0.5·1/20 = -1.025.
    # p0: mean -0.65625, std 1.09285 → 1.60625/1.09295 = 1.46965, -0.39375/…, -0.84375/…, -0.36875/….
    # p1 (0.95, -1.05 ×3): the same spread as 1/-1, mean -0.55, std 1 → 1.49985, -0.49995.
    p0 = [1.4696453, -0.3602632, -0.7719926, -0.3373894]
    want = in_order(trainer, {"p0": p0, "p1": [1.4998500, -0.4999500, -0.4999500, -0.4999500]})
    assert out["advantages"].tolist() == pytest.approx(want, abs=1e-6)
    assert p0 == pytest.approx(advantages([0.95, -1.05, -1.5, -1.025]), abs=1e-6)


def test_dapo_soft_equals_s2_when_nothing_nears_the_cap(tiny, tmp_path, monkeypatch):
    """Group-normalised advantages do not see DAPO's 1/-1 instead of 1/0 (up to TRL's 1e-4 in the std), so
    with no rollout inside the buffer DAPO-SOFT trains like S2: same loss rows, normaliser, gradient."""
    script = {"p0": "CWFW", "p1": "WCWW"}
    s2 = make_trainer(tiny, tmp_path, monkeypatch, "S2", script)
    o2 = generate(s2)
    soft = make_trainer(tiny, tmp_path, monkeypatch, "DAPO-SOFT", script)
    o4 = generate(soft)
    assert o4["advantages"].tolist() == pytest.approx(o2["advantages"].tolist(), abs=1e-3)
    assert (
        torch.equal(o4["tool_mask"], o2["tool_mask"]) and o4["num_items_in_batch"] == o2["num_items_in_batch"]
    )
    assert torch.allclose(grads(soft, o4), grads(s2, o2), rtol=1e-3, atol=1e-7)


def test_buffer_longer_than_the_cap_is_refused(tiny, tmp_path, monkeypatch):
    arms = {"D": {"policy_id": "dapo-soft-overlong-v1", "groups_per_step": 2, "policy_params": {"overlong_buffer_len": 25}}}  # fmt: skip
    with pytest.raises(ValueError, match="overlong_buffer_len 25 > cap 24"):
        make_trainer(tiny, tmp_path, monkeypatch, "D", {"p0": "CWWW", "p1": "CWWW"}, arms=arms)
    with pytest.raises(ValueError, match=r"unknown policy_params \['buffer'\]"):
        resolve_arm("D", {"D": {"policy_id": "dapo-soft-overlong-v1", "groups_per_step": 2, "policy_params": {"buffer": 4}}})  # fmt: skip


# --- DAPO: overlong filtering + dynamic sampling ---------------------------------------------------
def test_filter_groups_is_gate_v2():
    """verl `recipe/dapo/dapo_ray_trainer.py` (filter_groups, metric `acc`): a group is kept iff
    np.std of its rollouts' acc > 0; acc is math_dapo's `correct`. On our outcomes acc = (outcome is correct),
    so over every group of 2–4 graded rollouts the rule is exactly gate v2."""
    for g in (2, 3, 4):
        for outcomes in itertools.product((C, W, T, F), repeat=g):
            accs = [float(o is C) for o in outcomes]
            mean = sum(accs) / g
            assert GATES["v2"](outcomes) is (sum((a - mean) ** 2 for a in accs) > 0), outcomes


def test_dapo_filter_by_hand(tiny, tmp_path, monkeypatch):
    """DAPO overlong filtering (arXiv 2503.14476 §3.4: the loss of truncated samples is masked; SkyRL
    `skyrl-train/skyrl_train/generators/utils.py` apply_overlong_filtering zeroes their loss mask, reward
    kept) + dynamic sampling (filter_groups on acc = gate v2), rewards verl math_dapo's 1 / -1. Format-
    rejected rollouts are ordinary failures (DAPO has no such outcome)."""
    script = {"p0": "CTTT", "p1": "CFWW", "p2": "WWWW", "p3": "CCCC"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "DAPO-FILTER", script, problems_per_round=4)
    out = generate(trainer)
    rec = trainer.step_record
    assert sorted(rec.task_ids_trained) == ["p0", "p1"]  # correct + truncated qualifies: acc spread 1, 0
    assert rec.groups["rejected"] == {"all_correct": 1, "no_correct": 1} and rec.groups["rounds"] == 1
    # Both groups: rewards 1, -1, -1, -1 (the masked truncated ones stay in the baseline) → 1.49985, -0.49995.
    want = in_order(trainer, {t: [1.4998500, -0.4999500, -0.4999500, -0.4999500] for t in ("p0", "p1")})
    assert out["advantages"].tolist() == pytest.approx(want, abs=1e-6)
    spelled, active, _ = rows(trainer, out, script)
    assert active == [c != "T" for c in spelled]
    assert out["num_items_in_batch"].item() == 6 + (6 + 5 + 6 + 6)  # C of p0, all of p1


# --- stop-properly penalty (S2-PEN): truncated rollouts get their own fixed reward -------------------
def test_stop_properly_reward_by_hand():
    """OpenRLHF's stop_properly_penalty_coef and NeMo RL's ProRLv2 "stop properly" penalty give a rollout that
    hit the cap a fixed reward below a wrong answer's; here c = -0.5 by default, from the recipe's `arms:`."""
    pen = PEER_ARMS["S2-PEN"].policy
    assert (pen.truncated, pen.format_rejected, pen.gate) == (TRAINED, TRAINED, "v1")
    assert [pen.reward(o, n, 24) for o, n in ((C, 6), (W, 6), (F, 5), (T, 24))] == [1.0, 0.0, 0.0, -0.5]
    tuned = resolve_arm(
        "P", {"P": {"policy_id": "stop-properly-penalty-v1", "groups_per_step": 2,
                    "policy_params": {"truncation_reward": -0.25}}}
    ).policy  # fmt: skip
    assert tuned.reward(T, 24, 24) == -0.25 and tuned.reward(W, 6, 24) == 0.0
    for bad in ({"truncation_reward": 0.0}, {"truncation_reward": -1.0, "failure_reward": -1.0},
                {"truncated": {"loss": False, "normaliser": False, "baseline": True}}):  # fmt: skip
        arm = resolve_arm("P", {"P": {"policy_id": "stop-properly-penalty-v1", "groups_per_step": 2,
                                      "policy_params": bad}})  # fmt: skip
        with pytest.raises(ValueError, match="truncation_reward must be < 0"):
            _ = arm.policy


def test_stop_properly_in_the_trainer_by_hand(tiny, tmp_path, monkeypatch):
    """S2-PEN = S2 (unresolved in the loss, gate v1) with truncated rollouts rewarded -0.5 instead of 0: every
    token stays in the loss and the normaliser; gate v1 still counts only completed wrongs as failures."""
    script = {"p0": "CWTF", "p1": "CWTT", "p2": "CTTT"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "S2-PEN", script, problems_per_round=3)
    out = generate(trainer)
    rec = trainer.step_record
    assert sorted(rec.task_ids_trained) == ["p0", "p1"]  # p2 has no completed wrong: gate v1 refuses it
    assert sum(rec.groups["rejected"].values()) == 1
    # p0 rewards 1, 0, -0.5, 0: mean 0.125, std 0.629153 → 0.875/0.629253, -0.125/…, -0.625/….
    # p1 rewards 1, 0, -0.5, -0.5: mean 0, std 0.707107 → 1/0.707207, 0, -0.5/0.707207.
    p0, p1 = [1.3905380, -0.1986483, -0.9932414, -0.1986483], [1.4140136, 0.0, -0.7070068, -0.7070068]
    assert p0 == pytest.approx(advantages([1, 0, -0.5, 0]), abs=1e-6)
    assert p1 == pytest.approx(advantages([1, 0, -0.5, -0.5]), abs=1e-6)
    assert out["advantages"].tolist() == pytest.approx(in_order(trainer, {"p0": p0, "p1": p1}), abs=1e-6)
    _, active, lengths = rows(trainer, out, script)
    assert (
        all(active) and out["num_items_in_batch"].item() == sum(lengths) == 6 + 6 + 24 + 5 + 6 + 6 + 24 + 24
    )


def test_a_normaliser_apart_from_the_loss(tiny, tmp_path, monkeypatch):
    """The table can keep masked tokens in the dapo normaliser (loss=False, normaliser=True): they dilute
    the step's loss without moving it. Other loss types normalise by the loss mask itself, so it is refused."""
    counted = {"truncated": {"loss": False, "normaliser": True, "baseline": True}}
    arms = {"K": {"policy_id": "trl-mask-truncated", "groups_per_step": 2, "policy_params": counted}}
    script = {"p0": "CWTF", "p1": "WWWW"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "K", script, arms=arms)
    out = generate(trainer)
    spelled, active, _ = rows(trainer, out, script)
    assert active == [c != "T" for c in spelled]
    assert out["num_items_in_batch"].item() == 6 + 6 + 24 + 5 + 4 * 6
    with pytest.raises(ValueError, match="needs loss_type dapo"):
        make_trainer(tiny, tmp_path, monkeypatch, "K", script, arms=arms, loss_type="grpo")
    with pytest.raises(ValueError, match="must count in the normaliser"):
        CapPolicy("x", Treatment(loss=True, normaliser=False, baseline=True), TRAINED, "v1")


def test_peer_policy_rows():
    """The table's rows, as docs/training.md states them."""
    policy = {name: arm.policy for name, arm in PEER_ARMS.items()}
    assert (policy["TRL-MT"].truncated, policy["TRL-MT"].format_rejected, policy["TRL-MT"].gate) == (
        MASKED, TRAINED, "all"
    )  # fmt: skip
    assert not policy["TRL-NONE"].truncated.baseline and policy["TRL-NONE"].format_rejected.loss
    assert math.isnan(policy["TRL-NONE"].reward(F, 5, 24)) and policy["TRL-NONE"].reward(W, 5, 24) == 0.0
    assert policy["DAPO-SOFT"].gate == "v1" and policy["DAPO-SOFT"].overlong_penalty_factor == 1.0
    assert policy["DAPO-FILTER"].gate == "v2" and policy["DAPO-FILTER"].reward(T, 24, 24) == -1.0
    assert policy["S2-PEN"].gate == "v1" and policy["S2-PEN"].reward(T, 24, 24) == -0.5


# --- cards: each peer arm's card says what it does and where the rule comes from -------------------
@pytest.mark.parametrize("arm", sorted(PEER_ARMS))
def test_cards_name_the_peer_rule(tmp_path, arm):
    from huggingface_hub import ModelCard
    from test_cards import make_run

    from cards.checkpoint_card import write_checkpoint_card
    from cards.run_card import write_run_card

    run = make_run(tmp_path, "S2")
    meta = json.loads((run / "run.json").read_text())
    policy = PEER_ARMS[arm].policy
    meta.update(arm=arm, policy_id=policy.id, gate=policy.gate)
    (run / "run.json").write_text(json.dumps(meta))
    run_card = ModelCard.load(write_run_card(run)).text
    checkpoint = ModelCard.load(write_checkpoint_card(run, 4)).text
    for text in (run_card, checkpoint):
        assert policy.source in text and f"cap policy `{policy.id}`" in text
    assert f"Where the policy comes from: {policy.source}." in run_card
    expected = {
        "TRL-MT": "Format-rejected rollouts are active (reward 0) in the loss instead of masked.",
        "TRL-NONE": "Unresolved rollouts (truncated or format-rejected) are given no reward (NaN): out of the "
        "group baseline, advantage 0, tokens kept in the loss normaliser, instead of masked",
        "DAPO-SOFT": "plus DAPO's soft overlong punishment: −1 × (length − (cap − B)) / B over the last B tokens "
        "before the cap (B = a fifth of the cap)",
        "DAPO-FILTER": "Reward: 1 for correct, -1 for any other gradeable outcome.",
        "S2-PEN": "Truncated rollouts are active (reward -0.5) in the loss instead of masked.",
    }[arm]
    assert expected in run_card


def test_card_reports_the_recipes_policy_params(tmp_path):
    from huggingface_hub import ModelCard
    from test_cards import make_run

    from cards.run_card import write_run_card

    run = make_run(tmp_path, "S2")
    meta = json.loads((run / "run.json").read_text())
    spec = {"policy_id": "dapo-soft-overlong-v1", "groups_per_step": 4,
            "policy_params": {"overlong_buffer_len": 64, "overlong_penalty_factor": 0.5}}  # fmt: skip
    meta.update(arm="D64", policy_id=spec["policy_id"], gate="v1")
    meta["config"]["arms"] = json.dumps({"D64": spec})  # as run.json's resolved config records a --arms JSON
    (run / "run.json").write_text(json.dumps(meta))
    assert "−0.5 × (length − (cap − B)) / B over the last B tokens before the cap (B = 64)" in (
        ModelCard.load(write_run_card(run)).text
    )

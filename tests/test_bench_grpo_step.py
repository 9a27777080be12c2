"""The step benchmark's own logic (bench/grpo_step.py): the coin's rollouts and the 1-vs-2-GPU comparison.
The benchmark itself runs on GPUs; what decides whether its comparison can be trusted is tested here."""

import importlib.util
import json

import pytest
import torch

from bench import grpo_step
from bench.coin import CoinGrader
from bench.report import compare
from bench.runs import engine_for, training_settings

G, CAP, VOCAB = 4, 64, 300
NEVER = [2, 0, 1, 3]  # EOS first: it ends a rollout; the others never appear


def coin():
    return CoinGrader(0.3, 0.1, seed=5, group_size=G, step_fn=lambda: 1)


def prompts(n: int) -> list[list[int]]:
    return [[10 + i, 11 + i, 12] for i in range(n) for _ in range(G)]  # G rows per prompt, in order


def test_coin_rollouts_do_not_depend_on_how_rows_are_split():
    rows = prompts(6)
    whole = coin().rollouts(rows, step=3, cap=CAP, p_ended=0.5, vocab=VOCAB, never=NEVER)
    halves = [coin().rollouts(part, 3, CAP, 0.5, VOCAB, NEVER) for part in (rows[:12], rows[12:])]
    assert whole == halves[0] + halves[1]  # what two processes with half of the groups each produce
    assert whole != coin().rollouts(rows, step=4, cap=CAP, p_ended=0.5, vocab=VOCAB, never=NEVER)
    assert len({tuple(r) for r in whole[:G]}) == G  # rollouts of one prompt differ


def test_coin_rollouts_shape():
    rows = prompts(100)
    out = coin().rollouts(rows, step=1, cap=CAP, p_ended=0.4, vocab=VOCAB, never=NEVER)
    ended = [r for r in out if r[-1] == NEVER[0]]
    for r in out:
        assert 1 <= len(r) <= CAP and not set(r[:-1]) & set(NEVER) and 0 <= min(r) and max(r) < VOCAB
        assert r[-1] == NEVER[0] or (len(r) == CAP and r[-1] not in NEVER)
    assert 0.3 < len(ended) / len(out) < 0.5  # p_ended 0.4 of 400 rollouts
    assert min(len(r) for r in ended) < CAP / 4 and max(len(r) for r in ended) > 3 * CAP / 4


def test_coin_grades_truncation_then_the_coin():
    c = coin()
    grades = c.grade_batch(["x"] * 8, ["t1"] * 4 + ["t2"] * 4, [True] + [False] * 7)
    assert grades[0].outcome.value == "truncated"
    again = coin().grade_batch(["y"] * 8, ["t1"] * 4 + ["t2"] * 4, [False] * 8)
    assert [g.outcome for g in grades[1:]] == [g.outcome for g in again[1:]]  # text never matters
    assert len(c.pop_groups()) == 2 and c.pop_groups() == []


def test_coin_grades_capped_rollouts_at_p_ended_zero():
    """--p-ended 0 caps every rollout: the coin then grades them all, so groups still qualify."""
    capped = [True] * 8
    plain = coin().grade_batch(["x"] * 8, ["t1"] * 4 + ["t2"] * 4, capped)
    graded = CoinGrader(0.3, 0.1, 5, G, lambda: 1, grade_capped=True)
    outcomes = [g.outcome for g in graded.grade_batch(["x"] * 8, ["t1"] * 4 + ["t2"] * 4, capped)]
    assert {g.outcome.value for g in plain} == {"truncated"}
    assert outcomes == [
        g.outcome for g in coin().grade_batch(["x"] * 8, ["t1"] * 4 + ["t2"] * 4, [False] * 8)
    ]


def test_plain_tuned_trains_at_ours_settings():
    a = grpo_step.parse(["--batch", "4", "--ours-grad-ckpt", "true"])
    runs = {"ours": {"settings": {"micro_batch": 16, "grad_ckpt": False}}}
    assert training_settings(a, "plain", runs, on_cuda=True) == (4, True)
    assert training_settings(a, "plain-tuned", runs, on_cuda=True) == (16, False)
    assert training_settings(a, "ours", runs, on_cuda=True) == (None, True)  # None: ours sizes it
    assert training_settings(a, "ours", runs, on_cuda=False) == (None, False)


def test_every_arm_is_accepted():
    assert grpo_step.parse(["--arm", "DAPO-SOFT"]).arm == "DAPO-SOFT"
    with pytest.raises(SystemExit):
        grpo_step.parse(["--arm", "S9"])


def record(step, qualified, loss, grad_norm):
    return {
        "step": step,
        "sampled": 16,
        "qualified": qualified,
        "trained": qualified,
        "loss": loss,
        "grad_norm": grad_norm,
    }


def result(*steps):
    return {"runs": {"ours": {"steps": list(steps)}}}


def test_compare_counts_exact_floats_within_tolerance(tmp_path):
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(result(record(1, 10, 0.128, 3.203), record(2, 13, 0.196, 2.609))))
    close = compare(result(record(1, 10, 0.128, 3.206), record(2, 13, 0.196, 2.610)), ref, rtol=0.02)
    assert not [x for x in close if x.startswith("DIFFERS")] and len(close) == 4  # loss + grad norm per step
    far = compare(result(record(1, 11, 0.128, 3.9), record(3, 13, 0.2, 2.6)), ref, rtol=0.02)
    assert any("step 1 qualified: 11 here, 10" in x for x in far)
    assert any(x.startswith("DIFFERS ours step 1 grad_norm") for x in far)
    assert any(x.startswith("DIFFERS ours step 3: not in") for x in far)


@pytest.mark.slow
def test_benchmark_runs_and_matches_itself(tmp_path):
    """A tiny CPU run of ours and plain TRL; the same command again compares equal to the first."""
    tiny = "--hidden 64 --layers 4 --intermediate 128 --vocab 600 --groups 2 --G 4 --cap 16 --steps 1"
    tiny += " --eval-problems 3"
    first = grpo_step.main([*tiny.split(), "--coin-rollouts", "--out", str(tmp_path / "a")])
    assert set(first["runs"]) == {"ours", "plain"} and first["ratio_ours_over_plain"]["total"] > 0
    ours, plain = first["runs"]["ours"]["steps"][0], first["runs"]["plain"]["steps"][0]
    assert ours["sampled"] == plain["sampled"] == 2 and ours["qualified"] == plain["qualified"]
    against = ["--compare-with", str(tmp_path / "a" / "grpo_step.json"), "--rtol", "0"]
    try:  # --deterministic (a no-op on a CPU, whose kernels already are): equal to the bit, weights included
        second = grpo_step.main([*tiny.split(), "--coin-rollouts", "--deterministic", *against])
    finally:
        torch.use_deterministic_algorithms(False)
    assert second["comparison"]["verdict"] == "MATCH"
    assert second["runs"]["ours"]["weights_sha256"] == first["runs"]["ours"]["weights_sha256"]
    assert any(x.startswith("equal ours weights sha256") for x in second["comparison"]["lines"])
    evals = [run["runs"]["ours"]["steps"][0]["eval_sha256"] for run in (first, second)]
    assert evals[0] is not None and evals[0] == evals[1]


@pytest.mark.slow
def test_benchmark_runs_plain_tuned_at_p_ended_zero_for_a_peer_arm(tmp_path):
    tiny = "--hidden 64 --layers 4 --intermediate 128 --vocab 600 --groups 2 --G 4 --cap 16 --steps 1"
    out = grpo_step.main(
        [*tiny.split(), "--p-ended", "0", "--arm", "DAPO-SOFT", "--no-plain", "--plain-tuned"]
    )
    ours, tuned = out["runs"]["ours"], out["runs"]["plain-tuned"]
    assert (
        tuned["settings"]["micro_batch"] == ours["settings"]["micro_batch"]
        and "ratio_ours_over_plain_tuned" in out
    )
    assert ours["steps"][0]["trained"] == ours["steps"][0]["qualified"] > 0  # capped rollouts still train


TINY = "--hidden 64 --layers 4 --intermediate 128 --vocab 600 --groups 2 --G 4 --cap 16 --steps 1"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the run without vLLM")
def test_without_vllm_the_vllm_runs_are_skipped_with_one_line(tmp_path, capsys):
    out = grpo_step.main([*TINY.split(), "--p-ended", "0", "--vllm", "--out", str(tmp_path)])
    assert set(out["runs"]) == {"ours", "plain"}
    assert out["skipped"] == {"ours-vllm": "vLLM is not installed", "plain-vllm": "vLLM is not installed"}
    printed = capsys.readouterr().out
    assert "vLLM is not installed here: ours-vllm, plain-vllm skipped (tools/vllm_bundle.py)" in printed
    assert "plain-vllm: skipped (vLLM is not installed)" in (tmp_path / "grpo_step.md").read_text()
    step = out["runs"]["ours"]["steps"][0]
    assert step["sampler_agreement"] is None  # no vLLM
    assert (step["device_gib"] is None) == (not torch.cuda.is_available())


def test_a_vllm_run_gets_its_own_process_with_ours_settings(tmp_path):
    argv = [*TINY.split(), "--vllm", "--out", "x", "--compare-with", "y.json", "--plain-tuned"]
    runs = {"ours": {"settings": {"micro_batch": 8, "grad_ckpt": False}}}
    cmd = grpo_step.child_command(argv, "plain-vllm", runs, tmp_path / "r")
    assert cmd[1:3] == ["-m", "bench.grpo_step"] and "x" not in cmd and "y.json" not in cmd
    assert cmd[3:] == [*TINY.split(), "--vllm", "--plain-tuned", "--only", "plain-vllm", "--out"] + [
        str(tmp_path / "r"),
        "--settings-of-ours",
        "8,False",
    ]
    a = grpo_step.parse(cmd[3:])
    assert training_settings(a, "plain-vllm", {}, on_cuda=True) == (8, False)
    a.settings_of_ours = None  # ours did not run: plain TRL's own settings, ours' own sizing
    assert training_settings(a, "plain-vllm", {}, on_cuda=True) == (a.batch, True)
    assert training_settings(a, "ours-vllm", {}, on_cuda=True) == (None, None)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the run without vLLM")
def test_a_vllm_runs_process_trains_at_ours_settings_and_says_what_generated(tmp_path):
    argv = [*TINY.split(), "--p-ended", "0", "--only", "ours-vllm-stale", "--settings-of-ours", "4,False"]
    with pytest.warns(UserWarning, match="vLLM is not installed"):
        run = grpo_step.main([*argv, "--out", str(tmp_path)])["runs"]["ours-vllm-stale"]
    assert run["settings"]["micro_batch"] == 4 and run["settings"]["micro_batch_basis"] == "explicit"
    # the config fell back: no vLLM to generate with (ours compiled on one GPU)
    assert run["settings"]["generation"] == ("compiled" if torch.cuda.is_available() else "trl")


def test_engine_for_saves_a_model_without_a_directory_and_points_trl_at_it(tmp_path, monkeypatch):
    """A random model has name_or_path "" (and Path("") is ".", a directory): it must be saved, and the model's
    own name_or_path (what TRL's colocated engine loads) must name the saved copy. The H200 run found the
    engine given ''."""
    from trl.generation import vllm_generation

    from tests.scripted import tiny_random_model

    monkeypatch.setattr(vllm_generation, "LLM", lambda **kw: kw, raising=False)  # vLLM is absent here
    tok, model = tiny_random_model()
    model.name_or_path = model.config._name_or_path = ""
    engine_for(model, tok, tmp_path / "engine")
    assert model.name_or_path == str(tmp_path / "engine") == model.config.name_or_path
    assert (tmp_path / "engine/config.json").is_file() and (
        tmp_path / "engine/tokenizer_config.json"
    ).is_file()
    saved = (tmp_path / "engine/config.json").stat().st_mtime_ns
    engine_for(model, tok, tmp_path / "other")  # a model that has its directory is not saved again
    assert not (tmp_path / "other").exists() and (tmp_path / "engine/config.json").stat().st_mtime_ns == saved
    assert vllm_generation.LLM(model="m") == {  # Qwen3.5's two engine arguments TRL does not pass
        "model": "m", "additional_config": {"gdn_prefill_backend": "triton"}, "language_model_only": True,
    }  # fmt: skip

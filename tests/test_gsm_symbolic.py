"""GSM-Symbolic snapshots (data/gsm_symbolic.py) with whole templates held out, the held-out pool of
data/eval_sets.py, and grader v1 on model-style completions of numeric references. reasoning-gym is an optional
extra: the entries here are built by hand in its shape (question, metadata.answer_value, answer_cot)."""

from pathlib import Path

import pytest

from data import gsm_symbolic
from data.eval_sets import choose_eval_sets, heldout_pool_of
from data.gsm_symbolic import HELDOUT, MATH500, TRAIN, build, heldout_templates, tasks_of
from data.snapshot import SnapshotError, load_snapshot, read_math_jsonl, write_snapshot
from rewards.grader import grade
from rewards.outcome import Outcome

MATH500_JSONL = Path("/work/shared/data/math500.jsonl")


def _entry(question: str, value) -> dict:
    return {
        "question": question,
        "answer": str(value),
        "metadata": {"answer_value": value, "answer_cot": "c"},
    }


def _entries(n: int, templates: int) -> list[tuple[int, dict]]:
    return [(i % templates, _entry(f"Problem {i} of template {i % templates}?", i * 3)) for i in range(n)]


def test_whole_templates_are_marked_held_out_and_repeats_dropped():
    entries = _entries(40, 8)
    entries.insert(5, entries[2])  # reasoning-gym can generate the same problem twice
    held = frozenset({1, 6})
    tasks = tasks_of(entries, held, seed=3)
    assert len(tasks) == 40 and len({t["id"] for t in tasks}) == 40
    for task in tasks:
        template = int(task["source_id"].rsplit("template", 1)[1])
        assert task["subject"] == (HELDOUT if template in held else TRAIN)
        assert task["problem"].endswith(f"template {template}?")


def test_answers_are_numbers_a_whole_float_written_as_an_integer():
    tasks = tasks_of(
        [(0, _entry("a", 14.0)), (0, _entry("b", 9281.25)), (1, _entry("c", -5))], frozenset(), 0
    )
    assert [t["answer"] for t in tasks] == ["14", "9281.25", "-5"]
    with pytest.raises(
        SnapshotError, match=r"gsm_symbolic seed 0 index 0: answer_value must be a finite number"
    ):
        tasks_of([(0, _entry("a", "12"))], frozenset(), 0)
    with pytest.raises(SnapshotError, match="finite"):
        tasks_of([(0, _entry("a", float("nan")))], frozenset(), 0)


def test_the_held_out_templates_depend_on_the_seed_not_on_order():
    a = heldout_templates(range(85), 12, seed=0)
    assert len(a) == 12 and a == heldout_templates(reversed(range(85)), 12, seed=0)
    assert a != heldout_templates(range(85), 12, seed=1)
    with pytest.raises(SnapshotError, match="between 1 and 84, got 85"):
        heldout_templates(range(85), 85, seed=0)


def test_heldout300_comes_from_the_pool_and_no_pool_task_is_ever_trained_on():
    ids = [f"gsm-{i:012x}" for i in range(200)]
    pool = ids[::5]  # 40 tasks of held-out templates
    sets = choose_eval_sets(ids, seed=0, heldout_size=30, fixed_size=8, heldout_pool=pool)
    assert len(sets.heldout) == 30 and set(sets.heldout) <= set(pool)
    assert not set(sets.train_pool) & set(pool)  # the 10 pool tasks left out of heldout300 are not trained on
    assert len(sets.train_pool) == 160 and set(sets.fixed) <= set(sets.train_pool) and len(sets.fixed) == 8
    again = choose_eval_sets(ids[::-1], seed=0, heldout_size=30, fixed_size=8, heldout_pool=pool[::-1])
    assert (again.heldout, again.fixed) == (sets.heldout, sets.fixed)  # the ids' order does not matter
    with pytest.raises(ValueError, match="held-out pool has 40 tasks, fewer than heldout300 of 41"):
        choose_eval_sets(ids, seed=0, heldout_size=41, heldout_pool=pool)
    with pytest.raises(ValueError, match="ids not in the snapshot, e.g. 'x'"):
        choose_eval_sets(ids, seed=0, heldout_size=1, heldout_pool=["x"])


def test_the_snapshot_marks_its_pool_by_subject(tmp_path):
    tasks = tasks_of(_entries(30, 6), frozenset({2}), seed=0)
    path = tmp_path / "g.tasks.json"
    write_snapshot(tasks, path)
    loaded = list(load_snapshot(path))
    assert (
        set(heldout_pool_of(loaded, HELDOUT)) == {t["id"] for t in tasks if t["subject"] == HELDOUT} != set()
    )
    assert heldout_pool_of(loaded, "") is None
    with pytest.raises(
        ValueError, match="heldout_subject 'math500/': no task of the snapshot has that subject"
    ):
        heldout_pool_of(loaded, MATH500)


@pytest.mark.skipif(not MATH500_JSONL.is_file(), reason="the shared MATH500 file is on the dev machine")
def test_math500_replaces_the_held_out_templates_and_keeps_the_training_pool(monkeypatch):
    entries = _entries(60, 10)
    monkeypatch.setattr(gsm_symbolic, "generate", lambda size, seed: (entries[:size], list(range(10))))
    by_templates = build(60, 0, 2)
    by_math = build(60, 0, 2, heldout="math500", math500=str(MATH500_JSONL))
    train = [t for t in by_templates if t["subject"] == TRAIN]
    assert [t for t in by_math if t["subject"] == TRAIN] == train and len(train) == 48
    math = [t for t in by_math if t["subject"].startswith(MATH500)]
    assert len(math) == 500 and {t["id"] for t in math} == {t["id"] for t in read_math_jsonl(MATH500_JSONL)}
    assert not any(t["subject"] == HELDOUT for t in by_math)
    with pytest.raises(SnapshotError, match="--heldout math500: give --math500 PATH"):
        build(60, 0, 2, heldout="math500")


@pytest.mark.parametrize(
    "completion, reference, outcome",
    [
        ("12 days/month x 12 x 195 = 28080.\nThe answer is \\boxed{28080}", "28080", Outcome.CORRECT),
        ("So the total is \\boxed{28,080}.", "28080", Outcome.CORRECT),
        ("That leaves \\boxed{\\$78000}", "78000", Outcome.CORRECT),
        ("Interest: \\boxed{9281.25}", "9281.25", Outcome.CORRECT),
        ("Rounded: \\boxed{9281.3}", "9281.25", Outcome.WRONG),
        ("It is \\boxed{14.0} liters", "14", Outcome.CORRECT),
        ("First \\boxed{12}, then correcting: \\boxed{44}", "44", Outcome.CORRECT),
        ("The answer is 42.", "42", Outcome.FORMAT_REJECTED),
    ],
)
def test_grader_v1_on_model_style_completions(completion, reference, outcome):
    assert grade(completion, reference, truncated=False).outcome is outcome

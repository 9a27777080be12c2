"""bench/eval_backends.py: two backends' eval rows of one checkpoint, paired sample by sample."""

import pytest

from bench.eval_backends import compare


def rows(outcomes, seed=7, completion="x"):
    return [
        {
            "set": "s",
            "task_id": f"t{i}",
            "sample": 0,
            "seed": seed + i,
            "outcome": o,
            "completion": completion,
        }
        for i, o in enumerate(outcomes)
    ]


def test_shares_differences_and_the_paired_exact_p():
    a = rows(["correct"] * 8 + ["truncated"] * 2)
    b = rows(["truncated"] * 8 + ["truncated"] * 2, completion="y")
    got = compare(a, b)["s"]
    assert got["samples"] == 10 and got["identical_completions"] == 0
    assert got["correct"]["a"] == 0.8 and got["correct"]["b"] == 0.0
    assert got["correct"]["diff"] == pytest.approx(0.8)
    assert got["correct"]["p"] == pytest.approx(2 / 2**8)  # 8 discordant pairs all one way: McNemar's exact p
    assert got["wrong"]["p"] == 1.0 and compare(a, a)["s"]["identical_completions"] == 10


def test_rows_that_do_not_pair_are_refused():
    with pytest.raises(ValueError, match="has no partner with seed"):
        compare(rows(["correct"]), rows(["correct"], seed=8))
    with pytest.raises(ValueError, match="not the same samples once each"):
        compare(rows(["correct", "wrong"]), rows(["correct"]))

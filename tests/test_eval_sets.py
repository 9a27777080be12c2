import random

import pytest

from data.eval_sets import FIXED, HELDOUT, EvalSets, choose_eval_sets

IDS = [f"math-{i:012x}" for i in range(400)]


def test_sets_are_disjoint_sized_and_fixed_comes_from_the_pool():
    sets = choose_eval_sets(IDS, seed=7)
    assert len(sets.heldout) == 300 and len(sets.fixed) == 32
    assert sets.sizes == {FIXED: 32, HELDOUT: 300}
    assert not set(sets.heldout) & set(sets.train_pool)
    assert set(sets.fixed) <= set(sets.train_pool)
    assert set(sets.heldout) | set(sets.train_pool) == set(IDS)
    # The pool keeps snapshot order.
    assert list(sets.train_pool) == [i for i in IDS if i not in set(sets.heldout)]


def test_choice_depends_on_seed_not_on_input_order():
    shuffled = IDS[:]
    random.Random(0).shuffle(shuffled)
    a = choose_eval_sets(IDS, seed=1, heldout_size=50, fixed_size=8)
    b = choose_eval_sets(shuffled, seed=1, heldout_size=50, fixed_size=8)
    assert (a.heldout, a.fixed) == (b.heldout, b.fixed)
    assert set(a.train_pool) == set(b.train_pool)
    c = choose_eval_sets(IDS, seed=2, heldout_size=50, fixed_size=8)
    assert c.heldout != a.heldout


def test_small_snapshot_with_small_sets_keeps_the_user_names():
    sets = choose_eval_sets(IDS[:20], seed=0, heldout_size=5, fixed_size=4)
    assert set(sets.to_json()) == {"fixed32", "heldout300"}
    assert len(sets.to_json()["heldout300"]) == 5 and len(sets.to_json()["fixed32"]) == 4
    assert len(sets.train_pool) == 15


def test_too_small_snapshot_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"has 100 tasks.*need at least 332"):
        choose_eval_sets(IDS[:100], seed=0)
    with pytest.raises(ValueError, match="more than once"):
        choose_eval_sets(IDS[:10] + IDS[:1], seed=0, heldout_size=2, fixed_size=2)


def test_json_round_trip_and_validation_against_the_snapshot():
    sets = choose_eval_sets(IDS, seed=3, heldout_size=40, fixed_size=10)
    assert EvalSets.from_json(sets.to_json(), IDS) == sets
    with pytest.raises(ValueError, match="not in the snapshot"):
        EvalSets.from_json(sets.to_json(), IDS[:200])
    overlapping = {FIXED: [sets.heldout[0]], HELDOUT: list(sets.heldout)}
    with pytest.raises(ValueError, match="share ids"):
        EvalSets.from_json(overlapping, IDS)
    with pytest.raises(ValueError, match="'heldout300' must be a list"):
        EvalSets.from_json({FIXED: []}, IDS)

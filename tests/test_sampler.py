import json
import random

import pytest

from data.sampler import TaskSampler

POOL = [f"t{i:03d}" for i in range(37)]


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_each_epoch_is_a_permutation_of_the_pool(seed):
    sampler = TaskSampler(POOL, seed)
    epochs = [sampler.take(len(POOL)) for _ in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == POOL  # every problem once: no repeats, all covered
    assert epochs[0] != epochs[1] != epochs[2]
    assert sampler.state_dict()["epoch"] == 3 and sampler.position == 0


@pytest.mark.parametrize("seed", [0, 5])
def test_uneven_takes_cross_epochs_without_repeats_within_one(seed):
    rng = random.Random(seed)
    sampler = TaskSampler(POOL, seed)
    stream = []
    while len(stream) < 4 * len(POOL):
        stream += sampler.take(rng.randint(0, 50))
    for e in range(4):
        assert sorted(stream[e * len(POOL) : (e + 1) * len(POOL)]) == POOL


def test_deterministic_across_instances_and_input_order():
    shuffled = POOL[:]
    random.Random(9).shuffle(shuffled)
    assert TaskSampler(POOL, 4).take(100) == TaskSampler(shuffled, 4).take(100)
    assert TaskSampler(POOL, 4).take(100) != TaskSampler(POOL, 5).take(100)


@pytest.mark.parametrize("cut", [0, 1, 36, 37, 38, 80])
def test_resume_continues_exactly_like_an_uninterrupted_sampler(cut):
    reference = TaskSampler(POOL, 11)
    expected = reference.take(cut + 60)

    first = TaskSampler(POOL, 11)
    head = first.take(cut)
    state = json.loads(json.dumps(first.state_dict()))  # it must survive a JSON file
    resumed = TaskSampler(list(reversed(POOL)), 11)
    resumed.load_state_dict(state)
    assert head + resumed.take(60) == expected
    assert resumed.state_dict() == reference.state_dict()


def test_resume_on_another_pool_or_seed_is_refused():
    state = TaskSampler(POOL, 1).state_dict()
    with pytest.raises(ValueError, match="different training pool"):
        TaskSampler(POOL[:-1], 1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed 1"):
        TaskSampler(POOL, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="'position'"):
        TaskSampler(POOL, 1).load_state_dict(state | {"position": len(POOL)})
    with pytest.raises(ValueError, match="'epoch'"):
        TaskSampler(POOL, 1).load_state_dict(state | {"epoch": -1})
    with pytest.raises(ValueError, match="missing field 'pool_sha256'"):
        TaskSampler(POOL, 1).load_state_dict({"seed": 1, "epoch": 0, "position": 0})


def test_bad_pools_are_refused():
    with pytest.raises(ValueError, match="empty"):
        TaskSampler([], 0)
    with pytest.raises(ValueError, match="'t001' appears more than once"):
        TaskSampler(POOL + ["t001"], 0)

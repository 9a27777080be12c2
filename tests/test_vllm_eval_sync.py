"""In-training vLLM evaluation (trainer/train.py `synced_engine`): the engine gets each step's weights once,
whether evaluation or the next step's rollouts ask first. `make test-vllm` runs it on a real engine."""

from types import SimpleNamespace

from trainer.train import synced_engine, vllm_evaluates


class Engine:
    def __init__(self):
        self.pushes, self.llm = 0, object()

    def sync_weights(self):
        self.pushes += 1


def trainer_at(step: int, loaded: int, engine: Engine):
    return SimpleNamespace(
        state=SimpleNamespace(global_step=step), _last_loaded_step=loaded, vllm_generation=engine
    )


def test_evaluation_pushes_a_steps_weights_once_and_marks_them_for_trl():
    engine = Engine()
    trainer = trainer_at(step=5, loaded=4, engine=engine)
    assert synced_engine(trainer) is engine.llm and engine.pushes == 1
    assert trainer._last_loaded_step == 5  # TRL's next rollout sees them loaded and does not push again
    synced_engine(trainer)
    assert engine.pushes == 1
    assert synced_engine(trainer_at(step=5, loaded=5, engine=engine)) is engine.llm and engine.pushes == 1


def test_only_one_colocated_process_evaluates_on_the_engine():
    args = dict(use_vllm=True, vllm_mode="colocate", world_size=1)
    assert vllm_evaluates(SimpleNamespace(**args))
    for change in ({"vllm_mode": "server"}, {"world_size": 2}, {"use_vllm": False}):
        assert not vllm_evaluates(SimpleNamespace(**args | change))

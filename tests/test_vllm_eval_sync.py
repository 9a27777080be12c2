"""In-training vLLM evaluation (`CapGRPOTrainer.synced_vllm_engine`): the engine gets each step's weights once,
whether evaluation or the next step's rollouts ask first. `make test-vllm` runs it on a real engine."""

from types import SimpleNamespace

from trainer.backends import decide_backends
from trainer.config import CapGRPOConfig
from trainer.evaluation import EvalSpec
from trainer.grpo import CapGRPOTrainer

synced_engine = CapGRPOTrainer.synced_vllm_engine  # called on a stand-in trainer


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


def test_only_one_colocated_process_evaluates_on_the_engine(tmp_path):
    args = CapGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, use_cpu=True, bf16=False, report_to="none", max_steps=1
    )
    args.use_vllm, args.vllm_mode = True, "colocate"  # vLLM is not installed here: set past __post_init__
    generation = decide_backends(args, world=1, cuda=True).eval_generation
    assert generation == "vllm" == EvalSpec.from_config(args, generation).generation
    for change, world in (({"vllm_mode": "server"}, 1), ({}, 2), ({"use_vllm": False}, 1)):
        for name, value in change.items():
            setattr(args, name, value)
        assert decide_backends(args, world=world, cuda=True).eval_generation != "vllm"
        args.use_vllm, args.vllm_mode = True, "colocate"

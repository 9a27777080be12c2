"""Scripted generation and text-keyed grading for trainer tests (pytest and the two-process probe).

TRL's `_generate_single_turn` is replaced by a script (problem pK always yields the rollouts spelled by
script[pK], e.g. "CWTX") and grading by a fake pool that reads the outcome off the text, so every number
a test checks can be computed by hand.
"""

from trl import GRPOTrainer

from data.sampler import TaskSampler
from embedded.build import BuildConfig, build_model, build_tokenizer
from rewards.grader import BatchReport, Grade
from rewards.outcome import GRADER_VERSION, Outcome
from trainer.config import CapGRPOConfig
from trainer.grpo import CapGRPOTrainer
from trainer.setup import decide

G = 4
CAP = 24
# One scripted step on CPU: the settings every scripted trainer (ours and plain TRL's) shares.
STEP_ARGS = dict(
    num_generations=G,
    per_device_train_batch_size=G * 2,
    max_completion_length=CAP,
    report_to="none",
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    beta=0.0,
    learning_rate=1e-3,
    max_steps=1,
    seed=0,
)
TEXT = {"C": " \\boxed{1}", "W": " \\boxed{2}", "F": " no answer", "X": " ??", "T": " 1+1+1+1+1+1"}


class TextGrader:
    """Stands in for the grader pool: the outcome is written in the completion text."""

    last_report = BatchReport()  # GraderPool's per-batch report: nothing fails here

    def grade_batch(self, completions, references, truncated):
        grades = []
        for text, trunc in zip(completions, truncated, strict=True):
            if trunc:
                o = Outcome.TRUNCATED
            elif "??" in text:
                o = Outcome.INDETERMINATE
            elif "boxed{1}" in text:
                o = Outcome.CORRECT
            elif "boxed{2}" in text:
                o = Outcome.WRONG
            else:
                o = Outcome.FORMAT_REJECTED
            grades.append(Grade(o, None, GRADER_VERSION))
        return grades


def tiny_random_model():
    """A seeded, randomly initialised tiny Qwen3.5 (no warm start: scripted tests need no skill)."""
    cfg = BuildConfig(tokenizer_corpus_size=200, hidden_size=32, intermediate_size=64)
    tok = build_tokenizer(cfg)
    return tok, build_model(cfg, tok)


def make_trainer(tiny, out_dir, monkeypatch, arm: str, script: dict[str, str], **overrides):
    """A trainer whose problem `pK` always yields the rollouts spelled by script[pK] (e.g. "CWTX")."""
    tok, model = tiny
    cap = CAP
    tasks = {t: {"id": t, "problem": f"problem {t}", "answer": "1"} for t in script}
    by_prompt = {}
    for t, spelled in script.items():
        rollouts = []
        for letter in spelled:
            ids = tok(TEXT[letter], add_special_tokens=False)["input_ids"]
            if letter == "T":  # hit the cap without EOS
                rollouts.append((ids * cap)[:cap])
            else:
                rollouts.append(ids[: cap - 1] + [tok.eos_token_id])
        by_prompt[f"problem {t}"] = rollouts

    def scripted_generation(self, prompt_ids, images, multimodal_fields, num_generations, **kw):
        out, seen = [], {}
        for ids in prompt_ids:
            text = tok.decode(ids)
            problem = next(p for p in by_prompt if p in text)
            k = seen.get(problem, 0)
            seen[problem] = k + 1
            out.append(by_prompt[problem][k % G])
        return out, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted_generation)
    kw = dict(STEP_ARGS, output_dir=str(out_dir / arm), arm=arm, groups_per_step=2, max_sampling_rounds=3)
    kw.update(overrides)
    args, run = decide(CapGRPOConfig(**kw), model, tok, tasks)
    trainer = CapGRPOTrainer(
        model,
        args,
        run=run,
        tasks=tasks,
        sampler=TaskSampler(sorted(script), seed=0),
        grader=TextGrader(),
        processing_class=tok,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def generate(trainer):
    """One step's selection rounds + TRL's scoring: the batch the loss will see."""
    return trainer._generate_and_score_completions(None)


def spelled_rows(trainer, script) -> str:
    """The letters of the step's rollouts in batch order (groups come in task-sampler order)."""
    return "".join(script[t] for t in trainer.step_record.task_ids_trained)

"""Evaluations beyond the run's own (issue 62): `extra_evals` SET@CAP at `extra_eval_steps`, MATH500 at the
training cap and at 1024 and heldout300 at 3× the cap in the 1.5B plan. At the run's eval cap the rows join the
step's eval file; at another cap they get `eval_stepNNN_capCCCC.jsonl`, which `make eval --cap` also writes."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rundir.files import Run, read_jsonl, write_eval
from tests.test_resume_refusals import REPO
from trainer import eval_callback, train
from trainer.config import CapGRPOConfig, ConfigError
from trainer.eval_callback import EvalCallback
from trainer.evaluation import EvalSpec, sample_seed

SMALL = ["--max_steps", "2", "--groups_per_step", "2", "--num_generations", "2", "--problems_per_round", "2",
         "--per_device_train_batch_size", "4", "--heldout_size", "4", "--fixed_size", "2", "--fixed_samples", "2",
         "--eval_every", "1", "--eval_batch_size", "8", "--report_to", "none", "--max_completion_length", "24"]  # fmt: skip


def config(**kw) -> CapGRPOConfig:
    return CapGRPOConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True, **kw)


@pytest.mark.parametrize(
    "fields, says",
    [({"extra_evals": ["math500@1024"], "extra_eval_steps": [0]}, "extra_evals: 'math500@1024' is not SET@CAP"),
     ({"extra_evals": ["heldout300@x"], "extra_eval_steps": [0]}, "extra_evals: 'heldout300@x' is not SET@CAP"),
     ({"extra_evals": ["heldout300@1152"]}, "extra_evals and extra_eval_steps: give both"),
     ({"extra_evals": ["heldout300@9", "heldout300@9"], "extra_eval_steps": [0]}, "an entry given twice"),
     ({"extra_evals": ["heldout300@9"], "extra_eval_steps": [3], "eval_every": 2, "max_steps": 8},
      "extra_eval_steps: 3 is not an evaluation step"),
     ({"eval_set_files": {"heldout300": "x.jsonl"}}, "eval_set_files: heldout300 is the run's own set")],
)  # fmt: skip
def test_extra_evaluations_that_cannot_run_are_refused_by_name(fields, says):
    with pytest.raises(ConfigError, match=says):
        config(**fields)
    ok = config(extra_evals=["math500@1024", "heldout300@1152"], extra_eval_steps=[0, 10], eval_every=10,
                eval_set_files='{"math500": "m.jsonl"}')  # fmt: skip
    assert ok.eval_set_files == {"math500": "m.jsonl"}  # JSON on the command line


def fake_run_eval(model, tokenizer, tasks_by_set, spec, step, **kwargs):
    """run_eval's rows without a model: what the callback does with them is under test."""
    return [{"step": step, "set": name, "task_id": t["id"], "sample": i, "seed": sample_seed(spec.seed, t["id"], i),
             "outcome": "wrong", "answer": "1", "reference": "2", "completion_tokens": 5, "cap": spec.cap,
             "completion": "x"}
            for name in sorted(tasks_by_set) for t in sorted(tasks_by_set[name], key=lambda t: t["id"])
            for i in range(spec.samples[name])]  # fmt: skip


def test_extra_evaluations_go_where_their_cap_says_at_their_steps_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_callback, "run_eval", fake_run_eval)
    monkeypatch.setattr(eval_callback, "refreshed_weights", lambda copy_, model: None)
    spec = EvalSpec(cap=64, samples={"fixed32": 1, "heldout300": 1, "math500": 1})
    own = {"fixed32": [{"id": "f1"}], "heldout300": [{"id": "h1"}, {"id": "h2"}]}
    math = [{"id": "m1"}, {"id": "m2"}, {"id": "m3"}]
    extra = {64: {"math500": math}, 1024: {"math500": math}, 192: {"heldout300": own["heldout300"]}}
    cb = EvalCallback(tmp_path, own, spec, 1, None, extra=extra, extra_steps=(0, 2))
    for step in (0, 1, 2):
        cb.evaluate(None, step)
    files = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert files == ["eval_step000.jsonl", "eval_step000_cap0192.jsonl", "eval_step000_cap1024.jsonl",
                     "eval_step001.jsonl", "eval_step002.jsonl", "eval_step002_cap0192.jsonl",
                     "eval_step002_cap1024.jsonl"]  # fmt: skip
    sets = lambda name: sorted({r["set"] for r in read_jsonl(tmp_path / "results" / name)})  # noqa: E731
    assert sets("eval_step000.jsonl") == ["fixed32", "heldout300", "math500"]  # MATH500 at the training cap
    assert sets("eval_step001.jsonl") == ["fixed32", "heldout300"]  # not an extra step
    assert sets("eval_step002_cap0192.jsonl") == ["heldout300"] and sets("eval_step002_cap1024.jsonl") == [
        "math500"
    ]
    assert {r["cap"] for r in read_jsonl(tmp_path / "results/eval_step000_cap1024.jsonl")} == {1024}
    assert cb.last_summary.keys() == {"fixed32", "heldout300", "math500"}  # the step's own file


def test_a_shared_step0_copies_the_extra_files_too(tmp_path, monkeypatch):
    spec = EvalSpec(cap=64, samples={"fixed32": 1, "heldout300": 1})
    own = {"fixed32": [{"id": "f1"}], "heldout300": [{"id": "h1"}]}
    info = {"base_model": "/b", "eval": spec.to_json(), "extra_evals": {"evals": ["heldout300@192"]}}
    runs = {}
    for name in ("leader", "follower"):
        (tmp_path / name / "results").mkdir(parents=True)
        (tmp_path / name / "run.json").write_text(json.dumps(info))
        runs[name] = tmp_path / name
    write_eval(runs["leader"], 0, fake_run_eval(None, None, own, spec, 0))
    extra = {192: {"heldout300": own["heldout300"]}}
    write_eval(
        runs["leader"],
        0,
        fake_run_eval(None, None, extra[192], EvalSpec(cap=192, samples=spec.samples), 0),
        192,
    )
    source = runs["leader"] / "results/eval_step000.jsonl"
    cb = EvalCallback(runs["follower"], own, spec, 1, None, step0_rows=source, extra=extra, extra_steps=(0,))
    cb.on_train_begin(None, SimpleNamespace(global_step=0, max_steps=3), None)
    for name in ("eval_step000.jsonl", "eval_step000_cap0192.jsonl"):
        assert (runs["follower"] / "results" / name).read_bytes() == (
            runs["leader"] / "results" / name
        ).read_bytes()


@pytest.mark.slow
def test_a_run_evaluates_a_file_set_and_another_cap_and_records_them(tmp_path):
    """Through `make train`'s path on the embedded base: a MATH-format file as `math500`, at the run's cap and at
    a longer one, heldout300 at the longer cap too, at steps 0 and 2 (the last)."""
    math = tmp_path / "math.jsonl"
    problems = [("What is $2+3$?", "5"), ("Compute $4 \\cdot 2$.", "8"), ("What is $9-4$?", "5")]
    math.write_text("".join(json.dumps({"problem": p, "answer": a, "unique_id": f"t/{i}"}) + "\n"
                            for i, (p, a) in enumerate(problems)))  # fmt: skip
    run = tmp_path / "run"
    train.main(["--config", str(REPO / "configs/embedded.yaml"), "--output_dir", str(run), *SMALL,
                "--eval_set_files", json.dumps({"math500": str(math)}),
                "--extra_evals", "math500@24", "math500@48", "heldout300@48", "--extra_eval_steps", "0", "2"])  # fmt: skip
    info = json.loads((run / "run.json").read_text())
    assert info["extra_evals"]["evals"] == ["math500@24", "math500@48", "heldout300@48"]
    assert info["extra_evals"]["sets"]["math500"]["tasks"] == 3 and info["eval"]["samples"]["math500"] == 1
    r = Run(run)
    assert r.evaluated() == [0, 1, 2] and r.evaluated(48) == [0, 2]
    own = {row["set"] for _, row in r.rows(2)}
    longer = r.rows(2, 48)
    assert own == {"fixed32", "heldout300", "math500"} and {row["set"] for _, row in r.rows(1)} == {
        "fixed32",
        "heldout300",
    }
    assert {row["set"] for _, row in longer} == {"heldout300", "math500"} and {
        row["cap"] for _, row in longer
    } == {48}

    # the same samples (task, sample, seed) at both caps: only the cap differs
    def at(rows):
        return sorted(
            (x["set"], x["task_id"], x["sample"], x["seed"]) for _, x in rows if x["set"] == "heldout300"
        )

    assert at(r.rows(2)) == at(longer) and Path(run / "results/eval_step002_cap0048.jsonl").is_file()
    # what a plan's `secondary` section with a cap reads (launch/report.py): the set at that step and cap alone
    heldout = len(info["eval_sets"]["heldout300"])
    assert (r.score(2, "math500", 48).n, r.score(2, "math500").n, r.score(2, "heldout300", 48).problems) == (
        3,
        3,
        heldout,
    )
    assert r.score(1, "math500") is None and r.score(1, "heldout300", 48) is None
    # `make eval` on the saved last step writes what training wrote there, extra sets and caps included
    from trainer import eval_checkpoints

    before = {p.name: p.read_bytes() for p in (run / "results").glob("eval_step002*.jsonl")}
    for cap in ([], ["--cap", "48"]):
        assert eval_checkpoints.main([str(run), "--steps", "2", "--device", "cpu", *cap]) == 0
    assert {p.name: p.read_bytes() for p in (run / "results").glob("eval_step002*.jsonl")} == before

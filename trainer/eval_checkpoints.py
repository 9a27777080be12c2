"""`make eval`: evaluate a run's saved checkpoints after the fact, with the run's own sets, seeds and settings.

    python -m trainer.eval_checkpoints RUN_DIR --steps 20,29 [--cap 24576]

At the run's cap the rows must come out as the in-training `results/eval_stepNNN.jsonl` (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # checkpoints and bases are local directories

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GenerationConfig  # noqa: E402

from data.atomic import refused_write  # noqa: E402
from data.eval_sets import extra_evals_by_cap  # noqa: E402
from data.run_tasks import eval_set_file  # noqa: E402
from data.snapshot import load_snapshot, snapshot_sha256  # noqa: E402
from engine.chunked_gated_delta import torch_on_cpu  # noqa: E402
from engine.generation import BACKENDS  # noqa: E402
from rewards.grader import GraderPool  # noqa: E402
from rewards.outcome import GRADER_VERSION, grader_name  # noqa: E402
from rundir.files import step_dir, summarize, write_eval  # noqa: E402
from rundir.run_json import RunDirError, read_run_json  # noqa: E402
from rundir.state import StateError  # noqa: E402
from rundir.step import verify_step  # noqa: E402
from trainer.config import grader_limits, recorded_determinism  # noqa: E402
from trainer.evaluation import EvalSpec, as_checkpoint, eos_token_ids, refuse_past_positions, run_eval  # noqa: E402
from trainer.setup import apply_determinism  # noqa: E402


def is_adapter(path: Path) -> bool:
    """A LoRA run's stepNNN/: the adapter alone (docs/gpu.md "LoRA")."""
    return (Path(path) / "adapter_config.json").is_file()


@contextmanager
def merged_adapter(path: Path) -> Iterator[Path]:
    """A LoRA stepNNN/ as a model directory: its base (adapter_config.json's base_model_name_or_path) with the
    stored adapter merged in by PEFT, bf16, with the checkpoint's tokenizer and processor files and the base's
    generation config; removed afterwards. What the run's vLLM engine held (engine/lora_push.py)."""
    from peft import PeftConfig, PeftModel

    from trainer.checkpoint import PROCESSOR_FILES

    base = Path(PeftConfig.from_pretrained(path).base_model_name_or_path)
    model, _ = load_checkpoint(base, "cpu")
    merged = PeftModel.from_pretrained(model, path).merge_and_unload()
    with tempfile.TemporaryDirectory(prefix="capgrpo-merged-") as tmp:
        merged.to(torch.bfloat16).save_pretrained(tmp)
        transformers.AutoTokenizer.from_pretrained(path).save_pretrained(tmp)
        for name in (*PROCESSOR_FILES, "generation_config.json"):
            if (src := Path(path) / name).is_file() or (src := base / name).is_file():
                shutil.copy(src, Path(tmp) / name)
        yield Path(tmp)


def load_checkpoint(path: Path, device: str):
    """A saved stepNNN/ (or the base model) with the architecture class named in its config.json; a LoRA
    stepNNN/ merged into its base."""
    if is_adapter(path):
        with merged_adapter(path) as merged:
            return load_checkpoint(merged, device)
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: no such checkpoint config")
    names = json.loads(config_file.read_text()).get("architectures") or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ValueError(f"{config_file}: 'architectures' {names!r} names no transformers class")
    model = cls.from_pretrained(path, dtype=torch.bfloat16).to(device)  # the stored (bf16) values
    torch_on_cpu(model)  # fla installed: its Triton kernels for CUDA tensors only (`--device cpu`)
    return as_checkpoint(model), transformers.AutoTokenizer.from_pretrained(path)


def load_eval_tasks(run: Mapping, run_dir: Path) -> dict[str, list[dict]]:
    """The recorded eval sets, resolved against the snapshot pinned in run.json (sha256 verified)."""
    snap = run.get("snapshot") or {}
    if not snap.get("path"):
        raise ValueError(f"{run_dir / 'run.json'}: missing 'snapshot.path'")
    path = Path(snap["path"])
    if not path.is_absolute() and not path.exists():
        path = run_dir / path
    tasks = {t["id"]: t for t in load_snapshot(path, snap.get("sha256"))}
    sets = {}
    for set_name, ids in (run.get("eval_sets") or {}).items():
        unknown = [i for i in ids if i not in tasks]
        if unknown:
            raise ValueError(f"{path}: eval set {set_name!r} names task {unknown[0]!r}, not in the snapshot")
        sets[set_name] = [tasks[i] for i in ids]
    if not sets:
        raise ValueError(f"{run_dir / 'run.json'}: no 'eval_sets'")
    return sets


def sets_at(run: Mapping, run_dir: Path, tasks_by_set: dict, step: int, cap: int) -> dict[str, list[dict]]:
    """The sets training evaluated at (step, cap), so `make eval` writes the rows training wrote there: run.json's
    eval_sets, plus at extra_eval_steps the extra_evals at this cap (alone, at a cap other than the run's);
    elsewhere run.json's eval_sets. A file set is read from its recorded path, sha256 verified."""
    extra = run.get("extra_evals") or {}
    names = extra_evals_by_cap(extra.get("evals", [])).get(cap, [])
    if step not in extra.get("steps", []) or not names:
        return tasks_by_set
    sets = dict(tasks_by_set) if cap == run["eval"]["cap"] else {}
    for name in names:
        if name in tasks_by_set:
            sets[name] = tasks_by_set[name]
            continue
        recorded = extra["sets"][name]
        if snapshot_sha256(recorded["path"]) != recorded["sha256"]:
            raise ValueError(
                f"{recorded['path']}: not the file run.json's extra_evals.sets.{name} recorded (sha256)"
            )
        sets[name] = eval_set_file(recorded["path"])
    return sets


def _checkpoint_dir(run: Mapping, run_dir: Path, step: int) -> Path:
    if step == 0:  # the base model: no step000/ weights are saved
        if not run.get("base_model"):
            raise ValueError(f"{run_dir / 'run.json'}: step 0 needs 'base_model'")
        return Path(run["base_model"])
    verify_step(step_dir(run_dir, step), way_on="evaluate the run's other checkpoints")  # never a broken one
    return step_dir(run_dir, step)


def run_device(run: dict) -> str:
    """Where the run evaluated during training: a use_cpu run's rows are CPU rows, also on a GPU machine."""
    return "cpu" if (run.get("config") or {}).get("use_cpu") or not torch.cuda.is_available() else "cuda"


def _generation_config(path: Path) -> GenerationConfig | None:
    has_one = (Path(path) / "generation_config.json").exists()
    return GenerationConfig.from_pretrained(path) if has_one else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.eval_checkpoints", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--steps", required=True, help="comma-separated optimizer steps, e.g. 20,29 (0: base)"
    )
    parser.add_argument("--cap", type=int, help="eval token cap (default: the run's)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--batch-size", type=int, help="transformers backend; other values change the rows")
    parser.add_argument(
        "--backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="auto: the run's own (run.json eval.generation); another one only at another --cap",
    )
    parser.add_argument(
        "--device", help="default: the run's own (cpu for a use_cpu run, else cuda if present)"
    )
    args = parser.parse_args(argv)
    run_file = args.run_dir / "run.json"
    stack = ExitStack()  # the grader pool, closed on every way out
    try:
        run = read_run_json(args.run_dir)
        # a deterministic run's rows come again only from the same kernels: its switches, before any CUDA work
        apply_determinism(recorded_determinism(run.get("config") or {}))
        args.device = args.device or run_device(run)
        run_spec = EvalSpec.from_run(run, str(run_file))
        overrides = {
            "cap": args.cap,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "batch_size": args.batch_size,
        }
        if args.backend != "auto":
            overrides["generation"] = args.backend
        spec = replace(run_spec, **{k: v for k, v in overrides.items() if v is not None})
        sampling = (spec.temperature, spec.top_p, spec.generation)
        if spec.cap == run_spec.cap and sampling != (
            run_spec.temperature,
            run_spec.top_p,
            run_spec.generation,
        ):
            raise ValueError(
                f"{run_file}: other sampling settings or another backend (eval.generation "
                f"{run_spec.generation!r}) at the run's own cap would pass for its training-time evaluation "
                "(eval_stepNNN.jsonl); evaluate them at another --cap"
            )
        if spec.generation == "compiled" and not str(args.device).startswith("cuda"):
            raise ValueError(
                f"{run_file}: eval.generation 'compiled' needs a CUDA device (got {args.device})"
            )
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
        tasks_by_set = load_eval_tasks(run, args.run_dir)
        use_vllm = spec.generation == "vllm"
        grader = grader_name(run.get("grader_version", GRADER_VERSION))  # the run's own grader and limits
        pool = stack.enter_context(GraderPool(**grader_limits(run.get("config") or {}), grader=grader))
        grade_fn = pool.grade_batch
        for step in steps:
            start = time.perf_counter()
            path = _checkpoint_dir(run, args.run_dir, step)
            sets = sets_at(run, args.run_dir, tasks_by_set, step, spec.cap)
            if use_vllm:
                from vllm import LLM

                # a LoRA checkpoint: vLLM loads the merged model, as the run's engine held it
                with merged_adapter(path) if is_adapter(path) else nullcontext(path) as model_dir:
                    llm, model = LLM(model=str(model_dir), seed=spec.seed, dtype="auto"), None
                    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
                    eos = eos_token_ids(tokenizer, _generation_config(model_dir))
            else:
                (model, tokenizer), llm, eos = load_checkpoint(path, args.device), None, None
                problems = [t["problem"] for tasks in sets.values() for t in tasks]
                caps = {"--cap": spec.cap}  # vLLM refuses a cap past the model's length itself
                refuse_past_positions(model.config, tokenizer, problems, spec.system_prompt, caps, path)
            rows = run_eval(model, tokenizer, sets, spec, step, llm=llm, eos=eos, grade_fn=grade_fn)
            cap_suffix = spec.cap if spec.cap != run_spec.cap else None
            out = write_eval(args.run_dir, step, rows, cap_suffix)
            summary = ", ".join(f"{s} {v['accuracy']} (n={v['n']})" for s, v in summarize(rows).items())
            print(f"step {step}: {summary} -> {out} [{time.perf_counter() - start:.1f}s]", flush=True)
            del model, llm
    except (OSError, ValueError, KeyError, StateError, RunDirError) as err:
        print(f"error: {refused_write(err) or err}", file=sys.stderr)  # a read-only disk: path and reason
        return 1
    finally:
        stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

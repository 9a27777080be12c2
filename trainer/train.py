"""Train one arm: `python -m trainer.train --config configs/embedded.yaml --arm S2 [--field value ...]`.

Every field of `CapGRPOConfig` (TRL's `GRPOConfig` + ours) and TRL's `ModelConfig` can be set in the YAML
recipe or overridden on the command line (`TrlParser`).

Refusals (a bad field, a non-empty output_dir, a run directory another process holds, a resume that would
not be exact, a broken state or checkpoint, a full, read-only or forbidden disk) print one `error: ...` line
naming the path and exit with status 1, before anything is written; `--debug` or CAPGRPO_DEBUG=1 shows the
traceback instead. Ctrl-C prints one line
with the step reached and the resume command (status 130).
"""

import contextlib
import dataclasses
import gc
import os
import sys
from pathlib import Path

# Threads waiting for work sleep instead of spinning: on a CPU shared with other work the spinning threads of a
# two-thread training pass (cpu_threads: 2) stalled it ~4x (bench/cpu_profile.py --threads). Read at torch load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import yaml
from trl import ModelConfig, TrlParser
from trl.generation.vllm_generation import VLLMGeneration

from data.atomic import DiskFullError, is_disk_full, refused_write
from data.snapshot import SnapshotError
from rundir.files import RunFileError
from rundir.lock import RunLock, RunLockedError, require_shared
from rundir.resume import interrupted
from rundir.run_json import RunDirError
from rundir.state import StateError
from trainer.config import CapGRPOConfig, ConfigError, refuse_absurd_numbers
from trainer.finite_gradients import NonFiniteGradientError
from trainer.setup import build_trainer


class VLLMServerError(Exception):
    """The vLLM server (`vllm_mode: server`) cannot be reached or stopped answering; the message says where the
    run stands."""


REFUSALS = (
    ConfigError, RunDirError, RunLockedError, RunFileError, StateError, DiskFullError, SnapshotError,
    VLLMServerError, NonFiniteGradientError,
)  # fmt: skip


def server_lost(args: CapGRPOConfig, e: OSError, trainer) -> VLLMServerError | None:
    """A connection error from TRL's vLLM client (requests, or its own ConnectionError at start) in server
    mode, as one line: where the server was and where the run stands. None for any other error."""
    client = type(e).__module__.startswith(("requests", "urllib3")) or isinstance(e, ConnectionError)
    if not (args.use_vllm and args.vllm_mode == "server" and client):
        return None
    url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
    what = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    if trainer is None:  # TRL's client waits vllm_server_timeout seconds for the server at trainer init
        return VLLMServerError(
            f"vLLM server {url}: not reachable ({what}); start it first (`trl vllm-serve`, docs/gpu.md); "
            "nothing was written"
        )
    return VLLMServerError(
        f"vLLM server {url}: stopped answering ({what}); the run stopped, {interrupted(args.output_dir)} "
        "once the server is back"
    )


class Interrupted(Exception):
    """Ctrl-C: the message is the step reached and the resume command."""


class RecipeParser(TrlParser):
    """TrlParser whose refusals are one line: argparse's own error prints the whole usage (~220 lines)."""

    def error(self, message: str):
        raise CommandLineError(f"{message} (python -m trainer.train --help lists every field)")


class CommandLineError(ValueError):
    """A command line or recipe we cannot parse; the message names the flag, file, line or key. Exit 2."""


def check_recipe(argv: list[str]) -> None:
    """The --config recipe, checked before TrlParser reads it: there, a missing file, bad YAML or a file that is
    no mapping end in tracebacks, and an unknown key (a typo: `max_stepz: 3`) is silently ignored."""
    if "--config" not in argv:
        return
    i = argv.index("--config")
    if i + 1 == len(argv) or argv[i + 1].startswith("--"):
        raise CommandLineError("--config: expected a recipe file")
    path = Path(argv[i + 1])
    try:
        recipe = yaml.safe_load(path.read_text())
    except OSError as e:
        raise CommandLineError(f"{path}: cannot read the recipe ({e.strerror})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise CommandLineError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(recipe, dict):
        kind = "empty" if recipe is None else f"a {type(recipe).__name__}"
        raise CommandLineError(f"{path}: a recipe is a mapping of config fields, this one is {kind}")
    known = {f.name for cls in (CapGRPOConfig, ModelConfig) for f in dataclasses.fields(cls)} | {"env"}
    if unknown := sorted(set(recipe) - known):
        raise CommandLineError(
            f"{path}: unknown key(s) {', '.join(unknown)} (not a field of CapGRPOConfig or ModelConfig)"
        )


def split_config_flag(argv: list[str]) -> list[str]:
    """`--config=FILE` as `--config FILE`: TrlParser looks for the bare flag only, and argparse let the `=` form
    through unread, so the run went on with the defaults and failed elsewhere. Given twice: refused (TrlParser
    would read the first)."""
    out = []
    for arg in argv:
        out += ["--config", arg.removeprefix("--config=")] if arg.startswith("--config=") else [arg]
    if out.count("--config") > 1:
        raise CommandLineError(
            "--config: given more than once (one recipe per run; override fields with flags)"
        )
    if "--config" in out and out[out.index("--config") + 1 :][:1] == [""]:
        raise CommandLineError("--config: expected a recipe file")
    return out


def parse(argv: list[str] | None) -> tuple[CapGRPOConfig, ModelConfig]:
    argv = split_config_flag(list(sys.argv[1:] if argv is None else argv))
    check_recipe(argv)
    try:
        return RecipeParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(argv)
    except ValueError as e:
        # HfArgumentParser's "Some specified arguments are not used…: ['--no_such_flag', '3']"
        if "not used by the HfArgumentParser" not in str(e):
            raise
        raise CommandLineError(f"unknown argument(s): {str(e).split(': ', 1)[-1]}") from None


def train(argv: list[str] | None):
    """Run to the end; returns the process group a multi-process run ended (None alone), for `main` to free."""
    args, model_args = parse(argv)
    refuse_absurd_numbers(model_args)  # CapGRPOConfig's own fields are checked as it is built
    lock = RunLock(args.output_dir) if args.process_index == 0 else contextlib.nullcontext()
    trainer = None
    try:
        with lock:  # one writer per run directory, from before its first byte to the end
            if args.world_size > 1:  # every node reads (and resumes from) the directory rank 0 writes
                require_shared(args.output_dir)
            trainer = build_trainer(args, model_args)
            trainer.train(resume_from_checkpoint=str(trainer.resume_state) if trainer.resume_state else None)
    except KeyboardInterrupt:
        raise Interrupted(interrupted(args.output_dir)) from None
    except OSError as e:
        if (lost := server_lost(args, e, trainer)) is not None:
            raise lost from None
        raise
    trainer.accelerator.wait_for_everyone()  # processes leave together: an early exit can abort the others'
    close_vllm(trainer)
    group = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None  # see main
    trainer.accelerator.end_training()  # gloo/NCCL teardown (destroys the process group)
    return group


def close_vllm(trainer) -> None:
    """A colocated engine's teardown destroys vLLM's process groups, then the default one. Left to the
    interpreter's exit, it ran after end_training had destroyed the default group, and every process of a
    multi-process run ended on a traceback ("Invalid process group specified"; docs/gpu.md)."""
    engine = getattr(trainer, "vllm_generation", None)
    if isinstance(engine, VLLMGeneration) and engine.mode == "colocate":
        engine.llm.llm_engine.engine_core.shutdown()


def _pop_debug(argv: list[str]) -> bool:
    """A bare `--debug` is ours (TrainingArguments' own --debug takes a value)."""
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            del argv[i]
            return True
    return False


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _pop_debug(argv) or os.environ.get("CAPGRPO_DEBUG", "") not in ("", "0")
    try:
        group = train(argv)
        # The trainer ends in reference cycles that keep the DDP wrapper, and with it gloo's process group and
        # worker threads, alive until the interpreter's finalization, where a worker taking the GIL aborted the
        # exiting process now and then ("terminate called without an active exception"): collect them now. Held
        # here, the group outlives the collection: freed by DDP's reducer, which keeps the GIL, gloo's teardown
        # waited on a worker that waited for the GIL (a hang); its own binding lets go of the GIL (docs/gpu.md).
        gc.collect()
        del group
    except Interrupted as e:
        print(e, file=sys.stderr)
        sys.exit(130)
    except CommandLineError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (*REFUSALS, OSError) as e:
        full = is_disk_full(e) and not isinstance(e, DiskFullError)  # a write outside our savers
        # a read-only or forbidden run directory (the lock, run.json, a save): the path, not a traceback
        refused = None if isinstance(e, REFUSALS) or full else refused_write(e)
        if debug or not (isinstance(e, REFUSALS) or full or refused):
            raise
        if full:
            e = f"{e.filename or 'a file of the run'}: not written, the disk is full (free some space, then resume)"
        print(f"error: {refused or e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

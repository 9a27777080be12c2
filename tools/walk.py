"""The walk of one run's settings: every function of this repository that is handed the run's config object
while `build_trainer` builds a trainer from configs/embedded.yaml (nothing is trained).

    python tools/walk.py [--build trainer.setup:build_trainer]

A stay is a (file, function) the config reaches as an argument or as `self.args`; a return is a file the walk
comes back to after having left it. Run on an older commit with `--build trainer.train:build_trainer`.
"""

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def walk(build_path: str) -> list[tuple[str, str]]:
    from trl import ModelConfig, TrlParser

    from trainer.config import CapGRPOConfig

    module, name = build_path.split(":")
    build = getattr(importlib.import_module(module), name)
    out = tempfile.mkdtemp()
    argv = [
        "--config",
        str(ROOT / "configs/embedded.yaml"),
        "--output_dir",
        f"{out}/run",
        "--report_to",
        "none",
    ]
    args, model_args = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(argv)
    stays: list[tuple[str, str]] = []

    def tracer(frame, event, arg):
        if event != "call":
            return None
        file = frame.f_code.co_filename
        if (
            not file.startswith(str(ROOT))
            or "/.venv" in file
            or "/tests/" in file
            or file.endswith("walk.py")
        ):
            return None
        values = [frame.f_locals.get(v) for v in frame.f_code.co_varnames[: frame.f_code.co_argcount]]
        holder = frame.f_locals.get("self")
        if any(isinstance(v, CapGRPOConfig) for v in values) or isinstance(
            getattr(holder, "args", None), CapGRPOConfig
        ):
            stays.append((os.path.relpath(file, ROOT), frame.f_code.co_qualname))
        return None

    sys.settrace(tracer)
    try:
        build(args, model_args)
    finally:
        sys.settrace(None)
    return stays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="trainer.setup:build_trainer")
    stays = walk(ap.parse_args().build)
    seen, files, order = set(), [], []
    for stay in stays:
        if stay not in seen:
            seen.add(stay)
            order.append(stay)
        if not files or files[-1] != stay[0]:
            files.append(stay[0])
    returns = sum(1 for i, f in enumerate(files) if f in files[:i])
    for file, fn in order:
        print(f"{file}:{fn}")
    print(f"stays {len(order)} in {len({f for f, _ in order})} files, returns {returns}")


if __name__ == "__main__":
    main()

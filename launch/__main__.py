"""python -m launch PLAN STAGE [--work W] [--out O] [--budget-s S] [--smoke]: one experiment from its plan file.

    base    build the base, write the snapshots, measure the base on the plan's grid, apply its rule (choice.json)
    train   start or resume every arm x seed, in parallel on each GPU (--gpus), until done or --budget-s; pack
    report  print the report computed from the plan and the committed rows under the plan's `results`
    unpack  --archive A --into DIR: a train stage's archive into a new docs folder
    watch   --for-s S: follow a detached train (`train --detach`) for S seconds or until it ends
    pack    what the repository keeps of the work folder, into --out (after a detached train); --with-caches: also
            the compile caches and their key (compile-caches.tar.gz), which `train --caches FILE` starts from

`train --detach` starts the train stage in a session of its own and returns at once: on the GPU machine it runs on
after the device call that started it, until the machine is given back, so runs are never stopped at a call's end
(issue 60); later calls `watch`, then `pack`. Its output goes to <work>/launcher.log, its pid to <work>/launcher.pid.

--smoke runs base and train at CPU sizes with the shipped tiny embedded base (tests). Exit 1 with one line on
any refusal. docs/launch.md: the plan's fields and the GPU command lines.
"""

import argparse
import os
import sys
from pathlib import Path

from data.atomic import refused_write
from embedded import shipped
from launch.plan import ROOT, LaunchError, load
from rundir.errors import RunFileError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch", description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("stage", choices=("base", "train", "report", "unpack", "watch", "pack"))
    ap.add_argument("--work", type=Path, default=None, help="default artifacts/<plan name>")
    ap.add_argument("--out", type=Path, default=None, help="what comes back (default $OUT, else <work>/out)")
    ap.add_argument(
        "--gguf", type=Path, default=None, help="a packaged base's GGUF (default: the installed one)"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="train: default the plan's budget.train_s")
    ap.add_argument(
        "--parallel", type=int, default=None, help="train: runs at a time per GPU (default the plan's)"
    )
    ap.add_argument(
        "--gpus", type=int, default=None, help="train: how many GPUs (default budget.gpus, else all visible)"
    )
    ap.add_argument(
        "--seeds", default=None, help="train: only these of the plan's seeds, e.g. 3,4,5 (a launch's share)"
    )
    ap.add_argument(
        "--arms", default=None, help="train: only these of the plan's arms, e.g. S2 (a run alone)"
    )
    ap.add_argument(
        "--step0-from",
        type=Path,
        default=None,
        help="train: every new run copies these step-0 rows (an earlier lease's)",
    )
    ap.add_argument(
        "--committed-in",
        type=Path,
        default=None,
        help="train: the experiment folder whose launch*/ runs are committed: those are not run again",
    )
    ap.add_argument("--detach", action="store_true", help="train: in a session of its own, returning at once")
    ap.add_argument("--for-s", type=float, default=540.0, help="watch: seconds to follow at most")
    ap.add_argument(
        "--caches", type=Path, default=None, help="train: an earlier lease's compile-caches.tar.gz"
    )
    ap.add_argument(
        "--with-caches", action="store_true", help="pack: also the compile caches, with their key"
    )
    ap.add_argument("--smoke", action="store_true", help="CPU sizes, the tiny embedded base")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="report: rows from here, not the plan's results (--out writes the analysis.compare report and figures of these runs, or without --results of the plan's pooled launches)",
    )
    ap.add_argument("--archive", type=Path)
    ap.add_argument("--into", type=Path)
    args = ap.parse_args(argv)
    try:
        return run(args, argv)
    except (LaunchError, shipped.ShippedError) as e:  # a plan, a refusal or a failed run: one line
        print(f"error: {e}", file=sys.stderr)
    except RunFileError as e:  # a committed row file or rows.tar.xz that cannot be read (the report's rows)
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        if (refused := refused_write(e)) is None:
            raise
        print(f"error: {refused}", file=sys.stderr)  # a read-only or full work or out folder
    return 1


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    plan = load(args.plan)
    # --smoke and the embedded plans read the shipped files, tracked as .xz
    if args.stage in ("base", "train"):
        shipped.unpack()
    work = (args.work or ROOT / "artifacts" / plan.name).resolve()
    out = args.out or Path(os.environ.get("OUT") or work / "out")
    if args.stage == "report":
        from launch.report import report, write_comparison

        print(report(plan, args.results), end="")
        # the comparison's report.md and figures: of --results, else of the plan's launches
        if args.out is not None:
            print(f"wrote {write_comparison(plan, args.results, args.out) / 'report.md'}")
        return 0
    if args.stage == "unpack":
        from launch.pack import unpack

        return unpack(plan, args.archive, args.into)
    if args.stage == "base":
        from launch.base import run_base_report
        from launch.pack import pack

        if plan.base_report is None:
            from launch.base import build_base

            build_base(plan, work, None, args.smoke, args.gguf)
        else:
            run_base_report(plan, work, args.smoke, args.gguf)
        for name in ("base_report.md", "choice.json"):
            if (work / name).is_file():
                out.mkdir(parents=True, exist_ok=True)
                (out / name).write_bytes((work / name).read_bytes())
        pack(plan, work, out)
        return 0
    if args.stage == "watch":
        from launch.watch import watch

        return watch(work, args.for_s)
    if args.stage == "pack":
        from launch.pack import pack, pack_caches

        pack(plan, work, out)
        if args.with_caches:
            pack_caches(work, out)
        return 0
    if args.detach:
        from launch.watch import detach

        rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--detach"]
        return detach(
            work, [sys.executable, "-m", "launch", *rest, "--work", str(work), "--out", str(work / "out")]
        )
    from launch.runs import train

    seeds = None if args.seeds is None else _seeds(args.seeds)
    arms = None if args.arms is None else args.arms.split(",")
    return train(plan, work, out, args.smoke, args.budget_s, args.gguf, args.parallel, seeds, args.gpus,
                 args.caches, arms, args.step0_from, args.committed_in)  # fmt: skip


def _seeds(text: str) -> list[int]:
    """`--seeds 3,4,5`; a repeat or a non-number is refused (the plan's own seeds are checked when it loads)."""
    seeds = []
    for part in text.split(","):
        try:
            seed = int(part)
        except ValueError:
            raise LaunchError(f"--seeds: {part!r} is not a whole number") from None
        if seed in seeds:
            raise LaunchError(f"--seeds: {seed} appears twice")
        seeds.append(seed)
    return seeds


if __name__ == "__main__":
    sys.exit(main())

"""An experiment: several arms (and training seeds) trained from one recipe, each compared with the control.

    python -m trainer.experiment --recipe configs/embedded.yaml --arms S0,S2 [--seeds 0,1,2]
        [--runs runs] [--out comparisons] [--jobs 2] [-- extra trainer arguments]

Every run is `python -m trainer.train --config <recipe> --arm <arm> --output_dir <runs>/<name>`, where name
is the arm, or `<arm>-s<seed>` with `--seed <seed>` when seeds are given: the same base, snapshot, eval
sets and eval seeds for all, so only the arm (and the training seed) differs. Runs go `--jobs` at a time
(tiny CPU runs use one thread each, so the default is one per core). Then every arm but the first (the
control, S0 by default) is compared with it: `python -m analysis.compare <arm runs> <control runs> --out
<out>/<arm>_vs_<control>`. A run that fails stops the experiment with its log named; nothing is retried.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def run_names(arms: list[str], seeds: list[int] | None) -> dict[str, list[tuple[str, list[str]]]]:
    """arm -> [(run directory name, extra trainer arguments)], one entry per training seed."""
    if not seeds:
        return {arm: [(arm, [])] for arm in arms}
    return {arm: [(f"{arm}-s{s}", ["--seed", str(s)]) for s in seeds] for arm in arms}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m trainer.experiment", description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="configs/embedded.yaml", help="the recipe every arm runs")
    ap.add_argument("--arms", default="S0,S2", help="comma-separated; the first is the control")
    ap.add_argument("--seeds", default="", help="comma-separated training seeds (default: the recipe's)")
    ap.add_argument("--runs", type=Path, default=Path("runs"), help="parent folder of the run directories")
    ap.add_argument("--out", type=Path, default=Path("comparisons"), help="parent folder of the reports")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs trained at the same time")
    args = ap.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    seeds = [s for s in args.seeds.split(",") if s] or None
    if len(arms) < 2:
        ap.error("--arms needs a control and at least one other arm")
    if bad := [s for s in seeds or [] if not s.lstrip("-").isdigit()]:
        print(f"error: --seeds: {bad[0]!r} is not a whole number", file=sys.stderr)
        return 1
    seeds = [int(s) for s in seeds] if seeds else None
    for flag, values in (("--arms", arms), ("--seeds", seeds or [])):  # a repeat trains one run twice at once
        if (dup := next((v for i, v in enumerate(values) if v in values[:i]), None)) is not None:
            print(f"error: {flag}: {dup} appears twice", file=sys.stderr)
            return 1

    plan = run_names(arms, seeds)
    queue = [(arm, name, a_extra) for arm in arms for name, a_extra in plan[arm]]
    # refuse before anything starts, as trainer.train would, but for every run at once
    for _arm, name, _extra in queue:
        run = args.runs / name
        if run.exists() and any(run.iterdir()):
            print(f"error: {run} is not empty: remove it or pass another --runs folder", file=sys.stderr)
            return 1
    t0 = time.perf_counter()
    running: list[tuple[str, subprocess.Popen, Path]] = []
    args.runs.mkdir(parents=True, exist_ok=True)
    while queue or running:
        while queue and len(running) < max(1, args.jobs):
            arm, name, a_extra = queue.pop(0)
            log = args.runs / f"{name}.log"
            cmd = [sys.executable, "-m", "trainer.train", "--config", args.recipe, "--arm", arm]
            cmd += ["--output_dir", str(args.runs / name), *a_extra]
            # parallel runs: one intra-op thread each (two-thread training passes would share the cores)
            cmd += [*(["--cpu_threads", "1"] if args.jobs > 1 else []), *extra]
            print(
                f"[{time.perf_counter() - t0:6.0f} s] train {name}: {' '.join(cmd[1:])}  (log {log})",
                flush=True,
            )
            running.append((name, subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT), log))
        time.sleep(1)
        for item in list(running):
            name, proc, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode:
                for _, other, _ in running:
                    other.terminate()
                print(f"error: training {name} failed (exit {proc.returncode}); see {log}", file=sys.stderr)
                return 1
            print(f"[{time.perf_counter() - t0:6.0f} s] done {name}", flush=True)

    control = arms[0]
    runs_of = lambda arm: ",".join(str(args.runs / name) for name, _ in plan[arm])  # noqa: E731
    for arm in arms[1:]:
        out = args.out / f"{arm}_vs_{control}"
        cmd = [sys.executable, "-m", "analysis.compare", runs_of(arm), runs_of(control), "--out", str(out)]
        print(f"[{time.perf_counter() - t0:6.0f} s] compare: {' '.join(cmd[1:])}", flush=True)
        if subprocess.run(cmd).returncode:
            return 1
    print(f"experiment done in {time.perf_counter() - t0:.0f} s: reports under {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fault test of exact resume: SIGKILL a short run at seeded random moments, resume each, compare bitwise.

    python -m bench.fault_test --kills 20 --steps 5 --seed 0 --out runs/fault_test [--twin] [--torn N] [--lock]
        [--report F]

1. The code (trainer/, rundir/, data/, rewards/, policy/, cards/, analysis/ and the recipe) is copied to OUT/code and every
   run starts there: the working tree may change while the test runs. The base is the shipped
   embedded/base (`--base`, `--snapshot` for others).
2. One uninterrupted run (the reference) of the embedded S2 recipe scaled down, a state saved every step;
   T, its wall time from run.json to the end, is measured (`--twin`: and a second one must be identical).
3. `--kills` times, seeded: start the same run in a fresh directory, SIGKILL its process group (trainer
   and grader workers) at a uniform random moment between its run.json appearing (startup done) and T
   later, note what it left (states, rows, temp dirs of a save in flight), resume it with `--resume`, and
   compare with the reference: every steps.jsonl row but the timings, every eval row, the last stepNNN/
   weights, the last stateNNN/ tensors, RNG, sampler and scheduler state, the same stepNNN/ and
   stateNNN/ dirs, and no temp dir left. A run that finishes before its kill is drawn again.
4. `--torn` times: SIGKILL once steps.jsonl has a seeded number of rows, append half of the next step's
   row (what a crash or a full disk during that append leaves), resume, compare.
5. `--lock`: a fresh run is paused (SIGSTOP) once it has written its first row, a `--resume` of its
   directory and a second fresh run into it are started; each must be refused in one line naming the first
   run's pid; then the first goes on (SIGCONT) and must still end identical to the reference.

Prints a markdown table (docs/state.md has the measured one) and, with --report, writes it as JSON.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from rundir.files import read_jsonl, state_dir, steps_path
from rundir.lock import LOCK_FILE  # a killed run leaves it; the resume takes it over
from rundir.state import load_state
from trainer.steps_log import MEASURED

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer", "engine", "data", "rewards", "cards", "analysis", "rundir", "policy")
RECIPE = "configs/embedded.yaml"

# The embedded S2 recipe at a size a shared 2-core CPU runs in a couple of minutes.
SMALL = {
    "groups_per_step": 2, "num_generations": 8, "per_device_train_batch_size": 8, "problems_per_round": 8,
    "max_sampling_rounds": 2, "max_completion_length": 96, "heldout_size": 6, "fixed_size": 3,
    "fixed_samples": 2, "eval_every": 2, "eval_batch_size": 16, "keep_states": 2, "report_to": "none",
    "grader_workers": 1, "disable_tqdm": "true",
}  # fmt: skip


def snapshot_code(out: Path) -> Path:
    """A copy of the packages and the recipe, so that every run of the test runs the same code even while
    the working tree changes (the runs take an hour on a shared CPU)."""
    code = out / "code"
    shutil.rmtree(code, ignore_errors=True)
    for package in PACKAGES:
        shutil.copytree(REPO / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / RECIPE, code / "recipe.yaml")
    return code


def train_cmd(args, out: Path, resume: bool) -> list[str]:
    fields = {**SMALL, "max_steps": args.steps, "checkpoint_steps": " ".join(map(str, range(1, args.steps))),
              "model_name_or_path": args.base.resolve(), "snapshot_path": args.snapshot.resolve(),
              "snapshot_sha256": hashlib.sha256(args.snapshot.read_bytes()).hexdigest(), "output_dir": out}  # fmt: skip
    cmd = [sys.executable, "-m", "trainer.train", "--config", "recipe.yaml"]
    for k, v in fields.items():
        cmd += [f"--{k}", *str(v).split()]
    return cmd + (["--resume", str(out)] if resume else [])


def launch(cmd: list[str], log: Path, watch: Path, kill_at: float | None = None, until=None):
    """(return code or None if killed, seconds from `watch` appearing to the end). Killed: SIGKILL to the
    whole process group `kill_at` seconds after `watch` (the run's run.json) appeared: timing from there
    leaves out the startup (imports, model load), whose length varies most on a shared machine."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    seen = None
    with log.open("a") as f:
        proc = subprocess.Popen(
            cmd, cwd=log.parent / "code", env=env, stdout=f, stderr=f, start_new_session=True
        )
        while proc.poll() is None:
            if seen is None and watch.exists():
                seen = time.perf_counter()
            if until is not None and until():  # e.g. a row written: SIGKILL then
                kill_at = 0.0
            if kill_at is not None and seen is not None and time.perf_counter() - seen >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None, time.perf_counter() - seen
            time.sleep(0.02)
    return proc.returncode, time.perf_counter() - (seen or time.perf_counter())


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in MEASURED} for r in rows]


def compare(ref: Path, out: Path) -> dict[str, bool]:
    """Each check between the reference and a resumed run: True where bitwise identical."""
    names = lambda d, pattern: sorted(p.name for p in d.glob(pattern))  # noqa: E731
    evals = names(ref / "results", "eval_step*.jsonl")
    last = names(ref, "step[0-9][0-9][0-9]")[-1]
    state = names(ref, "state[0-9][0-9][0-9]")[-1]
    found = {
        "rows": untimed(read_jsonl(ref / "results/steps.jsonl"))
        == untimed(read_jsonl(out / "results/steps.jsonl")),
        "eval_rows": names(out / "results", "eval_step*.jsonl") == evals
        and all(read_jsonl(ref / "results" / n) == read_jsonl(out / "results" / n) for n in evals),
        "dirs": names(ref, "st*[0-9][0-9][0-9]") == names(out, "st*[0-9][0-9][0-9]"),
        "no_temp_dirs": not [p for p in out.iterdir() if p.name.startswith(".")],
    }
    if not found["dirs"]:
        return found | {"weights": False, "state": False}
    wa, wb = load_file(ref / last / "model.safetensors"), load_file(out / last / "model.safetensors")
    found["weights"] = wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)
    (ta, ma), (tb, mb) = load_state(ref / state), load_state(out / state)
    found["state"] = (
        ta.keys() == tb.keys()
        and all(ta[k].equal(tb[k]) for k in ta)
        and (ma["rng"], ma["task_sampler"], ma["scheduler"])
        == (mb["rng"], mb["task_sampler"], mb["scheduler"])
    )
    return found


def left_behind(out: Path) -> dict:
    """What a killed run left: its states, steps logged, and the temp dirs of a save in flight."""
    if not out.is_dir():
        return {"states": [], "rows": 0, "saving": []}
    steps = out / "results" / "steps.jsonl"
    return {
        "states": sorted(p.name for p in out.glob("state[0-9]*")),
        "rows": len(read_jsonl(steps, torn_tail="drop")) if steps.is_file() else 0,
        "saving": sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    ap.add_argument("--out", type=Path, default=Path("runs/fault_test"))
    ap.add_argument("--base", type=Path, default=REPO / "embedded/base", help="base model dir")
    ap.add_argument(
        "--snapshot", type=Path, default=REPO / "embedded/synthetic.tasks.json", help="task snapshot"
    )
    ap.add_argument("--keep", action="store_true", help="keep the run dirs of identical runs too")
    ap.add_argument(
        "--twin", action="store_true", help="first check that two uninterrupted runs are identical"
    )
    ap.add_argument("--report", type=Path, help="also write the results here as JSON")
    ap.add_argument("--torn", type=int, default=0, help="this many torn-last-row cases after the kills")
    ap.add_argument("--lock", action="store_true", help="then the two-writers case")
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    code = snapshot_code(args.out)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    args.commit = commit
    print(f"code: the working tree at commit {commit}, copied to {code}", flush=True)

    ref, timing = args.out / "reference", args.out / "reference.json"
    if not (timing.is_file() and state_dir(ref, args.steps).is_dir()):
        shutil.rmtree(ref, ignore_errors=True)
        rc, seconds = launch(train_cmd(args, ref, resume=False), args.out / "reference.log", ref / "run.json")
        if rc != 0:
            raise SystemExit(f"the reference run failed ({rc}): see {args.out / 'reference.log'}")
        timing.write_text(json.dumps({"seconds": seconds}))
    if args.twin:  # a second uninterrupted run must be identical, or a difference would mean nothing
        twin = args.out / "twin"
        shutil.rmtree(twin, ignore_errors=True)
        rc, _ = launch(train_cmd(args, twin, resume=False), args.out / "twin.log", twin / "run.json")
        if rc != 0 or not all(compare(ref, twin).values()):
            raise SystemExit(f"two uninterrupted runs differ or failed ({rc}): see {args.out / 'twin.log'}")
        shutil.rmtree(twin)
        print("twin: a second uninterrupted run is identical", flush=True)
    seconds = json.loads(timing.read_text())["seconds"]
    trained = sum(r["tokens_trained"] for r in read_jsonl(ref / "results/steps.jsonl"))
    print(f"reference: {args.steps} steps, {seconds:.0f} s from run.json to the end, {trained} tokens trained",
          flush=True)  # fmt: skip

    rng = random.Random(args.seed)
    results = []
    span = seconds  # shrinks when a run finishes before its kill (the machine got faster)
    for i in range(args.kills):
        out, log = args.out / f"kill{i:02d}", args.out / f"kill{i:02d}.log"
        for _ in range(5):  # a run that finished before its kill tested nothing: draw again
            at = rng.uniform(0, span)
            shutil.rmtree(out, ignore_errors=True)
            log.unlink(missing_ok=True)
            rc, took = launch(train_cmd(args, out, resume=False), log, out / "run.json", kill_at=at)
            if rc is None:
                break
            span = min(span, took)
        killed = left_behind(out)
        rc2, _ = launch(train_cmd(args, out, resume=True), log, out / "run.json")
        error = next((ln for ln in log.read_text().splitlines() if ln.startswith("error: ")), None)
        checks = compare(ref, out) if rc2 == 0 else {}
        row = {"kill": i, "at_s": round(at, 1), "finished_first": rc is not None, **killed, "rc": rc2,
               "error": error, "checks": checks, "identical": bool(checks) and all(checks.values())}  # fmt: skip
        if rc2 == 0:
            row["from_state"] = json.loads((out / "run.json").read_text())["resumes"][-1]["from_state"]
        results.append(row)
        print(json.dumps(row), flush=True)
        if row["identical"] and not args.keep:
            shutil.rmtree(out)
        write_table(args, results, seconds, trained)  # after every kill: a long run can be cut short
    for i in range(args.torn):
        results.append(torn_case(args, ref, i, rng))
        print(json.dumps(results[-1]), flush=True)
        write_table(args, results, seconds, trained)
    if args.lock:
        results.append(lock_case(args, ref))
        print(json.dumps(results[-1]), flush=True)
        write_table(args, results, seconds, trained)
    print("\n" + (args.out / "table.md").read_text())


def torn_case(args, ref: Path, i: int, rng: random.Random) -> dict:
    """SIGKILL once steps.jsonl has a seeded number of rows, append half a row, resume, compare."""
    out, log = args.out / f"torn{i:02d}", args.out / f"torn{i:02d}.log"
    shutil.rmtree(out, ignore_errors=True)
    log.unlink(missing_ok=True)
    rows = rng.randint(1, args.steps - 1)
    steps = steps_path(out)
    enough = lambda: steps.is_file() and steps.read_text().count("\n") >= rows  # noqa: E731
    launch(train_cmd(args, out, resume=False), log, out / "run.json", until=enough)
    killed = left_behind(out)
    last = read_jsonl(steps, torn_tail="drop")[
        -1
    ]  # the next step's row, cut in half: a crash during its append
    torn = json.dumps({**last, "step": last["step"] + 1})
    with steps.open("a") as f:
        f.write(torn[: len(torn) // 2])
    rc, _ = launch(train_cmd(args, out, resume=True), log, out / "run.json")
    error = next((ln for ln in log.read_text().splitlines() if ln.startswith("error: ")), None)
    checks = compare(ref, out) if rc == 0 else {}
    row = {"kill": f"torn{i}", "at_s": f"row {killed['rows']} written; half a row appended", "finished_first": False,
           **killed, "rc": rc, "error": error, "checks": checks, "identical": bool(checks) and all(checks.values())}  # fmt: skip
    if rc == 0:
        row["from_state"] = json.loads((out / "run.json").read_text())["resumes"][-1]["from_state"]
        if row["identical"] and not args.keep:
            shutil.rmtree(out)
    return row


def lock_case(args, ref: Path) -> dict:
    """A run in training, then a --resume of it and a fresh run into it: both refused by its pid."""
    out, log = args.out / "lock", args.out / "lock.log"
    shutil.rmtree(out, ignore_errors=True)
    log.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("a") as f:
        first = subprocess.Popen(train_cmd(args, out, resume=False), cwd=args.out / "code", env=env,
                                 stdout=f, stderr=f, start_new_session=True)  # fmt: skip
    while not steps_path(out).is_file() and first.poll() is None:  # training, past startup
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGSTOP)  # paused, still holding its lock, however long the two take to start
    refusals = []
    for resume in (True, False):
        second = subprocess.run(train_cmd(args, out, resume=resume), cwd=args.out / "code", env=env,
                                capture_output=True, text=True)  # fmt: skip
        last = (second.stderr.strip().splitlines() or [""])[-1]
        refusals.append(
            second.returncode == 1 and f"pid {first.pid}" in last and "Traceback" not in second.stderr
        )
    os.killpg(first.pid, signal.SIGCONT)
    rc = first.wait()
    checks = compare(ref, out) if rc == 0 else {}
    checks["refused_by_pid"] = all(refusals)
    row = {"kill": "lock", "at_s": "a --resume and a fresh run while training", "finished_first": False,
           "states": [], "rows": 0, "saving": [], "rc": rc, "error": last, "checks": checks,
           "identical": rc == 0 and all(checks.values()), "from_state": "not stopped"}  # fmt: skip
    if row["identical"] and not args.keep:
        shutil.rmtree(out)
    return row


def write_table(args, results: list[dict], seconds: float, trained: int) -> None:
    lines = ["| kill | at (s after run.json) | states when killed | rows | save in flight | resumed from | identical |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        saving = ", ".join(r["saving"]) or "-"
        start = "finished first" if r["finished_first"] else r.get("from_state") or "step 0"
        ok = "yes" if r["identical"] else f"NO {r['checks'] or r['error']}"
        lines.append(f"| {r['kill']} | {r['at_s']} | {', '.join(r['states']) or '-'} | {r['rows']} | {saving} | {start} | {ok} |")  # fmt: skip
    same = sum(r["identical"] for r in results)
    lines.append(f"\n{same}/{len(results)} resumed runs bitwise identical to the uninterrupted one ({args.steps}-step "
                 f"run, {seconds:.0f} s from run.json to the end, {trained} tokens trained; kill seed {args.seed})")  # fmt: skip
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    if args.report:
        report = {"seconds": seconds, "tokens_trained": trained, "runs": results,
                  "commit": args.commit}  # fmt: skip
        args.report.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

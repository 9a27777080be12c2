"""What a lease bought: lease seconds per run-step, run-steps per GPU-hour, how many runs were going at once, and
what the generation gate's refill cost, from a launch folder's committed rows (issue 60).

A launch folder holds, besides its runs' rows:
  lease.json      the device calls of the lease that served this launch, written from the device tool's replies:
                  {"calls": [{"what": "...", "wall_s": 12.3, "t0": unix, "t1": unix, "count": 1}, ...], "held_s": ...,
                  "gpus": 1, "note": "..."}; `held_s` (the lease's own clock) wins over the calls' sum where given
  timeline.jsonl  what the launcher saw (launch/runs.py Timeline): starts, exits, step rows with the number of
                  runs going, GPU utilisation samples
A run-step is one row of a run's steps.jsonl (an optimizer step, its evaluation and save included); rows a
resume rewound and redid count once, so a replay costs lease time without adding run-steps.
"""

import json
import statistics
from pathlib import Path

from rundir import archive
from rundir.files import read_jsonl


def _rows(path: Path) -> list[dict]:
    return read_jsonl(path, torn_tail="drop") if archive.exists(path) else []


def figures(folder: Path) -> dict:
    """The lease's figures for one launch folder (plain or archived rows)."""
    folder = Path(folder)
    lease = (
        json.loads(archive.read_bytes(folder / "lease.json")) if archive.exists(folder / "lease.json") else {}
    )
    calls = lease.get("calls", [])
    held = lease.get("held_s") or sum(c["wall_s"] for c in calls) or None
    runs = [p.parent for p in archive.glob(str(folder / "*/results")) if archive.exists(p / "steps.jsonl")]
    steps = {run.name: _rows(run / "results/steps.jsonl") for run in runs}
    run_steps = sum(len(rows) for rows in steps.values())
    groups = [r["groups"] for rows in steps.values() for r in rows if r.get("groups")]
    sampled, trained = sum(g["sampled"] for g in groups), sum(g["trained"] for g in groups)
    timeline = _rows(folder / "timeline.jsonl")
    live = [e["live"] for e in timeline if e.get("event") == "step"]
    utils = [u for e in timeline if e.get("event") == "gpu" for u in e["util"]]
    out = {
        "calls": sum(c.get("count", 1) for c in calls),  # an entry may stand for several alike calls
        "lease_s": held,
        "run_steps": run_steps,
        "runs": len(runs),
        "lease_s_per_run_step": held / run_steps if held and run_steps else None,
        "run_steps_per_gpu_hour": run_steps / (held * lease.get("gpus", 1) / 3600)
        if held and run_steps
        else None,
        "sampled_per_trained_group": sampled / trained if trained else None,
        "runs_going_median": statistics.median(live) if live else None,
        "runs_going_max": max(live) if live else None,
        "gpu_util_median": statistics.median(utils) if utils else None,
        "gpu_idle_share": sum(u == 0 for u in utils) / len(utils) if utils else None,
    }
    out["per_call"] = [_call(c, timeline) for c in calls]
    return out


def _call(call: dict, timeline: list[dict]) -> dict:
    """One call: its wall time and the step rows the launcher saw during it (with t0/t1 recorded)."""
    row = {"what": call.get("what", ""), "wall_s": call["wall_s"]}
    if "t0" in call and "t1" in call:
        row["run_steps"] = sum(
            1 for e in timeline if e.get("event") == "step" and call["t0"] <= e["t"] <= call["t1"]
        )
    return row


def table(folders: dict[str, Path]) -> str:
    """The lease figures of several launches side by side (the report's `lease` section)."""
    lines = ["| launch | calls | lease s | run-steps | **lease s per run-step** | run-steps per GPU-hour | "
             "runs going (median, max) | GPU idle samples | sampled groups per trained group |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def f(x, spec):
        return "—" if x is None else format(x, spec)

    for name, folder in folders.items():
        g = figures(folder)
        going = (
            "—" if g["runs_going_median"] is None else f"{g['runs_going_median']:g}, {g['runs_going_max']}"
        )
        lines.append(
            f"| {name} | {g['calls']} | {f(g['lease_s'], '.0f')} | {g['run_steps']} | "
            f"**{f(g['lease_s_per_run_step'], '.2f')}** | {f(g['run_steps_per_gpu_hour'], '.0f')} | {going} | "
            f"{f(g['gpu_idle_share'], '.0%')} | {f(g['sampled_per_trained_group'], '.2f')} |"
        )
    return "\n".join(lines) + "\n"

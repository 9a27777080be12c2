"""The embedded short run the slow end-to-end tests share (conftest.py's `short_run`, built once per session):
`python -m trainer.train` on the shipped base, arm S4, 3 steps, with BEMA, a stopping callback that does not
fire and a hook log. Tests that only read a finished run read this one; tests that kill, stop or resume a
run launch their own with the same arguments and compare it with this one (`same_run`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from rundir.state import load_state

REPO = Path(__file__).resolve().parent.parent

# Small enough for CI's 2 cores, big enough that groups qualify and the weights move: the shipped base
# qualifies ~92% of its 8-sample groups under S4's gate v2 and ~55% under S2's v1 (docs/embedded_default.md;
# the steps.jsonl rows of docs/experiment-embedded), so 4 problems a round fill the 2 groups, mostly in one
# round (a second one in about 1 step in 4 under S2).
SMALL = {
    "max_steps": 3,
    "groups_per_step": 2,
    "num_generations": 8,
    "per_device_train_batch_size": 8,
    "problems_per_round": 4,
    "max_sampling_rounds": 3,
    "max_completion_length": 160,
    "heldout_size": 6,
    "fixed_size": 3,
    "fixed_samples": 2,
    "eval_every": 2,
    "eval_batch_size": 16,
    "checkpoint_steps": "1 2",
    "report_to": "none",
    "grader_workers": 1,
    "disable_tqdm": "true",
}
EVALUATED = (0, 2, 3)  # eval_every 2 and the last step
BEMA = 'trl.BEMACallback={"update_freq": 1}'  # averages every step; its buffers are saved in stateNNN/
NEVER_STOP = 'tests.callback_examples:StopAtStep={"step": 99}'
# the shared run's callbacks but the hook log (which keeps no state, so a resume refuses it)
RESUMABLE = (BEMA, NEVER_STOP)


def hook_log(path: Path) -> str:
    return f'tests.callback_examples:HookLog={{"path": "{path}"}}'


def train_args(base: Path, snapshot: Path, arm: str = "S4", callbacks=(), **extra) -> list[str]:
    """`trainer.train`'s arguments for the SMALL run of the embedded recipe."""
    args = {**SMALL, "model_name_or_path": base, "snapshot_path": snapshot, **extra}
    cli = ["--config", str(REPO / "configs/embedded.yaml"), "--arm", arm]
    for k, v in args.items():
        cli += [f"--{k}", *str(v).split()]
    return cli + (["--callbacks", *callbacks] if callbacks else [])


def train_cmd(base: Path, snapshot: Path, out: Path, arm: str = "S4", callbacks=(), **extra) -> list[str]:
    args = train_args(base, snapshot, arm, callbacks, output_dir=out, **extra)
    return [sys.executable, "-m", "trainer.train", *args]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def build(base: Path, snapshot: Path, out: Path) -> Path:
    """The shared run: SMALL, S4, BEMA + a stop that never fires + a hook log at <out>/../hooks.jsonl."""
    run(train_cmd(base, snapshot, out, callbacks=(*RESUMABLE, hook_log(out.parent / "hooks.jsonl"))))
    return out


def rows(path: Path, drop=("seconds",)) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for k in drop:
            row.pop(k, None)
        out.append(row)
    return out


def same_run(a: Path, b: Path) -> None:
    """Bitwise: steps.jsonl rows (timings aside), every eval file, the last weights, the last state (BEMA's
    buffers included) and BEMA's averaged model."""
    assert rows(a / "results/steps.jsonl") == rows(b / "results/steps.jsonl")
    for step in EVALUATED:
        name = f"results/eval_step{step:03d}.jsonl"
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for weights in ("step003/model.safetensors", "bema/model.safetensors"):
        x, y = load_file(a / weights), load_file(b / weights)
        assert x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x), weights
    (ta, ma), (tb, mb) = load_state(a / "state003"), load_state(b / "state003")
    assert any(k.startswith("callbacks/FrozenSafeBEMACallback#0/ema/") for k in ta)
    assert ta.keys() == tb.keys() and all(ta[k].equal(tb[k]) for k in ta)
    assert ma["task_sampler"] == mb["task_sampler"] and ma["rng"] == mb["rng"]
    bema = "FrozenSafeBEMACallback#0"  # (StopAtStep's entry may differ: its own step and flag)
    assert ma["callbacks"][bema] == mb["callbacks"][bema]

"""Upload a run, or chosen checkpoints of it, to one Hub model repo with the run directory's layout (SPEC §8).

    python -m cards.push runs/S2 --repo org/capgrpo-s2 [--steps 10,20] [--states] [--revision main] [--dry-run]

The repo gets `README.md` (run card), `run.json`, `results/`, the chosen `stepNNN/` (each with its card) and,
with --states, their `stateNNN/`, each verified first (a broken state is refused by name, never uploaded).
A symlink in any of them that leads outside the run directory is refused by name: nothing from outside the
run is ever sent.
Cards are regenerated first, with loading snippets that point at the repo. A dry run writes nothing: it
renders the cards in memory and prints the plan with the sizes the push would upload.

Upload method: `HfApi.upload_folder` with `allow_patterns` set to exactly the planned files. The installed
huggingface_hub (2.x) has no `upload_large_folder`; its `upload_folder` streams files through hf_xet,
splits a large folder into several commits and resumes an interrupted upload when re-run, which is what
`upload_large_folder` was for, and it takes a commit message, so the repo history says what each push was.

The token comes from `huggingface_hub.get_token()` (HF_TOKEN, else the Hub login) and is only ever passed to
the Hub client: never printed, logged or written.
"""

import argparse
import glob
import json
import logging
import os
import sys
from pathlib import Path
from typing import NamedTuple

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.utils import validate_repo_id

from cards.card import parse_steps, write_cards
from cards.checkpoint_card import checkpoint_card
from cards.run_card import run_card
from data.atomic import refused_write
from rundir.files import Run, state_dir, state_name, step_dir, step_name
from rundir.state import StateError, verify_state
from rundir.step import verify_step

logger = logging.getLogger(__name__)

ROOT_FILES = ("README.md", "run.json")
NEVER = (".gitattributes",)  # a nested one would change how the Hub stores that subtree (the seed's bug)


class OutsideRunError(ValueError):
    """A symlink in what a push sends that leads outside the run directory; the message names the link."""


class PlanItem(NamedTuple):
    local_path: Path
    path_in_repo: str


def _files(run_dir: Path, sub: str, pending: frozenset[Path] = frozenset()) -> list[PlanItem]:
    """Files under `sub`, with `pending` ones (a dry run's cards, not written) as if they were there."""
    found = {p for p in (run_dir / sub).rglob("*") if p.is_file()} | {
        p for p in pending if p.parent == run_dir / sub
    }
    return [PlanItem(p, p.relative_to(run_dir).as_posix()) for p in sorted(found) if p.name not in NEVER]


def refuse_outside_links(run_dir: Path | str, names: list[str]) -> None:
    """Every symlink among `names` (files and folders of the run) and below them must lead inside the run
    directory: upload_folder reads through links, so a link out would send bytes that are not the run's."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()  # the run directory itself may be a link
    for name in names:
        found = [run_dir / name]
        if found[0].is_dir():
            for parent, dirs, files in os.walk(found[0]):  # a linked folder is judged as a link, not entered
                found += [Path(parent) / n for n in (*dirs, *files)]
        for path in found:
            if path.is_symlink() and not (target := path.resolve()).is_relative_to(root):
                raise OutsideRunError(
                    f"{path}: a symlink to {target}, outside {run_dir}; a push sends nothing from outside the "
                    "run directory (copy the file in, or remove the link)"
                )


def _pushed(run: Run, steps: list[int] | None, states: bool) -> tuple[list[int], list[int]]:
    """(checkpoint steps, state steps) a push sends."""
    chosen = run.saved if steps is None else sorted(steps)
    return chosen, (run.states if steps is None else chosen) if states else []


def _pushed_names(run: Run, chosen: list[int], state_steps: list[int]) -> list[str]:
    return [*ROOT_FILES, "results", *(step_name(s) for s in chosen), *(state_name(s) for s in state_steps)]


def plan_push(
    run_dir: Path | str,
    repo_id: str,
    *,
    steps: list[int] | None = None,
    states: bool = False,
    revision: str = "main",
    pending: frozenset[Path] = frozenset(),
) -> list[PlanItem]:
    """Every file the push uploads and its path in the repo (the run directory's own layout); `pending`:
    files the push writes first (cards), planned even where they do not exist yet."""
    validate_repo_id(repo_id)
    if not revision:
        raise ValueError("revision must be a branch name, e.g. main")
    run = Run(run_dir)
    chosen, state_steps = _pushed(run, steps, states)
    if missing := [s for s in chosen if s not in run.saved]:
        raise FileNotFoundError(f"{run.dir}: no {step_name(missing[0])}/ (checkpoints: {run.saved})")
    if missing := [s for s in state_steps if s not in run.states]:
        raise FileNotFoundError(f"{run.dir}: no {state_name(missing[0])}/ (optimizer states: {run.states})")
    for name in ROOT_FILES:
        if not (run.dir / name).is_file() and run.dir / name not in pending:
            raise FileNotFoundError(f"{run.dir / name}: missing (run `python -m cards.card {run.dir}` first)")
    refuse_outside_links(run.dir, _pushed_names(run, chosen, state_steps))
    plan = [PlanItem(run.dir / name, name) for name in ROOT_FILES] + _files(run.dir, "results")
    for s in chosen:  # StateError naming the file: a broken checkpoint or state is never pushed
        others = ",".join(str(o) for o in run.saved if o != s)
        verify_step(step_dir(run.dir, s), way_on=f"push the others with --steps {others}" if others else "")
        plan += _files(run.dir, step_dir(run.dir, s).name, pending)
    for s in state_steps:
        verify_state(state_dir(run.dir, s))
        plan += _files(run.dir, state_dir(run.dir, s).name)
    return plan


def _commit_message(arm: str, plan: list[PlanItem]) -> str:
    dirs = {item.path_in_repo.split("/")[0] for item in plan if "/" in item.path_in_repo} - {"results"}
    dirs = sorted(dirs, key=lambda d: (d.startswith("state"), d))  # checkpoints, then optimizer states
    return f"capgrpo {arm}: run card, run.json, results/" + "".join(f", {d}/" for d in dirs)


def format_plan(
    repo_id: str,
    revision: str,
    commit_message: str,
    plan: list[PlanItem],
    sizes: dict[Path, int] | None = None,
) -> str:
    """`sizes` overrides what is on disk (a dry run's cards, rendered in memory)."""
    sizes = sizes or {}
    size = {i.local_path: sizes[i.local_path] if i.local_path in sizes else i.local_path.stat().st_size
            for i in plan}  # fmt: skip
    lines = [f"repo: {repo_id} (model)", f"revision: {revision}", f"commit message: {commit_message}"]
    lines += [f"{i.local_path} -> {i.path_in_repo} ({size[i.local_path]:,} bytes)" for i in plan]
    lines.append(f"{len(plan)} files, {sum(size[i.local_path] for i in plan):,} bytes in total")
    return "\n".join(lines)


def rendered_cards(
    run_dir: Path | str, control: Path | str | None, steps: list[int] | None, repo_id: str
) -> dict[Path, bytes]:
    """The cards `write_cards` would write, {path: bytes}, without writing them."""
    run = Run(run_dir)
    cards = {step_dir(run.dir, s) / "README.md": checkpoint_card(run.dir, s, repo_id=repo_id)
             for s in steps or run.saved}  # fmt: skip
    cards[run.dir / "README.md"] = run_card(run.dir, control, repo_id=repo_id)
    return {path: str(card).encode() for path, card in cards.items()}


def push(
    run_dir: Path | str,
    repo_id: str,
    *,
    steps: list[int] | None = None,
    states: bool = False,
    revision: str = "main",
    private: bool = False,
    dry_run: bool = False,
    control: Path | str | None = None,
    commit_message: str | None = None,
    api: HfApi | None = None,
) -> list[PlanItem]:
    """Regenerate the cards, print the plan, then (unless dry_run) create the repo and upload the plan.

    A dry run writes nothing and calls nothing: the cards are rendered in memory (their sizes go in the
    plan) and the ones a real push would rewrite are named on stderr."""
    validate_repo_id(repo_id)
    run = Run(run_dir)  # before any card is written: a card written into a linked stepNNN/ lands outside
    refuse_outside_links(run.dir, _pushed_names(run, *_pushed(run, steps, states)))
    if dry_run:
        cards = rendered_cards(run_dir, control, steps, repo_id)
        stale = [p for p, data in cards.items() if not p.is_file() or p.read_bytes() != data]
    else:
        write_cards(run_dir, control, steps=steps, repo_id=repo_id)  # what lands on the Hub is current
        cards = {}
    plan = plan_push(
        run_dir, repo_id, steps=steps, states=states, revision=revision, pending=frozenset(cards)
    )
    arm = json.loads((Path(run_dir) / "run.json").read_text())["arm"]
    message = commit_message or _commit_message(arm, plan)
    sizes = {p: len(data) for p, data in cards.items()}
    print(
        ("DRY RUN, nothing uploaded\n" if dry_run else "")
        + format_plan(repo_id, revision, message, plan, sizes)
    )
    if dry_run:
        if stale:
            print(f"dry run: a push would first regenerate {', '.join(map(str, stale))}", file=sys.stderr)
        return plan
    if (
        constants.HF_HUB_OFFLINE
    ):  # read at call time: the Makefile exports HF_HUB_OFFLINE=1 for everything else
        raise RuntimeError(
            "HF_HUB_OFFLINE=1 is set, and a push needs the network: run it with HF_HUB_OFFLINE=0"
        )
    token = get_token()
    if not token:
        raise RuntimeError("no Hugging Face token: set HF_TOKEN or log in with `hf auth login`")
    api = api or HfApi()
    api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True)
    if revision != "main":
        api.create_branch(repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
    logger.info("uploading %d files to %s@%s", len(plan), repo_id, revision)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=Path(run_dir),
        repo_type="model",
        revision=revision,
        allow_patterns=[glob.escape(item.path_in_repo) for item in plan],  # exactly the plan, nothing else
        commit_message=message,
        token=token,
    )
    print(f"pushed: {info.commit_url}")
    return plan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Upload a run (or chosen checkpoints) to one Hub model repo."
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repo", required=True, help="Hub repo id, org/name")
    parser.add_argument("--steps", help="only these checkpoints, e.g. 10,20 (default: every stepNNN/)")
    parser.add_argument("--states", action="store_true", help="also the stateNNN/ of those steps")
    parser.add_argument("--revision", default="main", help="branch to push to (created if missing)")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--control", type=Path, help="control run for the run card's paired comparison")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; no Hub calls")
    args = parser.parse_args(argv)
    try:
        push(
            args.run_dir,
            args.repo,
            steps=parse_steps(args.steps),
            states=args.states,
            revision=args.revision,
            private=args.private,
            dry_run=args.dry_run,
            control=args.control,
        )
    except (StateError, FileNotFoundError, ValueError, RuntimeError, OSError) as e:
        if os.environ.get("CAPGRPO_DEBUG", "") not in ("", "0"):
            raise
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            if (refused := refused_write(e)) is None:  # a network error or a bug: its traceback
                raise
            e = refused  # the cards a push writes first, on a read-only run directory
        print(f"error: {e}", file=sys.stderr)  # one line; CAPGRPO_DEBUG=1 for the traceback
        sys.exit(1)


if __name__ == "__main__":
    main()

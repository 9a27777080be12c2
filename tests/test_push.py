"""Hub push without network: the Hub client is an autospec of HfApi, so calls are checked against its signatures."""

import json
import logging
import re
from pathlib import Path
from unittest.mock import create_autospec

import pytest
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects
from test_cards import make_run

from cards.card import write_cards
from cards.push import main, plan_push, push
from rundir.state import StateError

TOKEN = "hf_capgrpoTESTtokenNEVERprinted0123456789"
REPO = "org/capgrpo-s2"


@pytest.fixture
def run(tmp_path):
    run = make_run(tmp_path)
    (run / "README.md").write_text("stale")  # push regenerates every card before planning
    return run


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # as `make push` runs it
    fake = create_autospec(HfApi, instance=True)
    fake.upload_folder.return_value.commit_url = f"https://huggingface.co/{REPO}/commit/abc"
    return fake


def expected_paths(run, steps, states):
    """The repo paths a push must upload, listed independently from the directory tree."""
    paths = {"README.md", "run.json"}
    paths |= {p.relative_to(run).as_posix() for p in (run / "results").iterdir()}
    for s in steps:
        paths |= {
            f"step{s:03d}/{f}" for f in ("README.md", "config.json", "model.safetensors", "manifest.json")
        }
    for s in states:  # what the state's own descriptor lists, plus the descriptor and its seal
        desc = json.loads((run / f"state{s:03d}" / "descriptor.json").read_text())
        files = [f["file"] for f in desc["shards"] + desc["files"]] + ["descriptor.json", "descriptor.sha256"]
        paths |= {f"state{s:03d}/{f}" for f in files}
    return paths


def uploaded_paths(run, upload_kwargs):
    """What upload_folder would pick from the folder with these arguments, by huggingface_hub's own filter."""
    files = [p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()]
    ignore = [*(upload_kwargs.get("ignore_patterns") or []), *DEFAULT_IGNORE_PATTERNS]
    return set(
        filter_repo_objects(files, allow_patterns=upload_kwargs["allow_patterns"], ignore_patterns=ignore)
    )


def test_plan_keeps_the_layout_and_honours_steps_and_states(run):
    write_cards(run)
    (run / "step005" / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    plan = plan_push(run, REPO, steps=[5, 6], states=True)
    assert {item.path_in_repo for item in plan} == expected_paths(run, [5, 6], [5, 6])
    assert all(item.local_path == run / item.path_in_repo for item in plan)
    everything = plan_push(run, REPO)
    assert {i.path_in_repo for i in everything} == expected_paths(run, [2, 4, 5, 6], [])
    with pytest.raises(FileNotFoundError, match="step003"):
        plan_push(run, REPO, steps=[3])
    with pytest.raises(FileNotFoundError, match="state004"):
        plan_push(run, REPO, steps=[4], states=True)  # state004/ was never kept
    with pytest.raises(ValueError):
        plan_push(run, "not a repo id")


def test_push_uploads_exactly_the_plan_to_the_repo_and_revision(run, api):
    plan = push(run, REPO, steps=[5, 6], states=True, revision="exp019", private=True, api=api)
    token = {"token": TOKEN, "repo_type": "model"}
    api.create_repo.assert_called_once_with(REPO, private=True, exist_ok=True, **token)
    api.create_branch.assert_called_once_with(REPO, branch="exp019", exist_ok=True, **token)
    kwargs = api.upload_folder.call_args.kwargs
    assert api.upload_folder.call_count == 1
    assert (kwargs["repo_id"], kwargs["revision"], kwargs["folder_path"]) == (REPO, "exp019", run)
    assert (kwargs["repo_type"], kwargs["token"]) == ("model", TOKEN)
    message = "capgrpo S2: run card, run.json, results/, step005/, step006/, state005/, state006/"
    assert kwargs["commit_message"] == message
    files = expected_paths(run, [5, 6], [5, 6])
    assert uploaded_paths(run, kwargs) == files == {i.path_in_repo for i in plan}
    card = ModelCard.load(run / "step005" / "README.md")
    assert f'from_pretrained("{REPO}", subfolder="step005"' in card.text  # regenerated for the Hub
    run_card = ModelCard.load(run / "README.md")
    assert (
        run_card.data.model_name == "capgrpo-S2" and f'.from_pretrained("{REPO}", subfolder=' in run_card.text
    )


def test_push_to_main_creates_no_branch(run, api):
    push(run, REPO, api=api)
    api.create_branch.assert_not_called()
    assert api.upload_folder.call_args.kwargs["revision"] == "main"


def tree_bytes(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_dry_run_writes_nothing_and_prints_the_plan_a_push_uploads(run, api, capsys):
    before = tree_bytes(run)
    main([str(run), "--repo", REPO, "--steps", "6", "--states", "--dry-run"])
    dry, err = capsys.readouterr()
    assert tree_bytes(run) == before  # the stale cards too: a dry run changes nothing
    assert "a push would first regenerate" in err and str(run / "README.md") in err
    assert dry.startswith(f"DRY RUN, nothing uploaded\nrepo: {REPO} (model)\nrevision: main\n")
    push(run, REPO, steps=[6], states=True, api=api)
    real = capsys.readouterr().out
    assert real.startswith(dry.removeprefix("DRY RUN, nothing uploaded\n"))  # same plan, sizes included
    plan = plan_push(run, REPO, steps=[6], states=True)
    for item in plan:  # the sizes printed are those of the files as uploaded
        assert f"{item.local_path} -> {item.path_in_repo} ({item.local_path.stat().st_size:,} bytes)" in dry
    assert real.endswith(f"pushed: https://huggingface.co/{REPO}/commit/abc\n")


def test_a_broken_state_is_never_planned(run, api):
    shard = run / "state006" / "shard-00000-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(StateError, match=r"state006/shard-00000-of-00001\.safetensors: size .*truncated"):
        push(run, REPO, steps=[6], states=True, dry_run=True)
    with pytest.raises(StateError, match="state006"):
        push(run, REPO, steps=[6], states=True, api=api)
    assert not api.method_calls
    push(run, REPO, steps=[5], states=True, api=api)  # the other state is fine


def test_a_broken_checkpoint_is_never_planned(run, api, capsys):
    """Issue 30, case 2: `make push DRY_RUN=1` planned a truncated step003/model.safetensors."""
    weights = run / "step006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-3])
    with pytest.raises(StateError, match=r"step006/model\.safetensors: size .*truncated.*--steps 2,4,5"):
        push(run, REPO, dry_run=True)
    assert "step006" not in capsys.readouterr().out  # no plan printed
    push(run, REPO, steps=[2, 4, 5], api=api)


def test_cli_refusal_is_one_line(run, capsys):
    shard = run / "state006" / "shard-00000-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    before = tree_bytes(run)
    with pytest.raises(SystemExit) as exit:
        main([str(run), "--repo", REPO, "--steps", "6", "--states", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        exit.value.code == 1
        and err[-1].startswith(f"error: {shard}: size ")
        and "Traceback" not in "\n".join(err)
    )
    assert tree_bytes(run) == before


def test_token_is_never_printed_logged_or_written(run, api, capsys, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    push(run, REPO, states=True, revision="dev", api=api)
    main([str(run), "--repo", REPO, "--dry-run"])
    assert api.upload_folder.call_args.kwargs["token"] == TOKEN  # it was used ...
    out, err = capsys.readouterr()
    assert TOKEN not in out + err + caplog.text  # ... and never shown
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path


def test_missing_token_stops_before_any_hub_call(run, api, monkeypatch):
    monkeypatch.setattr("cards.push.get_token", lambda: None)
    with pytest.raises(RuntimeError, match="HF_TOKEN"):
        push(run, REPO, api=api)
    assert not api.method_calls


def test_offline_mode_stops_before_any_hub_call(run, api, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE=0"):
        push(run, REPO, api=api)
    assert not api.method_calls


def _link_outside(run, outside, where):
    """A symlink in the run whose target is outside it (issue 61, class 3); returns the link."""
    outside.mkdir()
    if where == "file":
        (outside / "secret.txt").write_text("not the run's\n")
        link = run / "results" / "notes.jsonl"
        link.symlink_to(outside / "secret.txt")
    elif where == "folder":
        (outside / "private").mkdir()
        (outside / "private" / "key.txt").write_text("not the run's\n")
        link = run / "step006" / "extra"
        link.symlink_to(outside / "private", target_is_directory=True)
    elif where == "checkpoint":  # the whole stepNNN/ elsewhere
        link = run / "step006"
        link.rename(outside / "step006")
        link.symlink_to(outside / "step006", target_is_directory=True)
    elif where == "run.json":
        link = run / "run.json"
        link.rename(outside / "run.json")
        link.symlink_to(outside / "run.json")
    else:  # a state's shard kept elsewhere (its bytes pass verification), through a relative link
        link = run / "state006" / "shard-00000-of-00001.safetensors"
        link.rename(outside / link.name)
        link.symlink_to(Path("..") / ".." / outside.name / link.name)
    return link


@pytest.mark.parametrize("where", ["file", "folder", "checkpoint", "run.json", "state"])
def test_a_symlink_to_outside_the_run_is_refused_by_name_and_nothing_is_sent(
    where, run, api, tmp_path, capsys
):
    """Issue 61, class 3: `make push DRY_RUN=1` listed a link to outside the run, and upload_folder follows it."""
    link = _link_outside(run, tmp_path / "outside", where)
    before = tree_bytes(run)
    with pytest.raises(SystemExit) as exit_:
        main([str(run), "--repo", REPO, "--steps", "6", "--states", "--dry-run"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exit_.value.code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {link}: "), lines
    assert "outside" in lines[0] and "DRY RUN" not in out
    with pytest.raises(ValueError, match=re.escape(str(link))):
        push(run, REPO, steps=[6], states=True, api=api)
    assert not api.method_calls  # no repo made, not a byte sent
    assert tree_bytes(run) == before  # the stale card not rewritten either


def test_a_symlink_inside_the_run_is_pushed_as_its_file(run, api):
    (run / "results" / "alias.jsonl").symlink_to("steps.jsonl")  # relative, to a file of the run
    plan = push(run, REPO, steps=[6], api=api)
    assert "results/alias.jsonl" in {item.path_in_repo for item in plan}

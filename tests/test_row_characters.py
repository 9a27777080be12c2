"""Every writer/reader pair of run rows keeps any string whole (issue 49): eval rows, steps.jsonl rows and
re-graded rows with the Unicode line separators, C0/C1 controls and a lone surrogate in their strings."""

import json

import pytest

from data.atomic import append_line
from rewards.grader import GraderPool
from rundir.files import Run, eval_path, read_jsonl, steps_path, write_eval
from rundir.regrade import regrade

# what str.splitlines() breaks on besides "\n" (U+2028/9, NEL, VT, FF, FS/GS/RS, CR), every other C0 and C1
# control, DEL, and a lone surrogate (a str, not valid UTF-8 on its own)
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
CONTROLS = "".join(map(chr, range(0x20))) + "\x7f" + "".join(map(chr, range(0x80, 0xA0)))
HARD = f"so{LINE_BREAKS}x{CONTROLS}y\ud800 \\boxed{{4}}\n"


def _row(sample: int, completion: str) -> dict:
    return {"step": 3, "set": "fixed32", "task_id": "t1", "sample": sample, "seed": 7, "outcome": "correct",
            "answer": "4", "reference": "4", "completion_tokens": 9, "cap": 64, "completion": completion}  # fmt: skip


@pytest.fixture
def run(tmp_path):
    meta = {"arm": "S2", "policy_id": "p", "gate": "v1", "grader_version": "v1",
            "eval": {"cap": 64, "samples": {"fixed32": 2}}, "eval_sets": {"fixed32": ["t1"]}}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(meta))
    return tmp_path


def test_eval_rows_round_trip_any_string(run):
    rows = [_row(0, HARD), _row(1, LINE_BREAKS)]
    path = write_eval(run, 3, rows)
    assert path.read_bytes().isascii() and path.read_bytes().count(b"\n") == 2  # one line a row, anywhere
    assert [r["completion"] for r in read_jsonl(path)] == [HARD, LINE_BREAKS]
    assert [r["completion"] for _, r in Run(run).rows(3)] == [HARD, LINE_BREAKS]
    assert Run(run).score(3, "fixed32").accuracy == 1.0
    assert write_eval(run, 3, rows) == path  # the same rows again: the same bytes, kept


def test_rows_written_raw_by_earlier_versions_are_read(run):
    """Files written with ensure_ascii=False keep U+2028 and friends raw: every reader takes them."""
    path = eval_path(run, 3)
    path.parent.mkdir()
    path.write_text(
        "".join(json.dumps(_row(i, LINE_BREAKS + "\u00e9"), ensure_ascii=False) + "\n" for i in (0, 1))
    )
    assert "\u2028" in path.read_text()
    assert [r["sample"] for _, r in Run(run).rows(3)] == [0, 1]
    assert set(Run(run).table(3)["fixed32"]) == {("t1", 0), ("t1", 1)}


def test_steps_rows_round_trip_any_string(run):
    """steps.jsonl as trainer/steps_log.py appends it (json.dumps, append_line) and as Run reads it."""
    for step in (1, 2):
        append_line(steps_path(run), json.dumps({"step": step, "note": HARD}))
    assert [r["note"] for r in Run(run).steps] == [HARD, HARD]


def test_regraded_rows_round_trip_any_string(run):
    write_eval(run, 3, [_row(0, HARD), _row(1, "\\boxed{5}" + LINE_BREAKS)])
    with GraderPool(workers=1, grader="v2") as pool:
        regrade(run, "v2", pool=pool)
    out = run / "results/regrade-v2/eval_step003.jsonl"
    rows = read_jsonl(out)
    assert out.read_bytes().isascii() and [r["completion"] for r in rows] == [
        HARD,
        "\\boxed{5}" + LINE_BREAKS,
    ]
    assert [r["outcome"] for r in rows] == ["correct", "wrong"]

import hashlib
import json
from pathlib import Path

import pytest

from data.snapshot import (
    COLUMNS,
    SnapshotError,
    convert_math_jsonl,
    load_snapshot,
    main,
    math_task_id,
    snapshot_sha256,
    snapshot_to_math_jsonl,
    write_snapshot,
)

MATH500 = Path(__file__).resolve().parents[2] / "shared" / "data" / "math500.jsonl"  # SPEC §9
needs_math500 = pytest.mark.skipif(not MATH500.exists(), reason="shared MATH500 data not present")


def task(i: int, **fields) -> dict:
    return {"id": f"t{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)} | fields


def write_raw(tmp_path: Path, text: str, name: str = "bad.tasks.json") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def document(tasks) -> str:
    return json.dumps({"format": "capgrpo-tasks-v1", "tasks": tasks})


def test_math_task_id_follows_the_rule():
    problem = "Find $x$ if $2^x = 8$ — ünïcode."
    digest = hashlib.sha256(problem.encode("utf-8")).hexdigest()
    assert math_task_id(problem) == "math-" + digest[:12]
    assert math_task_id(problem + " ") != math_task_id(problem)


@needs_math500
def test_math500_round_trip_keeps_ids_and_every_field(tmp_path):
    rows = [json.loads(line) for line in MATH500.read_text(encoding="utf-8").splitlines()]
    sha_a = convert_math_jsonl(MATH500, tmp_path / "a.tasks.json")
    sha_b = convert_math_jsonl(MATH500, tmp_path / "b.tasks.json")
    assert sha_a == sha_b == snapshot_sha256(tmp_path / "a.tasks.json")

    ds = load_snapshot(tmp_path / "a.tasks.json", expected_sha256=sha_a)
    assert ds.column_names == list(COLUMNS)
    assert ds["id"] == [math_task_id(row["problem"]) for row in rows]
    assert ds["source_id"] == [row["unique_id"] for row in rows]
    for name in ("problem", "solution", "answer", "subject", "level"):
        assert ds[name] == [row[name] for row in rows], name

    snapshot_to_math_jsonl(tmp_path / "a.tasks.json", tmp_path / "back.jsonl")
    back = [json.loads(line) for line in (tmp_path / "back.jsonl").read_text(encoding="utf-8").splitlines()]
    assert back == rows
    # Converting the round-tripped file gives the very same snapshot bytes.
    assert convert_math_jsonl(tmp_path / "back.jsonl", tmp_path / "c.tasks.json") == sha_a


def test_write_is_deterministic_utf8_and_loads_back(tmp_path):
    tasks = [task(0, subject="Álgebra", level=3, solution="1 + 1 = \\boxed{2}"), task(1, extra={"k": 1})]
    sha = write_snapshot(tasks, tmp_path / "x.tasks.json")
    data = (tmp_path / "x.tasks.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha
    assert data.endswith(b"]}\n") and "Álgebra".encode() in data
    # Key order of the input does not matter; the extra field is kept in the file.
    reordered = [dict(reversed(list(t.items()))) for t in tasks]
    assert write_snapshot(reordered, tmp_path / "y.tasks.json") == sha
    assert json.loads(data)["tasks"][1]["extra"] == {"k": 1}

    ds = load_snapshot(tmp_path / "x.tasks.json")
    assert ds[0] == {
        "id": "t0",
        "problem": "What is 0 + 1?",
        "answer": "1",
        "subject": "Álgebra",
        "level": 3,
        "solution": "1 + 1 = \\boxed{2}",
        "source_id": None,
    }
    assert ds[1]["subject"] is None and ds[1]["level"] is None and ds[1]["solution"] is None


def test_schema_is_fixed_when_optional_fields_are_all_missing(tmp_path):
    write_snapshot([task(0)], tmp_path / "a.tasks.json")
    write_snapshot([task(0, subject="s", level=1, solution="x", source_id="u")], tmp_path / "b.tasks.json")
    assert (
        load_snapshot(tmp_path / "a.tasks.json").features == load_snapshot(tmp_path / "b.tasks.json").features
    )


def test_loader_accepts_a_bare_list_and_math_level_strings(tmp_path):
    path = write_raw(tmp_path, json.dumps([task(0, level="Level 4"), task(1, level="Level ?")]))
    assert load_snapshot(path)["level"] == [4, None]


def test_sha256_mismatch_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "pinned.tasks.json"
    sha = write_snapshot([task(0)], path)
    assert len(load_snapshot(path, expected_sha256=sha)) == 1
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path, expected_sha256="0" * 64)
    assert str(path) in str(err.value) and "0" * 64 in str(err.value) and sha in str(err.value)


# (file content, fragments the error must contain besides the file name)
MALFORMED = {
    "bad json": ('{"format": "capgrpo-tasks-v1",\n "tasks": [}', ["line 2", "column"]),
    "top level string": ('"tasks"', ["top level", "str"]),
    "wrong format": (json.dumps({"format": "other", "tasks": []}), ["'format'", "other"]),
    "no tasks field": (json.dumps({"format": "capgrpo-tasks-v1"}), ["'tasks'"]),
    "tasks not a list": (document({"a": 1}), ["'tasks'", "list"]),
    "empty": (document([]), ["no tasks"]),
    "task not an object": (document([task(0), "x"]), ["task 1", "object"]),
    "missing answer": (document([task(0), {"id": "t1", "problem": "p"}]), ["task 1", "'t1'", "'answer'"]),
    "missing id": (document([{"problem": "p", "answer": "a"}]), ["task 0", "'id'"]),
    "answer not a string": (document([task(0), task(1, answer=2)]), ["task 1", "'t1'", "'answer'", "int"]),
    "empty problem": (document([task(0, problem="  ")]), ["task 0", "'t0'", "'problem'", "empty"]),
    "empty answer": (document([task(0, answer="")]), ["task 0", "'t0'", "'answer'", "empty"]),
    "level bool": (document([task(0), task(1, level=True)]), ["task 1", "'t1'", "'level'"]),
    "level float": (document([task(0, level=2.5)]), ["task 0", "'level'"]),
    "subject not a string": (document([task(0, subject=["x"])]), ["task 0", "'subject'", "list"]),
    "duplicate id": (
        document([task(0), task(1), task(2, id="t0")]),
        ["'id'", "duplicate", "'t0'", "tasks 0 and 2"],
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_snapshot_is_rejected_naming_file_task_and_field(tmp_path, case):
    text, fragments = MALFORMED[case]
    path = write_raw(tmp_path, text)
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_non_utf8_file_is_rejected(tmp_path):
    path = tmp_path / "latin1.tasks.json"
    path.write_bytes(b'[{"id": "t0", "problem": "caf\xe9?", "answer": "1"}]')  # Latin-1, not UTF-8
    with pytest.raises(SnapshotError, match="not UTF-8 at byte 29"):
        load_snapshot(path)


def test_writer_validates_and_leaves_an_existing_file_untouched(tmp_path):
    path = tmp_path / "x.tasks.json"
    write_snapshot([task(0)], path)
    before = path.read_bytes()
    with pytest.raises(SnapshotError, match="tasks 0 and 1"):
        write_snapshot([task(0), task(1, id="t0")], path)
    with pytest.raises(SnapshotError, match=r"task 0 \(id 't0'\): not JSON-serialisable"):
        write_snapshot([task(0, extra=float("nan"))], path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tasks.json"]


@pytest.mark.parametrize(
    ("lines", "fragments"),
    [
        (['{"problem": "p", "answer": "1"}', "{oops"], ["line 2", "invalid JSON"]),
        (['{"problem": "p", "answer": "1"}', '{"problem": "q"}'], ["line 2", "'answer'"]),
        (['{"problem": "p", "answer": "1", "unique_id": 7}'], ["line 1", "'unique_id'"]),
        (['{"problem": "p", "answer": "1"}', "", '{"problem": "p", "answer": "2"}'], ["lines 1 and 3"]),
    ],
)
def test_convert_errors_name_file_and_line(tmp_path, lines, fragments):
    src = tmp_path / "src.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SnapshotError) as err:
        convert_math_jsonl(src, tmp_path / "out.tasks.json")
    assert str(src) in str(err.value)
    for fragment in fragments:
        assert fragment in str(err.value)
    assert not (tmp_path / "out.tasks.json").exists()


def test_cli_convert_sha256_and_check(tmp_path, capsys):
    src = tmp_path / "src.jsonl"
    src.write_text('{"problem": "1+1?", "answer": "2", "level": "Level 1"}\n', encoding="utf-8")
    dst = tmp_path / "out.tasks.json"
    assert main(["convert", str(src), str(dst)]) == 0
    sha = capsys.readouterr().out.strip()
    assert sha == snapshot_sha256(dst)
    assert main(["sha256", str(dst)]) == 0
    assert capsys.readouterr().out.strip() == sha
    assert main(["check", str(dst), "--sha256", sha]) == 0
    assert capsys.readouterr().out.strip() == f"1 tasks, sha256 {sha}"
    assert main(["check", str(dst), "--sha256", "f" * 64]) == 1
    assert str(dst) in capsys.readouterr().err


def test_package_exports_resolve():
    import data

    modules = {name: getattr(data, name).__module__ for name in ("load_snapshot", "TaskSampler", "EvalSets")}
    assert modules == {
        "load_snapshot": "data.snapshot",
        "TaskSampler": "data.sampler",
        "EvalSets": "data.eval_sets",
    }
    assert all(hasattr(data, name) for name in data.__all__)

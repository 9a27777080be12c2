"""Task snapshots (SPEC §9): a pinned `*.tasks.json` file of math tasks, loaded as a `datasets.Dataset`.

File format (what `write_snapshot` writes, byte for byte deterministic):

    {"format": "capgrpo-tasks-v1", "tasks": [
    {"id": "math-…", "problem": "…", "answer": "…", "subject": …, "level": …, "solution": …, "source_id": …},
    …
    ]}

One task per line so that snapshots diff and grep well. The loader also accepts a bare JSON list of
tasks, the shape of snapshots made outside this project. Fields beyond the known ones are kept by the
writer and ignored by the loader (a pinned file cannot be edited without changing its sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import datasets

from data.atomic import write_atomic

FORMAT = "capgrpo-tasks-v1"
REQUIRED_FIELDS = ("id", "problem", "answer")
OPTIONAL_FIELDS = ("subject", "level", "solution", "source_id")
COLUMNS = REQUIRED_FIELDS + OPTIONAL_FIELDS
MATH_FIELDS = ("problem", "solution", "answer", "subject", "level")  # in MATH's own order, `unique_id` aside
FEATURES = datasets.Features(
    {name: datasets.Value("int64" if name == "level" else "string") for name in COLUMNS}
)
# MATH spells levels "Level 3"; a few MATH train problems have "Level ?", which means unknown.
_MATH_LEVEL = re.compile(r"Level (\d+|\?)")


class SnapshotError(ValueError):
    """A malformed snapshot or MATH JSONL file; the message names the file, the task and the field."""


def math_task_id(problem: str) -> str:
    """Task id rule for MATH problems: `math-` + the first 12 hex digits of sha256(problem)."""
    return "math-" + hashlib.sha256(problem.encode("utf-8")).hexdigest()[:12]


def snapshot_sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _where(path: str | os.PathLike, index: int, task: object) -> str:
    task_id = task.get("id") if isinstance(task, Mapping) else None
    known = f" (id {task_id!r})" if isinstance(task_id, str) else ""
    return f"{path}: task {index}{known}"


def _normalise(record: object, where: str, fields: Iterable[str] = COLUMNS) -> dict:
    """Check one task against the snapshot rules and return it with every known field present."""
    if not isinstance(record, Mapping):
        raise SnapshotError(f"{where}: expected a JSON object, got {type(record).__name__}")
    out = dict(record)
    for name in fields:
        value = record.get(name)
        if name in REQUIRED_FIELDS:
            if name not in record:
                raise SnapshotError(f"{where}: missing required field {name!r}")
            if not isinstance(value, str):
                raise SnapshotError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
            if not value.strip():
                raise SnapshotError(f"{where}: field {name!r} is empty")
        elif name == "level":
            if isinstance(value, str) and (match := _MATH_LEVEL.fullmatch(value.strip())):
                value = None if match.group(1) == "?" else int(match.group(1))
            # bool is an int subclass in Python; a boolean level is a broken file, not level 0/1.
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SnapshotError(
                    f"{where}: field 'level' must be an integer, null or 'Level N', got {value!r}"
                )
        elif value is not None and not isinstance(value, str):
            raise SnapshotError(
                f"{where}: field {name!r} must be a string or null, got {type(value).__name__}"
            )
        out[name] = value
    return out


def _validate(tasks: object, path: str | os.PathLike) -> list[dict]:
    """The rules shared by the writer and the loader: a non-empty list of valid tasks with unique ids."""
    if not isinstance(tasks, list):
        raise SnapshotError(f"{path}: 'tasks' must be a JSON list, got {type(tasks).__name__}")
    if not tasks:
        raise SnapshotError(f"{path}: the snapshot has no tasks")
    normalised, first_index = [], {}
    for index, task in enumerate(tasks):
        record = _normalise(task, _where(path, index, task))
        earlier = first_index.setdefault(record["id"], index)
        if earlier != index:
            raise SnapshotError(
                f"{path}: field 'id': duplicate id {record['id']!r} at tasks {earlier} and {index}"
            )
        normalised.append(record)
    return normalised


def _atomic_write(path: str | os.PathLike, data: bytes) -> str:
    write_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def write_snapshot(tasks: list[dict], path) -> str:
    """Validate `tasks` and write them as a snapshot at `path`; returns the file's sha256 (hex)."""
    lines = []
    for index, task in enumerate(_validate(tasks, path)):
        extras = sorted(set(task) - set(COLUMNS))
        ordered = {name: task[name] for name in (*COLUMNS, *extras)}
        try:
            lines.append(json.dumps(ordered, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise SnapshotError(f"{_where(path, index, task)}: not JSON-serialisable: {err}") from None
    text = f'{{"format": "{FORMAT}", "tasks": [\n' + ",\n".join(lines) + "\n]}\n"
    return _atomic_write(path, text.encode("utf-8"))


def load_snapshot(path, expected_sha256: str | None = None) -> datasets.Dataset:
    """Load and validate a snapshot; with `expected_sha256`, refuse a file whose sha256 differs."""
    data = Path(path).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and actual != expected_sha256.lower():
        raise SnapshotError(f"{path}: sha256 mismatch: expected {expected_sha256}, actual {actual}")
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SnapshotError(f"{path}: not UTF-8 at byte {err.start}") from None
    except json.JSONDecodeError as err:
        raise SnapshotError(
            f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None
    if isinstance(document, dict):
        if document.get("format") != FORMAT:
            raise SnapshotError(f"{path}: field 'format' must be {FORMAT!r}, got {document.get('format')!r}")
        if "tasks" not in document:
            raise SnapshotError(f"{path}: missing field 'tasks'")
        tasks = document["tasks"]
    elif isinstance(document, list):
        tasks = document
    else:
        raise SnapshotError(
            f"{path}: top level must be a JSON object or list of tasks, got {type(document).__name__}"
        )
    records = _validate(tasks, path)
    return datasets.Dataset.from_dict(
        {name: [record[name] for record in records] for name in COLUMNS}, features=FEATURES
    )


def convert_math_jsonl(src, dst) -> str:
    """MATH-format JSONL -> snapshot with MATH ids; `unique_id` becomes `source_id`. Returns the sha256."""
    return write_snapshot(read_math_jsonl(src), dst)


def read_math_jsonl(src) -> list[dict]:
    """The tasks of a MATH-format JSONL file (MATH ids, `unique_id` as `source_id`), checked line by line."""
    tasks, first_line = [], {}
    with open(src, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{src}: line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SnapshotError(f"{where}: invalid JSON at column {err.colno}: {err.msg}") from None
            row = _normalise(row, where, fields=MATH_FIELDS)
            source_id = row.get("unique_id")
            if source_id is not None and not isinstance(source_id, str):
                raise SnapshotError(
                    f"{where}: field 'unique_id' must be a string, got {type(source_id).__name__}"
                )
            task_id = math_task_id(row["problem"])
            earlier = first_line.setdefault(task_id, lineno)
            if earlier != lineno:
                raise SnapshotError(
                    f"{src}: field 'problem': the same problem on lines {earlier} and {lineno}"
                )
            tasks.append({"id": task_id, "source_id": source_id} | {k: row[k] for k in MATH_FIELDS})
    return tasks


def snapshot_to_math_jsonl(path, dst) -> str:
    """Snapshot -> MATH-format JSONL (null fields left out); returns the sha256 of the written file."""
    lines = []
    for task in load_snapshot(path):
        row = {"unique_id": task["source_id"]} | {k: task[k] for k in MATH_FIELDS}
        lines.append(json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False) + "\n")
    return _atomic_write(dst, "".join(lines).encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data.snapshot", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="MATH-format JSONL -> snapshot; prints its sha256")
    convert.add_argument("src")
    convert.add_argument("dst")
    digest = commands.add_parser("sha256", help="print a snapshot's sha256")
    digest.add_argument("path")
    check = commands.add_parser("check", help="validate a snapshot; prints the task count and sha256")
    check.add_argument("path")
    check.add_argument("--sha256", dest="expected", help="refuse unless the file has this sha256")
    args = parser.parse_args(argv)
    try:
        if args.command == "convert":
            print(convert_math_jsonl(args.src, args.dst))
        elif args.command == "sha256":
            print(snapshot_sha256(args.path))
        else:
            print(
                f"{len(load_snapshot(args.path, args.expected))} tasks, sha256 {snapshot_sha256(args.path)}"
            )
    except (SnapshotError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

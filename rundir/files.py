"""The files of a run directory (docs/CONTRACTS.md), in one place: names, rows, and accuracy per set and step.

Cards, `make compare`, the checkpoint ranking of run.json's `best_step` and the evaluation summaries of
steps.jsonl all read a run through this module; the trainer writes eval rows through `write_eval`.
It imports neither `trainer` nor `cards`, so both (and `analysis`) may use it.
"""

import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from data.atomic import write_atomic
from data.eval_sets import HELDOUT
from rewards.outcome import Outcome
from rundir import archive
from rundir.at_k import at_k
from rundir.errors import RunFileError  # rundir.files.RunFileError, as docs/CONTRACTS.md names it

STEP_DIR = re.compile(r"step(\d{3,})")
STATE_DIR = re.compile(r"state(\d{3,})")
EVAL_FILE = re.compile(r"eval_step(\d{3,})(?:_cap(\d+))?\.jsonl")  # no _capCCCC: the training-time cap
ROW_FIELDS = tuple(
    "step set task_id sample seed outcome answer reference completion_tokens cap completion".split()
)
READ_FIELDS = tuple(
    f for f in ROW_FIELDS if f not in ("answer", "reference", "completion")
)  # what readers use
RUN_FIELDS = ("arm", "policy_id", "gate", "grader_version", "eval")
OUTCOMES = frozenset(o.value for o in Outcome)


# --- names ------------------------------------------------------------------------------------------------
def step_name(step: int) -> str:
    """`step003`: the stepNNN/ weights of a step (and how cards and the Hub repo name them)."""
    return f"step{step:03d}"


def state_name(step: int) -> str:
    return f"state{step:03d}"


def step_dir(run_dir: Path | str, step: int) -> Path:
    return Path(run_dir) / step_name(step)


def state_dir(run_dir: Path | str, step: int) -> Path:
    return Path(run_dir) / state_name(step)


def steps_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / "results" / "steps.jsonl"


def eval_path(run_dir: Path | str, step: int, cap_suffix: int | None = None) -> Path:
    suffix = "" if cap_suffix is None else f"_cap{cap_suffix:04d}"
    return Path(run_dir) / "results" / f"eval_step{step:03d}{suffix}.jsonl"


# --- rows -------------------------------------------------------------------------------------------------
def read_jsonl(path: Path | str, *, torn_tail: str = "refuse") -> list[dict]:
    """The rows of a JSON-lines file. A last line without its newline that does not parse is what a crash
    during an append leaves (a torn row): `torn_tail="drop"` (resume, which redoes that step) leaves it out,
    "refuse" names it and the way on. An unparseable row anywhere else is always refused."""
    return [row for _, row in _numbered_rows(Path(path), torn_tail)]


def _numbered_rows(path: Path, torn_tail: str = "refuse") -> list[tuple[int, dict]]:
    text = archive.read_bytes(path).decode(errors="replace")  # a published run's rows are in its archive
    # only "\n" ends a row: str.splitlines() also breaks on U+2028, U+0085, \x1c… which JSON keeps raw in strings
    lines, rows, complete = text.split("\n"), [], text.endswith("\n")
    if complete:
        lines.pop()  # the empty string after the last newline
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            if i < len(lines) or complete:
                raise RunFileError(f"{path}:{i}: not valid JSON ({e.msg})") from None
            if torn_tail == "drop":
                break
            if path.name == "steps.jsonl":  # appended row by row: a crash can tear its last row
                raise RunFileError(
                    f"{path}:{i}: torn last row (what an append interrupted by a crash or a full disk leaves): "
                    "resume the run with --resume to redo its step, or delete that line"
                ) from None
            raise RunFileError(  # other row files are written whole (atomically): this is damage
                f"{path}:{i}: torn last row in a file written whole: restore it from a copy, or move it away "
                "and evaluate the step again (make eval RUN=<run> STEPS=<step>)"
            ) from None
    return rows


def write_eval(
    run_dir, step: int, rows: Sequence[Mapping], cap_suffix: int | None = None, *, overwrite: bool = False
) -> Path:
    """Write the rows atomically; an existing file with the same bytes is kept.

    An existing file with other rows is replaced only with `overwrite` (a resumed run redoing a step) and
    only when its cap is the same: a file from another cap is never overwritten.
    """
    path = eval_path(run_dir, step, cap_suffix)
    if not rows:
        raise ValueError(f"{path}: no rows to write")
    for row in rows:
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing or row["step"] != step:
            raise ValueError(
                f"{path}: row {row.get('set')}/{row.get('task_id')}/{row.get('sample')} "
                f"has step {row.get('step')!r} (want {step}) or lacks {missing}"
            )
    caps = {row["cap"] for row in rows}
    if len(caps) != 1 or (cap_suffix is not None and caps != {cap_suffix}):
        raise ValueError(f"{path}: rows have caps {sorted(caps)}; one cap matching the file name is required")
    data = "".join(
        json.dumps({k: row[k] for k in ROW_FIELDS}, allow_nan=False) + "\n"  # ASCII: any str round-trips
        for row in rows
    ).encode()
    if path.exists():
        old = path.read_bytes()
        if old == data:
            return path
        old_cap = json.loads(old.split(b"\n", 1)[0] or b"{}").get("cap")
        if not overwrite or old_cap != rows[0]["cap"]:
            raise FileExistsError(f"{path} exists with different rows (cap {old_cap}); not overwriting it")
    return write_atomic(path, data)


# --- accuracy ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One graded eval sample, as the paired comparison uses it."""

    outcome: Outcome
    tokens: int
    seed: int
    cap: int


Table = dict[str, dict[tuple[str, int], Sample]]  # eval set -> (task_id, sample index) -> graded sample


@dataclass(frozen=True)
class SetScore:
    """Outcome counts of one eval set (at one step and cap, possibly pooled over seeds)."""

    outcomes: dict[str, int]  # every Outcome value, 0 when absent (Outcome members index it too)
    problems: int
    median_tokens: float | None

    @classmethod
    def of(cls, outcomes: Iterable, task_ids: Iterable[str] = (), tokens: Iterable[int] = ()) -> "SetScore":
        counts = Counter(Outcome(o) for o in outcomes)  # an unknown outcome raises ValueError
        tokens = [t for t in tokens if isinstance(t, int)]
        return cls(
            {o.value: counts[o] for o in Outcome},
            len(set(task_ids)),
            statistics.median(tokens) if tokens else None,
        )

    @property
    def n(self) -> int:
        return sum(self.outcomes.values())

    @property
    def graded(self) -> int:
        """Denominator of accuracy: indeterminate samples are excluded (SPEC §2)."""
        return self.n - self.outcomes[Outcome.INDETERMINATE]

    def rate(self, outcome: Outcome) -> float:
        """Share of graded samples; NaN when nothing was graded."""
        return self.outcomes[outcome] / self.graded if self.graded else math.nan

    @property
    def accuracy(self) -> float:
        return self.rate(Outcome.CORRECT)

    @property
    def finished_accuracy(self) -> float:
        """Correct among the answers that ended within the cap (correct, wrong, format-rejected): what a policy
        that makes the model finish can convert (issue 62); NaN when none ended."""
        finished = self.graded - self.outcomes[Outcome.TRUNCATED]
        return self.outcomes[Outcome.CORRECT] / finished if finished else math.nan

    @property
    def samples(self) -> int:
        return self.n // max(self.problems, 1)

    def summary(self) -> dict:
        """steps.jsonl's `eval.<set>` object: accuracy (None if nothing was gradeable), n, outcome counts."""
        return {
            "accuracy": None if not self.graded else self.accuracy,
            "n": self.n,
            "outcomes": self.outcomes,
        }


def score_sets(rows: Iterable[Mapping]) -> dict[str, SetScore]:
    """Per eval set (sorted by name), the scores of its rows."""
    by_set: dict[str, list[Mapping]] = {}
    for row in rows:
        by_set.setdefault(row["set"], []).append(row)
    return {
        name: SetScore.of(
            (r["outcome"] for r in part),
            (r["task_id"] for r in part),
            (r.get("completion_tokens") for r in part),
        )
        for name, part in sorted(by_set.items())
    }


def summarize(rows: Iterable[Mapping]) -> dict[str, dict]:
    """steps.jsonl's `eval` object from one evaluation's rows; a set with ≥ 2 samples per problem also gets
    `at_k`: pass@j and maj@k, each {value, ci, level} (rundir.at_k)."""
    rows = list(rows)
    out = {name: score.summary() for name, score in score_sets(rows).items()}
    for name, s in out.items():
        if est := at_k(r for r in rows if r["set"] == name):
            s["at_k"] = {m: e.as_json() for m, e in est.items()}
    return out


def pct(x: float) -> str:
    """An accuracy or rate as the reports print it."""
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


# --- a run ------------------------------------------------------------------------------------------------
class Run:
    """`runs/<arm>/` as its files say: run.json, steps.jsonl, the eval files and the stepNNN/, stateNNN/ dirs.

    Read once when asked for; eval rows are validated on reading and not kept (they are large), their scores
    are. An eval file is keyed by (step, cap): the run's own eval cap for `eval_stepNNN.jsonl`.
    """

    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir)
        meta_path = self.dir / "run.json"
        if not archive.exists(meta_path):
            raise RunFileError(f"{self.dir}: not a run directory (no run.json)")
        try:
            self.meta = json.loads(archive.read_bytes(meta_path))
        except json.JSONDecodeError as e:
            raise RunFileError(f"{meta_path}: not valid JSON ({e})") from None
        if missing := [f for f in RUN_FIELDS if f not in self.meta]:
            raise RunFileError(f"{meta_path}: missing field(s) {', '.join(missing)}")
        self.saved = self._numbered(STEP_DIR)
        self.states = self._numbered(STATE_DIR)
        self.eval_files: dict[tuple[int, int], Path] = {}
        for path in archive.listing(self.dir / "results", "eval_step*.jsonl"):
            if m := EVAL_FILE.fullmatch(path.name):
                key = (int(m[1]), int(m[2]) if m[2] else self.eval_cap)
                if key in self.eval_files:
                    raise RunFileError(
                        f"run {self.dir}: two eval files for step {key[0]} at cap {key[1]}: "
                        f"{self.eval_files[key].name}, {path.name}"
                    )
                self.eval_files[key] = path
        self._tables: dict[int, Table] = {}

    def _numbered(self, pattern: re.Pattern) -> list[int]:
        if not self.dir.is_dir():  # a published run whose files are all in rows.tar.xz: no stepNNN/ either
            return []
        return sorted(
            int(m[1]) for p in self.dir.iterdir() if p.is_dir() and (m := pattern.fullmatch(p.name))
        )

    # --- run.json -----------------------------------------------------------------------------------------
    arm = property(lambda self: self.meta["arm"])
    policy_id = property(lambda self: self.meta["policy_id"])
    gate = property(lambda self: self.meta["gate"])
    eval_cap = property(lambda self: self.meta["eval"]["cap"])

    @property
    def seed(self) -> int | None:
        """The training seed (run.json config.seed); None when run.json has no config."""
        return (self.meta.get("config") or {}).get("seed")

    @property
    def base_model(self) -> str:
        """What the run trained from (cards name it); refused by name when run.json lacks it."""
        if "base_model" not in self.meta:
            raise RunFileError(f"{self.dir / 'run.json'}: missing field 'base_model'")
        return self.meta["base_model"]

    @property
    def groups_per_step(self) -> int | None:
        return self.meta.get("groups_per_step")

    @property
    def rank_set(self) -> str:
        """The set that picks the best checkpoint: run.json's best_step.set, else the held-out set."""
        return (self.meta.get("best_step") or {}).get("set", HELDOUT)

    # --- results/steps.jsonl --------------------------------------------------------------------------
    @cached_property
    def steps(self) -> list[dict]:
        """steps.jsonl's rows by step ([] before the first step); a row without a step or twice is refused."""
        path = steps_path(self.dir)
        rows: dict[int, dict] = {}
        for i, row in enumerate(read_jsonl(path) if archive.exists(path) else [], 1):
            if "step" not in row:
                raise RunFileError(f"{path}:{i}: row has no 'step'")
            if row["step"] in rows:
                raise RunFileError(f"{path}:{i}: duplicate row for step {row['step']}")
            rows[row["step"]] = row
        return [rows[s] for s in sorted(rows)]

    # --- results/eval_stepNNN*.jsonl ------------------------------------------------------------------
    def evaluated(self, cap: int | None = None) -> list[int]:
        """Steps with an eval file at `cap` (default: the run's eval cap)."""
        cap = cap or self.eval_cap
        return sorted(s for s, c in self.eval_files if c == cap)

    def rows(self, step: int, cap: int | None = None) -> list[tuple[int, dict]]:
        """(line, row) of one eval file, each row checked against the contract and the file's name."""
        cap = cap or self.eval_cap
        if (path := self.eval_files.get((step, cap))) is None:
            suffix = "" if cap == self.eval_cap else f"_cap{cap:04d}"
            steps = ", ".join(map(str, self.evaluated(cap)))
            raise RunFileError(
                f"run {self.dir}: step {step} was not evaluated (no results/eval_step{step:03d}{suffix}.jsonl); "
                f"evaluated steps: {steps}"
            )
        rows = []
        for i, r in _numbered_rows(path):
            if missing := [f for f in READ_FIELDS if f not in r]:
                raise RunFileError(f"{path}:{i}: missing field(s) {', '.join(missing)}")
            if r["outcome"] not in OUTCOMES:
                raise RunFileError(f"{path}:{i}: unknown outcome {r['outcome']!r}")
            if r["step"] != step or r["cap"] != cap:
                raise RunFileError(
                    f"{path}:{i}: row step/cap {r['step']}/{r['cap']} disagree with the file name"
                )
            rows.append((i, r))
        return rows

    @cached_property
    def scores(self) -> dict[tuple[int, int], dict[str, SetScore]]:
        """(step, cap) -> eval set -> its scores, for every eval file."""
        return {key: score_sets(r for _, r in self.rows(*key)) for key in sorted(self.eval_files)}

    @property
    def sets(self) -> list[str]:
        return sorted(self.meta.get("eval_sets") or {})

    def samples(self, name: str) -> int:
        return self.meta["eval"]["samples"][name]

    def table(self, step: int) -> Table:
        """The training-cap rows of one step, keyed for pairing (read once): every set of run.json's eval_sets and
        exactly its task ids × samples per problem, each once, since the pairing relies on it (the sets of
        extra_evals' files, at their steps alone, are not in it)."""
        if step in self._tables:
            return self._tables[step]
        path, table = self.eval_files.get((step, self.eval_cap)), {name: {} for name in self.sets}
        extra = (self.meta.get("extra_evals") or {}).get("sets") or {}  # eval_set_files': read by rows/score
        for i, row in self.rows(step):
            where = f"{path}:{i}"
            if row["set"] in extra:
                continue
            if row["set"] not in table:
                raise RunFileError(
                    f"{where}: eval set {row['set']!r} is not in {self.dir / 'run.json'} eval_sets"
                )
            rows, key = table[row["set"]], (row["task_id"], row["sample"])
            if key in rows:
                raise RunFileError(
                    f"{where}: duplicate row in run {self.dir}: set {row['set']}, task {key[0]}, sample {key[1]}"
                )
            rows[key] = Sample(
                Outcome(row["outcome"]), int(row["completion_tokens"]), row["seed"], row["cap"]
            )
        for name, rows in table.items():
            ids, n = self.meta["eval_sets"][name], self.samples(name)
            expected = {(t, i) for t in ids for i in range(n)}
            if set(rows) != expected:
                lacking, extra = sorted(expected - set(rows)), sorted(set(rows) - expected)
                detail = (
                    [f"{len(lacking)} missing (e.g. task {lacking[0][0]} sample {lacking[0][1]})"]
                    if lacking
                    else []
                )
                detail += (
                    [f"{len(extra)} unexpected (e.g. task {extra[0][0]} sample {extra[0][1]})"]
                    if extra
                    else []
                )
                raise RunFileError(
                    f"{path}: set {name} does not hold run.json's {len(ids)} task ids × {n} samples per problem: "
                    + "; ".join(detail)
                )
        self._tables[step] = table
        return table

    def score(self, step: int, name: str, cap: int | None = None) -> SetScore | None:
        return self.scores.get((step, cap or self.eval_cap), {}).get(name)

    def best_step(self, name: str) -> dict | None:
        """run.json's `best_step`: the evaluated step (at the run's cap) with the highest accuracy on `name`,
        the earliest on ties; None before any evaluation of it."""
        best = None
        for step in self.evaluated():
            if (
                (sc := self.score(step, name))
                and sc.graded
                and (best is None or sc.accuracy > best["accuracy"])
            ):
                best = {"set": name, "step": step, "accuracy": sc.accuracy}
        return best

    # --- stepNNN/ and stateNNN/ -----------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        trained = [r["step"] for r in self.steps]
        return max(trained + self.saved + [s for s, _ in self.eval_files] or [0])

    @property
    def resumable(self) -> list[int]:
        """Steps with both stepNNN/ and stateNNN/: where `--resume` can continue exactly."""
        return sorted(set(self.saved) & set(self.states))

    def ranking(self) -> list[tuple[int, float]]:
        """Saved checkpoints with a rank-set eval at the run's eval cap, best first (ties: earlier step first)."""
        scored = [(s, sc.accuracy) for s in self.saved if (sc := self.score(s, self.rank_set))]
        return sorted(scored, key=lambda t: (-t[1], t[0]))

    def architecture(self, step: int) -> str:
        config = step_dir(self.dir, step) / "config.json"
        if config.is_file() and (archs := json.loads(config.read_text()).get("architectures")):
            return archs[0]
        if arch := self.meta.get("architecture"):
            return arch
        raise RunFileError(f"{config}: no `architectures`, and {self.dir / 'run.json'} has no `architecture`")

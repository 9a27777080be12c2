"""The benchmark's grader: a seeded coin in GraderPool's place (random weights never answer anything, so a coin
decides outcomes; docs/gpu.md), and the synthetic tasks it reads, each answer replaced by its task id."""

import hashlib
import json
import random
import time
from pathlib import Path

from data.snapshot import load_snapshot, write_snapshot
from data.synthetic import generate_tasks
from rewards.grader import BatchReport, Grade
from rewards.outcome import Outcome


class CoinGrader:
    """GraderPool's `grade_batch` API with a seeded coin instead of math-verify.

    Rows come in groups of `group_size` consecutive rollouts of one task (how both trainers order them);
    the reference answer carries the task id (the benchmark's snapshot stores it there, see `bench_tasks`).
    """

    def __init__(self, p_correct, p_format, seed: int, group_size: int, step_fn, grade_capped: bool = False):
        if not (0 <= p_correct and 0 <= p_format and p_correct + p_format <= 1):
            raise ValueError(f"--p-correct {p_correct} and --p-format {p_format} must be >= 0, sum <= 1")
        self.p_correct, self.p_format, self.seed, self.group_size = p_correct, p_format, seed, group_size
        self.step_fn, self.grade_capped = step_fn, grade_capped
        self.last_report = BatchReport()  # GraderPool's per-batch report: a coin never fails
        self.seconds = 0.0
        self.outcomes: list[list[Outcome]] = []  # the groups graded since the last `pop_groups`

    def draw(self, task_id: str, index: int, step: int) -> float:
        digest = hashlib.sha256(f"capgrpo-coin:{self.seed}:{task_id}:{index}:{step}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def grade_batch(self, completions, references, truncated) -> list[Grade]:
        t0 = time.perf_counter()
        if len(references) % self.group_size:
            raise ValueError(f"coin grader: {len(references)} rows are not whole groups of {self.group_size}")
        step, grades = self.step_fn(), []
        for row, (task_id, capped) in enumerate(zip(references, truncated, strict=True)):
            u = self.draw(task_id, row % self.group_size, step)
            if capped and not self.grade_capped:
                outcome = Outcome.TRUNCATED
            elif u < self.p_correct:
                outcome = Outcome.CORRECT
            elif u < self.p_correct + self.p_format:
                outcome = Outcome.FORMAT_REJECTED
            else:
                outcome = Outcome.WRONG
            grades.append(Grade(outcome, None))
        g = self.group_size
        self.outcomes += [[x.outcome for x in grades[i : i + g]] for i in range(0, len(grades), g)]
        self.seconds += time.perf_counter() - t0
        return grades

    def rollouts(self, prompt_ids, step: int, cap: int, p_ended: float, vocab: int, never) -> list:
        """--coin-rollouts: what replaces the sampled rollouts, from the coin alone. Rollout k of a prompt gets
        a seeded length (1 to cap - 1 tokens ending in the first of `never`, with probability p_ended; else cap
        tokens without EOS) and seeded tokens from range(vocab) minus `never` (EOS, stop and special tokens)."""
        seen: dict[str, int] = {}
        out = []
        for prompt in prompt_ids:
            key = hashlib.sha256(json.dumps([int(t) for t in prompt]).encode()).hexdigest()[:16]
            index = seen[key] = seen.get(key, -1) + 1  # rollouts of one prompt come in order: index in group
            u = self.draw(f"rollout:{key}", index, step)
            rng = random.Random(f"{self.seed}:{key}:{index}:{step}")
            ended = u < p_ended
            length = 1 + int(u / p_ended * (cap - 2)) if ended else cap
            ids = []
            while len(ids) < length - ended:
                if (t := rng.randrange(vocab)) not in never:
                    ids.append(t)
            out.append(ids + [never[0]] * ended)
        return out

    def pop_groups(self) -> list[list[Outcome]]:
        groups, self.outcomes = self.outcomes, []
        return groups


def bench_tasks(a, work: Path) -> list[dict]:
    """Synthetic tasks through a snapshot file; each `answer` is replaced by the task id, which is what the
    coin grader reads (it never compares answers)."""
    tasks = generate_tasks(max(64, a.groups * a.steps * (8 if a.refill else 1) + a.eval_problems), a.seed)
    path = work / "bench.tasks.json"
    write_snapshot([{**t, "answer": t["id"]} for t in tasks], path)
    return list(load_snapshot(path))

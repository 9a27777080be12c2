"""`Comparison`: what `make compare` computed for two arms, in one value that analysis.compare builds and
analysis.report writes (both import it from here, so neither imports the other)."""

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from analysis.differences import PairedDiff, PeakDecline, SeedLevel
from analysis.pairing import Side
from analysis.stats import SMALLEST_EFFECT_PP, SignFlipResult, ceil_sig, fixed_sequence_holm
from rundir.at_k import Estimate
from rundir.files import Run


@dataclass(frozen=True)
class AtK:
    """One pass@j or maj@k of both arms, paired by problem (and seed pair) given these checkpoints."""

    metric: str
    a: Estimate
    b: Estimate
    test: SignFlipResult  # A − B, sign-flip over problems


@dataclass
class Comparison:
    a: Side
    b: Side
    primary: str  # the eval set of the primary comparison, named before looking
    paired: dict[str, PairedDiff]  # per eval set, pooled over the seed pairs; the primary set first
    per_seed: list[tuple[int | None, dict[str, PairedDiff]]]  # per seed pair (training seed, per set)
    disagreements: dict[str, Counter]  # per set, over every seed pair: (outcome in B, outcome in A)
    peaks: dict[str, dict[str, PeakDecline]]  # "A" / "B" -> eval set -> peak and decline
    warnings: list[str]
    report: Path
    plots: dict[str, Path]
    smallest_effect_pp: float = SMALLEST_EFFECT_PP
    seed_level: dict[str, SeedLevel] = field(default_factory=dict)  # per set; empty with one seed per arm
    at_k: dict[str, list[AtK]] = field(default_factory=dict)  # per set with ≥ 2 samples per problem

    # the single-run form's names
    @property
    def run_a(self) -> Run:
        return self.a.runs[0]

    @property
    def run_b(self) -> Run:
        return self.b.runs[0]

    @property
    def step_a(self) -> int:
        return self.a.step

    @property
    def step_b(self) -> int:
        return self.b.step

    @property
    def n_seeds(self) -> int:
        return len(self.per_seed)

    def family(self) -> list[tuple[str, float, str]]:
        """The report's tests, the primary first: (name, p, method); with several seeds the seed-level tests
        lead and the primary is the seed-level test on the primary set."""
        tests = [(f"seeds, A − B, {n}", s.test.p_value, s.test.method) for n, s in self.seed_level.items()]
        tests += [(f"A − B, {n}", d.test.p_value, d.test.method) for n, d in self.paired.items()]
        for side in (self.a, self.b):
            for n, pd in self.peaks[side.label].items():
                tests.append((f"decline, {side.label} ({side.arm}), {n}", pd.test.p_value, pd.test.method))
        return tests

    def adjusted_cells(self) -> dict[str, str]:
        """Adjusted p per test of family(): the primary at the full level, the rest Holm and never below the
        primary (analysis.stats.fixed_sequence_holm); rounded up, and "≤" where it rests on a Monte Carlo p."""
        fam = self.family()
        cells = {}
        for (name, *_), (adj, src) in zip(fam, fixed_sequence_holm([p for _, p, _ in fam])):
            if adj >= 1:
                cells[name] = "1"
            elif fam[src][2] == "monte_carlo":
                cells[name] = f"≤ {ceil_sig(adj, 2)}"
            else:
                cells[name] = ceil_sig(adj, 4)
        return cells

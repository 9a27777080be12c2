"""Trajectory plots for an arm comparison (SPEC §7): PNG files, matplotlib's Agg backend (no display)."""

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen before pyplot loads)
from matplotlib.ticker import MaxNLocator  # noqa: E402

COLORS = ("tab:blue", "tab:orange")  # arm A, arm B
MARKERS = ("o", "s")  # distinct so that overlapping arms stay visible


@dataclass(frozen=True)
class Trajectory:
    """One run's series. Eval-step series are indexed like `eval_steps`, per eval set; rates are 0..1."""

    label: str
    compared_step: int
    eval_steps: list[int]
    accuracy: dict[str, list[float]]
    median_tokens: dict[str, list[float]]
    truncated: dict[str, list[float]]
    format_rejected: dict[str, list[float]]
    train_steps: list[int]
    logprob_median: list[float]  # NaN where a step logged none
    gate_stat: list[float]


def plot_all(out_dir: Path, trajectories: list[Trajectory], sets: list[str]) -> dict[str, Path]:
    """Write every plot into out_dir; returns {title: path}."""
    return {
        "Accuracy per eval step": _per_set(
            out_dir / "accuracy.png", trajectories, sets, "accuracy", "accuracy (%)"
        ),
        "Median output length per eval step": _per_set(
            out_dir / "output_length.png", trajectories, sets, "median_tokens", "median completion tokens"
        ),
        "Truncation and format-rejection rates per eval step": _unresolved(
            out_dir / "unresolved_rates.png", trajectories, sets
        ),
        "Median sampled-token logprob per training step": _per_train_step(
            out_dir / "logprob_median.png", trajectories, "logprob_median", "median logprob of sampled tokens"
        ),
        "Gate statistic per training step": _per_train_step(
            out_dir / "gate_stat.png",
            trajectories,
            "gate_stat",
            "share of sampled groups: correct + unresolved,\nno completed wrong",
        ),
    }


def _per_set(path: Path, trajs: list[Trajectory], sets: list[str], field: str, ylabel: str) -> Path:
    scale = 100.0 if field == "accuracy" else 1.0
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    for ax, name in zip(axes[0], sets):
        for traj, color, marker in zip(trajs, COLORS, MARKERS):
            ys = [y * scale for y in getattr(traj, field)[name]]
            ax.plot(traj.eval_steps, ys, marker=marker, color=color, alpha=0.85, label=traj.label)
            _mark_compared(ax, traj, ys, color)
        _style(ax, name, ylabel)
    return _save(fig, path)


def _unresolved(path: Path, trajs: list[Trajectory], sets: list[str]) -> Path:
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    for ax, name in zip(axes[0], sets):
        for traj, color, marker in zip(trajs, COLORS, MARKERS):
            trunc = [100.0 * y for y in traj.truncated[name]]
            fmt = [100.0 * y for y in traj.format_rejected[name]]
            ax.plot(
                traj.eval_steps,
                trunc,
                marker=marker,
                color=color,
                alpha=0.85,
                label=f"{traj.label}: truncated",
            )
            ax.plot(
                traj.eval_steps, fmt, marker="x", ls="--", color=color, label=f"{traj.label}: format-rejected"
            )
        _style(ax, name, "share of graded samples (%)")
    return _save(fig, path)


def _per_train_step(path: Path, trajs: list[Trajectory], field: str, ylabel: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for traj, color, marker in zip(trajs, COLORS, MARKERS):
        ax.plot(
            traj.train_steps,
            getattr(traj, field),
            marker=marker,
            ms=4,
            color=color,
            alpha=0.85,
            label=traj.label,
        )
    _style(ax, "", ylabel)
    return _save(fig, path)


def _mark_compared(ax, traj: Trajectory, ys: list[float], color: str) -> None:
    """Ring the step that enters the paired comparison."""
    i = traj.eval_steps.index(traj.compared_step)
    ax.plot([traj.compared_step], [ys[i]], marker="o", ms=12, mfc="none", mec=color)


def _style(ax, title: str, ylabel: str) -> None:
    ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Trajectory plots for an arm comparison (SPEC §7): PNG files, matplotlib's Agg backend (no display).

One line per arm; with several training seeds each seed is a thin line under the mean over seeds, and a
band spans the lowest to the highest seed. Every value axis is scaled to its data (rates of 5-20% are not
drawn on 0-100%). Training-step series break where steps.jsonl has no row, rather than bridging the gap
with a straight line.
"""

import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen before pyplot loads)
from matplotlib.ticker import MaxNLocator  # noqa: E402

COLORS = ("tab:blue", "tab:orange")  # arm A, arm B
MARKERS = ("o", "s")  # distinct so that overlapping arms stay visible


@dataclass(frozen=True)
class Trajectory:
    """One arm's series, one list per training seed. Eval-step series are indexed like `eval_steps`, per
    eval set; rates are 0..1. Training-step series are indexed like `train_steps`; NaN where a seed logged
    no value (a null, or no row for that step)."""

    label: str
    compared_step: int
    eval_steps: list[int]
    accuracy: dict[str, list[list[float]]]
    median_tokens: dict[str, list[list[float]]]
    truncated: dict[str, list[list[float]]]
    format_rejected: dict[str, list[list[float]]]
    train_steps: list[int]
    logprob_median: list[list[float]]
    logprob_mean: list[list[float]]  # all NaN for runs from before steps.jsonl had it
    gate_stat: list[list[float]]

    @property
    def n_seeds(self) -> int:
        return len(self.logprob_median)


PLOTS = {  # title -> file name
    "Accuracy per eval step": "accuracy.png",
    "Median output length per eval step": "output_length.png",
    "Truncation and format-rejection rates per eval step": "unresolved_rates.png",
    "Median sampled-token logprob per training step": "logprob_median.png",
    "Mean sampled-token logprob per training step": "logprob_mean.png",
    "Gate statistic per training step": "gate_stat.png",
}


def figures(trajectories: list[Trajectory], sets: list[str]) -> dict[str, plt.Figure]:
    """Every plot as an open figure, by title (the caller saves or inspects and closes them)."""
    gate_label = "share of sampled groups: correct + unresolved,\nno completed wrong"
    return {
        "Accuracy per eval step": _per_set(trajectories, sets, "accuracy", "accuracy (%)", percent=True),
        "Median output length per eval step": _per_set(
            trajectories, sets, "median_tokens", "median completion tokens", percent=False
        ),
        "Truncation and format-rejection rates per eval step": _unresolved(trajectories, sets),
        "Median sampled-token logprob per training step": _per_train_step(
            trajectories, "logprob_median", "median logprob of sampled tokens"
        ),
        # a near-deterministic policy (the embedded base) has a median of ~0; the mean still moves
        "Mean sampled-token logprob per training step": _per_train_step(
            trajectories, "logprob_mean", "mean logprob of sampled tokens"
        ),
        "Gate statistic per training step": _per_train_step(trajectories, "gate_stat", gate_label),
    }


def plot_all(out_dir: Path, trajectories: list[Trajectory], sets: list[str]) -> dict[str, Path]:
    """Write every plot into out_dir; returns {title: path}."""
    paths = {}
    for title, fig in figures(trajectories, sets).items():
        paths[title] = out_dir / PLOTS[title]
        fig.tight_layout()
        save_png(fig, paths[title])
        plt.close(fig)
    return paths


def lead_split_figure(seeds, parts: dict[str, list[float]], title: str) -> plt.Figure:
    """Per training seed, the lead's parts side by side (pp) and their sum as a black tick; a dashed line per part
    at its mean over seeds. Seeds in the order given (launch.report.lead_parts: the tested seeds)."""
    fig, ax = plt.subplots(figsize=(max(6.5, 0.55 * len(seeds) + 2), 4))
    x = np.arange(len(seeds), dtype=float)
    width = 0.8 / len(parts)
    for i, ((part, values), color) in enumerate(zip(parts.items(), COLORS)):
        mean = float(np.mean(values))
        ax.bar(x + (i - (len(parts) - 1) / 2) * width, values, width, color=color, alpha=0.8,
               label=f"{part} (mean {mean:+.1f})")  # fmt: skip
        ax.axhline(mean, color=color, ls="--", lw=1)
    total = np.sum(list(parts.values()), axis=0)
    ax.plot(
        x, total, ls="none", marker="_", ms=14, mew=2, color="black", label=f"sum (mean {total.mean():+.1f})"
    )
    ax.axhline(0, color="0.4", lw=0.8)
    ax.set_xticks(x, [str(s) for s in seeds])
    ax.set(title=title, xlabel="training seed", ylabel="lead (pp of the seed's paired samples)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save_png(fig: plt.Figure, path: Path) -> None:
    """A 32-colour palette PNG: line plots look the same and weigh a quarter (reports are committed)."""
    from PIL import Image  # matplotlib's own dependency

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    image = Image.open(buf).convert("RGB")
    image.quantize(colors=32, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, optimize=True
    )


def break_gaps(xs: list[int], ys) -> tuple[np.ndarray, np.ndarray]:
    """Insert a NaN between steps that are not consecutive, so that a line stops at a missing row."""
    out_x, out_y = [], []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i and x - xs[i - 1] > 1:
            out_x.append((x + xs[i - 1]) / 2)
            out_y.append(math.nan)
        out_x.append(x)
        out_y.append(y)
    return np.asarray(out_x, dtype=float), np.asarray(out_y, dtype=float)


def _draw(ax, xs, per_seed, color: str, marker: str, label: str, *, scale=1.0, ls="-", gaps=False) -> None:
    """The mean over seeds as a line; with several seeds, each seed as a thin line and their range as a band."""
    ys = np.asarray(per_seed, dtype=float) * scale
    mean, lo, hi = _nan_stats(ys)
    if len(ys) > 1:
        label = f"{label} (mean of {len(ys)} seeds)"
        for seed_ys in ys:
            sx, sy = break_gaps(xs, seed_ys) if gaps else (np.asarray(xs, dtype=float), seed_ys)
            ax.plot(sx, sy, ls=ls, lw=0.7, color=color, alpha=0.35, gid="seed")
    x, m = break_gaps(xs, mean) if gaps else (np.asarray(xs, dtype=float), mean)
    ax.plot(x, m, marker=marker, ms=5 if gaps else 6, ls=ls, lw=1.8, color=color, alpha=0.9, label=label)
    if len(ys) > 1:
        x, lo = break_gaps(xs, lo) if gaps else (x, lo)
        _, hi = break_gaps(xs, hi) if gaps else (x, hi)
        ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)


def _nan_stats(ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over seeds (axis 0), NaN where no seed has a value."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: a step no seed logged
        return np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)


def _per_set(trajs: list[Trajectory], sets: list[str], field: str, ylabel: str, *, percent: bool):
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    scale = 100.0 if percent else 1.0
    for ax, name in zip(axes[0], sets):
        for traj, color, marker in zip(trajs, COLORS, MARKERS):
            per_seed = getattr(traj, field)[name]
            _draw(ax, traj.eval_steps, per_seed, color, marker, traj.label, scale=scale)
            _mark_compared(ax, traj, per_seed, color, scale)
        _style(ax, name, ylabel, [t.eval_steps for t in trajs], percent=percent)
    return fig


def _unresolved(trajs: list[Trajectory], sets: list[str]):
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    for ax, name in zip(axes[0], sets):
        for traj, color, marker in zip(trajs, COLORS, MARKERS):
            xs = traj.eval_steps
            _draw(ax, xs, traj.truncated[name], color, marker, f"{traj.label}: truncated", scale=100.0)
            _draw(
                ax,
                xs,
                traj.format_rejected[name],
                color,
                "x",
                f"{traj.label}: format-rejected",
                scale=100.0,
                ls="--",
            )
        _style(ax, name, "share of graded samples (%)", [t.eval_steps for t in trajs], percent=True)
    return fig


def _per_train_step(trajs: list[Trajectory], field: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for traj, color, marker in zip(trajs, COLORS, MARKERS):
        if traj.train_steps:
            _draw(ax, traj.train_steps, getattr(traj, field), color, marker, traj.label, gaps=True)
    if not any(t.train_steps for t in trajs):
        ax.text(0.5, 0.5, "no training steps logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
    _style(ax, "", ylabel, [t.train_steps for t in trajs], percent=False)
    return fig


def _mark_compared(ax, traj: Trajectory, per_seed, color: str, scale: float) -> None:
    """Ring the step that enters the paired comparison (the mean over seeds)."""
    i = traj.eval_steps.index(traj.compared_step)
    y = _nan_stats(np.asarray(per_seed, dtype=float)[:, i : i + 1])[0][0] * scale
    ax.plot([traj.compared_step], [y], marker="o", ms=12, mfc="none", mec=color)


def _style(ax, title: str, ylabel: str, steps: list[list[int]], *, percent: bool) -> None:
    ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
    xs = sorted({x for s in steps for x in s})
    if not xs:
        ax.set_xticks([])
    elif len(xs) == 1:  # one evaluated step: an axis around it, not matplotlib's ±0.045
        ax.set_xlim(xs[0] - 1, xs[0] + 1)
        ax.set_xticks(xs)
    else:
        pad = 0.04 * (xs[-1] - xs[0])
        ax.set_xlim(xs[0] - pad, xs[-1] + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if percent:  # scaled to the data (matplotlib's autoscale), never past 0-100 %
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(lo, -1.0), min(hi, 101.0))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)

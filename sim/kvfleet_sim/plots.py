"""PNG plots of simulator runs (matplotlib, Agg backend: no display needed).

* `plot_replicas`: replicas provisioned over time per run, with the load (arrivals per
  second, from the first run: every run replays the same trace) on a second axis.
* `plot_latency_cdfs`: TTFT and E2E latency CDFs per run, measured requests only.
* `plot_hit_rates`: the engines' prefix-cache hit rate per run (bar chart).
* `plot_efficiency`: scaling efficiency against N (log2 axis), with the seed research's
  bands shaded for reference.
* `write_all(dir, runs)`: the first three into a folder (`kvfleet sim compare --plot-dir`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvfleet_sim.run import SimRun

if TYPE_CHECKING:
    from kvfleet_sim.efficiency import Point

STYLES = ["-", "--", ":", "-."]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


def _measured(run: SimRun) -> list[Any]:
    end = run.start_s + run.summary.duration_s
    return [f for f in run.result.finished
            if run.start_s <= f.arrival < end and not f.is_aborted]  # fmt: skip


def arrivals_per_second(run: SimRun, bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    """(bin starts relative to the measured slice, arrivals per second) over the slice."""
    start, span = run.start_s, run.summary.duration_s
    num_bins = max(1, math.ceil(span / bin_s))
    counts = [0] * num_bins
    for f in run.result.finished:
        k = math.floor((f.arrival - start) / bin_s)
        if 0 <= k < num_bins:
            counts[k] += 1
    return [k * bin_s for k in range(num_bins)], [c / bin_s for c in counts]


def plot_replicas(path: str | Path, runs: Sequence[SimRun]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    start_s = runs[0].start_s if runs else 0.0
    for i, run in enumerate(runs):
        pts = [(t - start_s, p) for t, p, _ in run.result.timeline if t >= start_s]
        ax.step([t for t, _ in pts], [p for _, p in pts], where="post", label=run.name,
                linestyle=STYLES[i % len(STYLES)],
                linewidth=max(0.8, 2.5 - 0.5 * i))  # fmt: skip
    ax.set_xlabel("virtual seconds into the measured slice")
    ax.set_ylabel("replicas provisioned")
    if runs:
        span = runs[0].summary.duration_s
        bin_s = max(1.0, span / 200)
        xs, load = arrivals_per_second(runs[0], bin_s)
        load_ax = ax.twinx()
        load_ax.fill_between(xs, load, step="post", color="tab:gray", alpha=0.25,
                             label="load (arrivals/s)")  # fmt: skip
        load_ax.set_ylabel(f"arrivals per second ({bin_s:g} s bins)")
        load_ax.set_ylim(bottom=0)
        ax.set_zorder(load_ax.get_zorder() + 1)  # the replica lines over the load
        ax.patch.set_visible(False)
        lines, labels = ax.get_legend_handles_labels()
        more, more_labels = load_ax.get_legend_handles_labels()
        ax.legend(lines + more, labels + more_labels, loc="upper left", fontsize="small")
    _save(fig, path)


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def plot_latency_cdfs(path: str | Path, runs: Sequence[SimRun]) -> None:
    plt = _pyplot()
    fig, (ttft_ax, e2e_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, run in enumerate(runs):
        done = _measured(run)
        style = {"label": run.name, "linestyle": STYLES[i % len(STYLES)]}
        for ax, values in ((ttft_ax, [f.first_token - f.arrival for f in done]),
                           (e2e_ax, [f.finished - f.arrival for f in done])):  # fmt: skip
            if values:
                xs, ys = _cdf(values)
                ax.step(xs, ys, where="post", **style)
    for ax, name in ((ttft_ax, "TTFT"), (e2e_ax, "E2E latency")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (s, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    ttft_ax.legend(fontsize="small")
    _save(fig, path)


def plot_hit_rates(path: str | Path, runs: Sequence[SimRun]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(runs) + 2), 3.8))
    names = [r.name for r in runs]
    rates = [r.summary.prefix_hit_rate for r in runs]
    bars = ax.bar(range(len(runs)), rates, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.1%}" for v in rates], fontsize="small")
    ax.set_xticks(range(len(runs)), names, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("prefix-cache hit rate (engines)")
    ax.set_ylim(0, max([1.0, *rates]) * 1.08)
    _save(fig, path)


def plot_efficiency(path: str | Path, points: Sequence[Point], title: str = "") -> None:
    from kvfleet_sim.efficiency import REFERENCE_BANDS

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    top_n = max([256, *(p.replicas for p in points)])
    for i, (lo_n, hi_n, lo, hi) in enumerate(REFERENCE_BANDS):
        ax.fill_between([lo_n, hi_n or top_n], lo, hi, color="tab:orange", alpha=0.2,
                        label="seed research" if i == 0 else None)  # fmt: skip
    ax.plot([p.replicas for p in points], [p.efficiency for p in points], marker="o",
            label="kvfleet (simulated)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ticks = [2**k for k in range(int(math.log2(top_n)) + 1)]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("replicas N")
    ax.set_ylabel("efficiency: rate(N) / (N x rate(1))")
    ax.set_ylim(0, max([1.1, *(p.efficiency * 1.05 for p in points)]))
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower left")
    if title:
        ax.set_title(title, fontsize="medium")
    _save(fig, path)


def write_all(directory: str | Path, runs: Sequence[SimRun]) -> list[Path]:
    """replicas.png, latency_cdf.png and hit_rate.png in `directory` (created)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "replicas.png", out / "latency_cdf.png", out / "hit_rate.png"]
    for path, plot in zip(paths, (plot_replicas, plot_latency_cdfs, plot_hit_rates),
                          strict=True):  # fmt: skip
        plot(path, runs)
    return paths

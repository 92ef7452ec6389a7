"""The report's two plots: images/s and scaling efficiency by GPU count, one line per mode (and backend, --amp,
SyncBatchNorm), mean with the std over repeats as error bars; the projection's curves beside the measured points."""
from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from comparison.projection import FABRICS, projected_efficiency  # noqa: E402


def series(outcomes, key: str, scale: float = 1.0) -> dict[str, dict[int, list[float]]]:
    """{line label: {GPU count: [value per successful repeat]}}."""
    lines: dict[str, dict[int, list[float]]] = {}
    for o in outcomes:
        value = o.row.get(key)
        if o.status != "ok" or value is None:
            continue
        r = o.run
        label = " ".join(x for x in (r.mode, r.backend, o.row["amp"] and f"amp {o.row['amp']}",
                                     r.sync_bn and "SyncBN") if x)
        lines.setdefault(label, {}).setdefault(r.gpus, []).append(value * scale)
    return lines


def draw(ax, lines: dict[str, dict[int, list[float]]]) -> None:
    for label, points in lines.items():
        counts = sorted(points)
        means = [statistics.fmean(points[n]) for n in counts]
        stds = [statistics.stdev(points[n]) if len(points[n]) > 1 else 0.0 for n in counts]
        ax.errorbar(counts, means, yerr=stds, marker="o", capsize=3, label=label)


def write_plots(outcomes, out: Path, device: str, cuda: bool, projection: dict | None) -> list[Path]:
    """images_per_sec.png and scaling_efficiency.png in `out`; `projection` (report.projection_inputs) draws the
    projected efficiency per fabric."""
    paths, xlabel = [], "GPUs" if cuda else "CPU processes (one thread each)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw(ax, series(outcomes, "images_per_sec"))
    ax.set(xlabel=xlabel, ylabel="images/s (global)",
           title=f"Throughput — {device}")
    finish(ax, fig, out / "images_per_sec.png", paths)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw(ax, series(outcomes, "scaling_efficiency", 100))
    if projection:
        for fabric in FABRICS:
            counts = sorted({1, *fabric.gpu_counts}) if fabric.gpu_counts[0] <= 8 else list(fabric.gpu_counts)
            step, ddp_step = projection["step_s"], projection["ddp1_step_s"] or projection["step_s"]
            values = [100 * projected_efficiency(step, ddp_step, projection["grads"], n, fabric,
                                                 projection["bucket_cap_mb"]) for n in counts]
            ax.plot(counts, values, linestyle="--", alpha=0.7, label=f"projected DDP, {fabric.name}")
        ax.set_xscale("log", base=2)
    ax.axhline(100, color="grey", linewidth=0.8)
    ax.set(xlabel=xlabel, ylabel="scaling efficiency (%)",
           title=f"Scaling efficiency — {device}")
    finish(ax, fig, out / "scaling_efficiency.png", paths)
    return paths


def finish(ax, fig, path: Path, paths: list[Path]) -> None:
    counts = sorted({int(x) for line in ax.get_lines() for x in line.get_xdata()})
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)

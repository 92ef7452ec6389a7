"""The report's pictures, drawn from what the runs wrote to their results.json:

- images_per_sec.png: global images/s by GPU count, a line per configuration (mode, backend, --amp, SyncBN,
  ZeRO-2);
- scaling_efficiency.png: speedup over single_gpu ÷ GPUs by GPU count, and the projection's curves beside it;
- step_time.png: where a step goes, a stacked bar per configuration: data wait, compute, and for the parallel modes
  the time above single_gpu's step at the same per-GPU batch (what the parallelism costs);
- memory_per_gpu.png: each GPU's peak memory, grouped per configuration (only when the runs measured it: GPUs).

With --repeat, a point or bar is the mean over the repeats and the error bar their standard deviation; each
picture says how many runs it averages. Failed runs are left out. Every figure is built by a function that returns
it, so its axes can be checked before it is saved.
"""
from __future__ import annotations

import io
import statistics
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from comparison.projection import FABRICS, projected_efficiency  # noqa: E402
from comparison.report import PICTURES, groups, write_file  # noqa: E402

COLOURS = {"data wait": "#b0b0b0", "compute": "#4c72b0", "parallelism": "#dd5555"}
FABRIC_LINES = ("--", ":", "-.")  # one dash per projected curve


# ---------------------------------------------------------------------------------------------------- the data
def label(o) -> str:
    """A configuration's name in a legend: mode, backend, --amp, SyncBN, ZeRO-2 (fsdp without resharding after
    forward); the GPU count is the x axis."""
    r = o.run
    zero2 = r.reshard_after_forward is False and "ZeRO-2"
    return " ".join(x for x in (r.mode, r.backend, o.row["amp"] and f"amp {o.row['amp']}", r.sync_bn and "SyncBN",
                                zero2) if x)


def series(outcomes, key: str, scale: float = 1.0) -> dict[str, dict[int, list[float]]]:
    """{line label: {GPU count: [value of each successful repeat]}}."""
    lines: dict[str, dict[int, list[float]]] = {}
    for o in outcomes:
        value = o.row.get(key)
        if o.status == "ok" and value is not None:
            lines.setdefault(label(o), {}).setdefault(o.run.gpus, []).append(value * scale)
    return lines


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def configurations(outcomes) -> list[list]:
    """The report's configurations (repeats together, in the matrix's order), each with its
    successful runs that timed steps only (one that ended within its warm-up has no speed)."""
    drawn = lambda o: o.status == "ok" and o.row.get("images_per_sec") is not None  # noqa: E731
    return [ok for ok in ([o for o in group if drawn(o)] for group in groups(outcomes)) if ok]


def averaged(groups: list[list]) -> str:
    """How many runs each point or bar of a picture is the mean of."""
    counts = sorted({len(group) for group in groups})
    if not counts or counts == [1]:
        return "one run each"
    many = f"{counts[0]}–{counts[-1]}" if len(counts) > 1 else f"{counts[0]}"
    return f"mean ± std of {many} runs each"


def unit(cuda: bool) -> str:
    return "GPUs" if cuda else "CPU processes (one thread each)"


# ---------------------------------------------------------------------------------------------------- the axes
def gpu_axis(ax, counts, cuda: bool) -> None:
    """An x axis that holds exactly the GPU counts drawn: linear up to 8, base-2 logarithmic beyond (1-64), a tick
    and a label at each count and nowhere else, half a step of room at either end."""
    counts = sorted(set(counts))
    if counts[-1] > 8:
        ax.set_xscale("log", base=2)
        ax.set_xlim(counts[0] / 1.4, counts[-1] * 1.4)
    else:
        ax.set_xlim(counts[0] - 0.5, counts[-1] + 0.5)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(unit(cuda))


def draw_lines(ax, lines: dict[str, dict[int, list[float]]]) -> list[int]:
    """One line per configuration, mean with the std as error bars; the GPU counts drawn."""
    counts = []
    for name, points in lines.items():
        xs = sorted(points)
        means, stds = zip(*(mean_std(points[n]) for n in xs))
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=name)
        counts += xs
    return counts


def finish(fig: Figure, ax) -> Figure:
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------- the figures
def throughput_figure(outcomes, device: str, cuda: bool) -> Figure | None:
    lines = series(outcomes, "images_per_sec")
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpu_axis(ax, draw_lines(ax, lines), cuda)
    ax.set_ylim(bottom=0)  # from zero: the heights compare as ratios
    ax.set(ylabel="images/s (global)",
           title=f"Throughput — {device}\n{averaged(configurations(outcomes))}")
    return finish(fig, ax)


def efficiency_figure(outcomes, device: str, cuda: bool, projection: dict | None) -> Figure | None:
    lines = series(outcomes, "scaling_efficiency", 100)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    counts = draw_lines(ax, lines)
    if projection:
        for dash, ((xs, ys), names) in zip(FABRIC_LINES, projected_curves(projection).items()):
            ax.plot(xs, ys, linestyle=dash, linewidth=1.6, alpha=0.8, label=f"projected DDP, {' = '.join(names)}")
            counts += xs
    gpu_axis(ax, counts, cuda)
    ax.axhline(100, color="grey", linewidth=0.8)
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    title = f"Scaling efficiency — {device}\nmeasured: {averaged(configurations(outcomes))}"
    ax.set(ylabel="scaling efficiency (%)", title=title + ("; broken lines: projected" if projection else ""))
    return finish(fig, ax)


def projected_curves(projection: dict) -> dict[tuple, list[str]]:
    """{(GPU counts, efficiencies in %): the fabrics projected so}: fabrics whose curves coincide (communication
    that hides behind backward on both) share one line, named after all of them, rather than hiding each other."""
    step, ddp_step = projection["step_s"], projection["ddp1_step_s"] or projection["step_s"]
    curves: dict[tuple, list[str]] = {}
    for fabric in FABRICS:
        xs = sorted({1, *fabric.gpu_counts}) if fabric.gpu_counts[0] <= 8 else list(fabric.gpu_counts)
        ys = [round(100 * projected_efficiency(step, ddp_step, projection["grads"], n, fabric,
                                               projection["bucket_cap_mb"]), 1) for n in xs]
        curves.setdefault((tuple(xs), tuple(ys)), []).append(fabric.name)
    return curves


def step_parts(group: list, groups: list[list]) -> dict[str, tuple[float, float]]:
    """A configuration's mean step (ms) split into data wait, compute, and for a parallel mode the time above
    single_gpu's compute at the same per-GPU batch and --amp: {part: (mean, std over repeats)}. The step is the
    mean step (global batch ÷ images/s), of which data_wait_frac is the data wait."""
    def split(o) -> tuple[float, float]:
        step = 1000 * o.row["global_batch"] / o.row["images_per_sec"]
        return step * (o.row["data_wait_frac"] or 0.0), step * (1 - (o.row["data_wait_frac"] or 0.0))

    first = group[0]
    data, work = zip(*(split(o) for o in group))
    parts = {"data wait": mean_std(list(data))}
    reference = next((g for g in groups if g[0].run.mode == "single_gpu" and g[0].row["amp"] == first.row["amp"]
                      and g[0].row["per_gpu_batch"] == first.row["per_gpu_batch"]), None)
    if first.run.mode == "single_gpu" or reference is None:
        parts["compute"] = mean_std(list(work))
        return parts
    single = statistics.fmean(split(o)[1] for o in reference)
    parts["compute"] = mean_std([min(w, single) for w in work])
    parts["parallelism"] = mean_std([max(w - single, 0.0) for w in work])
    return parts


def step_figure(outcomes, device: str, cuda: bool) -> Figure | None:
    groups = configurations(outcomes)
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 * len(groups) + 3), 5.0))
    names, tops, no_reference, drawn = [], [], [], set()
    for x, group in enumerate(groups):
        first, parts = group[0], step_parts(group, groups)
        bottom = 0.0
        for part, (mean, _) in parts.items():
            ax.bar(x, mean, bottom=bottom, color=COLOURS[part], label=part, width=0.6)
            drawn |= {part} if mean > 0 else set()
            if mean >= 0.06 * max(1e-9, sum(m for m, _ in parts.values())):
                ax.text(x, bottom + mean / 2, f"{mean:.1f}", ha="center", va="center", fontsize=8, color="white")
            bottom += mean
        spread = mean_std([1000 * o.row["global_batch"] / o.row["images_per_sec"] for o in group])[1]
        if spread:
            ax.errorbar(x, bottom, yerr=spread, color="black", capsize=3)
        ax.text(x, bottom + spread, f"{bottom:.1f} ms\n", ha="center", va="bottom", fontsize=8)
        names.append(f"{label(first)}\n{first.run.gpus} × {first.row['per_gpu_batch']} images")
        tops.append(bottom + spread)  # where the error bar and its label end
        if first.run.mode != "single_gpu" and "parallelism" not in parts:
            no_reference.append(first.row["per_gpu_batch"])
    ax.set_xticks(range(len(groups)), names, fontsize=7)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, 1.25 * max(tops))  # room above the highest error bar for its label
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per part drawn, top part first
    ax.legend([handles[p] for p in reversed(COLOURS) if p in drawn], [p for p in reversed(COLOURS) if p in drawn],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(ylabel="ms per step (mean)", xlabel=f"{unit(cuda).split(' (')[0]} × images each",
           title=f"Where a step goes — {averaged(groups)}\n{device}")
    note = ""
    if no_reference:
        sizes = ", ".join(str(n) for n in sorted(set(no_reference)))
        note = textwrap.fill(f"No single_gpu run at {sizes} images per GPU, so what the parallelism costs is not "
                             f"split out of those bars: compare.py --batch_per_gpu N compares at equal per-GPU "
                             f"batches.", width=int(16 * fig.get_figwidth()))
        fig.text(0.01, 0.01, note, fontsize=7, va="bottom")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout(rect=(0, 0.03 * (note.count("\n") + 1) + 0.01 if note else 0, 1, 1))
    return fig


def memory_figure(outcomes, device: str) -> Figure | None:
    """None when no run measured memory (CPU runs)."""
    groups = [g for g in configurations(outcomes) if g[0].results.get("peak_mem_gb_per_gpu")]
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2), 4.5))
    names = []
    for x, group in enumerate(groups):
        per_gpu = [o.results["peak_mem_gb_per_gpu"] for o in group]
        gpus = sorted(per_gpu[0], key=int)
        width = 0.8 / len(gpus)
        for i, gpu in enumerate(gpus):
            mean, std = mean_std([memory[gpu] for memory in per_gpu if gpu in memory])
            position = x - 0.4 + width * (i + 0.5)
            ax.bar(position, mean, width=width * 0.9, yerr=std or None, capsize=2, color=f"C{i % 10}",
                   label=f"GPU {gpu}")
            ax.text(position, mean, f"{mean:.1f}", ha="center", va="bottom", fontsize=7)
        names.append(f"{label(group[0])}\n{group[0].run.gpus} GPU{'s' if group[0].run.gpus > 1 else ''}")
    ax.set_xticks(range(len(groups)), names, fontsize=7)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, 1.15 * ax.get_ylim()[1])
    ax.set(ylabel="peak memory per GPU (GB)", title=f"Peak memory of each GPU — {averaged(groups)}\n{device}")
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per GPU index
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------- the files
def pictures_section(outcomes, pictures: list[Path]) -> list[str]:
    """report.md's lines on the pictures written: each shown, and what each point or bar of them is."""
    if not pictures:
        return ["No run that succeeded timed a step, so there are no pictures."]
    lines = [" ".join(f"![{p.stem.replace('_', ' ')}]({p.name})" for p in pictures), "",
             f"Each point or bar is one configuration: {averaged(configurations(outcomes))} (failed runs left "
             f"out), the error bars their standard deviation. *step time* splits the mean step into the wait for "
             f"data, compute and, for a parallel mode, the time above single_gpu's step at the same per-GPU batch: "
             f"what the parallelism costs (gradient all-reduce not hidden by backward; DataParallel's "
             f"scatter, replication and gather)."]
    if not any(p.name == "memory_per_gpu.png" for p in pictures):
        lines[-1] += " There is no memory picture: peak memory is measured on GPUs only."
    return lines


def figures(outcomes, device: str, cuda: bool, projection: dict | None) -> dict[str, Figure]:
    """{file name: figure} of every picture there is something to draw for."""
    made = dict(zip(PICTURES, (throughput_figure(outcomes, device, cuda),
                               efficiency_figure(outcomes, device, cuda, projection),
                               step_figure(outcomes, device, cuda),
                               memory_figure(outcomes, device))))
    return {name: fig for name, fig in made.items() if fig is not None}


def write_plots(outcomes, out: Path, device: str, cuda: bool, projection: dict | None) -> list[Path]:
    """The pictures in `out`, each written whole or not at all (write_file), the paths written."""
    paths, drawn = [], figures(outcomes, device, cuda, projection)
    try:
        for name, fig in drawn.items():
            png = io.BytesIO()
            fig.savefig(png, dpi=120, format="png")
            write_file(out / name, png.getvalue())
            paths.append(out / name)
    finally:
        for fig in drawn.values():
            plt.close(fig)
    return paths

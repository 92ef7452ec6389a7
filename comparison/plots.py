"""The report's pictures, drawn from what the runs wrote to their run folders (results.json, the
traces):

- images_per_sec.png: global images/s by GPU count, a line per configuration (mode, backend, --amp,
  SyncBN, ZeRO-2);
- scaling_efficiency.png: speedup over single_gpu ÷ GPUs by GPU count, and the projection's
  curves beside it;
- step_breakdown.png: where a step goes, a stacked bar per configuration from the profiler's
  split (compute, exposed communication, data, optimizer, other; the communication hidden behind
  compute hatched over the compute it overlapped, not added), drawn from breakdown.step_split, the
  function the report's split table and its sentences use;
- memory_per_gpu.png: each GPU's peak memory, grouped per configuration (only when the runs
  measured it: GPUs).

Each point or bar is its configuration's figure as the report's table has it, and its error bar
the table's ±: images/s and scaling efficiency from measured.Measured (the global batch ÷ the mean
step, ± the step's std as the same share), the step's split from breakdown.step_split (± the
profiled step's std, as the split's table), each GPU's memory from the runs' mean (± their std, as
the table's memory cell). Each picture says how many runs it averages. Failed runs are left out.
CPU runs with more processes than cores are shaded as oversubscribed. Every figure is built by a
function that returns it, so its axes can be checked before it is saved.
"""
from __future__ import annotations

import io
import statistics
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from comparison.matrix import Cores
from comparison.projection import FABRICS, projected_efficiency
from comparison.report.breakdown import PART_NAMES, step_split
from comparison.report.files import PICTURES, write_file
from comparison.report.measured import groups, measured
from comparison.report.results_table import memory_per_gpu_gb
from comparison.report.rows import SPLIT_PARTS

PART_COLOURS = {"compute_ms": "#4c72b0", "comm_exposed_ms": "#dd5555", "bubble_ms": "#8c61b5",
                "data_ms": "#9a9a9a", "optimizer_ms": "#55a868", "other_ms": "#e0c060"}
HIDDEN = "communication hidden behind compute (overlaps it, not added)"
FABRIC_LINES = ("--", ":", "-.")  # one dash per projected curve


# ----------------------------------------------------------------------------------------- the data
def label(o) -> str:
    """A configuration's name in a legend: mode, backend, --amp, SyncBN, ZeRO-2 (fsdp without
    resharding after forward); the GPU count is the x axis."""
    r = o.run
    zero2 = r.reshard_after_forward is False and "ZeRO-2"
    return " ".join(x for x in (r.mode, r.backend, o.row["amp"] and f"amp {o.row['amp']}",
                                r.sync_bn and "SyncBN", zero2) if x)


def series(outcomes, figure) -> dict[str, dict[int, tuple[float, float]]]:
    """{line label: {GPU count: (figure, its ±)}} of each configuration that timed a step, as the
    report's table has it: `figure(m)` of its measured.Measured, ± the step's share of it (None:
    not measured, left out)."""
    lines: dict[str, dict[int, tuple[float, float]]] = {}
    for m in measured(outcomes):
        value = figure(m)
        if value is not None:
            name = label(types.SimpleNamespace(run=m.run, row=m.rows[0]))
            lines.setdefault(name, {})[m.run.gpus] = (value, value * m.share)
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
    return runs_note([len(group) for group in groups])


def runs_note(counts: list[int]) -> str:
    """'one run each', 'mean ± std of 3 runs each', 'mean ± std of 2–3 runs each'."""
    counts = sorted(set(counts))
    if not counts or counts == [1]:
        return "one run each"
    many = f"{counts[0]}–{counts[-1]}" if len(counts) > 1 else f"{counts[0]}"
    return f"mean ± std of {many} runs each"


def unit(cuda: bool) -> str:
    return "GPUs" if cuda else "CPU processes (one thread each)"


# ----------------------------------------------------------------------------------------- the axes
def gpu_axis(ax, counts, cuda: bool) -> None:
    """An x axis that holds exactly the GPU counts drawn: linear up to 8, base-2 logarithmic beyond
    (1-64), a tick and a label at each count and nowhere else, half a step of room at either end."""
    counts = sorted(set(counts))
    if counts[-1] > 8:
        ax.set_xscale("log", base=2)
        ax.set_xlim(counts[0] / 1.4, counts[-1] * 1.4)
    else:
        ax.set_xlim(counts[0] - 0.5, counts[-1] + 0.5)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(unit(cuda))


def shade_oversubscribed(ax, counts, cores: Cores | None) -> None:
    """Shade the GPU counts drawn that oversubscribe the CPU (more threads than cores), labelled
    so in the legend: their speed measures contention. Call once the x axis is set: the span starts
    halfway (geometrically on a log axis) between the last count that fits and the first that does
    not."""
    counts = sorted(set(counts))
    crowded = [n for n in counts if n > (cores.fit if cores else max(counts))]
    if not crowded:
        return
    fitting = [n for n in counts if n not in crowded]
    low, high = ax.get_xlim()
    if fitting:
        last, first = fitting[-1], crowded[0]
        low = (last * first) ** 0.5 if ax.get_xscale() == "log" else (last + first) / 2
    ax.axvspan(low, high, color="#f2c0c0", alpha=0.4, zorder=0, linewidth=0,
               label=f"oversubscribed: more processes than the {cores.available} cores")
    ax.set_xlim(ax.get_xlim()[0], high)


def draw_lines(ax, lines: dict[str, dict[int, tuple[float, float]]]) -> list[int]:
    """One line per configuration, its figures with their ± as error bars; the GPU counts
    drawn."""
    counts = []
    for name, points in lines.items():
        xs = sorted(points)
        means, stds = zip(*(points[n] for n in xs))
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=name)
        counts += xs
    return counts


def finish(fig: Figure, ax) -> Figure:
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -------------------------------------------------------------------------------------- the figures
def throughput_figure(outcomes, device: str, cuda: bool,
                      cores: Cores | None = None) -> Figure | None:
    lines = series(outcomes, lambda m: m.images_per_sec)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    counts = draw_lines(ax, lines)
    gpu_axis(ax, counts, cuda)
    shade_oversubscribed(ax, counts, cores)
    # from zero: the heights compare as ratios; room above the highest point for the legend
    ax.set_ylim(0, 1.2 * ax.get_ylim()[1])
    ax.set(ylabel="images/s (global batch ÷ mean step)",
           title=f"Throughput — {device}\n{averaged(configurations(outcomes))}")
    return finish(fig, ax)


def efficiency_figure(outcomes, device: str, cuda: bool, projection: dict | None,
                      cores: Cores | None = None) -> Figure | None:
    lines = series(outcomes, lambda m: 100 * m.efficiency if m.efficiency is not None else None)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    counts = draw_lines(ax, lines)
    if projection:
        for dash, ((xs, ys), names) in zip(FABRIC_LINES, projected_curves(projection).items()):
            ax.plot(xs, ys, linestyle=dash, linewidth=1.6, alpha=0.8,
                    label=f"projected DDP, {' = '.join(names)}")
            counts += xs
    gpu_axis(ax, counts, cuda)
    shade_oversubscribed(ax, [n for n in counts if n in {o.run.gpus for o in outcomes}], cores)
    ax.axhline(100, color="grey", linewidth=0.8)
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    title = f"Scaling efficiency — {device}\nmeasured: {averaged(configurations(outcomes))}"
    counted = unit(cuda).split(" (")[0]
    ax.set(ylabel=f"scaling efficiency (%): speedup ÷ {counted}",
           title=title + ("; broken lines: projected" if projection else ""))
    return finish(fig, ax)


def projected_curves(projection: dict) -> dict[tuple, list[str]]:
    """{(GPU counts, efficiencies in %): the fabrics projected so}: fabrics whose curves coincide
    (communication that hides behind backward on both) share one line, named after all of them,
    rather than hiding each other."""
    step, ddp_step = projection["step_s"], projection["ddp1_step_s"] or projection["step_s"]
    curves: dict[tuple, list[str]] = {}
    for fabric in FABRICS:
        xs = (sorted({1, *fabric.gpu_counts}) if fabric.gpu_counts[0] <= 8
              else list(fabric.gpu_counts))
        ys = [round(100 * projected_efficiency(step, ddp_step, projection["grads"], n, fabric,
                                               projection["bucket_cap_mb"]), 1) for n in xs]
        curves.setdefault((tuple(xs), tuple(ys)), []).append(fabric.name)
    return curves


def breakdown_figure(outcomes, device: str) -> Figure | None:
    """Where a step goes: a horizontal stacked bar per configuration (the report's order, first on
    top) of the parts breakdown.step_split gives, in ms per step (the mean over ranks of the
    profiled steps), each part's value written on it where it is wide enough, the profiled step at
    the bar's end (± its std over the runs); the communication hidden behind compute as a hatched
    outline over the compute it overlapped, not added. A configuration that recorded no split keeps
    its place, marked "not recorded". None where none recorded one."""
    splits = [(m, step_split(m)) for m in measured(outcomes)]
    if not any(split for _, split in splits):
        return None
    widest = max(split.step_ms + split.step_std_ms for _, split in splits if split)
    # the profiled step's label at the bar's end, '43.6 ± 2.1 ms', is as wide as some bars
    fig, ax = plt.subplots(figsize=(9.0, 2.3 + 0.55 * len(splits)))
    for y, (_, split) in enumerate(splits):
        if split is None:
            ax.text(0, y, "  not recorded", va="center", fontsize=8, color="#555555")
            continue
        left = 0.0
        for part in SPLIT_PARTS:
            value = split.parts[part]
            if value <= 0:  # nothing to draw or name (no bubble but a pipeline's)
                continue
            ax.barh(y, value, left=left, height=0.6, color=PART_COLOURS[part],
                    label=PART_NAMES[part])
            if value >= 0.07 * widest:  # wide enough for its figure
                ax.text(left + value / 2, y, f"{value:.1f}", ha="center", va="center", fontsize=8,
                        color="white")
            left += value
        if split.hidden_ms > 0:
            ax.barh(y, split.hidden_ms, left=0.0, height=0.6, fill=False, hatch="///",
                    edgecolor="black", linewidth=0.8, label=HIDDEN)
        if split.step_std_ms:
            ax.errorbar(left, y, xerr=split.step_std_ms, color="black", capsize=3)
        ax.text(left + split.step_std_ms + 0.01 * widest, y, f"{split.step_cell()} ms",
                va="center", fontsize=8)
    names = [f"{m.name()}\n{m.per_gpu_batch} images" + (" each" if m.run.gpus > 1 else "")
             for m, _ in splits]
    ax.set_yticks(range(len(splits)), names, fontsize=8)
    ax.set_ylim(len(splits) - 0.5, -0.5)  # the first configuration on top, as in the table
    # room for the step's label at the widest bar's end
    ax.set_xlim(0, (1.3 if max(split.runs for _, split in splits if split) > 1 else 1.15) * widest)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per part drawn
    order = [PART_NAMES[part] for part in SPLIT_PARTS] + [HIDDEN]
    shown = [name for name in order if name in handles]
    fig.legend([handles[name] for name in shown], shown, fontsize=8, ncol=4, loc="lower center",
               frameon=False)
    ax.set_xlabel("ms per step (mean over ranks of the profiled steps)")
    ax.grid(True, axis="x", alpha=0.3)
    counts = sorted({split.runs for _, split in splits if split})
    runs = ("one run each" if counts == [1] else
            f"the mean of {runs_note(counts).removeprefix('mean ± std of ')}, ± the profiled "
            "step's std (the split's table)")
    ax.set_title(f"Where a step goes — {device}\n{runs}", fontsize=10)
    fig.tight_layout(rect=(0, 0.6 / fig.get_figheight(), 1, 1))  # the legend's two rows below
    return fig


def memory_figure(outcomes, device: str) -> Figure | None:
    """None when no run measured memory (CPU runs)."""
    groups = [g for g in configurations(outcomes) if g[0].results.get("peak_mem_gb_per_gpu")]
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2), 4.5))
    names = []
    for x, group in enumerate(groups):
        # each run's GPUs in order, as the table's memory cell reads them (results_table's)
        per_run = memory_per_gpu_gb([o.row for o in group])
        gpus = [str(i) for i in range(len(per_run[0]))]
        width = 0.8 / len(gpus)
        for i, gpu in enumerate(gpus):
            mean, std = mean_std([gbs[i] for gbs in per_run if len(gbs) > i])
            position = x - 0.4 + width * (i + 0.5)
            ax.bar(position, mean, width=width * 0.9, yerr=std or None, capsize=2,
                   color=f"C{i % 10}", label=f"GPU {gpu}")
            ax.text(position, mean, f"{mean:.1f}", ha="center", va="bottom", fontsize=7)
        names.append(f"{label(group[0])}\n{group[0].run.gpus} "
                     f"GPU{'s' if group[0].run.gpus > 1 else ''}")
    ax.set_xticks(range(len(groups)), names, fontsize=7)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, 1.15 * ax.get_ylim()[1])
    ax.set(ylabel="peak memory per GPU (GB)", title="Peak memory of each GPU — "
                                                    f"{averaged(groups)}\n{device}")
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per GPU index
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------- the files
def pictures_section(outcomes, pictures: list[Path]) -> list[str]:
    """report.md's lines on the pictures written: each shown, and what
    each point or bar of them is."""
    if not pictures:
        return ["No run that succeeded timed a step, so there are no pictures."]
    lines = [" ".join(f"![{p.stem.replace('_', ' ')}]({p.name})" for p in pictures), "",
             "Each point or bar is one configuration: "
             f"{averaged(configurations(outcomes))} (failed runs left out), its figure and error "
             "bar the table's cell and its ±: images/s and scaling efficiency as the results "
             "table has them (made from the mean of the timed steps)."]
    if any(p.name == "step_breakdown.png" for p in pictures):
        lines[-1] += (" *step breakdown* draws the split of \"Where a step goes\" (the mean "
                      "over ranks of the profiled steps): compute, exposed communication, a "
                      "pipeline's bubble, data, optimizer and the rest, stacked; the "
                      "communication hidden behind compute hatched over the compute it "
                      "overlapped, not added; at each bar's end its profiled step, as the split's "
                      "table has it.")
    else:
        lines[-1] += (" There is no step breakdown picture: no run recorded the split of its step "
                      "(above).")
    if not any(p.name == "memory_per_gpu.png" for p in pictures):
        lines[-1] += " There is no memory picture: peak memory is measured on GPUs only."
    return lines


def figures(outcomes, device: str, cuda: bool, projection: dict | None,
            cores: Cores | None = None) -> dict[str, Figure]:
    """{file name: figure} of every picture there is something to draw for. `cores`: the CPU's,
    which CPU runs with more processes oversubscribe (shaded); None: not shaded."""
    made = dict(zip(PICTURES, (throughput_figure(outcomes, device, cuda, cores),
                               efficiency_figure(outcomes, device, cuda, projection, cores),
                               breakdown_figure(outcomes, device),
                               memory_figure(outcomes, device))))
    return {name: fig for name, fig in made.items() if fig is not None}


def write_plots(outcomes, out: Path, device: str, cuda: bool, projection: dict | None,
                cores: Cores | None = None) -> list[Path]:
    """The pictures in `out`, each written whole or not at all (write_file), the paths written."""
    paths, drawn = [], figures(outcomes, device, cuda, projection, cores)
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

"""compare.py's pictures, held to what was measured: each figure is built in-process from hand-made
outcomes (what fill_rows makes of the runs' results.json) and its axes are read before anything is
saved. The real compare.py run, with a failed configuration, is in tests/test_compare.py.
step_breakdown.png is held to the report's own sentences about the split of the step: one function
(breakdown.step_split) computes both."""
from __future__ import annotations

import re

import pytest
from matplotlib import pyplot as plt

from comparison.matrix import Cores, PlannedRun
from comparison.plots import (HIDDEN, PART_COLOURS, breakdown_figure, efficiency_figure, figures,
                              memory_figure, throughput_figure)
from comparison.report.breakdown import breakdown_section, step_split
from comparison.report.measured import groups, measured
from comparison.report.outcome import Outcome
from comparison.report.results_table import memory_cell, table_row
from comparison.report.rows import SPLIT_PARTS, fill_rows
from conftest import REPO

CPU_DEVICE = "CPU (test), no GPU"
# what projection_inputs gives for a model: its gradients' bytes per tensor
GRADS = [4_000_000] * 10


def outcome(mode, gpus, step_ms, *, backend=None, batch=32, repeat=1, data_frac=0.1, memory=None,
            failed=False, unit="cpu", index=1, breakdown=None, reshard=None):
    """One run's outcome as compare.py has it once fill_rows has read its run folder: `batch` is
    the global batch, `step_ms` the mean step, so images/s = batch / step; `breakdown`: each rank's
    split of its trace ({rank: split}, see split()); `memory`: each GPU's peak allocated memory,
    reserved a tenth more."""
    run = PlannedRun(mode, gpus, backend, None, False, batch, repeat, index, unit,
                     reshard_after_forward=reshard)
    if failed:
        return Outcome(run, "failed", error="exit status 1")
    results = {"summary": {"images_per_sec": batch / (step_ms / 1000),
                           "batch_time_p50": step_ms / 1000, "data_wait_frac": data_frac},
               "config": {"batch_size": batch, "amp": "off", "profile_steps": 3},
               "peak_mem_gb_per_gpu": memory and {gpu: [gb, 1.1 * gb]
                                                  for gpu, gb in memory.items()}}
    return Outcome(run, "ok", results=results, split=breakdown)


def split(compute, comm, exposed, data=1.0, optimizer=2.0, other=0.5, bubble=0.0) -> dict:
    """One rank's split, as comparison/breakdown.py makes it from the rank's trace: the parts add up
    to the step; `comm` is all communication, `exposed` the part of it not overlapped with
    compute; `bubble` a pipeline stage's wait for its neighbour (0 in the other modes)."""
    return {"step_ms": compute + exposed + bubble + data + optimizer + other,
            "compute_ms": compute, "comm_ms": comm, "comm_exposed_ms": exposed,
            "bubble_ms": bubble, "data_ms": data, "optimizer_ms": optimizer, "other_ms": other}


def filled(outcomes):
    fill_rows(outcomes, REPO)
    return outcomes


def cpu_matrix(repeats=1, failed_ddp=False):
    """The CPU default: single_gpu, data_parallel on one process, DDP on two
    (gloo), `repeats` times each."""
    runs = []
    for k in range(1, repeats + 1):
        runs += [outcome("single_gpu", 1, 100 + k, repeat=k),
                 outcome("data_parallel", 1, 101 + k, repeat=k),
                 outcome("dist_parallel", 2, 60 + 2 * k, backend="gloo", repeat=k)]
    if failed_ddp:
        runs.append(outcome("dist_parallel", 3, 0, backend="gloo", batch=48, failed=True))
    return filled(runs)


PROJECTION = {"step_s": 0.1, "ddp1_step_s": 0.102, "grads": GRADS, "bucket_cap_mb": 25.0,
              "amp": "off", "batch": 32}


def ticks(ax) -> list[int]:
    return [int(t) for t in ax.get_xticks()]


def legend(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


# ----------------------------------------------------------------------------------------- the axes
def test_throughput_axis_holds_exactly_the_measured_counts():
    fig = throughput_figure(cpu_matrix(), CPU_DEVICE, cuda=False)
    ax = fig.axes[0]
    assert ticks(ax) == [1, 2] and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    assert ax.get_xscale() == "linear" and ax.get_xlim() == pytest.approx((0.5, 2.5))
    assert ax.get_ylim()[0] == 0  # bars and points compare as ratios from zero
    assert legend(ax) == \
        ["single_gpu amp off", "data_parallel amp off", "dist_parallel gloo amp off"]
    assert ax.get_xlabel() == "CPU processes (one thread each)"
    assert ax.get_ylabel() == "images/s (global batch ÷ mean step)"
    assert "one run each" in ax.get_title()
    plt.close(fig)


def test_efficiency_axis_reads_well_from_two_counts_to_a_64_gpu_projection():
    """The defect this mends: the 100 % line's axes-coordinate x data (0 and 1)
    put a tick at 0 on a log axis."""
    fig = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=PROJECTION)
    ax = fig.axes[0]
    assert ticks(ax) == [1, 2, 4, 8, 16, 32, 64] and ax.get_xscale() == "log"
    assert 0.5 < ax.get_xlim()[0] < 1 and 64 < ax.get_xlim()[1] < 128
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16", "32", "64"]
    assert any(name.startswith("projected DDP") for name in legend(ax))
    assert legend(ax)[-3:] == \
        ["single_gpu amp off", "data_parallel amp off", "dist_parallel gloo amp off"]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 110
    plt.close(fig)
    without = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=None).axes[0]
    assert ticks(without) == [1, 2] and without.get_xscale() == "linear"


def test_coinciding_projections_share_one_line_named_after_both():
    """Where communication hides behind backward on NVLink and PCIe alike, their curves coincide:
    one line, both names, instead of one hiding the other."""
    tiny_gradients = {**PROJECTION, "grads": [1000]}  # nothing to communicate: every link keeps up
    ax = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=tiny_gradients).axes[0]
    projected = [name for name in legend(ax) if name.startswith("projected DDP")]
    # the same GPU counts
    assert projected == ["projected DDP, NVLink = PCIe", "projected DDP, InfiniBand"]
    separate = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False,
                                 projection=PROJECTION).axes[0]
    assert [name for name in legend(separate) if name.startswith("projected DDP")] == [
        "projected DDP, NVLink", "projected DDP, PCIe", "projected DDP, InfiniBand"]


def test_repeats_show_their_spread_and_the_title_says_how_many():
    ax = throughput_figure(cpu_matrix(repeats=3), CPU_DEVICE, cuda=False).axes[0]
    assert "mean ± std of 3 runs each" in ax.get_title()
    # the error bars' segments
    caps = [line for container in ax.containers for line in container.lines[2]]
    assert caps and all(segment.get_segments()[0][0][1] != segment.get_segments()[0][1][1]
                        for segment in caps)


def test_a_failed_configuration_is_left_out_and_the_pictures_still_drawn():
    outcomes = cpu_matrix(failed_ddp=True)
    drawn = figures(outcomes, CPU_DEVICE, cuda=False, projection=PROJECTION)
    # no memory on CPUs, no breakdown without a profile
    assert sorted(drawn) == ["images_per_sec.png", "scaling_efficiency.png"]
    # the failed 3-process run is not a point
    assert ticks(drawn["images_per_sec.png"].axes[0]) == [1, 2]
    failed = outcome("dist_parallel", 3, 0, backend="gloo", failed=True)
    profiled = figures(split_matrix() + [failed], CPU_DEVICE, cuda=False, projection=None)
    assert len(profiled["step_breakdown.png"].axes[0].get_yticks()) == 3  # nor a bar
    for fig in profiled.values():
        plt.close(fig)
    for fig in drawn.values():
        plt.close(fig)


# -------------------------------------------------------------------------------- where a step goes
def split_matrix():
    """single_gpu at 32 images, DDP on 2 GPUs at 16 images each (rank 1 a straggler: 8 ms more
    compute; rank 0 waits for it in exposed communication), fsdp on 2 GPUs; DDP twice (its split's
    step differs between its runs)."""
    single = {"0": split(60.0, 0.0, 0.0)}
    ddp = [{"0": split(30.0, 12.0, 10.5), "1": split(38.0, 12.0, 2.5)},
           {"0": split(31.0, 12.4, 10.9), "1": split(39.0, 12.4, 2.9)}]
    fsdp = {"0": split(31.0, 20.0, 7.0), "1": split(31.5, 20.0, 6.5)}
    return filled([outcome("single_gpu", 1, 64, unit="gpu", breakdown=single),
                   outcome("dist_parallel", 2, 45, backend="nccl", unit="gpu", index=2,
                           breakdown=ddp[0]),
                   outcome("dist_parallel", 2, 46, backend="nccl", unit="gpu", index=3, repeat=2,
                           breakdown=ddp[1]),
                   outcome("fsdp", 2, 50, backend="nccl", unit="gpu", index=4, breakdown=fsdp,
                           reshard=True)])


def bars(ax) -> dict[tuple[float, str], float]:
    """{(row, colour or 'hatched'): width} of a horizontal stacked bar chart."""
    drawn = {}
    for patch in ax.patches:
        rgb = [round(255 * c) for c in patch.get_facecolor()[:3]]
        kind = "hatched" if patch.get_hatch() else "#" + "".join(f"{c:02x}" for c in rgb)
        drawn[(round(patch.get_y() + patch.get_height() / 2), kind)] = patch.get_width()
    return drawn


def test_the_step_breakdown_draws_the_numbers_the_sentences_say():
    """Each configuration a bar of the six parts, in ms per step, their widths the split the
    report's table and sentences quote (one function computes them); the hidden communication
    hatched over the compute, not added; the profiled step at the bar's end."""
    outcomes = split_matrix()
    fig = breakdown_figure(outcomes, "2× GPU (test)")
    ax = fig.axes[0]
    drawn = bars(ax)
    splits = [step_split(m) for m in measured(outcomes)]
    assert len(ax.get_yticks()) == 3 and ax.get_ylim()[0] > ax.get_ylim()[1]  # first on top
    for row, each in enumerate(splits):
        for part in SPLIT_PARTS:  # a part of 0 ms (no bubble but a pipeline's) not drawn
            assert drawn.get((row, PART_COLOURS[part]), 0.0) == pytest.approx(each.parts[part])
            assert ((row, PART_COLOURS[part]) in drawn) is (each.parts[part] > 0)
        if each.hidden_ms:
            assert drawn[(row, "hatched")] == pytest.approx(each.hidden_ms)
    assert (0, "hatched") not in drawn  # single_gpu communicates nothing
    texts = [text.get_text() for text in ax.texts]
    section = "\n".join(breakdown_section(outcomes, 3))
    ddp = next(line for line in section.splitlines() if line.startswith("- **dist_parallel"))
    hidden, comm, exposed = re.search(r"([\d.]+) ms of its ([\d.]+) ms of gradient all-reduce "
                                      r"hidden behind compute, ([\d.]+) ms exposed", ddp).groups()
    assert float(hidden) == pytest.approx(drawn[(1, "hatched")], abs=0.05)
    assert float(exposed) == pytest.approx(drawn[(1, PART_COLOURS["comm_exposed_ms"])], abs=0.05)
    assert float(comm) == pytest.approx(float(hidden) + float(exposed), abs=0.11)
    before, after = re.search(r"its profiled step ([\d.]+) → ([\d.]+) ms", ddp).groups()
    # the bars' ends say the same steps, with their spread over the runs where there is one
    assert f"{before} ms" in texts and any(text.startswith(f"{after} ± ") for text in texts)
    ddp_bar = sum(drawn.get((1, PART_COLOURS[part]), 0.0) for part in SPLIT_PARTS)
    assert ddp_bar == pytest.approx(float(after), abs=0.05)
    compute, exposed_bar = PART_COLOURS["compute_ms"], PART_COLOURS["comm_exposed_ms"]
    assert (f"compute {drawn[(0, compute)]:.1f} → {drawn[(1, compute)]:.1f} ms; the part that grew "
            f"most, exposed communication 0.0 → {drawn[(1, exposed_bar)]:.1f} ms") in ddp
    assert "for 16 images per GPU, against 32" in ddp
    assert "rank 1 is the slowest" in ddp and "rank 0, which waits for it" in ddp
    assert ax.get_xlabel() == "ms per step (mean over ranks of the profiled steps)"
    assert ax.get_xlim()[0] == 0
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert labels == ["single_gpu\n32 images", "dist_parallel on 2 GPUs (nccl)\n16 images each",
                      "fsdp on 2 GPUs (nccl, reshard after forward (ZeRO-3))\n16 images each"]
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend == ["compute", "exposed communication", "data", "optimizer", "other", HIDDEN]
    assert "1–2 runs each" in ax.get_title()
    plt.close(fig)


def test_a_configuration_without_a_split_keeps_its_place_and_says_so():
    """A run that left no trace of a whole step (profiling off, a trace that cannot be read): its
    row of the picture says "not recorded"; no run with one: no picture, and the report says
    why."""
    outcomes = split_matrix()
    outcomes[3].split = None
    fill_rows(outcomes, REPO)
    ax = breakdown_figure(outcomes, "2× GPU (test)").axes[0]
    assert len(ax.get_yticks()) == 3 and "  not recorded" in [t.get_text() for t in ax.texts]
    assert not [key for key in bars(ax) if key[0] == 2]
    section = breakdown_section(outcomes, 3)
    assert any(line.startswith("| fsdp on 2 GPUs") and "not recorded" in line for line in section)
    plt.close(ax.figure)
    bare = cpu_matrix()
    assert breakdown_figure(bare, CPU_DEVICE) is None
    assert breakdown_section(bare, 0) == [
        "Not recorded: `--profile_steps 0` left the profiler off; by default compare.py profiles 3 "
        "steps of every run and splits them here."]
    assert breakdown_section(bare, 3) == [
        "Not recorded: no run left a trace of a whole step in its run folder "
        "(`trace_rank<r>.json`)."]


def test_the_step_breakdown_stays_legible_from_two_to_twelve_configurations():
    """Horizontal bars, one row per configuration: the figure grows with them and no two names
    overlap, nor does a name reach into the bars."""
    for count in (2, 12):
        made = [outcome("single_gpu", 1, 64, unit="gpu", breakdown={"0": split(60.0, 0.0, 0.0)})]
        made += [outcome("dist_parallel", 2 ** (1 + k % 3), 45, backend=("nccl", "gloo")[k // 6],
                         unit="gpu", index=k + 2, batch=32 * 2 ** (1 + k % 3) * (1 + k // 3),
                         breakdown={"0": split(30.0, 12.0, 3.0), "1": split(31.0, 12.0, 2.0)})
                 for k in range(count - 1)]
        fig = breakdown_figure(filled(made), "8× GPU (test)")
        ax = fig.axes[0]
        fig.canvas.draw()
        boxes = [label.get_window_extent() for label in ax.get_yticklabels()]
        assert len(boxes) == count
        assert all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
        assert max(box.x1 for box in boxes) <= ax.get_window_extent().x0
        assert fig.get_figheight() >= 0.5 * count
        plt.close(fig)


def left_edge(patch) -> float:
    """A patch's leftmost x in data coordinates: axvspan draws a Polygon up to matplotlib 3.8 and a
    Rectangle from 3.9, and only a Rectangle has get_x()."""
    corners = patch.get_patch_transform().transform(patch.get_path().vertices)
    return float(corners[:, 0].min())


def test_oversubscribed_counts_are_shaded_and_named():
    """8 CPU processes on 2 cores: the counts beyond the cores are shaded from halfway between 2
    and 8, and the legend says why; on enough cores, nothing is."""
    outcomes = filled(cpu_matrix() + [outcome("dist_parallel", 8, 200, backend="gloo", index=9)])
    crowded = throughput_figure(outcomes, CPU_DEVICE, cuda=False, cores=Cores(2, 1)).axes[0]
    spans = [patch for patch in crowded.patches if patch.get_label().startswith("oversubscribed")]
    assert len(spans) == 1 and left_edge(spans[0]) == pytest.approx(5.0)
    assert "oversubscribed: more processes than the 2 cores" in legend(crowded)
    assert ticks(crowded) == [1, 2, 8]
    efficiency = efficiency_figure(outcomes, CPU_DEVICE, cuda=False, projection=None,
                                   cores=Cores(2, 1)).axes[0]
    assert any(name.startswith("oversubscribed") for name in legend(efficiency))
    assert efficiency.get_ylabel() == "scaling efficiency (%): speedup ÷ CPU processes"
    roomy = throughput_figure(outcomes, CPU_DEVICE, cuda=False, cores=Cores(8, 1)).axes[0]
    assert not any(name.startswith("oversubscribed") for name in legend(roomy))
    plt.close("all")


# ------------------------------------------------------------------------------------------- memory
def test_memory_per_gpu_shows_data_parallels_heavier_first_gpu():
    outcomes = filled([outcome("data_parallel", 2, 100, memory={"0": 6.0, "1": 3.5}, unit="gpu"),
                       outcome("dist_parallel", 2, 90, backend="nccl", memory={"0": 4.0, "1": 4.0},
                               unit="gpu", index=2)])
    fig = memory_figure(outcomes, "2× GPU (test)")
    ax = fig.axes[0]
    assert [round(patch.get_height(), 2) for patch in ax.patches] == [6.0, 3.5, 4.0, 4.0]
    first, second = ax.patches[0], ax.patches[1]
    # GPU 0 then GPU 1, a group per run
    assert first.get_x() < second.get_x() < ax.patches[2].get_x()
    assert ax.get_ylabel() == "peak memory per GPU (GB)" and ax.get_ylim()[0] == 0
    assert [text.get_text() for text in ax.texts][:2] == ["6.0", "3.5"]
    plt.close(fig)
    assert memory_figure(cpu_matrix(), CPU_DEVICE) is None  # CPU runs measure no memory


def test_throughput_legend_covers_no_point():
    """The highest point is drawn below the top edge and the legend over no point: a matrix whose
    fastest configuration is at its largest count put it under the legend, at the frame's edge."""
    fig = throughput_figure(cpu_matrix(), CPU_DEVICE, cuda=False)
    ax = fig.axes[0]
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent()
    for line in ax.get_lines():
        for x, y in line.get_xydata():
            px, py = ax.transData.transform((x, y))
            assert not box.contains(px, py), (x, y)
            assert y < ax.get_ylim()[1] * 0.9


# --------------------------------------------------------------------- the table's figures, drawn
def points(ax) -> dict[str, list[tuple[float, float, float]]]:
    """{legend label: [(x, y, error bar's half height)]} of an errorbar chart."""
    drawn = {}
    for container in ax.containers:
        line, _, (bars,) = container.lines
        halves = [abs(segment[1][1] - segment[0][1]) / 2 for segment in bars.get_segments()]
        drawn[container.get_label()] = [(x, y, half) for (x, y), half in
                                        zip(line.get_xydata(), halves)]
    return drawn


def cell(row: str, column: int) -> tuple[float, float]:
    """A results table cell's mean and ± as figures: '1,234 ± 56' -> (1234.0, 56.0)."""
    text = row.strip("| ").split(" | ")[column].rstrip("×% ").replace(",", "")
    mean, _, std = text.partition(" ± ")
    return float(mean), float(std or 0)


def test_the_pictures_draw_the_tables_figures_and_its_spread():
    """Each point is its configuration's table cell: images/s the global batch over the mean step,
    not the mean of the runs' images/s, and its error bar the cell's ±; the same for the scaling
    efficiency."""
    outcomes = filled([outcome("single_gpu", 1, step, repeat=k, index=k)
                       for k, step in enumerate((300.0, 500.0, 400.0), 1)]
                      + [outcome("dist_parallel", 2, step, backend="gloo", repeat=k, index=3 + k)
                         for k, step in enumerate((200.0, 260.0, 230.0), 1)])
    rows = {group[0].run.mode: table_row(group, outcomes) for group in groups(outcomes)}
    images = points(throughput_figure(outcomes, CPU_DEVICE, cuda=False).axes[0])
    efficiency = points(efficiency_figure(outcomes, CPU_DEVICE, cuda=False,
                                          projection=None).axes[0])
    for name, mode in (("single_gpu amp off", "single_gpu"),
                       ("dist_parallel gloo amp off", "dist_parallel")):
        (_, y, half), = images[name]
        assert (round(y), round(half)) == cell(rows[mode], 8)
        (_, y, half), = efficiency[name]
        assert (round(y), round(half)) == cell(rows[mode], 10)
    (_, y, _), = images["single_gpu amp off"]
    assert y == pytest.approx(32 / 0.4) and cell(rows["single_gpu"], 6)[0] == 400.0
    plt.close("all")


def test_the_step_breakdowns_error_bar_is_the_split_tables_spread():
    """The bar's end and its error bar are the split table's profiled step, mean ± std over the
    runs: a figure the report's table shows."""
    outcomes = split_matrix()
    section = breakdown_section(outcomes, 3)
    ddp = next(line for line in section if line.startswith("| dist_parallel on 2 GPUs"))
    profiled = ddp.strip("| ").split(" | ")[2]
    mean, std = (float(x) for x in profiled.split(" ± "))
    ax = breakdown_figure(outcomes, "2× GPU (test)").axes[0]
    (bar,) = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    (segment,) = bar.lines[2][0].get_segments()
    assert segment[1][0] - segment[0][0] == pytest.approx(2 * std, abs=0.11)
    assert f"{profiled} ms" in [text.get_text() for text in ax.texts]
    assert mean == pytest.approx(step_split(measured(outcomes)[1]).step_ms, abs=0.05)
    plt.close("all")


def test_memory_bars_are_the_tables_cells_and_their_spread():
    outcomes = filled([outcome("dist_parallel", 2, 90, backend="nccl", memory=memory,
                               unit="gpu", index=k, repeat=k)
                       for k, memory in enumerate(({"0": 4.0, "1": 4.1}, {"0": 4.2, "1": 4.1}), 1)])
    ax = memory_figure(outcomes, "2× GPU (test)").axes[0]
    heights = [round(patch.get_height(), 2) for patch in ax.patches]
    assert heights == [4.1, 4.1]
    shown = memory_cell([o.row for o in outcomes])
    assert shown == "4.10 ± 0.14 (4.51) / 4.10 (4.51)"  # allocated (reserved), as results.json
    caps = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    (segment,) = caps[0].lines[2][0].get_segments()
    assert segment[1][1] - segment[0][1] == pytest.approx(2 * 0.1414, abs=0.001)
    plt.close("all")

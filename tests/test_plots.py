"""compare.py's pictures, held to what was measured: each figure is built in-process from hand-made outcomes (what
fill_rows makes of the runs' results.json) and its axes are read before anything is saved. The real compare.py run,
with a failed configuration, is in tests/test_compare.py."""
from __future__ import annotations

import pytest
from matplotlib import pyplot as plt

from comparison.matrix import PlannedRun
from comparison.plots import (efficiency_figure, figures, memory_figure, step_figure, step_parts,
                              throughput_figure, configurations)
from comparison.report import Outcome, fill_rows
from conftest import REPO

CPU_DEVICE = "CPU (test), no GPU"
GRADS = [4_000_000] * 10  # what projection_inputs gives for a model: its gradients' bytes per tensor


def outcome(mode, gpus, step_ms, *, backend=None, batch=32, repeat=1, data_frac=0.1, memory=None, failed=False,
            unit="cpu", index=1):
    """One run's outcome as compare.py has it once fill_rows has read its results.json: `batch` is the global
    batch, `step_ms` the mean step, so images/s = batch / step."""
    run = PlannedRun(mode, gpus, backend, None, False, batch, repeat, index, unit)
    if failed:
        return Outcome(run, "failed", error="exit status 1")
    results = {"summary": {"images_per_sec": batch / (step_ms / 1000), "batch_time_p50": step_ms / 1000,
                           "data_wait_frac": data_frac},
               "config": {"batch_size": batch, "amp": "off"}, "peak_mem_gb_per_gpu": memory}
    return Outcome(run, "ok", results=results)


def filled(outcomes):
    fill_rows(outcomes, REPO)
    return outcomes


def cpu_matrix(repeats=1, failed_ddp=False):
    """The CPU default: single_gpu, data_parallel on one process, DDP on two (gloo), `repeats` times each."""
    runs = []
    for k in range(1, repeats + 1):
        runs += [outcome("single_gpu", 1, 100 + k, repeat=k), outcome("data_parallel", 1, 101 + k, repeat=k),
                 outcome("dist_parallel", 2, 60 + 2 * k, backend="gloo", repeat=k)]
    if failed_ddp:
        runs.append(outcome("dist_parallel", 3, 0, backend="gloo", batch=48, failed=True))
    return filled(runs)


PROJECTION = {"step_s": 0.1, "ddp1_step_s": 0.102, "grads": GRADS, "bucket_cap_mb": 25.0, "amp": "off",
              "batch": 32}


def ticks(ax) -> list[int]:
    return [int(t) for t in ax.get_xticks()]


def legend(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


# ---------------------------------------------------------------------------------------------------- the axes
def test_throughput_axis_holds_exactly_the_measured_counts():
    fig = throughput_figure(cpu_matrix(), CPU_DEVICE, cuda=False)
    ax = fig.axes[0]
    assert ticks(ax) == [1, 2] and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    assert ax.get_xscale() == "linear" and ax.get_xlim() == pytest.approx((0.5, 2.5))
    assert ax.get_ylim()[0] == 0  # bars and points compare as ratios from zero
    assert legend(ax) == ["single_gpu amp off", "data_parallel amp off", "dist_parallel gloo amp off"]
    assert ax.get_xlabel() == "CPU processes (one thread each)" and ax.get_ylabel() == "images/s (global)"
    assert "one run each" in ax.get_title()
    plt.close(fig)


def test_efficiency_axis_reads_well_from_two_counts_to_a_64_gpu_projection():
    """The defect this mends: the 100 % line's axes-coordinate x data (0 and 1) put a tick at 0 on a log axis."""
    fig = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=PROJECTION)
    ax = fig.axes[0]
    assert ticks(ax) == [1, 2, 4, 8, 16, 32, 64] and ax.get_xscale() == "log"
    assert 0.5 < ax.get_xlim()[0] < 1 and 64 < ax.get_xlim()[1] < 128
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16", "32", "64"]
    assert any(name.startswith("projected DDP") for name in legend(ax))
    assert legend(ax)[-3:] == ["single_gpu amp off", "data_parallel amp off", "dist_parallel gloo amp off"]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 110
    plt.close(fig)
    without = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=None).axes[0]
    assert ticks(without) == [1, 2] and without.get_xscale() == "linear"


def test_coinciding_projections_share_one_line_named_after_both():
    """Where communication hides behind backward on NVLink and PCIe alike, their curves coincide: one line, both
    names, instead of one hiding the other."""
    tiny_gradients = {**PROJECTION, "grads": [1000]}  # nothing to communicate: every link keeps up
    ax = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=tiny_gradients).axes[0]
    projected = [name for name in legend(ax) if name.startswith("projected DDP")]
    assert projected == ["projected DDP, NVLink = PCIe", "projected DDP, InfiniBand"]  # the same GPU counts
    separate = efficiency_figure(cpu_matrix(), CPU_DEVICE, cuda=False, projection=PROJECTION).axes[0]
    assert [name for name in legend(separate) if name.startswith("projected DDP")] == [
        "projected DDP, NVLink", "projected DDP, PCIe", "projected DDP, InfiniBand"]


def test_repeats_show_their_spread_and_the_title_says_how_many():
    ax = throughput_figure(cpu_matrix(repeats=3), CPU_DEVICE, cuda=False).axes[0]
    assert "mean ± std of 3 runs each" in ax.get_title()
    caps = [line for container in ax.containers for line in container.lines[2]]  # the error bars' segments
    assert caps and all(segment.get_segments()[0][0][1] != segment.get_segments()[0][1][1] for segment in caps)


def test_a_failed_configuration_is_left_out_and_the_pictures_still_drawn():
    outcomes = cpu_matrix(failed_ddp=True)
    drawn = figures(outcomes, CPU_DEVICE, cuda=False, projection=PROJECTION)
    assert sorted(drawn) == ["images_per_sec.png", "scaling_efficiency.png", "step_time.png"]  # no memory on CPUs
    assert ticks(drawn["images_per_sec.png"].axes[0]) == [1, 2]  # the failed 3-process run is not a point
    assert len(drawn["step_time.png"].axes[0].get_xticks()) == 3  # nor a bar
    for fig in drawn.values():
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------- where a step goes
def test_a_step_splits_into_data_compute_and_what_the_parallelism_costs():
    """Weak scaling (32 images per GPU everywhere): DDP's 130 ms step against single_gpu's 100 ms, each 10 %
    data wait; the part above single_gpu's compute is the parallelism's."""
    outcomes = filled([outcome("single_gpu", 1, 100, batch=32, unit="gpu"),
                       outcome("dist_parallel", 2, 130, backend="nccl", batch=64, unit="gpu", index=2)])
    groups = configurations(outcomes)
    single, ddp = (step_parts(group, groups) for group in groups)
    assert list(single) == ["data wait", "compute"] and single["compute"][0] == pytest.approx(90)
    assert ddp["data wait"][0] == pytest.approx(13) and ddp["compute"][0] == pytest.approx(90)
    assert ddp["parallelism"][0] == pytest.approx(130 - 13 - 90)
    fig = step_figure(outcomes, "1× GPU (test)", cuda=True)
    ax = fig.axes[0]
    heights = sorted(round(patch.get_height(), 3) for patch in ax.patches)
    assert heights == sorted(round(h, 3) for h in [10, 90, 13, 90, 27])
    texts = [text.get_text() for text in ax.texts]
    assert "100.0 ms\n" in texts and "130.0 ms\n" in texts and "27.0" in texts  # the numbers on the bars
    assert legend(ax) == ["parallelism", "compute", "data wait"]
    assert ax.get_ylim()[0] == 0 and ax.get_ylabel() == "ms per step (mean)"
    plt.close(fig)


def test_without_single_gpu_at_the_same_per_gpu_batch_the_parallelism_is_not_guessed():
    outcomes = cpu_matrix()  # DDP on 2 processes has 16 images each; single_gpu and data_parallel 32
    groups = configurations(outcomes)
    assert list(step_parts(groups[2], groups)) == ["data wait", "compute"]
    assert list(step_parts(groups[1], groups)) == ["data wait", "compute", "parallelism"]  # data_parallel: 32
    fig = step_figure(outcomes, CPU_DEVICE, cuda=False)
    ax = fig.axes[0]
    note = " ".join(text.get_text() for text in fig.texts)
    assert "No single_gpu run at 16 images per GPU" in note and "--batch_per_gpu" in note
    assert [label.get_text().splitlines()[-1] for label in ax.get_xticklabels()] == [
        "1 × 32 images", "1 × 32 images", "2 × 16 images"]
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- memory
def test_memory_per_gpu_shows_data_parallels_heavier_first_gpu():
    outcomes = filled([outcome("data_parallel", 2, 100, memory={"0": 6.0, "1": 3.5}, unit="gpu"),
                       outcome("dist_parallel", 2, 90, backend="nccl", memory={"0": 4.0, "1": 4.0}, unit="gpu",
                               index=2)])
    fig = memory_figure(outcomes, "2× GPU (test)")
    ax = fig.axes[0]
    assert [round(patch.get_height(), 2) for patch in ax.patches] == [6.0, 3.5, 4.0, 4.0]
    first, second = ax.patches[0], ax.patches[1]
    assert first.get_x() < second.get_x() < ax.patches[2].get_x()  # GPU 0 then GPU 1, a group per run
    assert ax.get_ylabel() == "peak memory per GPU (GB)" and ax.get_ylim()[0] == 0
    assert [text.get_text() for text in ax.texts][:2] == ["6.0", "3.5"]
    plt.close(fig)
    assert memory_figure(cpu_matrix(), CPU_DEVICE) is None  # CPU runs measure no memory

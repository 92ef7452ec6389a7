"""The report's `Recommendation:` line (comparison.report.recommendation), one test per rule, on
outcomes built here as fill_rows makes them of the runs' results.json, and a model state from the
memory projection of a small model built on the meta device. That the line heads a real report:
tests/test_compare.py, on its comparison."""
from __future__ import annotations

import re
import statistics

import pytest
import torch
from torch import nn

from comparison.matrix import PlannedRun
from comparison.projection import memory_projection
from comparison.report.findings import findings
from comparison.report.measured import groups, measured
from comparison.report.outcome import Outcome
from comparison.report.projection_memory import memory_section
from comparison.report.recommendation import recommendation
from comparison.report.results_table import table_row
from comparison.report.rows import fill_rows
from conftest import REPO

SINGLE, DDP, GLOO = (("single_gpu", 1, None), ("dist_parallel", 2, "nccl"),
                     ("dist_parallel", 2, "gloo"))
DP, FSDP, DP1 = ("data_parallel", 2, None), ("fsdp", 2, "nccl"), ("data_parallel", 1, None)


def made(speeds: dict, unit: str = "gpu", failed: dict | None = None,
         status: str = "failed") -> list[Outcome]:
    """A comparison's outcomes: each configuration a run per figure of images/s given, 64 images per
    GPU; `failed`: configuration -> error of one more run of it that did not succeed, with
    `status` (failed, interrupted, not run)."""
    outcomes = []
    for setting, images_per_sec in speeds.items():
        mode, gpus, backend = setting
        for repeat, speed in enumerate(images_per_sec, 1):
            run = PlannedRun(mode, gpus, backend, None, False, 64 * gpus, repeat, len(outcomes) + 1,
                             unit)
            results = {"summary": {"images_per_sec": speed, "batch_time_p50": 64 * gpus / speed},
                       "config": {"batch_size": 64 * gpus, "amp": "bf16"}}
            outcomes.append(Outcome(run, "ok", results=results))
    for (mode, gpus, backend), error in (failed or {}).items():
        run = PlannedRun(mode, gpus, backend, None, False, 64 * gpus, 1, len(outcomes) + 1, unit)
        outcomes.append(Outcome(run, status, error=error))
    fill_rows(outcomes, REPO)
    return outcomes


def state(capacity: int | None = 80 * 2**30) -> dict:
    """The memory projection of a model of 1.01M parameters (a root of 10k, ten blocks of 100k)
    against a GPU of `capacity` bytes (None: no GPU, an assumed one), with a name as compare.py
    gives it: DDP needs 12.1 MB a GPU."""
    with torch.device("meta"):
        model = nn.Module()
        model.stem = nn.Linear(100, 100)
        model.blocks = nn.ModuleList(nn.Linear(1000, 100, bias=False) for _ in range(10))
    memory = memory_projection(lambda alpha: model, None, "off", True, capacity)
    return {**memory, "name": "tenblocks"}


def line(outcomes, memory=None) -> str:
    text = recommendation(outcomes, memory or state())
    assert text.startswith("Recommendation: ") and "\n" not in text
    return text


def speedup_cell(outcomes, mode: str) -> str:
    """The table's speedup cell of `mode`'s configuration: the figure the
    recommendation must quote as it is."""
    row = next(table_row(group, outcomes) for group in groups(outcomes)
               if group[0].run.mode == mode)
    return row.split(" | ")[9]


def test_ddp_fastest_beyond_the_spread_is_recommended_with_the_tables_speedup():
    outcomes = made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]})
    text = line(outcomes)
    assert text.startswith("Recommendation: dist_parallel (DDP): the model state under DDP, "
                           "11.6 MiB per GPU (weights, gradients and optimizer state; "
                           "projection.md), fits one GPU of 80.0 GiB, and DDP was fastest: "
                           "dist_parallel on 2 GPUs (nccl) at ")
    assert (f"at {speedup_cell(outcomes, 'dist_parallel')} one GPU, its range (mean ± std over 3 "
            "runs) above every other") in text
    assert "1.93 ± 0.08×" in text and "CPU process" not in text


def test_modes_whose_runs_overlap_tie_and_ddp_is_the_default_with_the_guides_reason():
    outcomes = made({SINGLE: [600, 640, 620], DP: [1180, 1300, 1240], DDP: [1150, 1250, 1200]})
    text = line(outcomes)
    assert text.startswith("Recommendation: dist_parallel (DDP): the model state under DDP, "
                           "11.6 MiB per GPU")
    assert ("no difference measurable between data_parallel on 2 GPUs and dist_parallel on 2 GPUs "
            "(nccl): their images/s (mean ± std over the repeats) overlap (data_parallel on 2 GPUs "
            "1,238 ± 60; dist_parallel on 2 GPUs (nccl) 1,199 ± 50), so any of them") in text
    assert ("DDP is the default where modes tie: PyTorch recommends it over DataParallel even on "
            "one machine, it scales past one node") in text and "(docs/guide.md)" in text


def test_one_run_each_shows_no_mode_faster_so_ddp_is_the_default():
    text = line(made({SINGLE: [600], DP: [1300], DDP: [1200]}))
    assert text.startswith("Recommendation: dist_parallel (DDP): the model state under DDP, "
                           "11.6 MiB per GPU")
    assert ("one run per configuration measures no spread, so no mode is shown faster than "
            "another (data_parallel on 2 GPUs was fastest in its run, 2.17× one GPU, and "
            "dist_parallel on 2 GPUs (nccl) 2.00× one GPU in its, slower in one run, which no "
            "noise measured here confirms or rules out; `--repeat 3` measures the spread)") in text


def test_data_parallel_only_on_measured_cause():
    """Beyond DDP's range: data_parallel, saying so. Faster than the rest with DDP not run: still
    DDP, not run. Tied with one GPU, DDP slower: one GPU, the simpler."""
    outcomes = made({SINGLE: [600, 640, 620], DP: [1400, 1420, 1410], DDP: [1150, 1250, 1200]})
    text = line(outcomes)
    assert text.startswith("Recommendation: data_parallel (nn.DataParallel): fastest, "
                           "data_parallel on 2 GPUs at "
                           f"{speedup_cell(outcomes, 'data_parallel')} one GPU")
    assert (f"dist_parallel's ({speedup_cell(outcomes, 'dist_parallel')} one GPU) "
            "included: the measured cause" in text)
    alone = line(made({SINGLE: [600, 640, 620], DP: [1400, 1420, 1410]}))
    assert alone.startswith("Recommendation: dist_parallel (DDP), not run "
                            "here (add it to --modes): ")
    assert ("data_parallel was fastest (2.28 ± 0.02× one GPU) but dist_parallel was "
            "not measured beside it" in alone)
    tied = line(made({SINGLE: [1380, 1400, 1390], DP: [1390, 1420, 1405], DDP: [1150, 1250, 1200]}))
    # where they tie, the simpler mode
    assert tied.startswith("Recommendation: single_gpu: no difference measurable between "
                           "data_parallel on 2 GPUs and single_gpu")
    assert ("dist_parallel on 2 GPUs (nccl) was slower beyond the noise (0.86 ± 0.04× one GPU, "
            "its range below data_parallel on 2 GPUs (1,405 ± 15 images/s)), the measured cause "
            "to prefer single_gpu here.") in tied, tied


def test_fsdp_or_one_gpu_when_it_is_faster_beyond_the_spread():
    fsdp = line(made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200], FSDP: [1300, 1320, 1310]}))
    assert fsdp.startswith("Recommendation: fsdp (FSDP2): fastest, fsdp on 2 GPUs (nccl) at 2.11 ± "
                           "0.02× one GPU, its range (mean ± std over 3 runs) above every other "
                           "configuration's, DDP's included, though the model state under DDP")
    single = line(made({SINGLE: [1300, 1320, 1310], DDP: [1150, 1250, 1200]}))
    assert single.startswith("Recommendation: single_gpu: faster than every parallel configuration "
                             "here (1,310 ± 10 images/s, its range (mean ± std over 3 runs) above")


def test_fsdp_where_ddps_model_state_outgrows_the_gpu_whatever_the_speed():
    """12.1 MB under DDP against a 10 MB GPU: FSDP on 2 GPUs holds 6.1 MB plus what it gathers.
    Against 1 MB, not even FSDP on 64 GPUs: none of these modes."""
    speeds = made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]})
    text = line(speeds, state(10_000_000))
    assert text.startswith("Recommendation: fsdp (FSDP2): under DDP each GPU would need 11.6 MiB "
                           "for the model state alone (weights, gradients and optimizer state), "
                           "more than its 9.5 MiB; FSDP holds it on 2 GPUs or more")
    none = line(speeds, state(1_000_000))
    assert none.startswith("Recommendation: none of these modes: under DDP each "
                           "GPU would need 11.6 MiB")
    assert "FSDP on 64 GPUs still" in none and "(tensor, pipeline stages with FSDP" in none


PIPE = ("pipeline_parallel", 2, "nccl")


def split(step: float, exposed: float = 0.0, bubble: float = 0.0) -> dict:
    """Two ranks' split of the step (comparison/breakdown.py's figures, ms): the rest compute."""
    parts = dict(step_ms=step, compute_ms=step - exposed - bubble, comm_ms=exposed,
                 comm_exposed_ms=exposed, bubble_ms=bubble, data_ms=0.0, optimizer_ms=0.0,
                 other_ms=0.0)
    return {"0": parts, "1": parts}


def with_splits(speeds: dict, splits: dict) -> list[Outcome]:
    """made()'s outcomes, each configuration's runs given `splits`' split, the pipeline's runs its
    2 stages and 4 micro-batches as its results.json has them."""
    outcomes = made(speeds)
    for o in outcomes:
        o.split = splits.get((o.run.mode, o.run.gpus, o.run.backend))
        if o.run.mode == "pipeline_parallel":
            o.results["stages"] = [{"first": "stem", "last": "blocks.4"},
                                   {"first": "blocks.5", "last": "blocks.9"}]
            o.results["config"] |= {"microbatches": 4, "schedule": "1f1b"}
            o.results["bubble_fraction"] = 1 / 5
    fill_rows(outcomes, REPO)
    return outcomes


def test_pipeline_where_the_state_outgrows_a_gpu_and_fsdps_traffic_costs_more_than_the_bubble():
    """12.1 MB under DDP against a 10 MB GPU, pipeline_parallel and fsdp both on 2 GPUs: the
    pipeline where its largest stage (5 blocks, 6 MB) fits and its step waits less in its bubble
    than fsdp's in its exposed communication; fsdp where it waits more, with the pipeline named as
    the other way to hold the state."""
    from comparison.projection import Piece
    memory = state(10_000_000)
    memory["pieces"] = [Piece("stem", 10_100, 10_000, 10_000)] + [
        Piece(f"blocks.{i}", 100_000, 100_000, 100_000) for i in range(10)]
    speeds = {SINGLE: [600, 640, 620], FSDP: [1000, 1010, 1020], PIPE: [900, 910, 920]}
    cheap = line(with_splits(speeds, {FSDP: split(120, exposed=30), PIPE: split(140, 8, 12)}),
                 memory)
    assert cheap.startswith("Recommendation: pipeline_parallel (torch.distributed.pipelining): "
                            "under DDP each GPU would need 11.6 MiB")
    assert ("holds it in 2 stages of 5.8 MiB at most, and its step waits 20.0 ms in its bubble "
            "and transfers against 30.0 ms of exposed all-gathers and reduce-scatters for fsdp on "
            "2 GPUs (nccl)") in cheap
    costly = line(with_splits(speeds, {FSDP: split(120, exposed=10), PIPE: split(140, 8, 12)}),
                  memory)
    assert costly.startswith("Recommendation: fsdp (FSDP2): under DDP each GPU would need")
    assert ("pipeline_parallel would hold it too, on 2 stages (5.8 MiB on the largest): "
            "`--modes fsdp pipeline_parallel` on as many GPUs weighs") in costly


def test_fsdp_where_a_ddp_run_ran_out_of_memory_and_fsdp_ran():
    outcomes = made({SINGLE: [600, 640, 620], FSDP: [1000, 1010, 1020]},
                    failed={DDP: "exit status 1: torch.OutOfMemoryError: CUDA out of memory. "
                                 "Tried to allocate 2 GiB"})
    text = line(outcomes)
    assert text.startswith("Recommendation: fsdp (FSDP2): dist_parallel ran out of memory "
                           "(`07-dist_parallel-2gpu-nccl-r1`")
    assert "and fsdp ran (fsdp on 2 GPUs (nccl), 1,010 images/s)" in text


def test_nothing_timed_recommends_nothing():
    text = line(made({}, failed={SINGLE: "exit status 1: error: boom",
                                 DDP: "exit status 1: error: boom"}))
    assert text == ("Recommendation: none: no run timed a step, so nothing was measured to choose "
                    "by (the failed runs are listed below).")


def test_on_the_cpu_it_says_what_processes_standing_in_for_gpus_can_and_cannot_tell():
    text = line(made({SINGLE: [600, 640, 620], GLOO: [1150, 1250, 1200]}, unit="cpu"), state(None))
    assert "fits one GPU of 80.0 GiB (assumed: no GPU here)" in text
    assert "at 1.93 ± 0.08× one CPU process" in text
    assert text.endswith("On this CPU-only machine each \"GPU\" is a CPU process with one "
                         "thread: its figures show the modes' mechanics (processes over gloo, "
                         "the split batch, each wrapper's own cost), not what GPUs would gain, "
                         "nor NCCL, nor GPU memory (projected, not measured); run compare.py on "
                         "GPUs to choose for them.")


# The first sentence under the table and the Recommendation: line judge speed alike (the same
# ranges, mean ± std, the same contenders); a scenario per kind of verdict.
VERDICTS = [
    ({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]}, "gpu", "dist_parallel"),  # apart
    ({SINGLE: [1300, 1320, 1310], DDP: [1150, 1250, 1200]}, "gpu", "single_gpu"),  # apart
    ({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200], FSDP: [1300, 1320, 1310]}, "gpu", "fsdp"),
    ({SINGLE: [600, 640, 620], DP: [1180, 1300, 1240], DDP: [1150, 1250, 1200]}, "gpu", None),
    ({SINGLE: [600], DP: [1300], DDP: [1200]}, "gpu", None),  # one run each
    ({SINGLE: [600, 640, 620], DDP: [1200]}, "gpu", None),  # one run of one: no spread there
    ({SINGLE: [400, 440, 420], DP1: [900, 300, 600], GLOO: [700, 720, 710]}, "cpu",
     "dist_parallel"),  # data_parallel on the CPU is no contender
]


def test_the_first_sentence_and_the_recommendation_never_disagree_on_speed():
    for speeds, unit, fastest in VERDICTS:
        outcomes = made(speeds, unit)
        first = findings(outcomes)[0]
        text = line(outcomes, state(None if unit == "cpu" else 80 * 2**30))
        if fastest is None:
            assert "cannot be told apart" in first and "**Fastest" not in first, first
            assert "no mode is shown faster" in text or "no difference measurable" in text, text
            assert ": fastest" not in text and "was fastest:" not in text
            assert "faster than every" not in text
        else:
            assert first.startswith(f"- **Fastest: {fastest}"), first
            assert "lies above every other's" in first
            assert text.startswith(f"Recommendation: {fastest}"), text
            assert "above every other" in text, text


def test_data_parallel_on_the_cpu_is_named_for_what_it_is_not_crowned():
    """Without GPUs nn.DataParallel calls the model itself: a run of it is single_gpu's
    computation. Faster than the rest by chance, it is neither the fastest nor recommended, and the
    sentences say why; its scaling efficiency is its speedup ÷ its one process, as for any
    configuration."""
    outcomes = made({SINGLE: [400, 440, 420], DP1: [900, 300, 600], GLOO: [700, 720, 710]},
                    unit="cpu")
    said = findings(outcomes)
    assert said[0].startswith("- **Fastest: dist_parallel on 2 CPU processes (gloo)**, 710 ± 10 "
                              "images/s")
    assert said[1] == ("- **data_parallel on 1 CPU process is single_gpu's computation:** without "
                       "GPUs nn.DataParallel calls the model itself, with nothing to scatter, "
                       "replicate or gather; its 491 ± 279 images/s against single_gpu's 419 ± 20 "
                       "is no measure of DataParallel, so it is left out of the ranking.")
    assert "data_parallel" not in line(outcomes, state(None)).split(" On this CPU-only")[0]
    row = next(table_row(group, outcomes) for group in groups(outcomes)
               if group[0].run.mode == "data_parallel")
    # the speedup, ± the step's share, and the efficiency it makes on one process
    speedup, efficiency = row.split(" | ")[9:11]
    assert speedup.endswith("×") and efficiency == f"{float(speedup.split()[0]) * 100:.0f} %" \
        or efficiency.startswith(f"{float(speedup.split()[0]) * 100:.0f} ± ")


# --- under noise: what the run resolves, no gain, and the modes that failed ---------------------

def said(outcomes) -> str:
    return "\n".join(findings(outcomes))


def test_two_configurations_of_the_same_computation_state_the_noise_floor():
    """On one CPU process single_gpu and data_parallel do the same computation: their 82 and 112
    images/s (repeats of 21 and 3 spread) are a floor no difference under which is shown. The
    report states it where it was measured, and judges by it: DDP at 1.2× one process, within
    the floor, ties with one process, and is not called fastest."""
    outcomes = made({SINGLE: [61, 103, 82], DP1: [109, 115, 112], GLOO: [98, 100, 99]}, unit="cpu")
    text = said(outcomes)
    floor = next(line for line in text.splitlines() if line.startswith("- **Noise floor"))
    assert "single_gpu and data_parallel on 1 CPU process do the same computation" in floor
    assert re.search(r"measured [\d,]+ ± \d+ and 112 ± 3 images/s", floor), floor
    assert re.search(r"(\d+) % apart", floor) and "differences of less than" in floor, floor
    assert "**Fastest" not in text
    assert "- **Tied with one CPU process:** dist_parallel on 2 CPU processes (gloo)" in text
    advice = line(outcomes, state(None))
    assert "It ties with one CPU process" in advice and "noise floor" in advice


def test_repeats_state_the_spread_they_measured():
    outcomes = made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]})
    floor = next(line for line in said(outcomes).splitlines() if line.startswith("- **Noise"))
    assert "3 runs" in floor and re.search(r"up to \d\.\d %", floor), floor


def test_no_floor_is_claimed_where_none_was_measured():
    text = said(made({SINGLE: [600], DDP: [1200]}))
    assert "Noise floor" not in text and "cannot be told apart: one run each" in text


def test_a_parallel_mode_whose_range_includes_one_gpus_ties_with_it():
    """DDP at 1.02 ± 0.05× one GPU: a tie, in the sentences and the recommendation, which still
    names DDP only as the default among modes that tie, with that said."""
    outcomes = made({SINGLE: [600, 610, 620], DDP: [590, 650, 620]})
    text = said(outcomes)
    assert "- **Tied with one GPU:** dist_parallel on 2 GPUs (nccl) at 1.0" in text
    assert "(its range includes 1×)" in text
    advice = line(outcomes)
    assert "It ties with one GPU" in advice and "dist_parallel on 2 GPUs (nccl) at 1.0" in advice
    # beyond it: faster, and no tie said
    beyond = said(made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]}))
    assert "Tied with" not in beyond and "- **Faster than one GPU:** dist_parallel" in beyond


@pytest.mark.parametrize("status, error, named", [
    ("failed", "exit status 1: RuntimeError: Gloo connectFullMesh failed", "failed"),
    ("interrupted", "compare.py was stopped by SIGTERM and stopped the run; it exited with status "
                    "143", "was stopped"),
    ("not run", "compare.py was stopped by SIGTERM before it started", "was not run"),
])
def test_a_failed_or_stopped_ddp_is_never_recommended_and_is_named(status, error, named):
    """DDP in the matrix that did not time a step is not "not run here (add it to --modes)": it
    is named for what happened to it, and the recommendation is among the modes measured."""
    for speeds in ({SINGLE: [600, 640, 620], DP: [1180, 1300, 1240]},  # a tie
                   {SINGLE: [600], DP: [1300]},  # one run each
                   {SINGLE: [600, 640, 620], DP: [1400, 1420, 1410]}):  # data_parallel beyond
        text = line(made(speeds, failed={DDP: error}, status=status))
        assert not text.startswith("Recommendation: dist_parallel"), text
        assert "add it to --modes" not in text
        assert f"dist_parallel (DDP) {named} here (`" in text, text
    text = line(made({SINGLE: [600, 640, 620], DP: [1400, 1420, 1410]}, failed={DDP: error},
                     status=status))
    assert text.startswith("Recommendation: data_parallel (nn.DataParallel): fastest")


def test_a_failed_fsdp_is_not_recommended_where_ddp_cannot_hold_the_model():
    outcomes = made({SINGLE: [600, 640, 620]}, failed={FSDP: "exit status 1: error: boom"})
    text = line(outcomes, state(10_000_000))
    assert not text.startswith("Recommendation: fsdp"), text
    assert "fsdp (FSDP2) failed here (`" in text and "add it to --modes" not in text


def test_the_memory_figures_of_the_report_and_the_projection_are_each_named():
    """The recommendation's model state under DDP on one GPU is projection.md's, under the same
    name; projection.md's "at most" over every setting says which setting that is."""
    memory = state()
    advice = line(made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]}), memory)
    ddp = re.search(r"model state under DDP, ([\d.]+ [KMG]iB) per GPU", advice).group(1)
    page = "\n".join(memory_section(memory, [], None))
    assert f"{ddp} per GPU under DDP" in page, page
    assert re.search(r"at most [\d.]+ [KMG]iB per GPU in any setting, DDP or FSDP on 1 to 64 GPUs "
                     r"\((FSDP|DDP)[^)]* on \d+ GPU", page), page


# --- judged with the noise floor the run measured ----------------------------------------------
# On the CPU single_gpu and data_parallel on 1 process do the same computation: their gap is the
# floor. Each scenario as a report met it, one run each unless repeated.

def sentence(outcomes, lead: str) -> str | None:
    return next((text for text in findings(outcomes) if text.startswith(lead)), None)


def test_a_mode_slower_beyond_the_floor_is_named_slower_and_not_recommended():
    """resnet18 at 32 px on two CPU processes: DDP at 0.75× one process, one run each, beside an
    11 % floor. The verdict names single_gpu fastest beyond the floor, a sentence names DDP
    slower, and the recommendation is single_gpu, naming DDP's figure as the table has it."""
    outcomes = made({SINGLE: [100], DP1: [90], GLOO: [75]}, unit="cpu")
    verdict = findings(outcomes)[0]
    assert verdict.startswith("- **Fastest: single_gpu**, 100 images/s: 1.33× the next fastest, "
                              "dist_parallel on 2 CPU processes (gloo) at 75"), verdict
    assert "more than the 11 % noise floor" in verdict and "one run each" in verdict, verdict
    slower = sentence(outcomes, "- **Slower than one CPU process:**")
    assert slower is not None and slower.startswith(
        "- **Slower than one CPU process:** dist_parallel on 2 CPU processes (gloo) at 0.75× one "
        "CPU process (more than the 11 % noise floor below 1×)"), findings(outcomes)
    text = line(outcomes, state(None))
    assert text.startswith("Recommendation: single_gpu: faster than every parallel "
                           "configuration here"), text
    assert f"dist_parallel on 2 CPU processes (gloo) at {speedup_cell(outcomes, 'dist_parallel')}"\
           " one CPU process" in text and "slower" in text, text
    assert "no mode is shown faster" not in text


def test_a_mode_within_the_floor_ties_and_is_said_to_tie_not_to_gain_nothing():
    """DDP at 1.05× one process within a 14 % floor: neither faster nor slower, as far as the run
    can tell; said as a tie, in the sentences and the recommendation, never "no gain"."""
    outcomes = made({SINGLE: [100], DP1: [88], GLOO: [105]}, unit="cpu")
    text = said(outcomes)
    assert "No gain" not in text and "no gain" not in text, text
    assert findings(outcomes)[0].startswith(
        "- **dist_parallel on 2 CPU processes (gloo) and single_gpu cannot be told apart:**")
    assert "lie within the 14 % noise floor" in findings(outcomes)[0]
    tied = sentence(outcomes, "- **Tied with one CPU process:**")
    assert tied is not None and tied.startswith(
        "- **Tied with one CPU process:** dist_parallel on 2 CPU processes (gloo) at 1.05× one CPU "
        "process (within the 14 % noise floor of 1×)"), text
    advice = line(outcomes, state(None))
    assert advice.startswith("Recommendation: dist_parallel (DDP): "), advice
    assert "No gain" not in advice and "no gain" not in advice, advice
    assert ("It ties with one CPU process: dist_parallel on 2 CPU processes (gloo) at 1.05× one "
            "CPU process (within the 14 % noise floor of 1×)") in advice, advice


def test_one_run_each_beside_a_floor_is_judged_by_the_floor():
    """DDP at 2.13× one process, one run each, beside a 23 % floor: faster, named so; not
    "cannot be told apart: one run each" beside the floor the same report states."""
    outcomes = made({SINGLE: [100], DP1: [123], GLOO: [213]}, unit="cpu")
    text = said(outcomes)
    assert "cannot be told apart" not in text and "- **Noise floor: 23 %.**" in text, text
    assert findings(outcomes)[0].startswith("- **Fastest: dist_parallel on 2 CPU processes "
                                            "(gloo)**, 213 images/s: 2.13× the next fastest")
    assert sentence(outcomes, "- **Faster than one CPU process:** dist_parallel on 2 CPU "
                              "processes (gloo) at 2.13× one CPU process") is not None, text
    advice = line(outcomes, state(None))
    assert advice.startswith("Recommendation: dist_parallel (DDP): "), advice
    assert "DDP was fastest: dist_parallel on 2 CPU processes (gloo) at 2.13× one CPU" in advice
    assert "more than the 23 % noise floor" in advice and "no mode is shown faster" not in advice


def test_data_parallel_on_the_cpu_beside_ddp_alone_is_named_with_its_timing():
    """`--modes data_parallel dist_parallel` on the CPU: both timed a step, as the table shows;
    neither the sentences nor the recommendation say that only dist_parallel did."""
    outcomes = made({DP1: [253], GLOO: [362]}, unit="cpu")
    text = said(outcomes) + "\n" + line(outcomes, state(None))
    assert "Only dist_parallel" not in text and "only dist_parallel" not in text, text
    verdict = findings(outcomes)[0]
    assert "data_parallel on 1 CPU process timed a step too (253 images/s)" in verdict, verdict
    assert "dist_parallel on 2 CPU processes (gloo)" in verdict and "362" in verdict
    assert "data_parallel on 1 CPU process, 253 images/s," in line(outcomes, state(None))


def test_a_mode_tied_with_the_fastest_but_slower_than_another_beyond_the_floor_is_not_chosen():
    """FSDP, the fastest, has a range wide enough to overlap both one process's and DDP's, but DDP
    lies below one process beyond the floor: the tie is FSDP's and single_gpu's; DDP is named
    slower, in the verdict and the recommendation, and not recommended."""
    outcomes = made({SINGLE: [99, 100, 101], DP1: [95, 95.1, 94.9], GLOO: [89, 90, 91],
                     ("fsdp", 2, "gloo"): [80, 110, 140]}, unit="cpu")
    assert findings(outcomes)[0] == (
        "- **fsdp on 2 CPU processes (gloo) and single_gpu cannot be told apart:** their images/s "
        "(mean ± std over 3 runs) overlap or lie within the 5.3 % noise floor: fsdp on 2 CPU "
        "processes (gloo) 104 ± 30; single_gpu 100 ± 1. dist_parallel on 2 CPU processes (gloo) "
        "(90 ± 1) is not told from fsdp on 2 CPU processes (gloo) either, but lies below "
        "single_gpu beyond the noise.")
    advice = line(outcomes, state(None))
    assert advice.startswith("Recommendation: fsdp (FSDP2): no difference measurable between fsdp "
                             "on 2 CPU processes (gloo) and single_gpu: "), advice
    assert ("; dist_parallel on 2 CPU processes (gloo) was slower beyond the noise (0.90 ± 0.01× "
            "one CPU process, its range below single_gpu (100 ± 1 images/s), by more than the "
            "5.3 % noise floor), the measured cause to prefer fsdp here.") in advice, advice
    assert sentence(outcomes, "- **Slower than one CPU process:** dist_parallel on 2 CPU "
                              "processes (gloo) at 0.90") is not None, said(outcomes)


SCENARIOS = [  # (speeds, unit): every kind of verdict, with and without a floor
    ({SINGLE: [100], DP1: [90], GLOO: [75]}, "cpu"),
    ({SINGLE: [100], DP1: [88], GLOO: [105]}, "cpu"),
    ({SINGLE: [100], DP1: [123], GLOO: [213]}, "cpu"),
    ({SINGLE: [100], DP1: [95], GLOO: [80], ("fsdp", 2, "gloo"): [103]}, "cpu"),
    ({SINGLE: [61, 103, 82], DP1: [109, 115, 112], GLOO: [98, 100, 99]}, "cpu"),
    ({SINGLE: [99, 100, 101], DP1: [95, 95.1, 94.9], GLOO: [79, 80, 81],
      ("fsdp", 2, "gloo"): [76, 101, 126]}, "cpu"),
    ({SINGLE: [99, 100, 101], DP1: [95, 95.1, 94.9], GLOO: [89, 90, 91],
      ("fsdp", 2, "gloo"): [80, 110, 140]}, "cpu"),
    ({SINGLE: [600, 640, 620], DDP: [400, 410, 405]}, "gpu"),
    ({SINGLE: [600, 640, 620], DP1: [610, 630, 620], DDP: [500, 510, 505], FSDP: [900, 910, 905]},
     "gpu"),
]


def images_per_sec_range(values: list[float]) -> tuple[float, float, float]:
    """A configuration's images/s and its range as docs/comparing.md defines them: the global batch
    ÷ the mean step of its runs, ± the step's std as the same share (any batch: it cancels)."""
    steps = [1 / value for value in values]
    mean = statistics.fmean(steps)
    share = statistics.stdev(steps) / mean if len(steps) > 1 else 0.0
    return 1 / mean, (1 - share) / mean, (1 + share) / mean


@pytest.mark.parametrize("speeds, unit", SCENARIOS)
def test_every_mode_slower_than_one_gpu_beyond_the_noise_is_said_so_wherever_it_is_named(speeds,
                                                                                       unit):
    """Judged here from the figures alone: a parallel configuration whose images/s lie below
    single_gpu's by more than the floor (and, repeated, whose range lies below single_gpu's) is
    named slower in the sentences, and the recommendation that names its mode says so."""
    outcomes = made(speeds, unit)
    figures = {setting: images_per_sec_range(values) for setting, values in speeds.items()}
    pair = sorted([figures[SINGLE][0], figures[DP1][0]]) if DP1 in speeds else None
    floor = pair[1] / pair[0] - 1 if pair else None  # the faster ÷ the slower, less 1
    advice = line(outcomes, state(None if unit == "cpu" else 80 * 2**30))
    one = "CPU process" if unit == "cpu" else "GPU"
    slower = sentence(outcomes, f"- **Slower than one {one}:**")
    names = {m.run.setting[:3]: m.name() for m in measured(outcomes)}
    for setting, values in speeds.items():
        if setting[0] == "single_gpu" or setting == DP1 and unit == "cpu":
            continue
        (speed, _, high), (single, low, _) = figures[setting], figures[SINGLE]
        below = high < low if len(values) > 1 and len(speeds[SINGLE]) > 1 else floor is not None
        if not (below and (floor is None or single / speed - 1 > floor)):
            continue
        assert slower is not None and names[setting] in slower, findings(outcomes)
        if advice.startswith(f"Recommendation: {setting[0]}"):
            assert "slower" in advice and names[setting] in advice, advice

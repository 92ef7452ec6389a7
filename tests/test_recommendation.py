"""The report's `Recommendation:` line (comparison.report.recommendation), one test per rule, on
outcomes built here as fill_rows makes them of the runs' results.json, and a model state from the
memory projection of a small model built on the meta device. That the line heads a real report:
tests/test_compare.py, on its comparison."""
from __future__ import annotations

import torch
from torch import nn

from comparison.matrix import PlannedRun
from comparison.projection import memory_projection
from comparison.report import Outcome, fill_rows, findings, groups, recommendation, table_row
from conftest import REPO

SINGLE, DDP, GLOO = (("single_gpu", 1, None), ("dist_parallel", 2, "nccl"),
                     ("dist_parallel", 2, "gloo"))
DP, FSDP, DP1 = ("data_parallel", 2, None), ("fsdp", 2, "nccl"), ("data_parallel", 1, None)


def made(speeds: dict, unit: str = "gpu", failed: dict | None = None) -> list[Outcome]:
    """A comparison's outcomes: each configuration a run per figure of images/s given, 64 images per
    GPU; `failed`: configuration -> error of one more run of it that failed."""
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
        outcomes.append(Outcome(run, "failed", error=error))
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
    row = next(table_row(group) for group in groups(outcomes) if group[0].run.mode == mode)
    return row.split(" | ")[9]


def test_ddp_fastest_beyond_the_spread_is_recommended_with_the_tables_speedup():
    outcomes = made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200]})
    text = line(outcomes)
    assert text.startswith("Recommendation: dist_parallel (DDP): the model's state fits one GPU "
                           "under DDP (11.6 MiB of its 80.0 GiB), and DDP was fastest: "
                           "dist_parallel on 2 GPUs (nccl) at ")
    assert (f"at {speedup_cell(outcomes, 'dist_parallel')} one GPU, its range (mean ± std over 3 "
            "runs) above every other") in text
    assert "1.94 ± 0.08×" in text and "CPU process" not in text


def test_modes_whose_runs_overlap_tie_and_ddp_is_the_default_with_the_guides_reason():
    outcomes = made({SINGLE: [600, 640, 620], DP: [1180, 1300, 1240], DDP: [1150, 1250, 1200]})
    text = line(outcomes)
    assert text.startswith("Recommendation: dist_parallel (DDP): the model's state "
                           "fits one GPU under DDP")
    assert ("no difference measurable between data_parallel on 2 GPUs and dist_parallel on 2 GPUs "
            "(nccl): their images/s (mean ± std over the repeats) overlap (data_parallel on 2 GPUs "
            "1,240 ± 60; dist_parallel on 2 GPUs (nccl) 1,200 ± 50), so any of them") in text
    assert ("DDP is the default where modes tie: PyTorch recommends it over DataParallel even on "
            "one machine, it scales past one node") in text and "(docs/guide.md)" in text


def test_one_run_each_shows_no_mode_faster_so_ddp_is_the_default():
    text = line(made({SINGLE: [600], DP: [1300], DDP: [1200]}))
    assert text.startswith("Recommendation: dist_parallel (DDP): the model's state "
                           "fits one GPU under DDP")
    assert ("one run per configuration measures no spread, so no mode is shown faster than "
            "another (data_parallel on 2 GPUs was fastest in its run, 2.17× one GPU; `--repeat "
            "3` measures the spread)") in text


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
    assert ("data_parallel was fastest (2.27 ± 0.02× one GPU) but dist_parallel was "
            "not measured beside it" in alone)
    tied = line(made({SINGLE: [1380, 1400, 1390], DP: [1400, 1420, 1410], DDP: [1150, 1250, 1200]}))
    # where they tie, the simpler mode
    assert tied.startswith("Recommendation: single_gpu: no difference measurable between "
                           "data_parallel on 2 GPUs and single_gpu")
    assert ("dist_parallel was slower beyond the spread (dist_parallel on 2 GPUs (nccl) "
            "at 0.86 ± 0.04× one GPU)") in tied


def test_fsdp_or_one_gpu_when_it_is_faster_beyond_the_spread():
    fsdp = line(made({SINGLE: [600, 640, 620], DDP: [1150, 1250, 1200], FSDP: [1300, 1320, 1310]}))
    assert fsdp.startswith("Recommendation: fsdp (FSDP2): fastest, fsdp on 2 GPUs (nccl) at 2.11 ± "
                           "0.02× one GPU, its range (mean ± std over 3 runs) above every other "
                           "configuration's, DDP's included, though the model's state fits")
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
    assert "FSDP on 64 GPUs still" in none and "(tensor, pipeline)" in none


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
    assert "(11.6 MiB of an assumed 80.0 GiB)" in text and "at 1.94 ± 0.08× one CPU process" in text
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
    sentences say why; one process's scaling efficiency is 100 % by definition, whatever its
    speedup."""
    outcomes = made({SINGLE: [400, 440, 420], DP1: [900, 300, 600], GLOO: [700, 720, 710]},
                    unit="cpu")
    said = findings(outcomes)
    assert said[0].startswith("- **Fastest: dist_parallel on 2 CPU processes (gloo)**, 710 ± 10 "
                              "images/s")
    assert said[1] == ("- **data_parallel on 1 CPU process is single_gpu's computation:** without "
                       "GPUs nn.DataParallel calls the model itself, with nothing to scatter, "
                       "replicate or gather; its 600 ± 300 images/s against single_gpu's 420 ± 20 "
                       "is no measure of DataParallel, so it is left out of the ranking.")
    assert "data_parallel" not in line(outcomes, state(None)).split(" On this CPU-only")[0]
    row = next(table_row(group) for group in groups(outcomes)
               if group[0].run.mode == "data_parallel")
    # the speedup varies; the efficiency cannot
    assert row.split(" | ")[9:11] == ["1.43 ± 0.71×", "100 %"]

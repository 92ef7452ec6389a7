"""compare.py's --run_timeout, sized to the run on GPUs (moved here from
tests/test_benchmark_scripts.py, which tests the benchmark scripts: these test compare.py)."""
from __future__ import annotations

import pytest

import compare
from comparison import model_shapes
from conftest import REPO


# ----------------------------------------------------------------------- compare.py --run_timeout
def timeout_of(argv: list[str], cuda=True, flops=1e9, batch=("--batch_size", "128")) -> int:
    """--run_timeout as compare.py resolves it for `argv` on a machine with or without GPUs,
    for a model of `flops` per training image (the global batch given: the train files' default,
    128, is theirs to resolve; test_the_train_files_default_batch_sizes_it)."""
    cc, train, group_only = compare.parse([*batch, *argv])
    cc = compare.resolve(cc, train, cuda, 1, group_only)
    if not cc.verify:
        compare.plan_matrix(cc, train, {}, cuda)  # which sets the runs' --epochs, as in compare.py
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_shapes, "flops_per_image", lambda model, channels, size: flops)
        return compare.run_timeout(cc, train, cuda)


def test_run_timeout_on_gpus_is_sized_to_the_runs_steps_and_model():
    start_s, slow = compare.RUN_START_S, compare.SLOW_TFLOPS * 1e12
    # a --benchmark run: 10 untimed, 100 timed and 3 profiled steps of the global batch, 128
    small = timeout_of([], flops=1e9)  # 128 GFLOP a step: the least a step is given
    assert small == start_s + round(113 * compare.SLOW_STEP_S)
    big = timeout_of([], flops=28.3e9)  # PyramidNet-110 alpha=270: 0.72 s a step at 5 TFLOP/s
    assert big == start_s + -(-113 * 28.3e9 * 128 // slow)
    assert timeout_of(["--benchmark_steps", "200"], flops=28.3e9) > big
    assert timeout_of(["--compile"], flops=28.3e9) == big + compare.COMPILE_S
    assert timeout_of(["--batch_per_gpu", "256"], flops=28.3e9, batch=()) > big  # a GPU's images
    # training: 2 epochs of 391 steps (50,000 images, batch 128) and of 79 test batches
    trained = timeout_of(["--epochs", "2", "--dataset", "cifar10"], flops=1e9)
    assert trained == start_s + round(2 * (391 + 79) * compare.SLOW_STEP_S)
    assert timeout_of(["--run_timeout", "90"]) == 90  # given: as given


def test_the_train_files_default_batch_sizes_it():
    assert timeout_of([], batch=()) == timeout_of([])


def test_run_timeout_without_gpus_is_an_hour():
    assert timeout_of([], cuda=False) == compare.CPU_RUN_TIMEOUT == 3600


def test_run_timeout_is_said_in_help_and_docs_as_the_code_sizes_it():
    text = " ".join(compare.build_compare_parser().format_help().split())
    assert (f"sized to the run: {compare.RUN_START_S // 60} minutes to start, "
            f"{compare.COMPILE_S // 60} more with --compile, and the FLOPs of each step and "
            f"evaluation batch at {compare.SLOW_TFLOPS:g} TFLOP/s, at least "
            f"{compare.SLOW_STEP_S:g} s each; without GPUs, an hour") in text
    assert compare.CPU_RUN_TIMEOUT == 3600
    comparing = " ".join((REPO / "docs" / "comparing.md").read_text().split())
    assert (f"`--run_timeout` (default on GPUs: {compare.RUN_START_S // 60} minutes to start"
            in comparing)

"""The modes proven against each other on the CPU, each run as a user runs it, every process on
one intra-op thread (the thread count changes the order of a convolution's sums):

- one device, the same computation: single_gpu, data_parallel (nn.DataParallel, which wraps
  nothing on the CPU) and dist_parallel as a group of one process end with
  the same weights, BatchNorm statistics and momentum, bit for bit, and report the same losses
  and accuracies;
- two processes: dist_parallel (DDP, the self-launch `--nproc_per_node 2`) and fsdp (FSDP2 under
  torchrun) end bit for bit alike, weights, statistics and momentum (DDP's bucketed all-reduce
  and FSDP's reduce-scatter are the same average: halving and a sum of two are exact), and each
  rank holds rank 0's parameters;
- evaluation is exact: 53 test images (neither 2 nor 3 divides them) evaluated by 1 process
  (single_gpu --evaluate of the 2-process checkpoint), 2 (the run's own end) and, in the second
  tier, 3 (--evaluate on 3 processes, dist_parallel and fsdp), every image once: the same
  accuracy, the loss but for float32 rounding (other batch sizes run other kernels); and what a
  2-process run reports is what its saved weights score.

compare.py --verify runs the same proofs on GPUs (tests/test_verify.py plans them). What only
GPUs can show: SyncBatchNorm (it refuses CPU modules), NCCL (one GPU a rank), nn.DataParallel's
scatter and gather over several GPUs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import read_results, two_at_a_time
from processes import TINY, in_process, run, script, torchrun

# 265 images: 8 steps of 32 an epoch, 53 test images; 12 steps: across epoch 1's end, and stopped
# mid-epoch 2 by --max_steps (evaluated there)
FLAGS = [*TINY, "--synthetic_size", "265", "--epochs", "2", "--max_steps", "12"]
FIGURES = ("train_loss", "train_acc", "test_loss", "test_acc", "test_acc_top5", "step")


def training_state(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every weight, BatchNorm statistic and momentum buffer of the run's checkpoint.pt (the
    optimizer's state keyed by the parameter's position, as every mode writes it)."""
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    momentum = {f"momentum.{index}": entry["momentum_buffer"]
                for index, entry in saved["optimizer"]["state"].items()}
    assert len(momentum) == len(saved["optimizer"]["param_groups"][0]["params"]) > 0
    return {**saved["model"], **momentum}


def assert_bit_identical(ours: dict, theirs: dict, what: str) -> None:
    assert ours.keys() == theirs.keys(), what
    differ = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not differ, f"{what}: {differ}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The runs these tests read: dist_parallel on 2 processes and fsdp on 2 side by side, then in
    this process single_gpu, data_parallel, dist_parallel as a group of one, and the 2-process
    checkpoint evaluated by single_gpu. The folder they are in."""
    logs = tmp_path_factory.mktemp("parallel")

    def launch(command, name, *more):
        done = run(command, *FLAGS, *more, "--log_dir", logs, "--run_name", name)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    two_at_a_time(lambda: launch(script("dist_parallel"), "ddp2", "--nproc_per_node", 2),
                  lambda: launch(torchrun(2, "fsdp"), "fsdp2"))
    ddp2 = logs / "ddp2" / "checkpoint.pt"
    for mode, name, more in (("single_gpu", "single_gpu", []),
                             ("data_parallel", "data_parallel", []),
                             ("dist_parallel", "ddp1", []),
                             ("single_gpu", "evaluate1", ["--evaluate", ddp2])):
        done = in_process(mode, *FLAGS, *more, "--log_dir", logs, "--run_name", name)
        assert done.returncode == 0, done.stdout + done.stderr
        (logs / name / "output.txt").write_text(done.stdout)
    return logs


# ------------------------------------------------------------------------------------ one device
def test_one_device_in_every_mode_is_one_computation_bit_for_bit(runs):
    """Same seed, same order of batches (RandomSampler from the seed and the epoch is
    DistributedSampler's order of one replica), same crops (drawn from seed, epoch and index),
    same arithmetic: DataParallel on the CPU and DDP with one rank change nothing."""
    reference = training_state(runs / "single_gpu")
    summaries = {name: read_results(runs / name)["summary"]
                 for name in ("single_gpu", "data_parallel", "ddp1")}
    assert summaries["single_gpu"]["step"] == 12 and summaries["single_gpu"]["epoch"] == 1
    for name in ("data_parallel", "ddp1"):
        assert_bit_identical(training_state(runs / name), reference, name)
        for figure in FIGURES:
            assert summaries[name][figure] == summaries["single_gpu"][figure], (name, figure)
    one_rank = read_results(runs / "ddp1")
    assert (one_rank["mode"], one_rank["world_size"], one_rank["params_in_sync"],
            one_rank["buffers_max_abs_diff"]) == ("dist_parallel", 1, True, 0.0)


# ----------------------------------------------------------------------------------- two processes
def test_ddp_and_fsdp_on_two_processes_end_bit_for_bit_alike(runs):
    """DDP (every rank the whole model, gradients all-reduced in buckets) and FSDP2 (each rank a
    slice, gradients reduce-scattered), 12 steps of 16 images a rank: every weight, statistic
    and momentum of their checkpoints, the same file's contents; each rank ended on rank 0's
    parameters."""
    assert_bit_identical(training_state(runs / "fsdp2"), training_state(runs / "ddp2"),
                         "fsdp vs dist_parallel")
    ddp, fsdp = read_results(runs / "ddp2"), read_results(runs / "fsdp2")
    assert (ddp["mode"], ddp["world_size"], fsdp["mode"], fsdp["world_size"]) == \
        ("dist_parallel", 2, "fsdp", 2)
    assert ddp["params_in_sync"] is fsdp["params_in_sync"] is True
    for figure in FIGURES:
        assert fsdp["summary"][figure] == pytest.approx(ddp["summary"][figure], rel=1e-6), figure
    by_ddp, by_fsdp = (torch.load(runs / name / "checkpoint.pt", weights_only=True)
                       for name in ("ddp2", "fsdp2"))
    assert by_fsdp.keys() == by_ddp.keys()
    assert by_fsdp["optimizer"]["param_groups"] == by_ddp["optimizer"]["param_groups"]
    assert all(tensor.device.type == "cpu" for tensor in by_fsdp["model"].values())


def test_two_processes_train_other_weights_than_one(runs):
    """The check above is no tautology: two ranks of 16 images a step normalise each half of the
    batch by its own statistics, so they end elsewhere than one process of 32."""
    ours, theirs = training_state(runs / "ddp2"), training_state(runs / "single_gpu")
    assert any(not torch.equal(ours[name], theirs[name]) for name in ours)


# -------------------------------------------------------------------------------------- evaluation
def test_one_process_scores_a_two_process_checkpoint_as_its_run_did(runs):
    """The 2-process checkpoint evaluated by 1 process and by the run's own end (2 processes,
    after rank 0's BatchNorm statistics are sent to every rank; shards of 27 and 26 images): each
    rank takes every world_size-th image (no DistributedSampler padding, which would count some
    twice) and the sums are all-reduced, so what the run reports is what its weights score."""
    ours, theirs = (read_results(runs / name)["summary"] for name in ("evaluate1", "ddp2"))
    assert ours["test_images"] == theirs["test_images"] == 53
    assert (ours["test_acc"], ours["test_acc_top5"]) == (theirs["test_acc"],
                                                         theirs["test_acc_top5"])
    assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-6)
    checkpoint = runs / "ddp2" / "checkpoint.pt"
    printed = [line for line in (runs / "evaluate1" / "output.txt").read_text().splitlines()
               if line.startswith(f"{checkpoint}: test loss ")]
    assert len(printed) == 1 and printed[0].endswith("(53 images)")


def test_fsdps_checkpoint_holds_whole_weights_that_one_process_evaluates(runs, tmp_path):
    """fsdp's checkpoint (each rank's slices gathered onto rank 0's CPU) is single_gpu's file:
    single_gpu --evaluate reads it and scores what fsdp's own end of run scored."""
    done = in_process("single_gpu", *FLAGS, "--evaluate", runs / "fsdp2" / "checkpoint.pt",
                      "--log_dir", tmp_path, "--run_name", "evaluated")
    assert done.returncode == 0, done.stderr
    ours, theirs = (read_results(folder)["summary"] for folder in (tmp_path / "evaluated",
                                                                   runs / "fsdp2"))
    assert ours["test_acc"] == theirs["test_acc"] and ours["test_images"] == 53
    # float32 logits from batches of other sizes (two ranks' shards, padded to equal passes): the
    # CPU's kernels may round them otherwise, by float32's epsilon (1.2e-7) at most
    assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-6)


@pytest.mark.second_tier  # a 3-process launch a mode
@pytest.mark.parametrize("mode", ["dist_parallel", "fsdp"])
def test_three_processes_evaluate_every_test_image_once(runs, tmp_path, mode):
    """Each mode's 2-process checkpoint evaluated on 3 processes: shards of 18, 18 and 17 images
    in batches of 16 (fsdp's short rank runs an empty batch to keep every rank's all-gathers in
    step): the accuracy of the run's own end, every image counted once."""
    trained = runs / ("ddp2" if mode == "dist_parallel" else "fsdp2")
    done = run(script(mode), *FLAGS, "--nproc_per_node", 3, "--batch_size", 48, "--evaluate",
               trained / "checkpoint.pt", "--log_dir", tmp_path, "--run_name", "three")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().splitlines()[-2].endswith("(53 images)")
    results = read_results(tmp_path / "three")
    ours, theirs = results["summary"], read_results(trained)["summary"]
    assert (results["world_size"], ours["test_images"]) == (3, 53)
    assert (ours["test_acc"], ours["test_acc_top5"]) == (theirs["test_acc"],
                                                         theirs["test_acc_top5"])
    assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-6)

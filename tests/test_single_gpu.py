"""single_gpu/train.py run the way a user runs it (`cd single_gpu && python train.py ...`, on the
CPU, a tiny model): what it prints, the run folder it leaves (results.json with every field the
comparison reads, the checkpoint, best.pt, model.pt), and --evaluate of the weights it saved."""
from __future__ import annotations

import re
import sys

import pytest
import torch

import runkit
from conftest import REPO, read_results, read_scalars
from processes import TINY, in_process, run, train_file

# results.json's summary, as docs/interruptions.md and compare.py read it
SUMMARY = {"images_per_sec", "images_per_sec_per_gpu", "batch_time_p50", "batch_time_p90",
           "timed_steps", "data_wait_frac", "flops_per_image", "parameters", "mfu", "mfu_note",
           "first_step_s", "gpu_util_mean", "peak_mem_gb", "peak_mem_reserved_gb", "train_loss",
           "train_acc", "profiled_steps", "wall_time_s", "epoch", "batch", "step", "best_acc",
           "best_epoch", "tested_step", "test_loss", "test_acc", "test_acc_top5", "test_images"}
WINDOW = re.compile(r"^Epoch (\d)/2 \[(\d)/8\] loss [\d.]+ acc [\d.]+% (batch [\d.]+s data [\d.]+% "
                    r"\d+ img/s|warming up)$")
TESTED = re.compile(r"^Epoch (\d)/2 test loss ([\d.]+) acc ([\d.]+)% \(51 images\)$")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two epochs of 8 steps from the mode's own folder, as the README's first command runs it,
    with --save_model: (its run folder, the finished process)."""
    log_dir = tmp_path_factory.mktemp("single") / "runs"
    done = run([sys.executable, "train.py"], *TINY, "--epochs", "2", "--log_dir", log_dir,
               "--run_name", "tiny", "--save_model", cwd=REPO / "single_gpu")
    assert done.returncode == 0, done.stdout + done.stderr
    return log_dir / "tiny", done


def test_the_run_says_what_it_trains_each_window_each_test_and_where_its_results_are(trained):
    run_dir, done = trained
    lines = done.stdout.splitlines()
    assert lines[0] == ("single_gpu on cpu: PyramidNet-8 a=12 (30,306 parameters) at 32 px, "
                        "synthetic, pad crop and flip, batch 32 (8 steps an epoch), amp off; logs "
                        f"in {run_dir}")
    windows = [WINDOW.match(line) for line in lines if line.startswith("Epoch ") and "[" in line]
    assert [(m.group(1), m.group(2)) for m in windows] == [("1", "4"), ("1", "8"), ("2", "4"),
                                                           ("2", "8")]
    assert windows[0].group(3).startswith("batch ")  # timed from step 2 (--warmup_steps 1)
    assert [TESTED.match(line).group(1) for line in lines if TESTED.match(line)] == ["1", "2"]
    assert lines[-1] == f"results in {run_dir / 'results.json'}"
    assert done.stderr == "warning: no CUDA GPU found: running on the CPU\n"  # said once


def test_results_json_holds_every_field_the_comparison_reads(trained):
    run_dir, done = trained
    results = read_results(run_dir)
    assert set(results) == {"mode", "world_size", "config", "env", "summary",
                            "peak_mem_gb_per_gpu"}
    assert (results["mode"], results["world_size"], results["peak_mem_gb_per_gpu"]) == \
        ("single_gpu", 1, {})
    config = results["config"]  # the flags as run: the defaults resolved for this machine
    assert {key: config[key] for key in ("amp", "channels_last", "augment", "flip", "image_size",
                                         "num_workers", "batch_size", "depth")} == \
        {"amp": "off", "channels_last": False, "augment": "pad", "flip": True, "image_size": 32,
         "num_workers": 0, "batch_size": 32, "depth": 8}
    assert {"torch", "cuda", "cudnn", "gpus", "cpu"} <= set(results["env"])
    summary = results["summary"]
    assert set(summary) == SUMMARY
    assert {key: summary[key] for key in ("epoch", "batch", "step", "tested_step", "timed_steps",
                                          "test_images", "profiled_steps")} == \
        {"epoch": 2, "batch": 0, "step": 16, "tested_step": 16, "timed_steps": 15,
         "test_images": 51, "profiled_steps": None}
    assert summary["images_per_sec"] > 0 and summary["batch_time_p50"] <= summary["batch_time_p90"]
    assert summary["images_per_sec_per_gpu"] == summary["images_per_sec"]
    assert 0 <= summary["data_wait_frac"] < 1 and summary["first_step_s"] > 0
    # measured on GPUs only
    assert (summary["mfu"], summary["gpu_util_mean"], summary["peak_mem_gb"]) == (None, None, None)
    assert summary["mfu_note"] == "CPU: MFU is measured against a GPU's peak"
    tested = [float(TESTED.match(line).group(3)) for line in done.stdout.splitlines()
              if TESTED.match(line)]
    assert round(100 * summary["test_acc"], 2) == tested[-1]
    assert round(100 * summary["best_acc"], 2) == max(tested)
    assert summary["best_epoch"] == tested.index(max(tested)) + 1
    assert summary["test_acc"] <= summary["test_acc_top5"] <= 1
    # the last epoch's two windows, each of 4 steps of 32 images
    losses = [loss for step, loss in read_scalars(run_dir)["train/loss"] if step > 8]
    assert summary["train_loss"] == pytest.approx(sum(losses) / 2, rel=1e-6)


def test_the_models_facts_are_counted_on_the_model_that_ran(trained):
    run_dir, _ = trained
    summary = read_results(run_dir)["summary"]
    model = train_file("single_gpu").PyramidNet(8, 12)
    assert summary["parameters"] == sum(param.numel() for param in model.parameters()) == 30_306
    assert summary["flops_per_image"] == runkit.flops_per_image(model, torch.zeros(2, 3, 32, 32))


def test_the_checkpoint_best_pt_and_model_pt_hold_what_their_names_say(trained):
    """checkpoint.pt: the last step's whole state; best.pt: the best epoch's checkpoint;
    model.pt: the unwrapped weights alone; every one loads with weights_only=True."""
    run_dir, _ = trained
    summary = read_results(run_dir)["summary"]
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert {"config", "model", "optimizer", "scheduler", "scaler", "progress", "rng", "format",
            "checksum"} <= set(checkpoint)
    assert checkpoint["progress"] == {key: summary[key] for key in checkpoint["progress"]}
    best = torch.load(run_dir / "best.pt", weights_only=True)
    assert (best["progress"]["best_epoch"], best["progress"]["best_acc"]) == \
        (summary["best_epoch"], summary["best_acc"])
    assert best["progress"]["step"] == 8 * summary["best_epoch"]
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    assert weights.keys() == checkpoint["model"].keys() and "fc.weight" in weights
    assert all(torch.equal(weights[name], checkpoint["model"][name]) for name in weights)


def test_evaluate_gives_the_test_figures_the_run_reported(trained, tmp_path):
    run_dir, _ = trained
    done = in_process("single_gpu", *TINY, "--evaluate", run_dir / "model.pt", "--log_dir",
                      tmp_path, "--run_name", "evaluated")
    assert done.returncode == 0, done.stderr
    reported, evaluated = read_results(run_dir)["summary"], read_results(tmp_path / "evaluated")
    assert (evaluated["mode"], evaluated["world_size"]) == ("single_gpu", 1)
    assert evaluated["summary"]["test_acc"] == reported["test_acc"]
    assert evaluated["summary"]["test_images"] == 51
    assert evaluated["summary"]["test_loss"] == pytest.approx(reported["test_loss"], rel=1e-9)
    assert f"{run_dir / 'model.pt'}: test loss " in done.stdout


@pytest.mark.second_tier  # five epochs: the longest run of this file
def test_the_synthetic_set_is_learnable(tmp_path):
    """Depth 8, alpha 12, 2048 synthetic images, 5 epochs on the CPU: at least 90 % test acc."""
    done = run([sys.executable, REPO / "single_gpu" / "train.py"], "--dataset", "synthetic",
               "--synthetic_size", "2048", "--depth", "8", "--alpha", "12", "--epochs", "5",
               "--num_workers", "0", "--log_interval", "100", "--log_dir", tmp_path,
               "--run_name", "learn")
    assert done.returncode == 0, done.stderr
    assert read_results(tmp_path / "learn")["summary"]["test_acc"] >= 0.90

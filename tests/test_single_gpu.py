"""single_gpu/train.py run the way a user runs it: a subprocess on the CPU with a tiny model."""
from __future__ import annotations

import pytest
import torch

from conftest import REPO, TINY, read_results, read_scalars, refuse_in_process, run_script

SCRIPT = "single_gpu/train.py"
SUMMARY = {"images_per_sec", "images_per_sec_per_gpu", "batch_time_p50", "batch_time_p90",
           "data_wait_frac", "flops_per_image", "parameters", "mfu", "mfu_note", "first_step_s",
           "compile_time_s", "compile_wait_s", "gpu_util_mean", "peak_mem_gb",
           "peak_mem_reserved_gb", "train_loss", "train_acc", "test_loss", "test_acc",
           "test_acc_top5", "test_images", "best_acc", "best_epoch", "epoch_time_s",
           "epoch_time_note", "wall_time_s", "steps", "timed_steps", "profiled_step_s",
           "profiled_steps", "breakdown", "breakdown_slowest_rank",
           "breakdown_steps", "breakdown_note"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short run with --save_model, shared by the tests that read what it left behind."""
    log_dir = tmp_path_factory.mktemp("single") / "runs"
    done = run_script(SCRIPT, *TINY, "--epochs", "2", "--log_dir", log_dir, "--run_name", "tiny",
                      "--save_model")
    assert done.returncode == 0, done.stderr
    return log_dir / "tiny", done


def test_run_prints_the_seeds_log_line_and_a_test_line(trained):
    _, done = trained
    assert "running on the CPU" in done.stderr  # the one warning
    lines = done.stdout.splitlines()
    window = [line for line in lines if line.startswith("Epoch 2/2 [8/8] loss")]
    assert window and " acc " in window[0] and "img/s" in window[0] and " data " in window[0]
    assert any(line.startswith("Epoch 2/2 test loss") and "(51 images)" in line for line in lines)
    assert "lr 0.025 (= 0.1 per 128 images x global batch 32" in done.stdout


def test_the_run_ends_by_saying_the_best_test_accuracy_its_epoch_the_last_and_the_time(trained):
    """The last lines say what the run reached: the best of its epochs' test accuracies, the epoch
    it came at, the last epoch's, the wall time; results.json keeps the best and its epoch (as the
    log lines count, from 1), and best.pt holds that epoch's weights. Ten classes: no top-5."""
    run_dir, done = trained
    tested = [float(line.split(" acc ")[1].split("%")[0]) for line in done.stdout.splitlines()
              if line.startswith("Epoch ") and " test loss " in line]
    summary = read_results(run_dir)["summary"]
    best = max(tested)
    assert len(tested) == 2 and summary["best_epoch"] == tested.index(best) + 1
    assert round(100 * summary["best_acc"], 2) == best and summary["test_acc_top5"] is None
    reached = (f"best test acc {best:.2f}% at epoch {summary['best_epoch']}/2; last (epoch 2) "
               f"{tested[1]:.2f}%; wall time ")
    line = next(line for line in done.stdout.splitlines() if line.startswith("best test acc"))
    assert line.startswith(reached) and line.endswith(" s"), line
    assert done.stdout.splitlines()[-1].startswith("results in ")
    checkpoint = torch.load(run_dir / "best.pt", weights_only=True)
    assert (checkpoint["best_epoch"], checkpoint["best_acc"]) == (summary["best_epoch"],
                                                                  summary["best_acc"])


def test_results_json_has_every_summary_field(trained):
    run_dir, _ = trained
    results = read_results(run_dir)
    assert results["mode"] == "single_gpu" and results["world_size"] == 1
    assert set(results["summary"]) == SUMMARY
    summary = results["summary"]
    assert summary["steps"] == 16  # 256 images // 32, two epochs
    assert summary["timed_steps"] == [2, 16]  # after the warm-up step; none profiled
    assert summary["profiled_steps"] is None and summary["profiled_step_s"] is None
    assert summary["images_per_sec"] > 0 and summary["batch_time_p50"] <= summary["batch_time_p90"]
    assert 0 <= summary["data_wait_frac"] < 1
    # measured only on GPUs
    assert summary["gpu_util_mean"] is None and summary["peak_mem_gb"] is None
    assert 0 <= summary["test_acc"] <= 1 and summary["test_loss"] > 0
    assert summary["test_images"] == 51  # a fifth of 256, every one counted
    assert results["config"]["batch_size"] == 32 and results["config"]["depth"] == 8
    assert {"torch", "cuda", "cudnn", "nccl", "gpus", "driver", "cpu"} <= set(results["env"])


def test_tensorboard_holds_every_tag_at_the_right_steps(trained):
    run_dir, _ = trained
    scalars = read_scalars(run_dir)
    for tag in ("train/loss", "train/acc_pct", "train/lr", "time/step_s", "time/data_wait_s",
                "time/data_wait_pct", "throughput/images_per_s"):
        assert [step for step, _ in scalars[tag]] == [4, 8, 12, 16], tag
    assert [step for step, _ in scalars["test/acc_pct"]] == [8, 16]
    test_acc = read_results(run_dir)["summary"]["test_acc"]
    assert scalars["test/acc_pct"][-1][1] == pytest.approx(100 * test_acc, abs=1e-4)  # in %
    assert scalars["train/lr"][0][1] == pytest.approx(0.025)
    # no GPU: no telemetry points, no MFU; one process: no rank/<r>/ tags
    assert not any(tag.startswith(("gpu/", "perf/", "rank/")) for tag in scalars)


def test_model_pt_is_the_unwrapped_state_dict(trained):
    run_dir, _ = trained
    state = torch.load(run_dir / "model.pt", weights_only=True)
    assert "fc.weight" in state and not any(key.startswith("module.") for key in state)


def test_evaluate_reproduces_the_reported_test_accuracy(trained, tmp_path):
    run_dir, _ = trained
    done = run_script(SCRIPT, *TINY, "--evaluate", run_dir / "model.pt", "--log_dir", tmp_path,
                      "--run_name", "ev")
    assert done.returncode == 0, done.stderr
    reported, evaluated = read_results(run_dir)["summary"], read_results(tmp_path / "ev")["summary"]
    assert evaluated["test_acc"] == reported["test_acc"]
    assert evaluated["test_loss"] == pytest.approx(reported["test_loss"], rel=1e-6)
    assert evaluated["steps"] == 0


def test_runs_from_its_own_folder_with_the_torchvision_loader(tmp_path):
    args = [arg if arg != "gpu" else "torchvision" for arg in TINY]
    done = run_script(SCRIPT, *args, "--num_workers", "1", "--max_steps", "3", "--log_dir",
                      tmp_path, "--run_name", "tv", cwd=REPO / "single_gpu")
    assert done.returncode == 0, done.stderr
    summary = read_results(tmp_path / "tv")["summary"]
    assert summary["steps"] == 3  # --max_steps stops mid-epoch, evaluation still runs
    assert summary["test_acc"] is not None


@pytest.mark.second_tier  # five epochs of training: the longest run of this file
def test_synthetic_data_is_learnable(tmp_path):
    """The issue's bar: depth 8, alpha 12, 2048 synthetic images, 5 epochs on the
    CPU -> at least 90 % test acc."""
    done = run_script(SCRIPT, "--dataset", "synthetic", "--synthetic_size", "2048", "--depth", "8",
                      "--alpha", "12", "--epochs", "5", "--loader", "gpu", "--log_interval", "100",
                      "--log_dir", tmp_path, "--run_name", "learn")
    assert done.returncode == 0, done.stderr
    assert read_results(tmp_path / "learn")["summary"]["test_acc"] >= 0.90


def _bad_inputs(tmp_path):
    not_a_checkpoint = tmp_path / "notes.txt"
    not_a_checkpoint.write_text("not weights")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    return {
        "batch size 0": (["--batch_size", "0"], "--batch_size"),
        "negative epochs": (["--epochs", "-1"], "--epochs"),
        "invalid depth": (["--depth", "9"], "6n+2"),
        "invalid alpha": (["--alpha", "0"], "alpha"),
        "unknown dataset": (["--dataset", "imagenet"], "--dataset"),
        "unknown loader": (["--loader", "dali"], "--loader"),
        "GPU that does not exist": (["--gpu_devices", "3"], "GPU 3"),
        "several GPUs": (["--gpu_devices", "0", "1"], "data_parallel"),
        "evaluate a missing file": (["--evaluate", tmp_path / "missing.pt"], "missing.pt"),
        "evaluate a non-checkpoint": (["--evaluate", not_a_checkpoint], "notes.txt"),
        "log_dir below a file": (["--log_dir", a_file / "runs"], "is a file"),
        "existing run folder": (["--log_dir", tmp_path / "runs", "--run_name", "taken"],
                                "--overwrite"),
        "batch larger than the data": (["--batch_size", "4096"], "larger than the training set"),
    }


# run as a user runs them too (a subprocess each); the others in-process
# (refuse_in_process): the same main()
AS_A_USER = ("existing run folder",)


def test_bad_input_is_one_line_a_nonzero_exit_and_nothing_written(tmp_path):
    cases = _bad_inputs(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    # Later flags win in argparse, so each case's flags follow the tiny defaults.
    args_default_dir = ["--log_dir", tmp_path / "runs", "--run_name", "fresh"]
    for name, (flags, expected) in cases.items():
        launch = run_script if name in AS_A_USER else refuse_in_process
        done = launch(SCRIPT, *TINY, *args_default_dir, *flags)
        assert done.returncode != 0, name
        errors = [line for line in done.stderr.splitlines() if not line.startswith("warning:")]
        assert len(errors) == 1 and errors[0].startswith("error: "), (name, done.stderr)
        assert expected in errors[0], (name, errors[0])
        assert "Traceback" not in done.stderr, name
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, name

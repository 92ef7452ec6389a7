"""Nothing is lost and nothing hangs, on the CPU with gloo, every launch as a user makes it:

1. single_gpu stopped by --max_steps mid-epoch (DataLoader workers augmenting) and resumed from its
   checkpoint's path under another --run_name ends bit-identical to an uninterrupted run, and
   carries the best.pt its results name; an epoch resumed from a batch gets that epoch's remaining
   batches, crops and flips included; the restored optimizer is the one the resuming run built;
2. torchrun --max-restarts 1 with 2 workers, one killed with SIGKILL after the first
   checkpoint: the group restarts, resumes from the checkpoint by itself (--resume auto), and ends
   bit-identical to the uninterrupted run;
3. `--resume auto` of a run that has ended (every epoch, or --max_steps, a lower one too) trains
   nothing and changes no file; a finished run whose checkpoint was deleted is refused, not
   retrained;
4. a rank that raises mid-step: the other exits by itself with a line naming its rank and step.

(Stop signals: tests/test_signals.py; the checkpoint's atomic write, checksum and refusals:
tests/test_runkit.py and tests/test_bad_input.py.)
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import runkit
from conftest import read_results
from processes import (TINY, by_hand, finish, in_process, run, script, start, torchrun,
                       train_file, wait_for)

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

SINGLE = train_file("single_gpu")
# 512 images, batch 32: 16 steps an epoch, long enough to kill a run while it trains; two
# DataLoader workers a process augmenting
LONGER = [*TINY, "--synthetic_size", "512", "--epochs", "2", "--save_model", "-j", "2"]


# ------------------------------------------------------------------------------------------ helpers
def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_bit_identical(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []


def run_ok(mode: str, log_dir: Path, name: str, *flags) -> subprocess.CompletedProcess:
    """single_gpu as `python single_gpu/train.py`, dist_parallel on 2 processes under torchrun."""
    command = torchrun(2, mode) if mode == "dist_parallel" else script(mode)
    done = run(command, *flags, "--log_dir", log_dir, "--run_name", name)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def files(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run_dir.iterdir()
            if path.is_file() and path.name != ".lock"}


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> Path:
    """The runs several tests read, two at a time: single (LONGER, uninterrupted), first (LONGER,
    --checkpoint_interval 10 and --max_steps 13: a checkpoint at step 10, then the final one at
    step 13, mid-epoch, evaluated), dist (2 processes under torchrun, uninterrupted)."""
    from concurrent.futures import ThreadPoolExecutor

    log_dir = tmp_path_factory.mktemp("shared")
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(run_ok, "single_gpu", log_dir, "single", *LONGER),
                       pool.submit(run_ok, "single_gpu", log_dir, "first", *LONGER,
                                   "--checkpoint_interval", "10", "--max_steps", "13"),
                       pool.submit(run_ok, "dist_parallel", log_dir, "dist", *LONGER)]:
            future.result()
    return log_dir


# ---------------------------------------------------------------------------------------- 1. resume
def test_resume_by_path_into_a_new_run_folder_ends_bit_identical(tmp_path, shared_runs):
    first = shared_runs / "first"
    run_ok("single_gpu", tmp_path, "second", *LONGER, "--resume", first / "checkpoint.pt")
    assert_bit_identical(weights(tmp_path / "second"), weights(shared_runs / "single"))
    # the best epoch's weights, named by the new folder's results, are in its own best.pt
    assert (tmp_path / "second" / "best.pt").is_file()


def test_the_checkpoint_holds_every_state_and_loads_weights_only(shared_runs):
    state = torch.load(shared_runs / "first" / "checkpoint.pt", weights_only=True)
    assert {"config", "model", "optimizer", "scheduler", "scaler", "progress", "rng", "format",
            "checksum"} <= set(state)
    assert {key: state["progress"][key] for key in ("epoch", "batch", "step", "tested_step")} == \
        {"epoch": 0, "batch": 13, "step": 13, "tested_step": 13}
    assert [set(rng) for rng in state["rng"]] == [{"torch", "cuda"}]
    assert state["config"]["depth"] == 8 and state["scheduler"]["last_epoch"] == 13
    assert (shared_runs / "first" / "best.pt").exists()  # the one evaluation so far is the best


def test_a_run_resumed_into_a_new_folder_carries_the_best_epochs_weights(tmp_path):
    """`--resume PATH --run_name new`: the new folder's results name the best epoch of the whole
    run, whose weights are in the best.pt beside PATH when no later epoch beats it (here a best of
    100% at step 4): the resume copies it, byte for byte; where there is none, there is none."""
    flags = [*TINY, "--epochs", "2", "--log_dir", tmp_path]
    assert in_process("single_gpu", *flags, "--run_name", "first", "--max_steps", 4).returncode == 0
    checkpoint = tmp_path / "first" / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["progress"]["best_acc"] = 1.0  # unbeatable
    runkit.save_checkpoint(checkpoint, {key: value for key, value in state.items()
                                        if key not in ("format", "checksum")})
    shutil.copyfile(checkpoint, tmp_path / "first" / "best.pt")
    resumed = in_process("single_gpu", *flags, "--run_name", "new", "--resume", checkpoint)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert ((tmp_path / "new" / "best.pt").read_bytes()
            == (tmp_path / "first" / "best.pt").read_bytes())
    summary = read_results(tmp_path / "new")["summary"]
    assert (summary["best_acc"], summary["best_epoch"]) == (1.0, 1)
    (tmp_path / "first" / "best.pt").unlink()
    resumed = in_process("single_gpu", *flags, "--run_name", "other", "--resume", checkpoint)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not (tmp_path / "other" / "best.pt").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_resumed_from_a_batch_gets_its_remaining_batches(workers):
    """Epoch 3 from batch 5 on is epoch 3's batches 5.. exactly, crops and flips included: they
    depend on the image and the epoch, not on the batches drawn before (nor on a worker's past);
    a fresh loader, a resumed run's, starts there too."""
    def loader():
        args = SINGLE.get_args([*TINY, "--synthetic_size", "64", "--batch_size", "8", "-j",
                                str(workers)])
        train_set, test_set, _ = SINGLE.get_datasets(args)
        SINGLE.data_defaults(args, len(train_set))
        return SINGLE.get_loaders(args, train_set, test_set, torch.device("cpu"))[0]

    train_loader = loader()
    whole = list(SINGLE.epoch_batches(train_loader, 3, {"batch": 0}))
    rest = list(SINGLE.epoch_batches(train_loader, 3, {"batch": 5}))
    fresh = list(SINGLE.epoch_batches(loader(), 3, {"batch": 5}))
    assert len(whole) == 8 and len(rest) == len(fresh) == 3
    for theirs in (rest, fresh):
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for a, b in zip(whole[5:], theirs, strict=True))


@pytest.mark.parametrize("saved_channels_last", [False, True])
def test_the_resumed_optimizer_is_the_one_this_run_built(saved_channels_last):
    """A checkpoint of a run under the other --channels_last and another SGD (a CPU run's, resumed
    on a GPU, or the reverse): the optimizer keeps this run's implementation, each buffer takes
    its parameter's strides and keeps the saved values."""
    def built(channels_last: bool, fused: bool | None):
        layout = "--channels_last" if channels_last else "--no-channels_last"
        args = SINGLE.get_args([*TINY, layout])
        args.amp, args.image_size = "off", 32
        _, raw_model, _ = SINGLE.get_model(args, 10, torch.device("cpu"))
        optimizer, scheduler, scaler = SINGLE.get_optimizer(args, raw_model, torch.device("cpu"), 8)
        for group in optimizer.param_groups:
            group["fused"] = fused
        for param in raw_model.parameters():
            optimizer.state[param]["momentum_buffer"].normal_()
        return raw_model, optimizer, scheduler, scaler

    *_, saved, _, _ = built(saved_channels_last, None)
    raw_model, optimizer, scheduler, scaler = built(not saved_channels_last, True)
    run = SimpleNamespace(raw_model=raw_model, optimizer=optimizer, scheduler=scheduler,
                          scaler=scaler, progress={})
    SINGLE.restore(run, {"model": raw_model.state_dict(), "optimizer": saved.state_dict(),
                         "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                         "progress": {}, "rng": [runkit.rng_states()]})
    assert [group["fused"] for group in optimizer.param_groups] == [True]
    saved_buffers = [saved.state[p]["momentum_buffer"] for p in saved.param_groups[0]["params"]]
    for param, saved_buffer in zip(raw_model.parameters(), saved_buffers, strict=True):
        buffer = optimizer.state[param]["momentum_buffer"]
        assert buffer.stride() == param.stride() and torch.equal(buffer, saved_buffer)


# --------------------------------------------------------------------------------------- 2. elastic
def test_torchrun_restarts_a_killed_worker_and_resumes(tmp_path, shared_runs):
    launch = start([*torchrun(2, "dist_parallel")[:-1], "--max-restarts", "1",
                    torchrun(2, "dist_parallel")[-1]], *LONGER, "--checkpoint_interval", "4",
                   "--resume", "auto", "--log_dir", tmp_path, "--run_name", "elastic")
    checkpoint = tmp_path / "elastic" / "checkpoint.pt"
    wait_for(checkpoint.exists, 120, "the first checkpoint")
    # the agent's own children: the ranks
    workers = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(launch.pid)],
                                                  capture_output=True, text=True).stdout.split()]
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)
    code, output = finish(launch)
    assert code == 0, output
    assert "resumed at step" in output  # the restarted group found the checkpoint by itself
    assert_bit_identical(weights(tmp_path / "elastic"), weights(shared_runs / "dist"))


# -------------------------------------------------------------------------------------- 3. the end
@pytest.mark.parametrize("name, flags", [
    ("single", []),  # every epoch done
    ("first", ["--max_steps", "13"]),  # ended by --max_steps 13
    ("first", ["--max_steps", "10"]),  # a lower ceiling on resume: still ended
])
def test_resuming_a_run_that_has_ended_trains_nothing_and_changes_nothing(shared_runs, name, flags):
    """An elastic command run again after its end (`--resume auto`): one line, exit 0, and the
    finished run's files byte for byte as they were."""
    before = files(shared_runs / name)
    done = in_process("single_gpu", *LONGER, *flags, "--log_dir", shared_runs, "--run_name", name,
                      "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "this run has ended" in done.stdout, done.stdout
    assert files(shared_runs / name) == before


def test_a_finished_run_whose_checkpoint_was_deleted_is_never_retrained(shared_runs, tmp_path):
    """A finished run whose checkpoint.pt was deleted to save space, continued with `--resume auto`
    (even with another --seed): refused in one line naming what the earlier run left, no file
    changed (it used to train from scratch and replace best.pt, model.pt and results.json)."""
    run_dir = tmp_path / "single"
    shutil.copytree(shared_runs / "single", run_dir)
    (run_dir / "checkpoint.pt").unlink()
    before = files(run_dir)
    done = in_process("single_gpu", *LONGER, "--seed", "7", "--log_dir", tmp_path, "--run_name",
                      "single", "--resume", "auto")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "has no checkpoint.pt but an earlier run's ['results.json']" in errors[0], errors[0]
    assert files(run_dir) == before


# -------------------------------------------------------------------------------------- 4. no hangs
def test_a_rank_that_raises_does_not_leave_the_other_hanging(tmp_path):
    """Two processes started by hand (no torchrun to clean up after them): rank 1 raises in its 3rd
    forward pass; rank 0, waiting in the gradient all-reduce, exits by itself with one line naming
    its rank and the step."""
    (code_0, _, errors_0), (code_1, _, errors_1) = by_hand(
        "dist_parallel", [*TINY, "--dist_timeout", "60"], tmp_path, "faulty",
        {"FAULT_RANK": "1", "FAULT_STEP": "3"})
    assert code_1 != 0 and "injected failure on rank 1" in errors_1
    errors = [line for line in errors_0.splitlines() if line.startswith("error:")]
    assert code_0 == 1 and len(errors) == 1, errors_0
    assert "rank 0 stopped at step 2: the process group failed" in errors[0], errors[0]
    assert "Traceback" not in errors_0

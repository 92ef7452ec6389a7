"""Nothing is lost and nothing hangs, on the CPU with gloo, every launch as a user makes it:

1. single_gpu stopped by --max_steps mid-epoch (the torchvision loader's workers augmenting) and
   resumed from its checkpoint's path ends bit-identical to an uninterrupted run; the restored
   optimizer is the one the resuming run built (fused or not), its buffers laid out like the
   parameters, whatever the memory format and device of the run that wrote the checkpoint; a run
   resumed into a new folder carries the best.pt its results name, or says that none holds it;
2. torchrun --max-restarts 1 with 2 workers, one killed with SIGKILL after the first
   checkpoint: the group restarts, resumes from the checkpoint by itself, and ends
   bit-identical to the uninterrupted run;
3. SIGTERM to every process of a running 2-process job, DataLoader workers included (torchvision
   loader): the workers carry on, the ranks write a checkpoint, no process is left, and --resume
   auto finishes it (bit-identical to the uninterrupted run, the torchvision loader's augmentation
   too); SIGINT (Ctrl-C) to the process group of single_gpu: a checkpoint at a log window, no
   traceback; `--resume auto` of a run that has ended (every epoch, or --max_steps, a lower one too)
   trains nothing and changes no file;
4. a rank that raises mid-step: the other exits within the timeout with a
   line naming its rank and the step;
5. a checkpoint write interrupted mid-way never replaces the previous good one.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.checkpoint import (LAST, load_checkpoint, restore_optimizer, rng_state, set_rng_state,
                               write_checkpoint)
from common.config import Config, UsageError, parse_config
from common.data import load_datasets
from common.loaders import make_loader
from common.samplers import ShuffleSampler
from conftest import (REPO, TINY, at_epoch, free_port, read_results, refuse_in_process, run_script,
                      train_in_process, two_at_a_time)
from models import pyramidnet

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

SINGLE, DIST = "single_gpu/train.py", "dist_parallel/train.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# 512 images, batch 32: 16 steps an epoch, long enough to signal or kill a run while it trains.
LONGER = [*TINY, "--synthetic_size", "512", "--epochs", "2", "--save_model", "--no_progress"]
# DataLoader workers (persistent) instead
TORCHVISION = ["--loader", "torchvision", "--num_workers", "2"]


# ------------------------------------------------------------------------------------------ helpers
def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_bit_identical(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []


def run_ok(script: str, log_dir: Path, name: str, *flags) -> subprocess.CompletedProcess:
    done = run_script(script, *flags, "--log_dir", log_dir, "--run_name", name, env=ONE_THREAD)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def start(args: list, log_dir: Path, name: str) -> subprocess.Popen:
    """A launch in the background, in its own session (so its whole process
    tree can be found and signalled)."""
    return subprocess.Popen([sys.executable, *map(str, args), "--log_dir", str(log_dir),
                             "--run_name", name],
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def session_alive(session: int) -> list[int]:
    """Processes still in the session `session` (a launch and everything
    it started), zombies excluded."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                alive.append(int(entry.name))
        except (ValueError, OSError, IndexError):
            continue
    return alive


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read_until(process: subprocess.Popen, text: str) -> str:
    """The launch's output up to and including the first line that contains
    `text` (training has started)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return "".join(lines)
    pytest.fail(f"the launch ended before printing {text!r}:\n{''.join(lines)}")


def finish(process: subprocess.Popen, timeout: float = 240, before: str = "") -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
        output = before + output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the launch did not finish within {timeout} s:\n{output}")
    return process.returncode, output


@pytest.fixture(scope="module")
def uninterrupted(shared_runs):
    """The reference runs' weights, uninterrupted, LONGER flags and the torchvision loader
    (TORCHVISION): single_gpu and 2-process dist_parallel. (compare.py --verify, in
    tests/test_parallel.py, resumes with the gpu loader.)"""
    return {name: weights(shared_runs / name) for name in ("single", "dist_torchvision")}


@pytest.fixture(scope="module")
def interval_run(shared_runs) -> Path:
    """single_gpu with LONGER, TORCHVISION, --checkpoint_interval 10 and --max_steps
    13: a checkpoint at step 10, then the final one at step 13 (mid-epoch), and best.pt
    from the evaluation at the end."""
    return shared_runs / "first"


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> Path:
    """The runs several tests read, two at a time: uninterrupted's, interval_run's first."""
    log_dir = tmp_path_factory.mktemp("shared")
    two_at_a_time(lambda: run_ok(SINGLE, log_dir, "single", *LONGER, *TORCHVISION),
                  lambda: run_ok(SINGLE, log_dir, "first", *LONGER, *TORCHVISION,
                                 "--checkpoint_interval", "10", "--max_steps", "13"),
                  lambda: run_ok(DIST, log_dir, "dist_torchvision", *LONGER, "--nproc_per_node",
                                 "2", *TORCHVISION))
    return log_dir


# ---------------------------------------------------------------------------------------- 1. resume
def test_resume_by_path_into_a_new_run_folder(tmp_path, uninterrupted, interval_run):
    """interval_run, stopped by --max_steps 13 mid-epoch (crop/flip on, DataLoader workers), resumed
    from its final checkpoint by its path under another --run_name. (The elastic test resumes from
    an interval checkpoint; the SIGTERM and Ctrl-C tests from a stop checkpoint; compare.py
    --verify, in tests/test_parallel.py, a 2-process run stopped by --max_steps.)"""
    assert torch.load(interval_run / LAST, weights_only=True)["step"] == 13
    run_ok(SINGLE, tmp_path, "second", *LONGER, *TORCHVISION, "--resume", interval_run / LAST)
    assert_bit_identical(weights(tmp_path / "second"), uninterrupted["single"])


def test_a_run_resumed_into_a_new_folder_carries_the_best_epochs_weights(tmp_path):
    """`--resume PATH --run_name new`: the new folder's results name the best epoch of the whole
    run, whose weights are in the first folder's best.pt when no later epoch beats it (here a best
    of 100% at step 4). The resume copies that best.pt into the new folder (which used to have no
    best.pt while its results and last line named a best epoch); where the first folder has none,
    the resume and the last line say that no best.pt there holds it."""
    flags = [*TINY, "--epochs", "2", "--no_progress", "--log_dir", tmp_path]
    assert train_in_process(SINGLE, *flags, "--run_name", "first", "--max_steps", 4).returncode == 0
    state = torch.load(tmp_path / "first" / LAST, weights_only=True)
    write_checkpoint(tmp_path / "first", {**state, "best_acc": 1.0}, best=True)  # unbeatable
    resumed = train_in_process(SINGLE, *flags, "--run_name", "new", "--resume",
                               tmp_path / "first" / LAST)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"best.pt (epoch 1) copied from {tmp_path / 'first' / 'best.pt'}" in resumed.stdout
    assert ((tmp_path / "new" / "best.pt").read_bytes()
            == (tmp_path / "first" / "best.pt").read_bytes())
    summary = read_results(tmp_path / "new")["summary"]
    assert (summary["best_acc"], summary["best_epoch"]) == (1.0, 1)
    assert "best test acc 100.00% at epoch 1/2; last" in resumed.stdout, resumed.stdout

    (tmp_path / "first" / "best.pt").unlink()
    resumed = train_in_process(SINGLE, *flags, "--run_name", "other", "--resume",
                               tmp_path / "first" / LAST)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "the best epoch's weights (epoch 1) are in no best.pt" in resumed.stdout
    assert not (tmp_path / "other" / "best.pt").exists()
    assert "at epoch 1/2 (no best.pt here holds it); last" in resumed.stdout, resumed.stdout


def test_checkpoint_holds_every_state_and_loads_weights_only(interval_run):
    # no arbitrary code: tensors and plain values
    state = torch.load(interval_run / LAST, weights_only=True)
    assert {"model", "optimizer", "scheduler", "scaler", "epoch", "batch", "step", "best_acc",
            "rng", "config"} <= set(state)
    assert (state["epoch"], state["batch"], state["step"]) == (0, 13, 13)
    assert set(state["rng"][0]) == {"torch", "cuda", "numpy", "python"}
    assert state["config"]["depth"] == 8 and state["scheduler"]["last_epoch"] == 13
    assert (interval_run / "best.pt").exists()  # the one evaluation so far is the best


def test_rng_states_round_trip():
    state = rng_state()
    expected = (torch.rand(3), np.random.rand(3), __import__("random").random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), __import__("random").random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]


@pytest.mark.parametrize("kind, workers", [("gpu", 0), ("torchvision", 0), ("torchvision", 2)])
def test_loaders_skip_the_consumed_batches(kind, workers):
    """Epoch 3 from batch 5 on is epoch 3's batches 5.. exactly, crops and flips
    included: they depend on the image and the epoch, not on the batches drawn before
    (nor on a persistent worker's past)."""
    dataset, _ = load_datasets("synthetic", "", 64, 0)
    loader = make_loader(kind, dataset, ShuffleSampler(64, True, 0), 8, torch.device("cpu"),
                         train=True, augment=True, num_workers=workers, seed=0)
    at_epoch(loader, 3)
    whole = list(loader)
    at_epoch(loader, 3, 5)
    rest = list(loader)
    assert len(loader) == 8 and len(rest) == 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole[5:], rest))
    fresh = make_loader(kind, dataset, ShuffleSampler(64, True, 0), 8, torch.device("cpu"),
                        train=True, augment=True, num_workers=workers, seed=0)
    at_epoch(fresh, 3, 5)  # a resumed run's loader starts there
    assert all(torch.equal(a[0], b[0]) for a, b in zip(whole[5:], fresh, strict=True))


def sgd_after_one_step(channels_last: bool, fused: bool | None):
    """PyramidNet-8 in the given memory format and its SGD after one step, so
    every momentum buffer exists."""
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = pyramidnet(8, 12).to(memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                nesterov=True, fused=fused)
    images = torch.randn(4, 3, 32, 32).contiguous(memory_format=layout)
    torch.nn.functional.cross_entropy(model(images), torch.arange(4)).backward()
    optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("saved_channels_last", [False, True])
@pytest.mark.parametrize("saved_fused, resumed_fused", [(None, True), (True, None)])
def test_resumed_optimizer_is_the_one_this_run_built(
        saved_channels_last, saved_fused, resumed_fused):
    """A checkpoint from a CPU run (fused None) resumed on a GPU (fused SGD), or the reverse, under
    the other --channels_last: the optimizer keeps this run's implementation, each buffer takes its
    parameter's strides (CUDA's fused SGD refuses anything else) and keeps the saved values."""
    _, saved = sgd_after_one_step(saved_channels_last, saved_fused)
    model, optimizer = sgd_after_one_step(not saved_channels_last, resumed_fused)
    restore_optimizer(model, optimizer, saved.state_dict())
    assert [group["fused"] for group in optimizer.param_groups] == [resumed_fused]
    saved_buffers = [saved.state[p]["momentum_buffer"] for p in saved.param_groups[0]["params"]]
    for param, saved_buffer in zip(model.parameters(), saved_buffers, strict=True):
        buffer = optimizer.state[param]["momentum_buffer"]
        assert buffer.stride() == param.stride()
        assert torch.equal(buffer, saved_buffer)
    assert optimizer.param_groups[0]["lr"] == 0.1 and optimizer.param_groups[0]["momentum"] == 0.9


# --------------------------------------------------------------------------------------- 2. elastic
def test_torchrun_restarts_a_killed_worker_and_resumes(tmp_path, uninterrupted):
    launch = start(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    "--max-restarts", "1", DIST, *LONGER, *TORCHVISION, "--checkpoint_interval",
                    "4", "--resume", "auto"],
                   tmp_path, "elastic")
    checkpoint = tmp_path / "elastic" / LAST
    wait_for(checkpoint.exists, 120, "the first checkpoint")
    # the agent's own children: the ranks
    workers = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(launch.pid)],
                                                  capture_output=True, text=True).stdout.split()]
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)
    code, output = finish(launch)
    assert code == 0, output
    assert "resumed at step" in output  # the restarted group found the checkpoint by itself
    assert_bit_identical(weights(tmp_path / "elastic"), uninterrupted["dist_torchvision"])


# --------------------------------------------------------------------------------------- 3. signals
def test_sigterm_to_a_two_process_job_checkpoints_and_leaves_no_process(tmp_path, uninterrupted):
    """With the torchvision loader, whose DataLoader workers get the signal too and carry on until
    their rank has stopped: then its resume is bit-identical as well."""
    launch = start([DIST, *LONGER, "--nproc_per_node", "2", "--log_interval", "2", *TORCHVISION],
                   tmp_path, "job")
    before = read_until(launch, "Epoch 1/2 [4/16]")
    assert len(descendants(launch.pid)) >= 2 + 2 * 2  # the ranks and their DataLoader workers
    # every process of the job, as SLURM sends it (the launcher passes it on)
    os.killpg(launch.pid, signal.SIGTERM)
    code, output = finish(launch, timeout=90, before=before)
    assert code == 128 + signal.SIGTERM, output
    # the self-launch heard from rank 0
    assert "stopped by SIGTERM: the workers stopped cleanly" in output
    assert "continue with --resume auto --run_name job" in output  # the run's name, to paste
    assert "Traceback" not in output
    wait_for(lambda: not session_alive(launch.pid), 10, "every process of the job to exit")
    state = torch.load(tmp_path / "job" / LAST, weights_only=True)
    assert 0 < state["step"] < 32
    assert not (tmp_path / "job" / "results.json").exists()  # an unfinished run has no results
    resumed = run_ok(DIST, tmp_path, "job", *LONGER, "--nproc_per_node", "2", "--log_interval", "2",
                     *TORCHVISION, "--resume", "auto")
    assert f"resumed at step {state['step']}" in resumed.stdout
    assert_bit_identical(weights(tmp_path / "job"), uninterrupted["dist_torchvision"])


def test_ctrl_c_stops_single_gpu_with_a_checkpoint(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group, the DataLoader workers
    included, which used to exit on it and make the run fail ("DataLoader worker exited
    unexpectedly") before its checkpoint."""
    launch = start([SINGLE, *LONGER, "--log_interval", "2", *TORCHVISION], tmp_path, "run")
    before = read_until(launch, "Epoch 1/2 [4/16]")
    # the training loader's workers (the test loader's start later)
    assert len(descendants(launch.pid)) == 2
    os.killpg(launch.pid, signal.SIGINT)
    code, output = finish(launch, timeout=60, before=before)
    assert code == 128 + signal.SIGINT and "stopped by SIGINT" in output, output
    assert "Traceback" not in output
    # resumed as the SIGTERM test's checkpoint is
    state = torch.load(tmp_path / "run" / LAST, weights_only=True)
    # at a log window, where the run stopped
    assert 4 <= state["step"] < 32 and state["step"] % 2 == 0


# -------------------------------------------------------------------------------------- 3b. the end
def files(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run_dir.iterdir()
            if path.is_file() and path.name != ".lock"}


@pytest.mark.parametrize("name, flags", [
    ("single", []),  # every epoch done
    ("first", ["--max_steps", "13"]),  # ended by --max_steps 13
    # a lower ceiling on resume: still ended (it used to train to the end)
    ("first", ["--max_steps", "10"]),
])
def test_resuming_a_run_that_has_ended_trains_nothing_and_changes_nothing(shared_runs, name, flags):
    """An elastic command run again after its end (`--resume auto`): one line, exit 0,
    and the finished run's files byte for byte as they were (results.json used to be
    replaced by one full of nulls)."""
    before = files(shared_runs / name)
    done = refuse_in_process(SINGLE, *LONGER, *TORCHVISION, *flags, "--log_dir", shared_runs,
                             "--run_name", name, "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert (done.stdout.count("\n") == 1 and "this run has ended" in done.stdout
            and done.stderr == "")
    assert files(shared_runs / name) == before


def test_a_finished_run_whose_checkpoint_was_deleted_is_never_retrained(shared_runs, tmp_path):
    """A finished run whose checkpoint.pt was deleted to save space, continued with `--resume auto`
    (even with another --seed): known as finished by its results.json, it trains nothing and changes
    no file (it used to train from scratch and replace best.pt, model.pt and results.json)."""
    run_dir = tmp_path / "single"
    shutil.copytree(shared_runs / "single", run_dir)
    (run_dir / LAST).unlink()
    before = files(run_dir)
    done = refuse_in_process(SINGLE, *LONGER, *TORCHVISION, "--seed", "7", "--log_dir", tmp_path,
                             "--run_name", "single", "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert ("this run has finished" in done.stdout and "results.json" in done.stdout
            and done.stderr == "")
    assert files(run_dir) == before


# -------------------------------------------------------------------------------------- 4. no hangs
def test_a_rank_that_raises_does_not_leave_the_other_hanging(tmp_path):
    """Two processes started by hand (no torchrun to clean up after them): rank 1 raises in its 3rd
    forward pass; rank 0, waiting in the gradient all-reduce, must exit by itself with a line
    naming its rank and the step."""
    port = free_port()
    processes = []
    for rank in range(2):
        env = {**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1", "RANK": str(rank),
               "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "FAULT_RANK": "1", "FAULT_STEP": "3"}
        processes.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "fault_injection.py"), DIST, *map(str, TINY),
             "--dist_timeout", "60", "--log_dir", str(tmp_path), "--run_name", "faulty"], cwd=REPO,
            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    started = time.monotonic()
    outputs = [process.communicate(timeout=120) for process in processes]
    assert time.monotonic() - started < 90
    assert processes[1].returncode != 0 and "injected failure on rank 1" in outputs[1][1]
    assert processes[0].returncode == 1, outputs[0]
    errors = [line for line in outputs[0][1].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 0 stopped at step 3" in errors[0], outputs[0][1]
    assert "Traceback" not in outputs[0][1]


# ---------------------------------------------------------------------------------------- 5. atomic
def test_an_interrupted_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    good = {"format": "x", "model": {"w": torch.ones(1000)}}
    write_checkpoint(tmp_path, good, best=False)
    before = (tmp_path / LAST).read_bytes()

    def dies_half_way(state, f):
        f.write(b"\x80\x02" + b"0" * 4096)  # some bytes of a pickle, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, {"format": "x", "model": {"w": torch.zeros(1000)}}, best=True)
    assert (tmp_path / LAST).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [LAST]  # no temporary file, no best.pt
    monkeypatch.undo()
    assert torch.equal(torch.load(tmp_path / LAST, weights_only=True)["model"]["w"],
                       torch.ones(1000))


def test_a_truncated_checkpoint_is_refused_with_one_line(tmp_path, interval_run):
    data = (interval_run / LAST).read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[:len(data) // 2])
    with pytest.raises(UsageError, match="truncated or not a checkpoint"):
        load_checkpoint(tmp_path / "cut.pt", parse_config(Config, TINY))

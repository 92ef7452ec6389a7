"""A stop signal ends a run the same way in every mode: at the next log window (every rank at the
same one), with a checkpoint, one line that says how to go on, and the exit status 128 + the
signal; SIGTERM (kill, SLURM, torchrun), SIGINT (Ctrl-C), SIGHUP (a terminal that closes), SIGUSR1
(SLURM's warning before a time limit). A stop in the run's last window keeps everything: its
resume evaluates and writes results.json and best.pt (issue 44), at the run's --max_steps, at an
epoch's end, and in a process group.

The signals are sent to real processes from outside, as a user or a scheduler sends them; where
the moment matters the run waits for the signal in the step after the line the test reads
(tests/fault_injection.py's FAULT_AWAIT_SIGNAL: the signal is sent once the run says it waits in
that step), so that it lands there on any machine."""
from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import termios
from pathlib import Path

import pytest
import torch

from conftest import REPO, read_results
from processes import (TINY, by_hand, continue_flags, finish, in_process, read_until, run, script,
                       session_alive, start, train_file, under_fault, wait_for)

# issue 44's command: 40 steps an epoch, a window at each, --max_steps 4
ISSUE = ["--dataset", "synthetic", "--synthetic_size", "640", "-b", "16", "--epochs", "1",
         "--depth", "8", "--alpha", "12", "-p", "1", "--num_workers", "0", "--max_steps", "4"]
# 512 images: 16 steps an epoch, a window every 2
LONGER = [*TINY, "--synthetic_size", "512", "--epochs", "2", "--log_interval", "2"]


def stop_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("stopped by ")]
    assert len(lines) == 1, output
    return lines[0]


def progress(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]


# ------------------------------------------------------------------ a stop in the run's last window
@pytest.fixture(scope="module")
def last_window(tmp_path_factory):
    """The issue's run, SIGTERM sent when `[3/40]` is printed (it lands in step 4, the last),
    then the command its stop line prints, pasted: (run folder, stopped output, its exit status,
    the resume, the stopped checkpoint's progress)."""
    log_dir = tmp_path_factory.mktemp("last_window")
    flags = [*ISSUE, "--log_dir", log_dir, "--run_name", "run"]
    stopped = under_fault("single_gpu", flags, {"FAULT_STEP": "4", "FAULT_AWAIT_SIGNAL": "1"})
    before = read_until(stopped, "[3/40]")
    before += read_until(stopped, "waiting for a signal")  # in step 4, past window 3's vote
    stopped.send_signal(signal.SIGTERM)
    code, output = finish(stopped, before=before)
    line = stop_line(output)
    stopped_at = progress(log_dir / "run")  # before the resume writes its own
    resumed = run(script("single_gpu"), *ISSUE, "--log_dir", log_dir, *continue_flags(line))
    return log_dir / "run", output, code, resumed, stopped_at


def test_a_stop_in_the_last_window_checkpoints_and_says_how_to_go_on(last_window):
    run_dir, output, code, _, stopped_at = last_window
    assert code == 143, output
    checkpoint = run_dir / "checkpoint.pt"
    assert stop_line(output) == (f"stopped by SIGTERM at step 4; checkpoint {checkpoint}: continue "
                                 "with --resume auto --run_name run")
    assert (stopped_at["step"], stopped_at["tested_step"]) == (4, None)
    assert "test loss" not in output and "Traceback" not in output


def test_the_command_it_prints_evaluates_and_writes_the_results_and_best_pt(last_window):
    """The resume used to say "this run has ended" and exit 0, the results never written: under
    SLURM a requeued job then ended "successfully" with nothing."""
    run_dir, _, _, resumed, _ = last_window
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[0] == f"resumed at step 4 from {run_dir / 'checkpoint.pt'}"
    assert "Epoch 1/1 test loss " in resumed.stdout and "(128 images)" in resumed.stdout
    summary = read_results(run_dir)["summary"]
    assert summary["test_images"] == 128 and summary["best_epoch"] == 1
    best = torch.load(run_dir / "best.pt", weights_only=True)["progress"]
    assert best["best_acc"] == summary["best_acc"] == summary["test_acc"]


def test_the_resume_trains_no_step_past_max_steps(last_window):
    run_dir, _, _, resumed, _ = last_window
    assert "[5/40]" not in resumed.stdout
    summary = read_results(run_dir)["summary"]
    assert (summary["step"], summary["tested_step"]) == (4, 4)


def test_run_again_after_its_resume_it_has_ended_and_changes_nothing(last_window):
    run_dir, output, _, _, _ = last_window
    before = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()}
    again = in_process("single_gpu", *ISSUE, "--log_dir", run_dir.parent,
                       *continue_flags(stop_line(output)))
    assert again.returncode == 0 and "this run has ended" in again.stdout, again.stdout
    assert {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()} == before


def test_a_stop_at_an_epochs_end_leaves_its_evaluation_to_the_resume(tmp_path):
    """SIGTERM noted at epoch 1's last window (of 2): the run checkpoints saying the evaluation is
    owed; its resume evaluates epoch 1 first, as the run would have, then trains epoch 2: the same
    test figures, best epoch, best.pt and weights as the run that was not stopped."""
    flags = [*TINY, "--epochs", "2", "--save_model", "--log_dir", tmp_path]
    whole = in_process("single_gpu", *flags, "--run_name", "whole")
    stopped = in_process("single_gpu", *flags, "--run_name", "run", stop_at=8)
    assert whole.returncode == 0 and stopped.returncode == 143, stopped.stdout + stopped.stderr
    assert "at step 8 (the epoch trained, its evaluation owed); checkpoint" in \
        stop_line(stopped.stdout)
    assert "test loss" not in stopped.stdout and not (tmp_path / "run" / "best.pt").exists()
    resumed = in_process("single_gpu", *flags, *continue_flags(stop_line(stopped.stdout)))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    tested = [line for line in resumed.stdout.splitlines() if " test loss " in line]
    assert [line.split(" test")[0] for line in tested] == ["Epoch 1/2", "Epoch 2/2"]
    ours, theirs = (read_results(tmp_path / name)["summary"] for name in ("run", "whole"))
    for figure in ("test_loss", "test_acc", "best_acc", "best_epoch", "step", "train_loss"):
        assert ours[figure] == theirs[figure], figure
    for name in ("model.pt", "best.pt"):
        ours, theirs = (torch.load(tmp_path / folder / name, weights_only=True)
                        for folder in ("run", "whole"))
        ours, theirs = (state.get("model", state) for state in (ours, theirs))
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs), name


def test_a_signal_to_one_rank_stops_the_group_at_its_last_window_and_the_resume_ends_it(tmp_path):
    """Two processes started by hand, SIGTERM to rank 1 alone in step 8, the run's last: the ranks
    vote at each window, so both stop there with 143 and rank 0 alone says so and writes the
    checkpoint; the self-launch's `--resume auto` evaluates, writes results.json and best.pt."""
    ranks = by_hand("dist_parallel", TINY, tmp_path, "job",
                    {"FAULT_RANK": "1", "FAULT_STEP": "8", "FAULT_SIGNAL": "SIGTERM"})
    assert [code for code, _, _ in ranks] == [143, 143], ranks
    assert stop_line(ranks[0][1]) == (
        f"stopped by SIGTERM at step 8 (the epoch trained, its evaluation owed); checkpoint "
        f"{tmp_path / 'job' / 'checkpoint.pt'}: continue with --resume auto --run_name job")
    assert "stopped" not in ranks[1][1] and "Traceback" not in ranks[0][2] + ranks[1][2]
    assert progress(tmp_path / "job")["step"] == 8
    assert not (tmp_path / "job" / "results.json").exists()
    resumed = run(script("dist_parallel"), *TINY, "--nproc_per_node", 2, "--log_dir", tmp_path,
                  *continue_flags(stop_line(ranks[0][1])))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Epoch 1/1 test loss" in resumed.stdout
    results = read_results(tmp_path / "job")
    assert (results["world_size"], results["summary"]["step"], results["summary"]["tested_step"],
            results["summary"]["test_images"]) == (2, 8, 8, 51)
    assert (tmp_path / "job" / "best.pt").exists()


# ------------------------------------------------------------------------------ each stop signal
@pytest.mark.second_tier
def test_ctrl_c_stops_at_a_window_with_a_checkpoint_whatever_the_workers_saw(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group, the DataLoader
    workers included, which leave the stop to their run: a checkpoint at a window, exit 130."""
    launch = start(script("single_gpu"), *LONGER, "-j", 2, "--log_dir", tmp_path, "--run_name",
                   "run")
    before = read_until(launch, "[4/16]")
    os.killpg(launch.pid, signal.SIGINT)
    code, output = finish(launch, before=before)
    assert code == 130 and "Traceback" not in output, output
    assert stop_line(output).startswith("stopped by SIGINT at step ")
    step = progress(tmp_path / "run")["step"]
    assert 4 <= step < 32 and step % 2 == 0
    wait_for(lambda: not session_alive(launch.pid), 30, "every process of the run to end")


@pytest.mark.second_tier
def test_sigterm_to_every_process_of_a_run_stops_it_with_a_checkpoint(tmp_path):
    """SLURM (scancel, the time limit) and a container's stop send SIGTERM to every process of the
    job, the DataLoader workers too: the run stops at its next window as it does when the signal
    reaches it alone."""
    launch = start(script("single_gpu"), *LONGER, "-j", 2, "--log_dir", tmp_path, "--run_name",
                   "run")
    before = read_until(launch, "[4/16]")
    os.killpg(launch.pid, signal.SIGTERM)
    code, output = finish(launch, before=before)
    assert code == 143 and "Traceback" not in output, output
    assert 4 <= progress(tmp_path / "run")["step"] < 32


def on_a_closing_terminal(command: list, stop_at: str) -> tuple[int, str]:
    """`command` on a pseudo-terminal that is its controlling terminal, closed when `stop_at` is
    printed, as a terminal window or an ssh session closes: the kernel sends SIGHUP to its
    foreground process group. (exit status, what it printed up to then)."""
    main, terminal = pty.openpty()

    def controlled_by_the_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen([*map(str, command)], cwd=REPO, stdin=terminal, stdout=terminal,
                               stderr=terminal, preexec_fn=controlled_by_the_terminal,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.close(terminal)
    seen = b""
    try:
        while stop_at.encode() not in seen:
            seen += os.read(main, 4096)  # OSError (EIO) if the run ended before it
    finally:
        os.close(main)  # the terminal is gone: writing to it fails
    os.killpg(process.pid, signal.SIGHUP)  # as the kernel hangs up its session
    return process.wait(timeout=120), seen.decode(errors="replace")


@pytest.mark.second_tier
def test_a_closed_terminal_stops_the_run_with_a_checkpoint(tmp_path):
    """single_gpu on a terminal that closes: SIGHUP, and lines to a terminal that is gone; the run
    stops at its next window with its checkpoint and exits 128 + 1 (a run used to die of it)."""
    code, seen = on_a_closing_terminal([*script("single_gpu"), *LONGER, "--log_dir", tmp_path,
                                        "--run_name", "hup"], "[4/16]")
    assert code == 128 + signal.SIGHUP, seen
    step = progress(tmp_path / "hup")["step"]
    assert 4 <= step < 32 and step % 2 == 0


@pytest.mark.second_tier
def test_sigusr1_to_the_self_launch_stops_every_worker_with_a_checkpoint(tmp_path):
    """SLURM's `--signal=USR1@T` warning, or `kill -USR1`, to `python dist_parallel/train.py`: the
    agent passes it on, every rank stops at the next window, rank 0 writes the checkpoint, and the
    launch exits 128 + 10."""
    launch = start(script("dist_parallel"), *LONGER, "--nproc_per_node", 2, "--log_dir",
                   tmp_path, "--run_name", "usr1")
    before = read_until(launch, "[4/16]")
    os.kill(launch.pid, signal.SIGUSR1)  # the launcher alone
    code, output = finish(launch, before=before)
    assert code == 128 + signal.SIGUSR1, output
    assert stop_line(output).startswith("stopped by SIGUSR1 at step ")
    assert 4 <= progress(tmp_path / "usr1")["step"] < 32
    wait_for(lambda: not session_alive(launch.pid), 30, "every process of the job to end")


@pytest.mark.second_tier
def test_a_stop_in_fsdps_last_window_is_finished_by_its_resume(tmp_path):
    ranks = by_hand("fsdp", TINY, tmp_path, "job",
                    {"FAULT_RANK": "1", "FAULT_STEP": "8", "FAULT_SIGNAL": "SIGTERM"})
    assert [code for code, _, _ in ranks] == [143, 143], ranks
    assert "(the epoch trained, its evaluation owed)" in stop_line(ranks[0][1])
    resumed = run(script("fsdp"), *TINY, "--nproc_per_node", 2, "--log_dir", tmp_path,
                  *continue_flags(stop_line(ranks[0][1])))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    results = read_results(tmp_path / "job")
    assert (results["mode"], results["summary"]["tested_step"]) == ("fsdp", 8)
    assert (tmp_path / "job" / "best.pt").exists()


# ------------------------------------------------------------------------- a stopped --evaluate
@pytest.mark.second_tier
def test_an_evaluation_stopped_by_sigterm_says_so_and_the_command_it_offers_evaluates(tmp_path):
    """SIGTERM during --evaluate's third batch: one line, exit 143, no results; the same command
    again is refused with a line that offers --overwrite and not --resume (which --evaluate
    refuses); with --overwrite it evaluates (issue 44)."""
    weights = tmp_path / "model.pt"
    torch.manual_seed(0)
    torch.save(train_file("single_gpu").PyramidNet(8, 12).state_dict(), weights)
    flags = [*TINY, "--synthetic_size", "2560", "--evaluate", weights, "--log_dir", tmp_path,
             "--run_name", "ev"]
    stopped = under_fault("single_gpu", flags, {"FAULT_STEP": "3", "FAULT_SIGNAL": "SIGTERM"})
    code, output = finish(stopped)
    assert code == 143 and "stopped by SIGTERM" in output, output
    again = in_process("single_gpu", *flags)
    assert again.returncode == 2 and "--overwrite" in again.stderr, again.stderr
    assert "--resume" not in again.stderr
    evaluated = in_process("single_gpu", *flags, "--overwrite")
    assert evaluated.returncode == 0, evaluated.stderr
    assert read_results(tmp_path / "ev")["summary"]["test_images"] == 512

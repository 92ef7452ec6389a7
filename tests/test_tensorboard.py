"""What TensorBoard shows of a run that was killed and resumed, read with TensorBoard's own
EventAccumulator (which drops the points a restarted run purged, as the UI does), and the
results.json such a run leaves:

1. killed with SIGKILL (as the out-of-memory killer kills) right after a log window, a run has
   left every point it logged up to that window in its event file;
2. resumed with --resume auto, its curves never go back: the points up to the checkpoint (the
   first epoch's test accuracy included) are the killed attempt's, those after it the resumed one's;
3. train/lr is the rate each step trained with, at the step schedule's epoch boundary too;
4. the resumed run's results.json names the figures that are its last attempt's; the others cover
   the whole run.

One run of two attempts serves them all: single_gpu, killed mid-epoch after a checkpoint, then
resumed by dist_parallel on 2 processes (checkpoints are every mode's, and a restart may bring more
workers), where rank 0 alone writes: the purge and the flushes of the resumed attempt are rank 0's.
The first attempt is paused, not raced: it stops right after the log window it is to be killed at
(injected from outside, as tests/fault_injection.py injects its failure).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from common.config import Config, parse_config
from common.logger import ATTEMPT_FIELDS, SUMMARY_FIELDS, RunLogger
from conftest import REPO, TINY, read_results, read_scalars, run_script, scalar_events

SINGLE, DIST = "single_gpu/train.py", "dist_parallel/train.py"
# 256 images, global batch 32: 8 steps an epoch, 16 in all, a log window every 2 steps. The rate
# drops tenfold after the first epoch: step 8 trains at 0.025, step 9 at 0.0025. Checkpoints at the
# end of epoch 1 (step 8) and at step 12; the first attempt is killed after the window of step 14.
FLAGS = [*TINY, "--epochs", "2", "--log_interval", "2", "--checkpoint_interval", "12"]
STEPS_PER_EPOCH, CHECKPOINT, KILLED = 8, 12, 14

# `python -c PAUSE script flags...`: the script as __main__, except that it stops for good right
# after the log window of step PAUSE_STEP, and says so.
PAUSE = """
import os, runpy, sys, time
import common.loop

record_window = common.loop.Run.record_window


def record_then_pause(run, *args):
    record_window(run, *args)
    if run.step == int(os.environ["PAUSE_STEP"]):
        print("paused", flush=True)
        time.sleep(600)


common.loop.Run.record_window = record_then_pause
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass
class Killed:
    """The run's folder; a copy of what the killed attempt had left (its event file and
    checkpoint); when it was killed; what the resumed attempt printed."""
    run_dir: Path
    left: Path
    killed_at: float
    output: str


def kill_when_paused(launch: subprocess.Popen) -> float:
    """SIGKILL once the launch has paused; when."""
    lines = []
    for line in launch.stdout:
        lines.append(line)
        if line.startswith("paused"):
            launch.kill()
            killed_at = time.time()
            launch.wait(timeout=30)
            return killed_at
    pytest.fail(f"the run ended before it paused:\n{''.join(lines)}")


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Killed:
    log_dir = tmp_path_factory.mktemp("killed")
    run_dir, left = log_dir / "run", log_dir / "left"
    where = ["--log_dir", log_dir, "--run_name", "run"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PAUSE_STEP": str(KILLED)}
    launch = subprocess.Popen([sys.executable, "-c", PAUSE, SINGLE, *map(str, [*FLAGS, *where])],
                              cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    killed_at = kill_when_paused(launch)
    left.mkdir()
    for path in [*run_dir.glob("events.out.tfevents.*"), run_dir / "checkpoint.pt"]:
        shutil.copy(path, left)
    resumed = run_script(DIST, *FLAGS, *where, "--nproc_per_node", "2", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed at step {CHECKPOINT}" in resumed.stdout
    return Killed(run_dir, left, killed_at, resumed.stdout)


# ---------------------------------------------------------------------------------- 1. flushed
def test_a_killed_run_leaves_every_point_up_to_its_last_window(killed):
    left = read_scalars(killed.left)
    for tag in ("train/loss", "train/acc", "train/lr", "time/batch", "throughput/images_per_sec"):
        assert [step for step, _ in left[tag]] == list(range(2, KILLED + 1, 2)), tag
    assert [step for step, _ in left["test/acc"]] == [STEPS_PER_EPOCH]


# ---------------------------------------------------------------------------------- 2. purged
def test_a_resumed_run_continues_the_curves_from_its_checkpoint(killed):
    events = scalar_events(killed.run_dir)
    for tag, points in events.items():
        steps = [point.step for point in points]
        assert steps == sorted(set(steps)), f"{tag} goes back: {steps}"
    assert [point.step for point in events["train/loss"]] == list(range(2, 17, 2))
    assert [point.step for point in events["test/acc"]] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    for tag, points in events.items():  # to the checkpoint the killed attempt's, then the resumed
        by_the_killed_attempt = [point.wall_time < killed.killed_at for point in points]
        assert by_the_killed_attempt == [point.step <= CHECKPOINT for point in points], tag
    # one event file per attempt: of the two processes that resumed, rank 0 alone writes
    assert len(list(killed.run_dir.glob("events.out.tfevents.*"))) == 2


# ---------------------------------------------------------------------------------- 3. lr
def test_train_lr_is_the_rate_each_step_trained_with(killed):
    """--lr 0.1 per 128 images at global batch 32, no warm-up: 0.025 for the first epoch's steps
    (step 8, its last, included), a tenth of it from step 9 on. The point of step 8 used to read
    0.0025, the rate of the step after it."""
    logged = dict(read_scalars(killed.run_dir)["train/lr"])
    trained_with = {step: 0.025 if step <= STEPS_PER_EPOCH else 0.0025 for step in logged}
    assert list(logged) == list(range(2, 17, 2))
    assert logged == pytest.approx(trained_with, rel=1e-6)


# ---------------------------------------------------------------------------------- 4. results
def test_results_of_a_resumed_run_cover_the_run_and_say_what_does_not(killed):
    results = read_results(killed.run_dir)
    assert results["resumed"] == {"attempts": 2, "from_step": CHECKPOINT,
                                  "last_attempt_only": list(ATTEMPT_FIELDS)}
    assert (results["mode"], results["world_size"]) == ("dist_parallel", 2)  # the last attempt's
    summary = results["summary"]
    assert summary["steps"] == 2 * STEPS_PER_EPOCH
    earlier = torch.load(killed.left / "checkpoint.pt", weights_only=True)["history"]
    # the second epoch's seconds as the resumed attempt printed them: the killed attempt's share
    # (up to its checkpoint) and its own
    printed = re.search(r"Epoch 2/2 test loss .* epoch ([\d.]+)s", killed.output).group(1)
    second_epoch = float(printed)
    assert second_epoch > earlier["epoch_time_s"] > 0
    first_epoch = earlier["epoch_times_s"][0]
    assert summary["epoch_time_s"] == pytest.approx((first_epoch + second_epoch) / 2, abs=0.06)
    resumed_share = second_epoch - earlier["epoch_time_s"]
    assert summary["wall_time_s"] > earlier["wall_time_s"] + resumed_share
    # the last epoch's training loss over all its windows, both attempts' (windows of equal size)
    windows = [loss for step, loss in read_scalars(killed.run_dir)["train/loss"] if step > 8]
    assert summary["train_loss"] == pytest.approx(sum(windows) / len(windows), rel=1e-5)


def test_a_run_trained_in_one_attempt_has_no_resumed_entry(tmp_path):
    cfg = parse_config(Config, [*FLAGS, "--log_dir", str(tmp_path), "--run_name", "once"])
    logger = RunLogger(tmp_path / "once", cfg, "single_gpu", world_size=1)
    try:
        logger.write_results(dict.fromkeys(SUMMARY_FIELDS), attempts=1)
    finally:
        logger.close()
    assert read_results(tmp_path / "once")["resumed"] is None


def test_each_kept_attempt_says_its_config_once_and_keeps_its_file(tmp_path):
    """Three attempts in one second: the first logs to step 4 and checkpoints at step 2; the second resumes from
    that checkpoint and is killed before its next one; the third resumes from the same checkpoint. TensorBoard
    shows the config of the attempts whose work was kept, each at the first step it trained (the killed
    attempt's config used to stay beside the third's, both at step 2), and every attempt keeps its own event
    file (tensorboardX names one by the second, and an attempt started in the same second emptied the
    earlier one's)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    cfg = parse_config(Config, [*FLAGS, "--log_dir", str(tmp_path), "--run_name", "run", "--resume", "auto"])
    for resumed_step, steps in ((None, (2, 4)), (2, (4,)), (2, (4, 6))):
        logger = RunLogger(tmp_path / "run", cfg, "single_gpu", world_size=1, resumed_step=resumed_step)
        for step in steps:
            logger.scalars(step, {"train/loss": float(step)})
        logger.close()
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 3
    assert read_scalars(tmp_path / "run")["train/loss"] == [(2, 2.0), (4, 4.0), (6, 6.0)]
    accumulator = EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0})  # the UI's reader
    accumulator.Reload()  # (text is kept as tensors, which the scalars' reader never purges)
    assert [event.step for event in accumulator.Tensors("config/text_summary")] == [0, 3]

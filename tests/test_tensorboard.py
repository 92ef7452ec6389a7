"""What TensorBoard shows of a run that was killed and resumed, read with TensorBoard's own
EventAccumulator (which drops the points a restarted run purged, as the UI does), and the
results.json such a run leaves:

1. killed with SIGKILL (as the out-of-memory killer kills) right after a log window, a run has
   left every point it logged up to that window in its event file;
2. resumed with --resume auto, its curves never go back: the points up to the checkpoint (the
   first epoch's test accuracy included) are the killed attempt's, those after it the resumed one's;
3. train/lr is the rate each step trained with, at the step schedule's epoch boundary too;
4. the resumed run's results.json names the figures that are its last attempt's; the others cover
   the whole run;
5. every tag names its unit and holds the figure the console printed (accuracy in %, seconds, the
   data wait's share in %); in a process group each rank's own window is under rank/<r>/; MFU is
   written where a peak is known (its formula, with a stated peak) and not on the CPU; the tags are
   the ones the docs list; a run logged under the old names and resumed under the new keeps both.

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
from common.logger import ATTEMPT_FIELDS, SUMMARY_FIELDS, RunLogger, window_scalars
from common.metrics import Sums
from common.performance import GPU_PEAK_TFLOPS, window_mfu
from conftest import (REPO, TINY, read_results, read_scalars, run_script, scalar_events,
                      train_in_process)

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
    checkpoint); when it was killed; what the resumed attempt printed, and the killed one."""
    run_dir: Path
    left: Path
    killed_at: float
    output: str
    killed_output: str


def kill_when_paused(launch: subprocess.Popen) -> tuple[float, str]:
    """SIGKILL once the launch has paused; when, and what it had printed."""
    lines = []
    for line in launch.stdout:
        lines.append(line)
        if line.startswith("paused"):
            launch.kill()
            killed_at = time.time()
            launch.wait(timeout=30)
            return killed_at, "".join(lines)
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
    killed_at, killed_output = kill_when_paused(launch)
    left.mkdir()
    for path in [*run_dir.glob("events.out.tfevents.*"), run_dir / "checkpoint.pt"]:
        shutil.copy(path, left)
    resumed = run_script(DIST, *FLAGS, *where, "--nproc_per_node", "2", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed at step {CHECKPOINT}" in resumed.stdout
    return Killed(run_dir, left, killed_at, resumed.stdout, killed_output)


# ---------------------------------------------------------------------------------- 1. flushed
def test_a_killed_run_leaves_every_point_up_to_its_last_window(killed):
    left = read_scalars(killed.left)
    tags = ("train/loss", "train/acc_pct", "train/lr", "time/step_s", "throughput/images_per_s")
    for tag in tags:
        assert [step for step, _ in left[tag]] == list(range(2, KILLED + 1, 2)), tag
    assert [step for step, _ in left["test/acc_pct"]] == [STEPS_PER_EPOCH]


# ---------------------------------------------------------------------------------- 2. purged
def test_a_resumed_run_continues_the_curves_from_its_checkpoint(killed):
    events = scalar_events(killed.run_dir)
    for tag, points in events.items():
        steps = [point.step for point in points]
        assert steps == sorted(set(steps)), f"{tag} goes back: {steps}"
    assert [point.step for point in events["train/loss"]] == list(range(2, 17, 2))
    test_steps = [point.step for point in events["test/acc_pct"]]
    assert test_steps == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
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
    """Three attempts in one second: the first logs to step 4 and checkpoints at step 2; the second
    resumes from that checkpoint and is killed before its next one; the third resumes from the same
    checkpoint. TensorBoard shows the config of the attempts whose work was kept, each at the first
    step it trained (the killed attempt's config used to stay beside the third's, both at step 2),
    and every attempt keeps its own event file (tensorboardX names one by the second, and an attempt
    started in the same second emptied the earlier one's)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    flags = [*FLAGS, "--log_dir", str(tmp_path), "--run_name", "run", "--resume", "auto"]
    cfg = parse_config(Config, flags)
    for resumed_step, steps in ((None, (2, 4)), (2, (4,)), (2, (4, 6))):
        logger = RunLogger(tmp_path / "run", cfg, "single_gpu", world_size=1,
                           resumed_step=resumed_step)
        for step in steps:
            logger.scalars(step, {"train/loss": float(step)})
        logger.close()
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 3
    assert read_scalars(tmp_path / "run")["train/loss"] == [(2, 2.0), (4, 4.0), (6, 6.0)]
    # the UI's reader
    accumulator = EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0})
    accumulator.Reload()  # (text is kept as tensors, which the scalars' reader never purges)
    assert [event.step for event in accumulator.Tensors("config/text_summary")] == [0, 3]


# ---------------------------------------------------------------------------------- 5. tags
# The console's window line and test line (common/logger.py window_line, Run.record_test)
WINDOW = re.compile(r"^Epoch (\d+)/\d+ \[(\d+)/\d+\] loss ([\d.]+) acc ([\d.]+)% batch ([\d.]+)s "
                    r"data ([\d.]+)% (\d+) img/s$", re.MULTILINE)
TEST = re.compile(r"^Epoch (\d+)/\d+ test loss ([\d.]+) acc ([\d.]+)%", re.MULTILINE)
# each printed figure, its tag, and half the last digit printed
PRINTED = {"train/loss": 0.0005, "train/acc_pct": 0.005, "time/step_s": 0.0005,
           "time/data_wait_pct": 0.05, "throughput/images_per_s": 0.5}
RANK_TAGS = ("time/step_s", "time/data_wait_s", "time/data_wait_pct")


def printed(output: str) -> dict[str, dict[int, float]]:
    """{tag: {step: the figure the console printed}} of a run's output."""
    figures = {tag: {} for tag in [*PRINTED, "test/loss", "test/acc_pct"]}
    for epoch, batch, *values in WINDOW.findall(output):
        step = (int(epoch) - 1) * STEPS_PER_EPOCH + int(batch)
        for tag, value in zip(PRINTED, values):
            figures[tag][step] = float(value)
    for epoch, loss, acc in TEST.findall(output):
        step = int(epoch) * STEPS_PER_EPOCH
        figures["test/loss"][step], figures["test/acc_pct"][step] = float(loss), float(acc)
    return figures


def test_every_tag_holds_what_the_console_printed_in_the_unit_its_name_says(killed):
    """Accuracy in % (0-100), as the log line prints it, not 0-1; the step and its data wait in
    seconds, the wait also as % of the step (the console's `data 0.6%`), never a share beside
    seconds. Up to the checkpoint the killed attempt's lines, after it the resumed one's."""
    scalars = read_scalars(killed.run_dir)
    before, after = printed(killed.killed_output), printed(killed.output)
    tolerance = {**PRINTED, "test/loss": 0.0005, "test/acc_pct": 0.005}
    for tag, half_digit in tolerance.items():
        console = {**{step: v for step, v in before[tag].items() if step <= CHECKPOINT},
                   **{step: v for step, v in after[tag].items() if step > CHECKPOINT}}
        logged = dict(scalars[tag])
        assert list(logged) == list(console), tag
        assert logged == pytest.approx(console, abs=half_digit * 1.001), tag
    for tag in ("train/acc_pct", "test/acc_pct"):
        assert all(0 <= acc <= 100 for _, acc in scalars[tag]), tag
    step_s, wait_s = dict(scalars["time/step_s"]), dict(scalars["time/data_wait_s"])
    share = {step: 100 * wait_s[step] / step_s[step] for step in step_s}
    assert dict(scalars["time/data_wait_pct"]) == pytest.approx(share, rel=1e-5)


def test_each_rank_has_its_own_window_under_rank_r(killed):
    """The attempt resumed on 2 processes logs each rank's own step and data wait under
    rank/<r>/ (the run-wide time/step_s is their mean); the one-process attempt, none. No GPU
    here: no gpu/<i>/ nor rank/<r>/gpu/ tags, and no MFU, whose peak is a GPU's."""
    scalars = read_scalars(killed.run_dir)
    resumed = [step for step in range(2, 17, 2) if step > CHECKPOINT]
    per_rank = {tag for tag in scalars if tag.startswith("rank/")}
    assert per_rank == {f"rank/{rank}/{name}" for rank in (0, 1) for name in RANK_TAGS}
    for tag in per_rank:
        assert [step for step, _ in scalars[tag]] == resumed, tag
    ranks = [dict(scalars[f"rank/{rank}/time/step_s"]) for rank in (0, 1)]
    mean = {step: (ranks[0][step] + ranks[1][step]) / 2 for step in resumed}
    run_wide = {step: seconds for step, seconds in scalars["time/step_s"] if step in mean}
    assert run_wide == pytest.approx(mean, rel=1e-5)
    assert not [tag for tag in scalars if "gpu/" in tag or tag.startswith("perf/")]


def test_the_docs_list_the_tags_a_run_writes(killed):
    """docs/interruptions.md names every tag (`<i>`: a GPU's index, `<r>`: a rank), and every
    tag it names that needs no GPU is one this run wrote."""
    text = (REPO / "docs" / "interruptions.md").read_text()
    listed = text[text.index("- TensorBoard scalars"):text.index("A run started before these")]
    tag = r"`((?:train|test|time|throughput|perf|gpu|rank)/[\w/<>]*\w)`"
    documented = set(re.findall(tag, listed))
    pattern = {tag: re.sub(r"<[ir]>", r"\\d+", re.escape(tag)) for tag in documented}
    written = set(read_scalars(killed.run_dir))
    for tag in written:
        assert any(re.fullmatch(regex, tag) for regex in pattern.values()), f"{tag}: not in docs"
    # top-5: for more than 10 classes (tests/test_imagefolder.py's run of 11 writes it)
    without_gpu = {tag for tag in documented if "gpu/" not in tag and not tag.startswith("perf/")
                   and tag != "test/acc_top5_pct"}
    for tag in without_gpu:
        assert any(re.fullmatch(pattern[tag], seen) for seen in written), f"{tag}: never written"


def test_mfu_is_the_windows_images_per_s_times_an_images_flops_over_the_peak(tmp_path, monkeypatch):
    """Where a GPU's peak is known, each window's perf/mfu_pct is its images/s (per GPU) times the
    FLOPs of one training image (forward and backward, results.json's flops_per_image) over the
    peak, in %. The CPU has none (no perf/ tag above): a peak is stated here for it."""
    import common.loop

    peak = 1e-3  # TFLOP/s: of the order of this CPU's, so the figure is not vanishingly small
    monkeypatch.setattr(common.loop, "peak_tflops", lambda device, amp: peak)
    done = train_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "run")
    assert done.returncode == 0, done.stdout + done.stderr
    scalars = read_scalars(tmp_path / "run")
    flops = read_results(tmp_path / "run")["summary"]["flops_per_image"]
    rates = dict(scalars["throughput/images_per_s"])
    formula = {step: 100 * rate * flops / (peak * 1e12) for step, rate in rates.items()}
    assert len(rates) == 2 and dict(scalars["perf/mfu_pct"]) == pytest.approx(formula, rel=1e-5)


def test_window_mfu_shares_the_rate_over_the_gpus_of_the_batch():
    """Two H100 SXM in bf16 training 40,000 images/s of 28.3 GFLOP each (PyramidNet-110 α=270):
    20,000 images/s on each GPU; none without a rate or a peak."""
    peak = GPU_PEAK_TFLOPS["H100"]["bf16"]
    per_gpu = 20_000 * 28.3e9 / (peak * 1e12)
    assert window_mfu(40_000.0, 2, 28_300_000_000, peak) == pytest.approx(per_gpu)
    assert window_mfu(None, 2, 28_300_000_000, peak) is None
    assert window_mfu(40_000.0, 2, None, None) is None
    # 64 images in 2 timed steps of 0.5 s, 0.1 s of it waiting for data; 48 of them right
    scalars = window_scalars(Sums([128.0, 48.0, 64.0, 2.0, 1.0, 0.1]), 32, 0.1, 0.25)
    assert scalars == pytest.approx({
        "train/loss": 2.0, "train/acc_pct": 75.0, "train/lr": 0.1, "time/step_s": 0.5,
        "time/data_wait_s": 0.05, "time/data_wait_pct": 10.0, "throughput/images_per_s": 64.0,
        "perf/mfu_pct": 25.0})


def test_a_run_logged_under_the_old_tags_and_resumed_keeps_both(tmp_path):
    """A run started before the tags named their units (train/acc 0-1, time/batch, ...) and
    resumed after: TensorBoard shows the old tags up to the checkpoint and the new ones from it, two
    series of one figure. The purge on resume is by step for every tag, whatever its name: what the
    killed attempt logged after the checkpoint is gone under the old names too."""
    flags = [*FLAGS, "--log_dir", str(tmp_path), "--run_name", "run", "--resume", "auto"]
    cfg = parse_config(Config, flags)
    for resumed_step, steps, tags in ((None, (2, 4, 6), ("train/acc", "time/batch")),
                                      (4, (6, 8), ("train/acc_pct", "time/step_s"))):
        logger = RunLogger(tmp_path / "run", cfg, "single_gpu", 1, resumed_step=resumed_step)
        for step in steps:
            logger.scalars(step, dict.fromkeys(tags, 0.5))
        logger.close()
    scalars = read_scalars(tmp_path / "run")
    steps = {tag: [step for step, _ in points] for tag, points in scalars.items()}
    assert steps == {"train/acc": [2, 4], "time/batch": [2, 4],
                     "train/acc_pct": [6, 8], "time/step_s": [6, 8]}

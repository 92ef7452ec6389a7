"""What TensorBoard shows of a run that was killed and resumed, read with TensorBoard's own
EventAccumulator (which drops the points a restarted run purged, as the UI does), and the
results.json such a run leaves:

1. killed with SIGKILL (as the out-of-memory killer kills) after a log window, a run has left every
   point it logged up to that window in its event file;
2. resumed with --resume auto, its curves never go back: the points up to the checkpoint (the
   first epoch's test accuracy included) are the killed attempt's, those after it the resumed one's;
3. train/lr is the rate each step trained with, at the schedule's epoch boundary too;
4. the resumed run's results.json: the last attempt's mode and speed, the whole run's steps and
   test figures;
5. every tag names its unit and holds the figure the console printed (accuracy in %, seconds, the
   data wait's share in %); the tags are the ones the docs list; a run logged under old names and
   resumed under new ones keeps both.

One run of two attempts serves them all: single_gpu, killed mid-epoch after a checkpoint, then
resumed by dist_parallel on 2 processes (checkpoints are every mode's, and a restart may bring more
workers), where rank 0 alone writes. The first attempt is not raced: it waits in the step after the
window it is to be killed at (tests/fault_injection.py's FAULT_AWAIT_SIGNAL) and is killed there.
"""
from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import runkit
from conftest import REPO, read_results, read_scalars, scalar_events
from processes import TINY, finish, read_until, run, script, under_fault

# 256 images, global batch 32: 8 steps an epoch, 16 in all, a log window every 2 steps. The rate
# drops tenfold after the first epoch: step 8 trains at 0.025, step 9 at 0.0025. Checkpoints at the
# end of epoch 1 (step 8) and at step 12; the first attempt is killed after the window of step 14.
FLAGS = [*TINY, "--epochs", "2", "--log_interval", "2", "--checkpoint_interval", "12"]
STEPS_PER_EPOCH, CHECKPOINT, KILLED = 8, 12, 14
# the loss function's calls up to step 15's forward: 8 steps, 2 test batches (51 images), 7 steps
IN_STEP_15 = 8 + 2 + 7
# what a run writes without a GPU (design: the tags compare and the docs rely on)
TAGS = {"train/loss", "train/acc_pct", "train/lr", "time/step_s", "time/data_wait_s",
        "time/data_wait_pct", "throughput/images_per_s", "test/loss", "test/acc_pct"}


@dataclass
class Killed:
    """The run's folder; a copy of what the killed attempt had left (its event file and
    checkpoint); when it was killed; what the resumed attempt printed, and the killed one."""
    run_dir: Path
    left: Path
    killed_at: float
    output: str
    killed_output: str


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Killed:
    log_dir = tmp_path_factory.mktemp("killed")
    run_dir, left = log_dir / "run", log_dir / "left"
    where = ["--log_dir", log_dir, "--run_name", "run"]
    launch = under_fault("single_gpu", [*FLAGS, *where],
                         {"FAULT_STEP": str(IN_STEP_15), "FAULT_AWAIT_SIGNAL": "1"})
    killed_output = read_until(launch, "waiting for a signal")
    assert f"[{KILLED - STEPS_PER_EPOCH}/8]" in killed_output.splitlines()[-2], killed_output
    launch.kill()
    killed_at = time.time()
    finish(launch)
    left.mkdir()
    for path in [*run_dir.glob("events.out.tfevents.*"), run_dir / "checkpoint.pt"]:
        shutil.copy(path, left)
    time.sleep(1)  # tensorboardX names an event file by the second: the resume's is another
    resumed = run(script("dist_parallel"), *FLAGS, *where, "--nproc_per_node", "2", "--resume",
                  "auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed at step {CHECKPOINT}" in resumed.stdout
    return Killed(run_dir, left, killed_at, resumed.stdout, killed_output)


# ---------------------------------------------------------------------------------- 1. flushed
def test_a_killed_run_leaves_every_point_up_to_its_last_window(killed):
    left = read_scalars(killed.left)
    for tag in ("train/loss", "train/acc_pct", "train/lr", "time/step_s",
                "throughput/images_per_s"):
        assert [step for step, _ in left[tag]] == list(range(2, KILLED + 1, 2)), tag
    assert [step for step, _ in left["test/acc_pct"]] == [STEPS_PER_EPOCH]


# ---------------------------------------------------------------------------------- 2. purged
def test_a_resumed_run_continues_the_curves_from_its_checkpoint(killed):
    events = scalar_events(killed.run_dir)
    for tag, points in events.items():
        steps = [point.step for point in points]
        assert steps == sorted(set(steps)), f"{tag} goes back: {steps}"
    assert [point.step for point in events["train/loss"]] == list(range(2, 17, 2))
    assert [point.step for point in events["test/acc_pct"]] == [8, 16]
    for tag, points in events.items():  # to the checkpoint the killed attempt's, then the resumed
        by_the_killed_attempt = [point.wall_time < killed.killed_at for point in points]
        assert by_the_killed_attempt == [point.step <= CHECKPOINT for point in points], tag
    # one event file per attempt: of the two processes that resumed, rank 0 alone writes
    assert len(list(killed.run_dir.glob("events.out.tfevents.*"))) == 2


# ---------------------------------------------------------------------------------- 3. lr
def test_train_lr_is_the_rate_each_step_trained_with(killed):
    """--lr 0.1 per 128 images at global batch 32, warm-up within the first step: 0.025 for the
    first epoch's steps (step 8, its last, included), a tenth of it from step 9 on."""
    logged = dict(read_scalars(killed.run_dir)["train/lr"])
    assert list(logged) == list(range(2, 17, 2))
    assert logged == pytest.approx({step: 0.025 if step <= STEPS_PER_EPOCH else 0.0025
                                    for step in logged}, rel=1e-6)


# ---------------------------------------------------------------------------------- 4. results
def test_results_of_a_resumed_run_are_the_last_attempts_speed_and_the_whole_runs_figures(killed):
    results = read_results(killed.run_dir)
    assert (results["mode"], results["world_size"]) == ("dist_parallel", 2)  # the last attempt's
    summary = results["summary"]
    assert (summary["step"], summary["epoch"], summary["tested_step"]) == (16, 2, 16)
    assert summary["timed_steps"] == 16 - CHECKPOINT - 1  # this attempt's, less its warm-up
    tests = read_scalars(killed.run_dir)["test/acc_pct"]
    assert 100 * summary["test_acc"] == pytest.approx(tests[-1][1], rel=1e-6)
    assert 100 * summary["best_acc"] == pytest.approx(max(acc for _, acc in tests), rel=1e-6)
    assert "resumed" not in results and "attempts" not in summary


# ---------------------------------------------------------------------------------- 5. tags
WINDOW = re.compile(r"^Epoch (\d+)/\d+ \[(\d+)/\d+\] loss ([\d.]+) acc ([\d.]+)% batch ([\d.]+)s "
                    r"data ([\d.]+)% (\d+) img/s$", re.MULTILINE)
TEST = re.compile(r"^Epoch (\d+)/\d+ test loss ([\d.]+) acc ([\d.]+)%", re.MULTILINE)
# each printed figure, its tag, and half the last digit printed
PRINTED = {"train/loss": 0.0005, "train/acc_pct": 0.005, "time/step_s": 0.0005,
           "time/data_wait_pct": 0.05, "throughput/images_per_s": 0.5}


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
    seconds, the wait also as % of the step (the console's `data 0.6%`). Up to the checkpoint the
    killed attempt's lines, after it the resumed one's (its first window, step 14, untimed)."""
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


def test_the_run_writes_the_tags_the_docs_list(killed):
    """Without a GPU a run writes these tags, and docs/interruptions.md names each (`<i>`: a GPU's
    index)."""
    written = set(read_scalars(killed.run_dir))
    assert written == TAGS
    text = (REPO / "docs" / "interruptions.md").read_text()
    listed = text[text.index("- TensorBoard scalars"):text.index("- `results.json`, written")]
    documented = set(re.findall(r"`((?:train|test|time|throughput|gpu)/[\w/<>]*\w)`", listed))
    assert written <= documented, written - documented


def killed_attempt(run_dir: Path, steps, tags, checkpoint_step=None) -> None:
    """An attempt that logged `tags` at `steps` and was killed (every point flushed), resumed from
    the checkpoint of `checkpoint_step`; its event file named as one of a second long past."""
    log = runkit.RunLog(run_dir, {"attempt": len(list(run_dir.glob("events.*")))},
                        checkpoint_step and {"progress": {"step": checkpoint_step}})
    for step in steps:
        log.scalars(step, dict.fromkeys(tags, float(step)))
    log.close()
    for number, path in enumerate(sorted(run_dir.glob("events.out.tfevents.*"))):
        path.rename(path.with_name(f"events.out.tfevents.{1_000_000_000 + number}.host"))


def test_each_kept_attempt_says_its_config_once_at_the_first_step_it_trained(tmp_path):
    """Three attempts: the first logs to step 4 and checkpoints at step 2; the second resumes from
    that checkpoint and is killed before its next one; the third resumes from the same checkpoint.
    TensorBoard shows the config of the attempts whose work was kept, each at the first step it
    trained, and every attempt's points after the checkpoint only from the last."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    for checkpoint_step, steps in ((None, (2, 4)), (2, (4,)), (2, (4, 6))):
        killed_attempt(tmp_path, steps, ("train/loss",), checkpoint_step)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 3
    assert read_scalars(tmp_path)["train/loss"] == [(2, 2.0), (4, 4.0), (6, 6.0)]
    accumulator = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    accumulator.Reload()  # the config is text, kept as tensors
    assert [event.step for event in accumulator.Tensors("config/text_summary")] == [0, 3]


def test_a_run_logged_under_other_tags_and_resumed_keeps_both(tmp_path):
    """A run started under the earlier tag names (train/acc 0-1, time/batch) and resumed under the
    new: TensorBoard shows the old tags up to the checkpoint and the new ones from it. The purge on
    resume is by step for every tag, whatever its name: what the killed attempt logged after the
    checkpoint is gone under the old names too."""
    killed_attempt(tmp_path, (2, 4, 6), ("train/acc", "time/batch"))
    killed_attempt(tmp_path, (6, 8), ("train/acc_pct", "time/step_s"), checkpoint_step=4)
    steps = {tag: [step for step, _ in points] for tag, points in read_scalars(tmp_path).items()}
    assert steps == {"train/acc": [2, 4], "time/batch": [2, 4],
                     "train/acc_pct": [6, 8], "time/step_s": [6, 8]}


def test_the_checkpoint_the_resume_read_is_the_killed_attempts(killed):
    """The resumed attempt started from the step-12 checkpoint the killed attempt left, mid-epoch
    (no later one: the kill came before step 16's)."""
    state = torch.load(killed.left / "checkpoint.pt", weights_only=True)
    assert (state["progress"]["step"], state["progress"]["epoch"], state["progress"]["batch"]) == \
        (CHECKPOINT, 1, CHECKPOINT - STEPS_PER_EPOCH)

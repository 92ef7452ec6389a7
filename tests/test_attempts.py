"""A run made of attempts counts each epoch's time once, on the CPU:

1. the run's clock over a chain of attempts (--max_steps, SIGTERM, an interval checkpoint then
   a kill, a stop at an epoch's last window): each epoch's seconds are the sum of the kept
   parts of its attempts, recorded once;
2. histories an earlier version wrote, which counted an epoch cut by --max_steps once per attempt
   (the second such stop made a checkpoint that no run could resume: "has a damaged 'history'
   entry"), resume: the time they can tell apart is kept, the rest is not known;
3. a chain of five attempts as users make them: single_gpu stopped by --max_steps, fsdp on 2
   processes resumed and stopped by a larger --max_steps, single_gpu stopped by SIGTERM, then by
   --max_steps in the next epoch, then to the end: every checkpoint resumes, each holds one time per
   epoch done, and results.json's epoch_time_s is the mean of whole epochs only (null, with a note
   that says what there is, when no epoch was whole);
4. a checkpoint written between two log windows (--checkpoint_interval, a DataLoader worker that
   died) ends a window first: it holds the figures of every step it holds, and the run resumed from
   it reports the training loss and accuracy the uninterrupted run reports (the steps after the last
   window were lost to both attempts).

The single_gpu attempts run inside this process (main() as its __main__ block runs it),
a SIGTERM injected at a log window as the signal handler would note it; fsdp runs as a
user starts it (two processes, gloo).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import common.metrics
from common.checkpoint import LAST, write_checkpoint
from common.metrics import RunClock
from conftest import TINY, read_results, read_scalars, run_script, train_in_process

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

SINGLE, FSDP = "single_gpu/train.py", "fsdp/train.py"
# 256 images, global batch 32: 8 steps an epoch, 16 in two; a log window
# every 2 steps (and at --max_steps)
FLAGS = [*TINY, "--epochs", "2", "--log_interval", "2", "--no_progress"]
STEPS_PER_EPOCH = 8


# ----------------------------------------------------------------------------------------- 1. clock
class FakeTime:
    """time.perf_counter() as the test sets it."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def attempt(fake: FakeTime, history: dict | None, epoch: int, batch: int) -> RunClock:
    """An attempt's clock, started now, resumed at (epoch, batch)
    from a checkpoint with `history`."""
    clock = RunClock(fake.now)
    clock.load(history, epoch, batch)
    return clock


def test_each_epoch_counts_once_whatever_the_attempts(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(common.metrics, "time", fake)
    # attempt 1: --max_steps cuts epoch 1 after 3 s; its evaluation (1 s) is no part of the epoch
    first = RunClock(fake.now)
    first.start_epoch()
    fake.now = 3
    assert first.end_epoch(whole=False) == 3
    fake.now = 4
    one = first.state()
    assert (one["epoch_times_s"], one["epoch_time_s"], one["wall_time_s"]) == ([], 3, 4)
    assert first.epoch_time() is None  # no whole epoch
    # attempt 2, a larger --max_steps: 2 s more of epoch 1, cut again
    fake.now = 10
    second = attempt(fake, one, 0, 3)
    second.start_epoch()
    fake.now = 12
    assert second.end_epoch(whole=False) == 5
    two = second.state()
    assert (two["epoch_times_s"], two["epoch_time_s"], two["attempts"]) == ([], 5, 2)
    # attempt 3: 1 s more, a checkpoint (--checkpoint_interval), then 1 s that a kill -9 loses
    fake.now = 20
    third = attempt(fake, two, 0, 5)
    third.start_epoch()
    fake.now = 21
    three = third.state()
    assert three["epoch_time_s"] == 6
    # attempt 4 resumes that checkpoint: epoch 1 ends after 2 s more (8 s
    # in all), epoch 2 is cut after 1 s
    fake.now = 30
    fourth = attempt(fake, three, 0, 6)
    fourth.start_epoch()
    fake.now = 32
    assert fourth.end_epoch(whole=True) == 8
    assert fourth.state()["epoch_times_s"] == [8]
    fourth.start_epoch()
    fake.now = 33
    assert fourth.end_epoch(whole=False) == 1
    four = fourth.state()
    assert (four["epoch_times_s"], four["epoch_time_s"]) == ([8], 1)
    assert fourth.epoch_time() == 8  # the whole epoch alone
    # attempt 5: SIGTERM at epoch 2's last window (3 s more): the stop checkpoint leaves the
    # epoch's end owed, its 4 s under way
    fake.now = 40
    fifth = attempt(fake, four, 1, 4)
    fifth.start_epoch()
    fake.now = 43
    five = fifth.state()
    assert (five["epoch_times_s"], five["epoch_time_s"], five["attempts"]) == ([8], 4, 5)
    # attempt 6 resumes at that last batch and ends the epoch without training: both epochs
    # done, once each
    fake.now = 50
    sixth = attempt(fake, five, 1, 8)
    assert sixth.end_epoch(whole=True) == 4
    assert sixth.epoch_times == [8, 4] and sixth.epoch_time() == 6
    # the wall time: each attempt up to the checkpoint the next resumed from
    # (attempt 3's to its checkpoint)
    assert five["wall_time_s"] == 4 + 2 + 1 + 3 + 3


# --------------------------------------------------------------------------------------- 2. earlier
def history(times: list, under_way: float, attempts: int | None = 2) -> dict:
    return {"attempts": attempts, "wall_time_s": 30.0, "epoch_times_s": times,
            "epoch_time_s": under_way, "epoch_sums": [0.0] * 6}


@pytest.mark.parametrize("written, epoch, batch, times, under_way", [
    # an epoch cut once by --max_steps: its seconds were the list's last, and are the epoch's so far
    (history([3.0], 0.0), 0, 3, [], 3.0),
    (history([8.0, 3.0], 0.0), 1, 3, [8.0], 3.0),
    # cut twice (the checkpoint no run could resume): which seconds are which epoch's cannot be told
    (history([3.0, 2.0], 0.0), 0, 5, [], None),
    (history([3.0, 5.0, 1.0], 0.0), 1, 4, [None], None),
    (history([3.0, 5.0], 0.5), 1, 2, [None], None),  # then stopped by a signal in the next epoch
    # at an epoch's start: nothing under way
    (history([3.0, 5.0, 2.0], 0.0), 2, 0, [None, None], 0.0),
    # a checkpoint without a history (written before checkpoints kept one), resumed mid-epoch
    (None, 1, 3, [None], None),
    (history([], 0.0, attempts=None), 1, 0, [None], 0.0),
    # one resumed after such: the epochs before it have no time
    (history([4.0], 1.0), 2, 1, [None, 4.0], 1.0),
])
def test_histories_of_earlier_versions_resume_with_what_they_can_tell(monkeypatch, written, epoch,
                                                                         batch, times, under_way):
    fake = FakeTime()
    monkeypatch.setattr(common.metrics, "time", fake)
    clock = attempt(fake, written, epoch, batch)
    assert (clock.epoch_times, clock.epoch_earlier) == (times, under_way)
    clock.start_epoch()
    fake.now = 2.0
    assert clock.end_epoch(whole=True) == (None if under_way is None else under_way + 2.0)
    known = [seconds for seconds in clock.epoch_times if seconds is not None]
    assert clock.epoch_time() == (statistics.mean(known) if known else None)


# --------------------------------------------------------------------------------------- 3. a chain
@dataclass
class Attempt:
    code: int
    output: str
    checkpoint: dict  # the checkpoint it left
    results: dict | None  # results.json as it left it


def train_here(run_dir: Path, *flags, sigterm_at: int | None = None) -> Attempt:
    """single_gpu/train.py with FLAGS and `flags` into `run_dir`, inside this process; a SIGTERM
    noted at the log window of step `sigterm_at`."""
    done = train_in_process(SINGLE, *FLAGS, *flags, "--log_dir", run_dir.parent, "--run_name",
                            run_dir.name, sigterm_at=sigterm_at)
    return left_by(run_dir, done.returncode, done.stdout + done.stderr)


def left_by(run_dir: Path, code: int, output: str) -> Attempt:
    results = read_results(run_dir) if (run_dir / "results.json").exists() else None
    return Attempt(code, output, torch.load(run_dir / LAST, weights_only=True), results)


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> list[Attempt]:
    run_dir = tmp_path_factory.mktemp("chain") / "run"
    attempts = [train_here(run_dir, "--max_steps", 3)]
    fsdp = run_script(FSDP, *FLAGS, "--nproc_per_node", 2, "--resume", "auto", "--max_steps", 5,
                      "--log_dir", run_dir.parent, "--run_name", run_dir.name)
    attempts.append(left_by(run_dir, fsdp.returncode, fsdp.stdout + fsdp.stderr))
    attempts.append(train_here(run_dir, "--resume", "auto", "--max_steps", 12, sigterm_at=6))
    attempts.append(train_here(run_dir, "--resume", "auto", "--max_steps", 12))
    attempts.append(train_here(run_dir, "--resume", "auto"))
    return attempts


def test_every_attempt_resumes_where_the_last_one_stopped(chain):
    assert [attempt.code for attempt in chain] == \
        [0, 0, 143, 0, 0], [attempt.output for attempt in chain]
    positions = [(attempt.checkpoint["epoch"], attempt.checkpoint["batch"]) for attempt in chain]
    assert positions == [(0, 3), (0, 5), (0, 6), (1, 4), (2, 0)]
    # it used to be refused at the third: a damaged 'history'
    for before, attempt in zip(chain, chain[1:]):
        assert f"resumed at step {before.checkpoint['step']} " in attempt.output, attempt.output
    assert [attempt.checkpoint["history"]["attempts"] for attempt in chain] == [1, 2, 3, 4, 5]


def test_each_checkpoint_holds_one_time_per_epoch_done(chain):
    histories = [attempt.checkpoint["history"] for attempt in chain]
    assert [len(history["epoch_times_s"]) for history in histories] == [0, 0, 0, 1, 2]
    # epoch 1 so far: each attempt adds its part
    cut = [history["epoch_time_s"] for history in histories[:3]]
    assert 0 < cut[0] < cut[1] < cut[2]
    first_epoch = histories[3]["epoch_times_s"][0]
    fourth_wall = histories[3]["wall_time_s"] - histories[2]["wall_time_s"]
    # the three parts before, and the fourth attempt's
    assert cut[2] < first_epoch < cut[2] + fourth_wall
    assert histories[4]["epoch_times_s"][0] == first_epoch
    second_epoch = histories[4]["epoch_times_s"][1]
    assert histories[3]["epoch_time_s"] < second_epoch
    # each epoch's test line says its seconds over every attempt; a cut one
    # says how much of it was trained
    printed = re.search(r"Epoch 1/2 test loss .* epoch ([\d.]+)s", chain[3].output).group(1)
    assert float(printed) == pytest.approx(first_epoch, abs=0.051)
    assert re.search(r"Epoch 1/2 test loss .* epoch [\d.]+s \(3 of 8 "
                     r"batches\)", chain[0].output), chain[0].output


def test_epoch_time_is_the_mean_of_whole_epochs_only(chain):
    first, _, _, fourth, last = chain
    # it used to be the cut epoch's 3 batches
    assert first.results["summary"]["epoch_time_s"] is None
    assert first.results["summary"]["epoch_time_note"] == (
        "no epoch was trained to its end: --max_steps 3 stopped the run at batch 3 of 8 of epoch "
        f"1, trained in {first.checkpoint['history']['epoch_time_s']:.3g} s")
    whole = fourth.checkpoint["history"]["epoch_times_s"]
    # not epoch 2's 4 batches
    assert fourth.results["summary"]["epoch_time_s"] == pytest.approx(whole[0])
    assert fourth.results["summary"]["epoch_time_note"] is None
    summary = last.results["summary"]
    assert summary["epoch_time_s"] == \
        pytest.approx(statistics.mean(last.checkpoint["history"]["epoch_times_s"]))
    assert summary["epoch_time_note"] is None and summary["steps"] == 2 * STEPS_PER_EPOCH
    assert last.results["resumed"]["attempts"] == 5


def test_an_evaluation_has_no_epoch_and_says_nothing_of_one(chain, tmp_path):
    torch.save(chain[-1].checkpoint["model"], tmp_path / "model.pt")
    done = train_in_process(SINGLE, *TINY, "--evaluate", tmp_path / "model.pt", "--log_dir",
                            tmp_path, "--run_name", "evaluated")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = read_results(tmp_path / "evaluated")["summary"]
    assert (summary["steps"] == 0 and summary["epoch_time_s"] is None
            and summary["epoch_time_note"] is None)


def test_a_checkpoint_an_earlier_version_damaged_resumes(chain, tmp_path):
    """The checkpoint the bug left (an epoch cut twice by --max_steps, its two parts
    recorded as two epochs) resumes and finishes; the epoch's seconds cannot be told
    apart, and results.json says so."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = {key: value for key, value in chain[1].checkpoint.items() if key != "checksum"}
    cut = state["history"]["epoch_time_s"]
    state["history"] = {**state["history"], "epoch_times_s": [cut / 3, cut * 2 / 3],
                        "epoch_time_s": 0.0}
    write_checkpoint(run_dir, state, best=False)
    resumed = train_here(run_dir, "--resume", "auto")
    assert resumed.code == 0 and "resumed at step 5 " in resumed.output, resumed.output
    summary = resumed.results["summary"]
    assert resumed.checkpoint["history"]["epoch_times_s"][0] is None
    assert summary["epoch_time_s"] == \
        pytest.approx(resumed.checkpoint["history"]["epoch_times_s"][1])
    assert summary["epoch_time_note"].startswith("the mean of 1 of the 2 epochs trained")


# --------------------------------------------------------------------------------------- 4. windows
def written_checkpoints(patch: pytest.MonkeyPatch) -> dict[int, bytes]:
    """Every checkpoint file the run writes from now on, by step."""
    import common.checkpoint

    files, write = {}, common.checkpoint.write_checkpoint

    def keep(run_dir, state, best):
        path = write(run_dir, state, best)
        files[state["step"]] = path.read_bytes()
        return path

    patch.setattr(common.checkpoint, "write_checkpoint", keep)
    return files


def test_an_interval_checkpoint_holds_the_figures_of_every_step(tmp_path):
    """A window every 2 steps, a checkpoint every 3: the checkpoint at step 3 ends a
    window there (step 3's loss used to be in no checkpoint, and in no attempt's results
    or curves once resumed from it)."""
    flags = [*TINY, "--log_interval", 2, "--checkpoint_interval", 3, "--no_progress", "--log_dir",
             tmp_path]
    with pytest.MonkeyPatch.context() as patch:
        files = written_checkpoints(patch)
        whole = train_in_process(SINGLE, *flags, "--run_name", "whole")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    (tmp_path / "resumed").mkdir()
    (tmp_path / "resumed" / LAST).write_bytes(files[3])
    images = torch.load(tmp_path / "resumed" / LAST, weights_only=True)["history"]["epoch_sums"][2]
    assert images == 3 * 32  # those of steps 1 to 3
    assert [step for step, _ in read_scalars(tmp_path / "whole")["train/loss"]] == [2, 3, 4, 6, 8]
    resumed = train_in_process(SINGLE, *flags, "--run_name", "resumed", "--resume", "auto")
    assert resumed.returncode == 0 and "resumed at step 3 " in resumed.stdout, \
        resumed.stdout + resumed.stderr
    for figure in ("train_loss", "train_acc"):
        assert read_results(tmp_path / "resumed")["summary"][figure] == pytest.approx(
            read_results(tmp_path / "whole")["summary"][figure], rel=1e-12), figure


def test_a_dead_loader_worker_checkpoint_holds_the_figures_of_every_step(tmp_path):
    """A DataLoader worker found dead before step 4 (a window every 2 steps): the run stops with a
    checkpoint at step 3 whose figures include step 3, as a signal's would."""
    from common.workers import LoaderWorkerDied
    from common.metrics import StepTimer

    timed = StepTimer.timed

    def dies_before_step_4(timer, loader):
        for number, batch in enumerate(timed(timer, loader), start=1):
            if number == 4:
                raise LoaderWorkerDied("DataLoader worker (pid 1) is killed by signal: Killed")
            yield batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StepTimer, "timed", dies_before_step_4)
        done = train_in_process(SINGLE, *TINY, "--log_interval", 2, "--no_progress", "--log_dir",
                                tmp_path, "--run_name", "died")
    assert done.returncode == 1 and "stopped at step 3" in done.stderr, done.stdout + done.stderr
    state = torch.load(tmp_path / "died" / LAST, weights_only=True)
    assert state["step"] == 3 and state["history"]["epoch_sums"][2] == 3 * 32

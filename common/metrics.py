"""Honest step timing and on-device accumulation of loss and accuracy.

GPU work is asynchronous, so host clocks around a step measure only the launch. On CUDA the timer
records an event when the step starts waiting for its batch, one when the batch is ready and one
when the step's work is queued; their elapsed times are read once per log window, after the window's
last event has completed. The wait for data (DataLoader stalls, the device loader's kernels) is
measured apart from compute; warm-up steps are left out. On the CPU the work is synchronous, and
perf_counter gives the same three marks. The run's first step, which carries torch.compile's
compilation and cuDNN's autotuning, is synchronised once and timed on the host; the compilation
itself is timed apart, by torch's compile callbacks (common/compiling.py).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from common.breakdown import StepProfiler
from common.compiling import CompileClock
from common.config import RunError
from common.telemetry import MemoryHistory


class _HostClock:
    def mark(self):
        return time.perf_counter()

    @staticmethod
    def seconds(start, end) -> float:
        return end - start

    def wait(self, mark) -> None:
        pass


class _CudaClock:
    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start, end) -> float:
        return start.elapsed_time(end) / 1000.0

    def wait(self, mark) -> None:
        mark.synchronize()


class StepTimer:
    """`timed(loader)` yields batches and marks the data wait; `step_done()` closes a step;
    `window()` syncs once and returns the window's (timed steps, step seconds, data seconds).
    Per-step times are kept for percentiles. When the warm-up ends, the peak memory of `gpus` is
    reset too, so that peak memory, like time, describes the training step and not cuDNN's
    autotuning workspaces or torch.compile's first step. A `recorder` (--profile_steps'
    StepProfiler) is told at the marks where each step starts, gets its batch and ends; the steps
    it records are never timed steps (the profiler's own cost would land in them), and are timed
    apart (`profiled_seconds`). `timed_span` is the first and last timed step of this attempt."""

    def __init__(self, device: torch.device, warmup_steps: int, gpus=(),
                 compile_cache: str | None = None, recorder: StepProfiler | None = None,
                 memory: MemoryHistory | None = None):
        self.clock = _CudaClock() if device.type == "cuda" else _HostClock()
        self.recorder = recorder or StepProfiler(0, warmup_steps, device)  # by default, none
        self.memory = memory  # --memory_snapshot: the allocator's history, written after N steps
        # a compiled run: its compile cache made ready, and the time torch spends
        # compiling (common/compiling.py)
        self.compiling = CompileClock(compile_cache) if compile_cache else None
        self.warmup_steps = warmup_steps
        self.gpus = list(gpus)
        self.steps_seen = 0
        if warmup_steps == 0:
            self._warmup_done()
        self.pending = []  # (start, batch ready, step done) marks of this window's timed steps
        self.profiled = []  # the same marks of this window's profiled steps, timed apart
        self.step_seconds = []  # every timed step of the run
        self.profiled_seconds = []  # every profiled step of the run
        self.timed_span = None  # (first, last) of this attempt's timed steps
        self.data_seconds = 0.0
        self.first_step_seconds = None

    def timed(self, loader):
        iterator = iter(loader)
        while True:
            self.recorder.starting(self.steps_seen + 1)  # may start the profiler: before the mark
            start = self.clock.mark()
            if self.steps_seen == 0:
                self._first_start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self.recorder.no_batch()  # the epoch's end: no step
                return
            self._marks = (start, self.clock.mark())
            self.recorder.ready(self.steps_seen + 1)
            yield batch

    def step_done(self) -> None:
        self.steps_seen += 1
        done = self.clock.mark()
        self.recorder.done()  # may stop the profiler and split its trace: after the mark
        if self.memory is not None:
            self.memory.step_done(self.steps_seen)  # may write the snapshot: after the mark
        if self.steps_seen == 1:
            self.clock.wait(done)
            self.first_step_seconds = time.perf_counter() - self._first_start
        if self.steps_seen == self.warmup_steps:
            self._warmup_done()
        if self.recorder.covers(self.steps_seen):  # profiled: not a timed step
            self.profiled.append((*self._marks, done))
        elif self.steps_seen > self.warmup_steps:
            self.pending.append((*self._marks, done))
            first = self.timed_span[0] if self.timed_span else self.steps_seen
            self.timed_span = (first, self.steps_seen)

    def _warmup_done(self) -> None:
        # the caching allocator keeps its statistics on the host: no sync needed
        for gpu in self.gpus:
            torch.cuda.reset_peak_memory_stats(gpu)

    def window(self) -> tuple[int, float, float]:
        """Wait for the window's last step, then read its marks: a
        host sync, once per log window."""
        if self.profiled:  # after the timed steps: the window's last
            self.clock.wait(self.profiled[-1][2])
            self.profiled_seconds += [self.clock.seconds(start, done)
                                      for start, _, done in self.profiled]
            self.profiled = []
        if not self.pending:
            return 0, 0.0, 0.0
        self.clock.wait(self.pending[-1][2])
        step = [self.clock.seconds(start, done) for start, _, done in self.pending]
        data = sum(self.clock.seconds(start, ready) for start, ready, _ in self.pending)
        self.pending = []
        self.step_seconds += step
        self.data_seconds += data
        return len(step), sum(step), data

    def close(self) -> None:
        if self.compiling is not None:
            self.compiling.close()
        if self.memory is not None:  # a run shorter than --memory_snapshot: what it recorded
            self.memory.close(self.steps_seen)

    def percentiles(self) -> tuple[float | None, float | None]:
        if not self.step_seconds:
            return None, None
        p50, p90 = np.percentile(self.step_seconds, [50, 90])
        return float(p50), float(p90)


class TrainMeter:
    """Loss sum and correct predictions accumulated on the device (no `.item()`, no host-to-device
    copy inside the loop); the image count, known on the host, joins them once per window."""

    def __init__(self, device: torch.device):
        self.totals = torch.zeros(2, dtype=torch.float64, device=device)
        self.images = 0
        # this window's per-step loss tensors: references only, no work in the step
        self.losses = []
        self.last_losses = []

    @torch.no_grad()
    def update(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        n = labels.shape[0]
        correct = (logits.argmax(dim=1) == labels).sum()
        self.totals += torch.stack([loss.detach().double() * n, correct.double()])
        self.images += n
        self.losses.append(loss.detach())

    def take(self) -> torch.Tensor:
        """The window's [loss sum, correct, images] (on the device), and a fresh start."""
        totals = torch.cat([self.totals, self.totals.new_tensor([self.images])])
        self.last_losses, self.losses = self.losses, []
        self.totals, self.images = torch.zeros_like(self.totals), 0
        return totals

    def first_nonfinite_step(self, step: int) -> int:
        """The optimizer step (1-based, of the run) whose loss was first NaN/inf in the last
        window taken, read only when the window's loss sum is not finite; `step` is the run's
        step count at the window's end."""
        bad = (~torch.isfinite(torch.stack(self.last_losses))).nonzero()
        return step - len(self.last_losses) + int(bad[0].item()) + 1


def check_loss(sums: Sums, meter: TrainMeter, step: int, checkpoint: str) -> None:
    """A window whose loss is NaN/inf ends the run, naming the step; the last
    good checkpoint stays as it is."""
    if not math.isfinite(sums.loss_sum):
        raise RunError("the training loss became NaN/inf at step "
                       f"{meter.first_nonfinite_step(step)}: stopped "
                       f"({checkpoint}); try a lower --lr")


TOP = 5  # top-5 accuracy: the label among the five highest logits
# Before an image folder's evaluation its BatchNorm statistics are those of the weights evaluated,
# from at most this many of each process's training images (PreciseBN's 8192: Wu & Johnson,
# "Rethinking 'Batch' in BatchNorm", 2021)
FRESH_STATISTICS_IMAGES = 8192


def fresh_batchnorm_statistics(cfg, model, loader, epoch: int, precision) -> None:
    """An image folder's BatchNorm statistics made those of the weights about to be evaluated,
    from the training images of epoch `epoch` (at most FRESH_STATISTICS_IMAGES of this process's,
    its first batches, augmented as they were trained on, under the `precision` context, the
    run's autocast); other datasets keep their running statistics, as the paper's CIFAR recipe.

    Why: the running statistics average the last ~10 steps' batches (momentum 0.1), each taken
    with the weights of its own step. On a small folder early in a run the weights change that
    much in ten steps: a ResNet-18 on 1,438 8x8 digits, 11 steps an epoch, evaluated after its
    first epoch at a test loss of 259 (chance accuracy) with them and at 2.26 (59 %) with the
    statistics of its weights, after a second at 43,064 where they gave 1.58 (BENCHMARKS.md).
    Training never reads the running statistics (a training step normalises by its batch's own),
    so this changes the evaluations and the saved statistics alone. Every process of a group runs
    as many batches: FSDP's forward gathers the parameters, SyncBatchNorm's reduces its
    statistics."""
    if cfg.dataset != "imagefolder":
        return
    loader.start_epoch(epoch)  # the epoch's batches from its first, a resumed epoch's too
    batches = min(len(loader), max(1, FRESH_STATISTICS_IMAGES // loader.batch_size))
    with precision:
        batchnorm_statistics(model, loader, batches)


@torch.no_grad()
def batchnorm_statistics(model: torch.nn.Module, loader, batches: int) -> None:
    """Every BatchNorm layer's running mean and variance replaced by their mean over the first
    `batches` batches of `loader`, forward passes in training mode with the weights as they are (a
    cumulative average: momentum None); the layers' momentum, the count of batches they tracked
    and the model's mode stay as they were."""
    norms = [module for module in model.modules()
             if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
             and module.track_running_stats]
    if not norms or not batches:
        return
    kept = [(module.momentum, module.num_batches_tracked.clone()) for module in norms]
    training = model.training
    for module in norms:
        module.reset_running_stats()
        module.momentum = None
    model.train()
    for index, (images, _) in enumerate(loader):
        model(images)
        if index + 1 == batches:
            break
    for module, (momentum, tracked) in zip(norms, kept):
        module.momentum = momentum
        module.num_batches_tracked.copy_(tracked)
    model.train(training)


@torch.no_grad()
def evaluation_sums(model, loader, device: torch.device) -> torch.Tensor:
    """[loss sum, correct, correct in the top 5, images] over every batch of `loader`, on the
    device, in float64: sums, so that a process group's all_reduce adds up every rank's shard."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    images = 0
    for batch_images, labels in loader:
        logits = model(batch_images)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        top = logits.topk(min(TOP, logits.shape[1]), dim=1).indices
        sums += torch.stack([loss.double(), (logits.argmax(dim=1) == labels).sum().double(),
                             (top == labels[:, None]).any(dim=1).sum().double()])
        images += labels.shape[0]
    return torch.cat([sums, sums.new_tensor([images])])


class Sums:
    """A window's totals, by name; windows add up to epochs and runs. In a process group every
    rank's are added up in one all-reduce of `window_sums`' tensor (its entries in FIELDS' order),
    and `mean_time` then makes the timings the mean over ranks (each rank timed the same steps),
    where the counts stay added up."""

    FIELDS = ("loss_sum", "correct", "image_count", "steps_timed", "step_seconds", "data_seconds")
    SIZE = len(FIELDS)

    def __init__(self, values=None):
        values = [0.0] * self.SIZE if values is None else list(values)
        self.loss_sum = values[0]  # the loss of every image of the window, added up
        self.correct = values[1]  # its correct predictions
        self.image_count = values[2]  # its images
        self.steps_timed = values[3]  # its steps past the warm-up, whose time is measured
        self.step_seconds = values[4]  # their time
        self.data_seconds = values[5]  # of it, the time spent waiting for data

    @property
    def values(self) -> list:
        """The totals in FIELDS' order: what a checkpoint keeps of an epoch's windows."""
        return [getattr(self, name) for name in self.FIELDS]

    def __add__(self, other: Sums) -> Sums:
        return Sums(a + b for a, b in zip(self.values, other.values))

    def mean_time(self, ranks: int) -> Sums:
        """These totals, added up over `ranks` ranks that each timed the same steps, with the
        timings made the mean over the ranks; the loss, the correct predictions and the images stay
        added up."""
        return Sums([self.loss_sum, self.correct, self.image_count, self.steps_timed / ranks,
                     self.step_seconds / ranks, self.data_seconds / ranks])

    loss = property(lambda self: self.loss_sum / self.image_count if self.image_count else None)
    acc = property(lambda self: self.correct / self.image_count if self.image_count else None)
    images = property(lambda self: int(self.image_count))
    timed_steps = property(lambda self: int(self.steps_timed))
    batch_time = property(lambda self: self.step_seconds / self.steps_timed
                          if self.steps_timed else None)
    data_frac = property(lambda self: self.data_seconds / self.step_seconds
                         if self.steps_timed else None)
    # the mean data wait of a step, in seconds
    data_time = property(lambda self: self.data_seconds / self.steps_timed
                         if self.steps_timed else None)

    def images_per_sec(self, global_batch: int) -> float | None:
        return global_batch / self.batch_time if self.steps_timed else None


def window_sums(meter: TrainMeter, timer: StepTimer) -> torch.Tensor:
    """The window's Sums as a float64 tensor on the meter's device (the
    timer's host sync happens here)."""
    timing = timer.window()
    sums = meter.take()
    return torch.cat([sums, sums.new_tensor(timing)])


class RunClock:
    """The run's wall time and epoch times, whole when the run is made of attempts (stopped by a
    signal or --max_steps, or killed, then resumed, in any mode and on any number of processes): a
    checkpoint keeps the seconds up to it, and the attempt that resumes from it adds its own. An
    attempt's time after its last checkpoint is not kept, as its steps are not: the next attempt
    trains them again. An epoch counts once, whatever number of attempts trained it: one that
    --max_steps cut short is paused, not ended, and its seconds so far go on with the attempt that
    resumes it. A time that is not known (part of the epoch was trained by an attempt whose
    seconds no checkpoint kept) is None."""

    def __init__(self, started: float):
        self.started = started  # perf_counter() when this attempt began
        self.attempts = 1  # the attempts whose work the run kept, this one included; None: unknown
        self.earlier = 0.0  # the earlier attempts' seconds, up to the checkpoint resumed from
        # seconds of each epoch trained to its end, one per epoch (None: not known)
        self.epoch_times = []
        # the epoch under way's seconds not timed by epoch_started (None: unknown)
        self.epoch_earlier = 0.0
        # perf_counter() when this attempt began (or went on with) that epoch
        self.epoch_started = None

    def start_epoch(self) -> None:
        self.epoch_started = time.perf_counter()

    def end_epoch(self, whole: bool) -> float | None:
        """Stop the epoch's clock: its seconds over every attempt that trained part of it (None: not
        known). `whole`: the epoch was trained to its end, and counts as one of the run's epochs;
        otherwise (--max_steps stopped it) its seconds so far wait, in the checkpoint, for the
        attempt that trains the rest of it."""
        seconds = self._under_way()
        self.epoch_started = None
        if whole:
            self.epoch_times.append(seconds)
        self.epoch_earlier = 0.0 if whole else seconds
        return seconds

    def _under_way(self) -> float | None:
        """The seconds of the epoch under way so far, over every attempt (None: not known)."""
        if self.epoch_earlier is None:
            return None
        if self.epoch_started is None:
            return self.epoch_earlier
        return self.epoch_earlier + time.perf_counter() - self.epoch_started

    def wall_time(self) -> float:
        return self.earlier + time.perf_counter() - self.started

    def epoch_time(self) -> float | None:
        """The mean seconds of the whole epochs whose time is known; None without one."""
        known = [seconds for seconds in self.epoch_times if seconds is not None]
        return sum(known) / len(known) if known else None

    def state(self) -> dict:
        """The run's seconds so far, for a checkpoint: the epochs ended, and the seconds so far of
        the epoch under way (none at an epoch's start; all of them where a stop at its last window
        left its end owed), which the attempt that resumes it goes on with."""
        return {"attempts": self.attempts, "wall_time_s": self.wall_time(),
                "epoch_times_s": list(self.epoch_times), "epoch_time_s": self._under_way()}

    def load(self, history: dict | None, epoch: int, batch: int) -> None:
        """A checkpoint's seconds, as the earlier attempts' share of this run; the checkpoint
        resumes at batch `batch` of epoch `epoch`. Without them (a checkpoint written before
        checkpoints kept them, or one resumed from such) the earlier attempts are unknown: the
        figures are this attempt's, and an epoch it did not train from its start has no time."""
        unknown = None if batch else 0.0  # the epoch under way's seconds, when not known
        if history is None or history["attempts"] is None:
            self.attempts = None
            self.epoch_times, self.epoch_earlier = [None] * epoch, unknown
            return
        self.attempts = history["attempts"] + 1
        self.earlier = history["wall_time_s"]
        times, under_way = list(history["epoch_times_s"]), history["epoch_time_s"] if batch else 0.0
        # an earlier version's: an epoch cut by --max_steps counted per attempt
        if len(times) > epoch:
            # cut once, the epoch under way
            if len(times) == epoch + 1 and batch and under_way == 0:
                times, under_way = times[:-1], times[-1]
            else:  # which epoch each time belongs to cannot be told
                times, under_way = [None] * epoch, unknown
        # fewer: the first epochs were trained before an attempt that did not know the earlier ones
        self.epoch_times = [None] * (epoch - len(times)) + times
        self.epoch_earlier = under_way

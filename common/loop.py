"""The training loop's state, `Run`: what every mode's loop carries from step to step, the one
thing that save_checkpoint, restore and the log window take. Beside it, what every mode does
alike with it: the bookkeeping of a log window and an evaluation, the results summary, and the
teardown. The loop itself (`train_one_epoch`) and every parallel call stay in each mode's
train.py, where they are compared."""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

import common.checkpoint
from common.breakdown import StepProfiler, breakdown_line, slowest_rank, trace_text
from common.checkpoint import (FORMAT, StopSignals, all_rng_states, carry_best, extends,
                               last_checkpoint_note, restore_optimizer, set_rng_state)
from common.config import Config, RunError
from common.errors import plural
from common.logger import (Console, RunLogger, device_scalars, percent, shows_top5, speed_line,
                           window_line, window_scalars)
from common.metrics import RunClock, StepTimer, Sums, TrainMeter, check_loss
from common.optim import lr_factor
from common.performance import flops_per_image, peak_tflops, speed_summary, window_mfu
from common.state import all_finite, load_model_state, model_state, optimizer_state
from common.telemetry import GpuTelemetry, MemoryHistory, environment, peak_memory_gb

# an evaluation: (loss, accuracy, images, top-5 accuracy); (None, None, 0, None) before the first
Test = tuple


@dataclass
class Run:
    """What the loop carries from step to step, and what a checkpoint saves of it."""
    cfg: Config
    device: torch.device  # this process's device: its GPU, or the CPU
    gpus: list[int]  # the CUDA ids this process uses ([] on the CPU)
    model: torch.nn.Module  # the model to call: wrapped (DataParallel, DDP), sharded, compiled
    raw_model: torch.nn.Module  # the unwrapped model, whose weights are evaluated and saved
    train_loader: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    logger: RunLogger
    console: Console
    run_dir: Path | None  # the run's folder (None: this process writes nothing)
    timer: StepTimer
    meter: TrainMeter
    telemetry: GpuTelemetry
    clock: RunClock  # the run's wall time and epoch times, over the attempts it is made of
    profiler: StepProfiler  # --profile_steps: the steps after the warm-up, recorded and split
    # from here on, a stop signal stops the run
    signals: StopSignals = field(default_factory=StopSignals)
    step: int = 0  # optimizer steps so far
    epoch: int = 0  # the epoch being trained (or to train next)
    batch: int = 0  # batches of that epoch done
    best_acc: float = -1.0  # the best test accuracy so far
    best_epoch: int | None = None  # its epoch, counted from 1 as the log lines count them
    best_acc_top5: float | None = None  # the top-5 accuracy of that evaluation
    stop: str | None = None  # the signal that asked the run to stop
    totals: Sums = field(default_factory=Sums)  # every log window of the run
    # the log windows of the epoch under way (or last done)
    epoch_sums: Sums = field(default_factory=Sums)
    gpu_util: list = field(default_factory=list)  # every window's utilisation of every GPU
    test: Test = (None, None, 0, None)  # the last evaluation
    tested_epoch: int | None = None  # its epoch, counted from 1
    # the last check that every rank holds the same weights (process groups)
    sync: dict | None = None
    # each time --epochs was raised: where, from and to
    extended: list = field(default_factory=list)
    # the position (epoch, batch) where the last epoch's end (its evaluation) ran: see end_owed
    ended_at: tuple | None = None
    # whether the run folder's best.pt holds the best epoch's weights (False: resumed from a
    # checkpoint file whose folder's best.pt could not be carried into this one)
    best_kept: bool = True
    # results.json's figures of the attempt that trained (attempt_figures), kept by the checkpoint
    # of a stop that left an epoch's end owed: reported where this attempt trains no step
    trained_attempt: dict | None = None

    @classmethod
    def start(cls, cfg: Config, device: torch.device, gpus: list[int], started: float,
              **parts) -> Run:
        """The run's state at its first step: `parts` are the model, the loaders' training
        one, the optimizer and its schedule and scaler, the logger, the console and the run
        folder; the timers start here."""
        profiler = StepProfiler(cfg.profile_steps, cfg.warmup_steps, device)
        profiler.plan(0, cfg.last_step(len(parts["train_loader"])))  # the run's last steps
        cache = cfg.compile_cache if cfg.compile else None
        memory = (MemoryHistory(cfg.memory_snapshot, parts["run_dir"], parts["console"].line)
                  if cfg.memory_snapshot else None)  # a GPU's: refused elsewhere (fast path)
        timer = StepTimer(device, cfg.warmup_steps, gpus, cache, recorder=profiler,
                          memory=memory)
        return cls(cfg=cfg, device=device, gpus=gpus, timer=timer, meter=TrainMeter(device),
                   telemetry=GpuTelemetry(gpus), clock=RunClock(started), profiler=profiler,
                   **parts)

    @functools.cached_property
    def peak(self) -> float | None:
        """One GPU's dense peak for the run's dtype, for each window's MFU; None where none is
        known (the CPU, a MIG slice, a GPU missing from the table: results.json's mfu_note says
        which)."""
        return peak_tflops(self.device, self.cfg.amp)

    @functools.cached_property
    def flops(self) -> int:
        """The FLOPs of one training image, counted once (seconds for the full model): at the first
        log window where a peak makes them an MFU, else for results.json."""
        return flops_per_image(self.cfg)

    @functools.cached_property
    def top5(self) -> bool:
        """Whether the run shows top-5 accuracy beside top-1 (more than 10 classes)."""
        return shows_top5(self.cfg)

    def accuracy(self, test: Test) -> str:
        """`98.33%`, with `(top-5 99.72%)` where the run shows top-5."""
        top5 = f" (top-5 {100 * test[3]:.2f}%)" if self.top5 and test[3] is not None else ""
        return f"{100 * test[1]:.2f}%{top5}"

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where checkpoints go: the run folder, except under
        --benchmark (it measures speed only)."""
        return None if self.cfg.benchmark else self.run_dir

    @property
    def end_owed(self) -> bool:
        """Whether the epoch under way has no step left to train (its last batch done, or
        --max_steps reached) and its end has not run yet: the evaluation, its checkpoint and
        best.pt, and at the run's end results.json. A stop signal at the epoch's last log window
        leaves the run there; its checkpoint says so, and the attempt that resumes it begins
        with that end instead of a step."""
        trained = (self.batch == len(self.train_loader)
                   or self.cfg.reached_max_steps(self.step))
        return trained and self.ended_at != (self.epoch, self.batch)

    @property
    def owed(self) -> str | None:
        """What a stop here leaves owed (end_owed), in the words of its line; None: nothing."""
        if not self.end_owed:
            return None
        if self.epoch + 1 >= self.cfg.epochs or self.cfg.reached_max_steps(self.step):
            return "the training done, its evaluation and results owed"
        return f"epoch {self.epoch + 1} trained, its evaluation owed"

    def resume(self, checkpoint: dict, rank: int) -> None:
        """Everything of `checkpoint` into the run (this rank's RNG), said once."""
        restore(checkpoint, self, rank)
        # --profile_steps: the run's last steps, counted from where this attempt starts
        self.profiler.plan(self.step, self.cfg.last_step(len(self.train_loader)))
        # the best.pt of the run continued, into this folder (main process)
        best = ""
        if self.run_dir is not None:
            self.best_kept, best = carry_best(checkpoint, self.run_dir)
        owed = (": its training was done, its evaluation was not: evaluating it"
                if self.end_owed else "")
        self.console.line(f"resumed at step {self.step} (epoch {self.epoch + 1}, batch "
                          f"{self.batch}) from "
                          f"{checkpoint['file']}{self.extension_note(checkpoint)}{best}{owed}")

    def extension_note(self, checkpoint: dict) -> str:
        """What a resume that raised --epochs says of the schedule (restore):
        nothing for a plain resume."""
        if not extends(checkpoint["config"], self.cfg):
            return ""
        before, now = checkpoint["config"]["epochs"], self.cfg.epochs
        rate = self.optimizer.param_groups[0]["lr"]
        return (f"; the run is extended from {before} to {now} epochs: from here the learning rate "
                f"follows the schedule of {now} epochs (above), at {rate:g} now, where its "
                f"{self.step} steps so far followed that of {before}, so it is not the run "
                f"--epochs {now} trains from the start")

    def record_window(self, epoch: int, index: int, sums: Sums, gpu: dict,
                      ranks: dict | None = None) -> None:
        """A log window's totals (`sums`, over every rank) and GPU readings (`gpu`: by CUDA index
        in one process; by rank in a process group, which gives `ranks`, each rank's own Sums):
        added to the run's, a NaN loss stopped before it reaches the logs, then TensorBoard, the
        log line and the progress bar."""
        self.totals += sums
        self.gpu_util += [util for util, _ in gpu.values() if util is not None]
        check_loss(sums, self.meter, self.step, last_checkpoint_note(self.checkpoint_dir))
        rate = sums.images_per_sec(self.cfg.batch_size)
        # the rate the window's last step trained with: a function of the step (the optimizer holds
        # the next step's rate by now)
        lr = self.cfg.effective_lr() * lr_factor(self.step - 1, self.cfg, len(self.train_loader))
        gpus = max(len(self.gpus), 1) * len(ranks or [0])  # what the global batch is split over
        utilisation = None if self.peak is None else window_mfu(rate, gpus, self.flops, self.peak)
        # first, and flushed: a window on the terminal is one in the event file
        scalars = window_scalars(sums, self.cfg.batch_size, lr, utilisation)
        self.logger.scalars(self.step, {**scalars, **device_scalars(gpu, ranks)})
        untimed = "profiled, not timed" if self.profiler.recorded else "warming up"
        self.console.line(window_line(epoch, self.cfg.epochs, index, len(self.train_loader),
                                      sums.loss, sums.acc, sums.batch_time, sums.data_frac, rate,
                                      untimed))
        self.console.update(0, loss=f"{sums.loss:.3f}", acc=f"{100 * sums.acc:.1f}%",
                            img_s=f"{rate or 0:.0f}")

    def end_epoch(self) -> float | None:
        """Stop the epoch's clock after its training: its seconds over every attempt that
        trained part of it (None: not known). An epoch that --max_steps cut short is paused, not
        counted as one of the run's epochs: the attempt that resumes it goes on with its
        seconds. The last epoch's end ends --profile_steps' recording, if the run had fewer
        steps: no evaluation is recorded."""
        if self.epoch + 1 >= self.cfg.epochs or self.cfg.reached_max_steps(self.step):
            self.profiler.stop()
        self.ended_at = (self.epoch, self.batch)
        return self.clock.end_epoch(whole=self.batch == len(self.train_loader))

    def record_test(self, epoch: int, test: Test, epoch_seconds: float | None) -> None:
        """An epoch's test loss and accuracy, on the terminal and in TensorBoard."""
        self.test, self.tested_epoch = test, epoch + 1
        self.logger.scalars(self.step, {"test/loss": test[0], "test/acc_pct": percent(test[1]),
                                        "test/acc_top5_pct": percent(test[3]) if self.top5
                                        else None})
        timed = "time not known" if epoch_seconds is None else f"{epoch_seconds:.1f}s"
        batches = len(self.train_loader)
        # an epoch cut short by --max_steps
        cut = "" if self.batch == batches else f" ({self.batch} of {batches} batches)"
        self.console.line(f"Epoch {epoch + 1}/{self.cfg.epochs} test loss {test[0]:.3f} acc "
                          f"{self.accuracy(test)} ({plural(test[2], 'image')}) epoch {timed}{cut}")

    def record_evaluation(self, test: Test) -> None:
        """--evaluate's one evaluation of saved weights, said."""
        self.test = test
        self.console.line(f"{self.cfg.evaluate}: test loss {test[0]:.4f} acc "
                          f"{self.accuracy(test)} ({plural(test[2], 'image')})")

    def rank_record(self) -> dict:
        """What results.json needs of this process in a process group, gathered once from every
        rank: its GPU's peak memory ({gpu: Peak}, empty on the CPU), its wait for its node's first
        compile, and its profiled steps (what StepProfiler.result() gives)."""
        return {"peaks": peak_memory_gb(self.gpus),
                "compile_wait": getattr(self.timer.compiling, "waited", None),
                "profile": self.profiler.result()}

    def attempt_figures(self, devices: int, records: list[dict] | None = None) -> dict:
        """What results.json reports of this attempt alone: the speed over `devices` (GPUs or CPU
        processes), utilisation and peak memory of each GPU (allocated and reserved) of the
        hardware it ran on, its timed and profiled steps, and `env`; each rank's profiler trace
        is written beside them. One process: its own rank_record(), its GPUs' peaks by GPU. In
        a process group, `records` holds every rank's rank_record(), in rank order: each rank's
        GPU's peak (by rank), its wait for its node's first compile, and its profiled steps."""
        group = records is not None
        records = records if group else [self.rank_record()]
        if group:  # one GPU a rank: its peak by rank
            peaks = {rank: peak for rank, record in enumerate(records)
                     for peak in record["peaks"].values()}
            compile_waits = {rank: record["compile_wait"] for rank, record in enumerate(records)}
        else:  # one process, every GPU it drives: by GPU
            peaks = records[0]["peaks"]
            compile_waits = None
        profiles = {rank: record["profile"] for rank, record in enumerate(records)}
        summary = {
            **speed_summary(self.cfg, self.totals, self.timer, self.device, devices, compile_waits,
                            self.flops),
            "gpu_util_mean": sum(self.gpu_util) / len(self.gpu_util) if self.gpu_util else None,
            "peak_mem_gb": max((peak.allocated for peak in peaks.values()), default=None),
            "peak_mem_reserved_gb": max((peak.reserved for peak in peaks.values()), default=None),
            "timed_steps": self.timed_steps(),
            # the profiled steps by the run's own clock (this process's), never in the figures above
            "profiled_step_s": (sum(self.timer.profiled_seconds) / len(self.timer.profiled_seconds)
                                if self.timer.profiled_seconds else None),
            **self.breakdown_summary(profiles)}
        traces = [self.logger.write_trace(rank, trace_text(result))
                  for rank, result in profiles.items()]
        return {"mode": self.logger.mode, "devices": devices, "summary": summary,
                "peak_mem_gb_per_gpu": {str(i): peak.allocated for i, peak in peaks.items()},
                "peak_mem_reserved_gb_per_gpu": {str(i): peak.reserved
                                                 for i, peak in peaks.items()},
                "env": environment(), "traces": any(traces)}

    def write_results(self, devices: int, records: list[dict] | None = None):
        """results.json: this attempt's figures (attempt_figures: `devices`, `records`), or, where
        this attempt trained no step but only finished the run (the end a stop left owed), those
        of the attempt that trained, kept by its checkpoint; the run's last epoch's training and
        test figures, its best, its times; then its speed line and where the results are. In a
        process group the summary adds the sync check (None where none was made). With
        --profile_steps, each rank's split of its profiled steps, their traces beside it."""
        group = records is not None
        kept = self.trained_attempt
        attempt = (kept if kept and not self.totals.images and kept["mode"] == self.logger.mode
                   and kept["devices"] == devices else self.attempt_figures(devices, records))
        summary = {
            **attempt["summary"],
            "train_loss": self.epoch_sums.loss,
            "train_acc": self.epoch_sums.acc,
            "test_loss": self.test[0],
            "test_acc": self.test[1],
            "test_acc_top5": self.test[3] if self.top5 else None,
            "test_images": self.test[2] or None,
            "best_acc": self.best_acc if self.best_acc >= 0 else None,
            "best_epoch": self.best_epoch,
            "epoch_time_s": self.clock.epoch_time(),  # with wall_time_s: over every attempt
            "epoch_time_note": self.epoch_time_note(),
            "wall_time_s": self.clock.wall_time(),
            "steps": self.step}
        if group:
            summary["params_in_sync"] = (self.sync or {}).get("params_in_sync")
            summary["buffers_max_abs_diff"] = (self.sync or {}).get("buffers_max_abs_diff")
        path = self.logger.write_results(
            summary, self.clock.attempts, extended=self.extended or None, env=attempt["env"],
            peak_mem_gb_per_gpu=attempt["peak_mem_gb_per_gpu"],
            peak_mem_reserved_gb_per_gpu=attempt["peak_mem_reserved_gb_per_gpu"])
        if not self.cfg.evaluate:  # an evaluation trains no step to time
            self.console.line(speed_line(summary))
        if self.best_acc >= 0 and not self.cfg.evaluate:
            self.console.line(self.reached_line(summary["wall_time_s"]))
        if summary["breakdown"]:
            slowest, steps = summary["breakdown_slowest_rank"], summary["breakdown_steps"]
            self.console.line(breakdown_line(summary["breakdown"], slowest, steps))
        if summary["breakdown_note"]:
            self.console.line(f"profile: {summary['breakdown_note']}")
        if attempt["traces"]:
            where = self.run_dir / "trace_rank*.json"
            self.console.line(f"profiler traces in {where} (Perfetto, chrome://tracing)")
        self.console.line(f"results in {path}")

    def reached_line(self, wall_time: float) -> str:
        """What the run reached, in one line: `best test acc 98.33% at epoch 12/15; last (epoch 15)
        98.05%; wall time 3 min 12 s` (top-5 beside each where the run shows it)."""
        best = self.accuracy((None, self.best_acc, 0, self.best_acc_top5))
        last = (f"; last (epoch {self.tested_epoch}) {self.accuracy(self.test)}"
                if self.tested_epoch is not None else "")
        # a checkpoint written before runs kept the best's epoch: not known
        epoch = (f"at epoch {self.best_epoch}/{self.cfg.epochs}" if self.best_epoch is not None
                 else "(its epoch not known)")
        if not self.best_kept:  # resumed from another folder's checkpoint, without its best.pt
            epoch += " (no best.pt here holds it)"
        return f"best test acc {best} {epoch}{last}; wall time {duration(wall_time)}"

    @staticmethod
    def breakdown_summary(profiles: dict) -> dict:
        """results.json's split of the profiled steps (--profile_steps, common/breakdown.py): each
        rank's mean, in ms, keyed by the rank as text; the slowest rank; the steps split; and what
        the figures are not, where fewer steps than asked were profiled (None where all were)."""
        breakdown = {str(rank): result["breakdown"] for rank, result in sorted(profiles.items())
                     if result["breakdown"] is not None}
        steps = min((result["steps"] for result in profiles.values()), default=0)
        notes = [result["note"] for result in profiles.values() if result["note"]]
        spans = [result["span"] for result in profiles.values()]  # every rank records the same
        return {"profiled_steps": spans[0] if spans and None not in spans else None,
                "breakdown": breakdown or None, "breakdown_slowest_rank": slowest_rank(breakdown),
                "breakdown_steps": steps or None, "breakdown_note": notes[0] if notes else None}

    def timed_steps(self) -> list[int] | None:
        """results.json's `timed_steps`: the first and last step (the run's numbers) that the speed
        figures time, those of the run's last attempt; None where none was timed."""
        span = self.timer.timed_span
        return None if span is None else [self.profiler.before + step for step in span]

    def epoch_time_note(self) -> str | None:
        """What epoch_time_s is when it is not the mean of every epoch the run trained
        (None then): the mean of whole epochs only, so a run that --max_steps ended
        before any epoch's end has none."""
        times = self.clock.epoch_times
        known = [seconds for seconds in times if seconds is not None]
        if known and len(known) == len(times):
            return None
        if not times:
            if not self.batch:  # nothing trained: --evaluate
                return None
            limit = ("--benchmark's steps" if self.cfg.benchmark
                     else f"--max_steps {self.cfg.max_steps}")
            seconds = self.clock.epoch_earlier
            timed = "in a time not known" if seconds is None else f"in {seconds:.3g} s"
            return (f"no epoch was trained to its end: {limit} stopped the run at batch "
                    f"{self.batch} of {len(self.train_loader)} of epoch "
                    f"{self.epoch + 1}, trained {timed}")
        return (f"the mean of {len(known)} of the {len(times)} epochs trained: the others' seconds "
                "were not kept (a checkpoint this run resumed from did not hold them)")

    def close(self) -> None:
        """The teardown, whatever ended the run: the signal handlers back, the NVML sampler stopped,
        the event file and the logs closed."""
        self.signals.restore()
        self.profiler.close()  # a recording the run did not finish: stopped
        self.timer.close()  # torch's compile callbacks removed
        self.telemetry.close()
        self.logger.close()


# -------------------------------------------------------------------------------------- checkpoints
def checkpoint_state(run: Run, rng_states: list[dict], trained_attempt: dict | None) -> dict:
    """The checkpoint of `run` (the training loop's state) at its current position; `rng_states` is
    one entry per rank. A finished epoch is stored as the start of the next one; one whose end is
    owed (Run.end_owed: a stop at its last window) as it is, `end_owed` marked, with the figures of
    the attempt that trained it (`trained_attempt`, for the results of an attempt that resumes it
    only to end the run). The weights and the optimizer's state are whole tensors in every mode
    (under FSDP gathered onto rank 0, every rank taking part: common/state.py)."""
    epoch, batch, end_owed = run.epoch, run.batch, run.end_owed
    epoch_done = batch == len(run.train_loader) and not end_owed
    if epoch_done:
        epoch, batch = epoch + 1, 0
    # what the run's results need of the attempts so far: the seconds, and the epoch's log windows
    epoch_sums = Sums() if epoch_done else run.epoch_sums
    history = {**run.clock.state(), "epoch_sums": epoch_sums.values}
    return {
        "format": FORMAT, "config": dataclasses.asdict(run.cfg), "epoch": epoch, "batch": batch,
        "step": run.step, "best_acc": run.best_acc, "best_epoch": run.best_epoch,
        "best_acc_top5": run.best_acc_top5, "model": model_state(run.raw_model),
        "optimizer": optimizer_state(run.raw_model, run.optimizer),
        "scheduler": run.scheduler.state_dict(), "scaler": run.scaler.state_dict(),
        "rng": rng_states, "history": history, "extended": run.extended,
        "end_owed": end_owed, "trained_attempt": trained_attempt,
        "data": common.checkpoint.data_record(run.cfg),  # an image folder's classes and files
    }


def save_checkpoint(run: Run, test_acc: float | None = None) -> Path | None:
    """Check that the weights are finite, then write the run's checkpoint (main process only), and
    best.pt too when the epoch's `test_acc` is the best so far. Weights that turned NaN/inf stop the
    run instead: the last good checkpoint is never replaced by a diverged one. A checkpoint that
    leaves the epoch's end owed (a stop at its last window) keeps this attempt's figures, for the
    results of an attempt that resumes it only to end the run: that one trains no step to measure.
    In a process group every rank must call it (RNG states, and those figures, are gathered from
    all of them)."""
    if not all_finite(run.raw_model):  # every rank's verdict, combined (FSDP: each holds a slice)
        note = last_checkpoint_note(run.checkpoint_dir)
        raise RunError(f"the weights are NaN/inf at step {run.step}: the training diverged; "
                       f"stopped without writing a checkpoint ({note}); try a lower --lr")
    best = test_acc is not None and test_acc > run.best_acc
    if best:
        run.best_acc, run.best_epoch, run.best_acc_top5 = test_acc, run.epoch + 1, run.test[3]
        run.best_kept = True
    trained_attempt = None
    if run.end_owed and not run.cfg.benchmark:  # the same on every rank: all gather, or none
        in_group = dist.is_available() and dist.is_initialized()
        records = every_rank(run.rank_record()) if in_group else None
        # what the global batch is split over, as write_results is told it
        devices = max(len(run.gpus), 1) * (dist.get_world_size() if in_group else 1)
        if run.checkpoint_dir is not None:  # the process that writes it
            # as results.json will hold them: plain values, which a weights-only load reads
            trained_attempt = json.loads(json.dumps(run.attempt_figures(devices, records)))
    state = checkpoint_state(run, all_rng_states(), trained_attempt)
    return common.checkpoint.write_checkpoint(run.checkpoint_dir, state, best)  # the file


def every_rank(record: dict) -> list[dict]:
    """`record` of every rank of the process group, in rank order (gathered)."""
    records = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return records


def restore(state: dict, run: Run, rank: int) -> None:
    """Everything of `state` into `run`: weights, optimizer, schedule, scaler, position, history,
    this rank's RNG."""
    load_model_state(run.raw_model, state["model"])
    restore_optimizer(run.raw_model, run.optimizer, state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    run.epoch = state["epoch"]
    run.batch = state["batch"]
    run.step = state["step"]
    run.best_acc = state["best_acc"]
    # absent from checkpoints written before runs kept them: the best's epoch is then not known
    run.best_epoch, run.best_acc_top5 = state.get("best_epoch"), state.get("best_acc_top5")
    run.extended = list(state.get("extended", []))
    # a stop at an epoch's last window left its end owed (the position is then that window's:
    # Run.end_owed), with the figures of the attempt that trained
    run.trained_attempt = state.get("trained_attempt")
    if extends(state["config"], run.cfg):  # the schedule of the new --epochs, from this step on
        run.extended.append({"at_step": run.step, "epochs_from": state["config"]["epochs"],
                             "epochs_to": run.cfg.epochs})
        scheduler = run.scheduler  # the optimizer holds the rate the old schedule gave this step
        rates = zip(run.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas)
        for group, base, factor in rates:
            group["lr"] = base * factor(scheduler.last_epoch)  # as LambdaLR computes it
        scheduler._last_lr = [group["lr"] for group in run.optimizer.param_groups]
    history = state.get("history")  # None in a checkpoint written before checkpoints kept one
    run.clock.load(history, run.epoch, run.batch)  # the results cover the whole run, every attempt
    run.epoch_sums = Sums(history["epoch_sums"] if run.clock.attempts else None)  # epoch so far
    rng = state["rng"]
    set_rng_state(rng[rank] if rank < len(rng) else rng[0])


def duration(seconds: float) -> str:
    """`45.2 s`, `3 min 12 s`, `2 h 05 min`: a wall time as a reader takes it in."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"

"""What a run leaves behind: <log_dir>/<run_name>/ with TensorBoard events, results.json and model.pt; and what it
prints: a tqdm bar per epoch on a terminal and a plain line per log window. Only the main process writes."""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import torch

from common.config import Config, UsageError
from common.state import load_model_state
from common.telemetry import environment

SUMMARY_FIELDS = ("images_per_sec", "images_per_sec_per_gpu", "batch_time_p50", "batch_time_p90", "data_wait_frac",
                  "flops_per_image", "mfu", "mfu_note", "first_step_s", "compile_time_s", "gpu_util_mean",
                  "peak_mem_gb", "train_loss", "train_acc", "test_loss", "test_acc", "test_images", "epoch_time_s",
                  "wall_time_s", "steps")


def resolve_run_dir(cfg: Config, mode: str, gpu_count: int) -> Path:
    """The run's folder, checked before anything is written: log_dir must be a writable folder (or creatable), the
    name must fit the file system, and the run folder must not exist unless --overwrite or --resume auto. A run
    resumed from a checkpoint file continues in a new folder, or in that checkpoint's own, never in another run's."""
    name = cfg.run_name or f"{mode}-{f'{gpu_count}gpu' if gpu_count else 'cpu'}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir = Path(cfg.log_dir)
    existing = next(p for p in [log_dir, *log_dir.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise UsageError(f"--log_dir {log_dir}: {existing} is a file, not a folder; give a folder for the runs")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--log_dir {log_dir}: {existing} is not writable; give a folder you can write to")
    run_dir = log_dir / name
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir} is a file, not a run folder: choose another --run_name")
    if run_dir.exists() and cfg.resume not in (None, "auto") and not cfg.overwrite:
        own = Path(cfg.resume).absolute().parent
        if run_dir.resolve() != own.resolve():
            raise UsageError(f"run folder {run_dir} exists already and belongs to another run than {cfg.resume}: "
                             f"choose a new --run_name (or --run_name {own.name} --log_dir {own.parent} to "
                             f"continue in the checkpoint's own folder)")
    elif run_dir.exists() and not (cfg.overwrite or cfg.resume):
        raise UsageError(f"run folder {run_dir} exists already: choose another --run_name, add --overwrite, or "
                         f"continue it with --resume auto")
    return run_dir


LOCK = ".lock"  # locked (lockf) by the one process that writes a run folder, for as long as it runs


def claim_run_dir(run_dir: Path, cfg: Config):
    """Make `run_dir` this process's, for as long as the returned lock file stays open: a new folder is created
    exclusively (a second run started with the same --run_name at the same moment is refused), and an existing
    one (--resume, --overwrite) is locked, so a run whose folder is in use by a live run (an orphan, a second
    `--resume auto`) is refused in one line rather than writing beside it. The lock (a POSIX record lock, which
    a forked child such as a DataLoader worker does not inherit) dies with its process. Temporary files that a
    writer killed mid-write left behind are removed: no other process writes here now."""
    import fcntl

    fresh = not (cfg.resume or cfg.overwrite)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_dir.mkdir(exist_ok=not fresh)
    except FileExistsError:
        raise UsageError(f"run folder {run_dir} was created by another run a moment ago: choose another "
                         f"--run_name") from None
    lock = open(run_dir / LOCK, "a+")
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise UsageError(f"run folder {run_dir} is in use by a run that is still running (pid {holder}): wait "
                         f"for it to end or stop it, or choose another --run_name") from None
    except OSError:  # a file system without locks (some Lustre and NFS mounts): the exclusive mkdir still guards
        pass  # new runs, and the run goes on unlocked rather than not at all
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    for left in run_dir.glob(".*.tmp"):  # see write_atomically
        left.unlink(missing_ok=True)
    if cfg.overwrite:  # the folder's files go, its lock stays held
        for path in run_dir.iterdir():
            if path.name != LOCK:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return lock


class RunLogger:
    """TensorBoard scalars (tensorboardX), results.json and model.pt in one run folder. Given no folder (every
    process but the main one of a process group) it writes nothing, so callers need no guard."""

    def __init__(self, run_dir: Path | None, cfg: Config, mode: str, world_size: int):
        self.run_dir, self.cfg, self.mode, self.world_size = run_dir, cfg, mode, world_size
        self.writer = self.lock = None
        if run_dir is None:
            return
        from tensorboardX import SummaryWriter

        self.lock = claim_run_dir(run_dir, cfg)  # a resumed run adds to its folder; --overwrite empties it
        self.writer = SummaryWriter(logdir=str(run_dir))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in dataclasses.asdict(cfg).items()))

    def scalars(self, step: int, values: dict) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            if value is not None:
                self.writer.add_scalar(tag, value, step)

    def write_results(self, summary: dict, **extra) -> Path | None:
        assert set(SUMMARY_FIELDS) <= set(summary), f"summary lacks {set(SUMMARY_FIELDS) - set(summary)}"
        if self.run_dir is None:
            return None
        results = {"mode": self.mode, "world_size": self.world_size, "config": dataclasses.asdict(self.cfg),
                   "env": environment(), "summary": summary, **extra}
        path = self.run_dir / "results.json"
        write_atomically(path, lambda f: f.write(json.dumps(results, indent=2).encode()))
        return path

    def save_model(self, state_dict: dict) -> Path | None:
        if self.run_dir is None:
            return None
        path = self.run_dir / "model.pt"
        write_atomically(path, lambda f: torch.save(state_dict, f))
        return path

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.lock is not None:
            self.lock.close()  # releases the run folder


def write_atomically(path: Path, write) -> None:
    """Write to a temporary file, fsync, rename: a crash leaves the old file or the new one, never half of one. The
    temporary file's name is this process's own, so no two writers ever share one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # only left if the write failed: the old file is untouched


def load_model_weights(raw_model: torch.nn.Module, path: str) -> None:
    """Weights from a model.pt (a state_dict) into the unwrapped model, refusing anything that is not one. Every
    process reads the file; a model sharded by FSDP keeps its slice."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--evaluate: no file at {file}; give the model.pt a run wrote with --save_model")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception:
        raise UsageError(f"--evaluate: {file} is not a PyTorch weights file; give a model.pt written with "
                         f"--save_model") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a full checkpoint: its model part
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"--evaluate: {file} holds no model weights (state_dict); give a model.pt written with "
                         f"--save_model")
    if state and all(key.startswith("module.") for key in state):
        state = {key[len("module."):]: value for key, value in state.items()}  # saved from a wrapped model
    try:
        load_model_state(raw_model, state)  # under FSDP each rank keeps its slice
    except (RuntimeError, KeyError, ValueError):
        raise UsageError(f"--evaluate: the weights in {file} do not fit this model; pass the --depth, --alpha, "
                         f"--block and --dataset the run was trained with") from None


def window_line(epoch: int, epochs: int, step: int, steps: int, loss: float, acc: float,
                batch_time: float | None, data_frac: float | None, images_per_sec: float | None) -> str:
    """The plain log line: `Epoch 1/3 [120/390] loss 1.464 acc 45.36% batch 0.052s data 0.1% 4912 img/s`."""
    timing = ("warming up" if batch_time is None else
              f"batch {batch_time:.3f}s data {100 * data_frac:.1f}% {images_per_sec:.0f} img/s")
    return f"Epoch {epoch + 1}/{epochs} [{step}/{steps}] loss {loss:.3f} acc {100 * acc:.2f}% {timing}"


def report_window(run, epoch: int, index: int, sums, gpu: dict) -> None:
    """A log window's side effects: the plain line, the progress bar's figures, TensorBoard scalars.
    `run` is the training loop's state (cfg, console, logger, scheduler, step, train_loader)."""
    rate = sums.images_per_sec(run.cfg.batch_size)
    run.console.line(window_line(epoch, run.cfg.epochs, index, len(run.train_loader), sums.loss, sums.acc,
                                  sums.batch_time, sums.data_frac, rate))
    run.console.update(0, loss=f"{sums.loss:.3f}", acc=f"{100 * sums.acc:.1f}%", img_s=f"{rate or 0:.0f}")
    run.logger.scalars(run.step, {
        "train/loss": sums.loss, "train/acc": sums.acc, "train/lr": run.scheduler.get_last_lr()[0],
        "time/batch": sums.batch_time, "time/data": sums.data_frac, "throughput/images_per_sec": rate,
        **{f"gpu/util/{i}": util for i, (util, _) in gpu.items()},
        **{f"gpu/mem_gb/{i}": mem for i, (_, mem) in gpu.items()}})


def report_test(run, epoch: int, test: tuple[float, float, int], epoch_seconds: float) -> None:
    """An epoch's test loss and accuracy, on the terminal and in TensorBoard."""
    run.logger.scalars(run.step, {"test/loss": test[0], "test/acc": test[1]})
    run.console.line(f"Epoch {epoch + 1}/{run.cfg.epochs} test loss {test[0]:.3f} acc {100 * test[1]:.2f}% "
                     f"({test[2]} images) epoch {epoch_seconds:.1f}s")


def speed_line(summary: dict) -> str:
    """The run's speed in one line: `speed: 15012 img/s (15012 per GPU), batch p50 17.1 ms p90 17.4 ms, ...`."""
    if summary["images_per_sec"] is None:
        return "speed: no timed steps (raise --max_steps or --benchmark_steps above --warmup_steps)"
    figures = [f"speed: {summary['images_per_sec']:.0f} img/s ({summary['images_per_sec_per_gpu']:.0f} per GPU)",
               f"batch p50 {1e3 * summary['batch_time_p50']:.1f} ms p90 {1e3 * summary['batch_time_p90']:.1f} ms",
               f"data wait {100 * summary['data_wait_frac']:.2f}%",
               f"{summary['flops_per_image'] / 1e9:.2f} GFLOP/img"]
    if summary["mfu"] is not None:
        figures.append(f"MFU {100 * summary['mfu']:.1f}%")
    if summary["peak_mem_gb"] is not None:
        figures.append(f"peak mem {summary['peak_mem_gb']:.2f} GB")
    if summary["compile_time_s"] is not None:
        figures.append(f"compile {summary['compile_time_s']:.1f} s (untimed)")
    return ", ".join(figures)


class Console:
    """What a run prints: plain lines, and a tqdm bar per epoch when stdout is a terminal and `bar` is set.
    Disabled (every process but the main one of a process group), it prints nothing, so callers need no guard."""

    def __init__(self, enabled: bool, bar: bool):
        self.enabled = enabled
        self.show_bar = enabled and bar and sys.stdout.isatty()
        self.bar = None

    def start(self, total: int, description: str) -> None:
        if self.show_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=description, leave=False, dynamic_ncols=True)

    def update(self, steps: int = 1, **postfix) -> None:
        if self.bar is not None:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        elif self.enabled:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        if self.enabled:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

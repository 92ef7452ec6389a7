"""What a run leaves behind: <log_dir>/<run_name>/ with TensorBoard events, results.json and
model.pt; and what it prints: a tqdm bar per epoch on a terminal and a plain line per log
window. Only the main process writes."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path

import torch

from common.augmentation import describe_augmentation
from common.breakdown import TRACE_NAME
from common.config import LATER_FLAGS, MODEL_FLAGS, Config, UsageError, batch_note
from common.data import dataset_info
from common.metrics import Sums
from common.optim import describe_lr
from common.performance import describe_fast_path
from common.state import load_file, load_model_state
from common.telemetry import environment

SUMMARY_FIELDS = ("images_per_sec", "images_per_sec_per_gpu", "batch_time_p50", "batch_time_p90",
                  "data_wait_frac", "flops_per_image", "parameters", "mfu", "mfu_note",
                  "first_step_s", "compile_time_s", "compile_wait_s", "gpu_util_mean",
                  "peak_mem_gb", "peak_mem_reserved_gb", "train_loss", "train_acc", "test_loss",
                  "test_acc", "test_acc_top5", "test_images", "best_acc", "best_epoch",
                  "epoch_time_s", "epoch_time_note", "wall_time_s",
                  "steps", "breakdown", "breakdown_slowest_rank", "breakdown_steps",
                  "breakdown_note")
# What a resumed run reports of its last attempt alone: the figures of the hardware it ran on
# (speed, utilisation, memory), that of results.json's `env` (a restart may run on other GPUs).
# Every other figure covers the whole run. (The peak_mem_*_per_gpu are beside the summary.)
ATTEMPT_FIELDS = ("images_per_sec", "images_per_sec_per_gpu", "batch_time_p50", "batch_time_p90",
                  "data_wait_frac", "mfu", "mfu_note", "first_step_s", "compile_time_s",
                  "compile_wait_s", "gpu_util_mean", "peak_mem_gb", "peak_mem_reserved_gb",
                  "peak_mem_gb_per_gpu", "peak_mem_reserved_gb_per_gpu",
                  "breakdown", "breakdown_slowest_rank", "breakdown_steps", "breakdown_note")
# The figures that cover the whole run from the earlier attempts' history in the checkpoint: a
# checkpoint without one leaves them to the last attempt too.
HISTORY_FIELDS = ("train_loss", "train_acc", "epoch_time_s", "wall_time_s")


# written into every run folder: what --overwrite may empty and --resume continue
MARKER = ".pytorch-multigpu-run"
LOCK = ".lock"  # locked (lockf) by the one process that writes a run folder, for as long as it runs
# What a run folder written before the marker existed holds: --resume
# auto continues such a folder too.
EARLIER_RUN_FILES = ("checkpoint.pt", "results.json")


def default_run_name(mode: str, gpu_count: int) -> str:
    """<mode>-<n>gpu-<date>-<time>-<pid>: the process id keeps apart two
    runs started in the same second."""
    units = f"{gpu_count}gpu" if gpu_count else "cpu"
    return f"{mode}-{units}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def resolve_run_dir(cfg: Config, mode: str, gpu_count: int) -> Path:
    """The run's folder, checked before anything is written: log_dir must be a writable folder (or
    creatable), the name must fit the file system, and the run folder must not exist unless
    --overwrite or --resume auto. A run resumed from a checkpoint file continues in a new folder, or
    in that checkpoint's own, never in another run's. An existing folder is replaced (--overwrite)
    only if this suite made it a run folder (its marker), and continued (--resume) only if it is
    one; a symbolic link is never followed into another folder."""
    name = cfg.run_name or default_run_name(mode, gpu_count)
    log_dir = Path(cfg.log_dir)
    existing = first_existing(log_dir)
    if not existing.is_dir():
        raise UsageError(f"--log_dir {log_dir}: {existing} is a file, not a folder; "
                         "give a folder for the runs")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--log_dir {log_dir}: {existing} is not writable; give a "
                         "folder you can write to")
    run_dir = log_dir / name
    if run_dir.is_symlink():
        raise UsageError(f"run folder {run_dir} is a symbolic link (to {os.readlink(run_dir)}): "
                         "runs are never written through one; give the folder itself with "
                         "--log_dir and --run_name")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir} is a file, not a run folder: choose another --run_name")
    if run_dir.exists() and cfg.resume not in (None, "auto") and not cfg.overwrite:
        own = Path(cfg.resume).absolute().parent
        if run_dir.resolve() != own.resolve():
            raise UsageError(f"run folder {run_dir} exists already and belongs to another run than "
                             f"{cfg.resume}: choose a new --run_name (or --run_name "
                             f"{shlex.quote(own.name)} --log_dir {shlex.quote(str(own.parent))} to "
                             "continue in the checkpoint's own folder)")
    elif run_dir.exists() and not (cfg.overwrite or cfg.resume):
        then = "choose another --run_name or add --overwrite"
        if not (cfg.evaluate or cfg.benchmark):  # --resume continues training, which they do not
            then = "choose another --run_name, add --overwrite, or continue it with --resume auto"
        raise UsageError(f"run folder {run_dir} exists already: {then}")
    if run_dir.is_dir() and not is_run_folder(run_dir, earlier_runs=not cfg.overwrite):
        flag_given = "--overwrite only replaces" if cfg.overwrite else "--resume only continues"
        raise UsageError(f"{run_dir} is not a run folder (it has no {MARKER}): "
                         f"{flag_given} a folder a run made, and leaves this one as it is; "
                         "choose another --run_name")
    return run_dir


def first_existing(path: Path) -> Path:
    """The nearest of `path` and its parents that exists: where a new folder would be made.
    A symbolic link on the way that leads nowhere (dangling, or a loop) is refused: a
    folder cannot be made through it."""
    for candidate in [path, *path.absolute().parents]:
        if candidate.exists():
            return candidate
        if candidate.is_symlink():
            raise UsageError(f"--log_dir {path}: {candidate} is a symbolic link that leads nowhere "
                             f"(to {os.readlink(candidate)}, missing or a loop); mend the link or "
                             "give another --log_dir")
    return Path("/")


def is_run_folder(folder: Path, earlier_runs: bool) -> bool:
    """Whether a run made `folder` (its marker), or it is empty (but for the lock of a run that died
    as it made the folder); with `earlier_runs`, also a run folder written before runs marked theirs
    (a checkpoint or results.json in it)."""
    if (folder / MARKER).is_file() or all(path.name == LOCK for path in folder.iterdir()):
        return True
    return earlier_runs and any((folder / name).is_file() for name in EARLIER_RUN_FILES)


# the line of MARKER that names the job attempt that started the run afresh
STARTED = "started afresh by: "


def this_attempt() -> dict | None:
    """The job this process is an attempt of, and which attempt: a SLURM job keeps its id when it is
    requeued (SLURM_RESTART_COUNT counts the requeues), torchrun (or the self-launch) its run id
    over the restarts of its workers (TORCHELASTIC_RESTART_COUNT) and its agent (the worker's
    parent, which restarts it; a run id is "none" without --rdzv_id, or one given by hand to many
    launches). None outside both: a run started by hand is no attempt of a job."""
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        job = f"SLURM job {env['SLURM_JOB_ID']}"
    # and the agent: a run id given by hand may name many launches
    elif env.get("TORCHELASTIC_RUN_ID"):
        job = f"torchrun {env['TORCHELASTIC_RUN_ID']} (agent {socket.gethostname()}:{os.getppid()})"
    else:
        return None
    try:
        attempt = [int(env.get("SLURM_RESTART_COUNT") or 0),
                   int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)]
    except ValueError:
        return None
    return {"job": job, "attempt": attempt}


def fresh_restart(run_dir: Path) -> bool:
    """Whether this process is a later attempt (a requeue, an elastic restart) of the job that
    started the run in `run_dir` afresh, with no checkpoint written since (a run resumed from one is
    marked without a starter): what an earlier attempt of it logged is this run's, and lost to the
    kill, so it may start afresh again."""
    now = this_attempt()
    try:
        lines = (run_dir / MARKER).read_text().splitlines()
        started = next((json.loads(line[len(STARTED):]) for line in lines
                        if line.startswith(STARTED)), None)
        return (now is not None and started["job"] == now["job"]
                and started["attempt"] < now["attempt"])
    # no mark, or one edited by hand
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return False


def logged_curves(run_dir: Path) -> str | None:
    """What TensorBoard curves the event files in `run_dir` hold, for a message ("TensorBoard curves
    to step 40"), or None when they hold no point (an attempt that died before its first log window
    logs only its config). The files are read record by record (TFRecord: the Event's length, a CRC,
    the Event, a CRC); one that cannot be read is never taken for an empty one."""
    from google.protobuf.message import DecodeError
    from tensorboardX.proto.event_pb2 import Event

    last = None
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        try:
            with open(path, "rb") as events:
                size = os.fstat(events.fileno()).st_size
                while len(header := events.read(12)) == 12:
                    length = int.from_bytes(header[:8], "little")
                    if events.tell() + length > size:  # the last record, cut by a kill
                        break
                    record = events.read(length)
                    events.read(4)
                    event = Event.FromString(record)
                    if any(value.HasField("simple_value") for value in event.summary.value):
                        last = max(last or 0, event.step)
        except (OSError, DecodeError):
            return f"TensorBoard event files ({path.name} cannot be read)"
    return None if last is None else f"TensorBoard curves to step {last}"


def claim_run_dir(run_dir: Path, cfg: Config, started_by: dict | None = None):
    """Make `run_dir` this process's, for as long as the returned lock file stays open: a new folder
    is created exclusively (a second run started with the same --run_name at the same moment is
    refused), and an existing one (--resume, --overwrite) is locked, so a run whose folder is in use
    by a live run (an orphan, a second `--resume auto`) is refused in one line rather than writing
    beside it. The lock (a POSIX record lock, which a forked child such as a DataLoader worker does
    not inherit) dies with its process. Temporary files that a writer killed mid-write left behind
    are removed: no other process writes here now. The folder is marked as a run's (MARKER), which
    --overwrite and --resume look for; the mark of a run started afresh names the job attempt that
    started it (`started_by`, this_attempt()), so that a restart of that job before its first
    checkpoint may start afresh again (fresh_restart)."""
    import fcntl

    fresh = not (cfg.resume or cfg.overwrite)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_dir.mkdir(exist_ok=not fresh)
    except FileExistsError:
        raise UsageError(f"run folder {run_dir} was created by another run a moment ago: "
                         "choose another --run_name") from None
    lock = open(run_dir / LOCK, "a+")
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise UsageError(f"run folder {run_dir} is in use by a run that is still "
                         f"running (pid {holder}): wait for it to end or stop it, or "
                         "choose another --run_name") from None
    except OSError:
        # a file system without locks (some Lustre and NFS mounts): the exclusive mkdir still
        # guards new runs, and the run goes on unlocked rather than not at all
        pass
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    # marked once locked: the record of a fresh start is this process's,
    # never one of a run refused here
    started = f"{STARTED}{json.dumps(started_by)}\n" if started_by else ""
    (run_dir / MARKER).write_text("A run folder of pytorch-multigpu: --overwrite may replace "
                                  f"what is in it.\n{started}")
    for left in run_dir.glob(".*.tmp"):  # see write_atomically
        left.unlink(missing_ok=True)
    if cfg.overwrite:  # the folder's files go, its lock stays held
        for path in run_dir.iterdir():
            if path.name not in (LOCK, MARKER):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return lock


class RunLogger:
    """TensorBoard scalars (tensorboardX's event files), results.json and model.pt in one run
    folder. Given no folder (every process but the main one of a process group) it writes nothing,
    so callers need no guard.

    Events are written by the caller, not by a writer thread behind a queue, and flushed as they
    are logged, once per log window or evaluation (which sync the host anyway): a run killed at any
    moment (kill -9, the out-of-memory killer) leaves every point it had logged, and a checkpoint
    never gets ahead of the curves. A run resumed from the checkpoint of step `resumed_step` goes
    on from there: its first event tells TensorBoard to drop what the folder holds from step
    `resumed_step + 1` on (what a killed attempt logged after that checkpoint and is trained again
    now) and to keep everything up to it."""

    def __init__(self, run_dir: Path | None, cfg: Config, mode: str, world_size: int,
                 resumed_step: int | None = None):
        self.run_dir, self.cfg, self.mode, self.world_size = run_dir, cfg, mode, world_size
        self.resumed_step = resumed_step
        self.events = self.lock = None
        if run_dir is None:
            return
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import text

        # a resumed run adds to its folder; --overwrite empties it; a
        # fresh start names its job's attempt
        self.lock = claim_run_dir(run_dir, cfg, this_attempt() if resumed_step is None else None)
        # a new file, beside earlier attempts': tensorboardX names it by the second and opens it
        # with "wb", so an attempt started in the second of an earlier one would empty that one's;
        # the nanosecond keeps it apart, and in the order of the attempts (TensorBoard reads the
        # files in the order of their names)
        self.events = EventsWriter(str(run_dir / "events"), filename_suffix=f".{time.time_ns()}")
        if cfg.resume:
            # with no checkpoint yet (--resume auto), nothing an earlier attempt logged was kept
            purge_step = 0 if resumed_step is None else resumed_step + 1
            self._write(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))
        config = "\n".join(f"    {k}: {v}" for k, v in dataclasses.asdict(cfg).items())
        # the config this attempt trains with, at the first step it trains: an attempt
        # killed before its first checkpoint is purged by the next one, resumed from the
        # same checkpoint, config and all
        self._write(Event(step=0 if resumed_step is None else resumed_step + 1,
                          summary=text("config", config)))
        self.events.flush()

    def _write(self, event) -> None:
        event.wall_time = time.time()
        self.events.write_event(event)

    def scalars(self, step: int, values: dict) -> None:
        """One log window's or evaluation's points, flushed to the file before training goes on."""
        if self.events is None:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        for tag, value in values.items():
            if value is not None:
                self._write(Event(step=step, summary=scalar(tag, value)))
        self.events.flush()

    def write_results(self, summary: dict, attempts: int | None, env: dict | None = None,
                      **extra) -> Path | None:
        """results.json. `attempts`: those whose work the run kept, this one included (None: not
        known). A resumed run's `resumed` names the figures that are its last attempt's alone.
        `env`: where the figures were measured (None: here, now)."""
        assert set(SUMMARY_FIELDS) <= \
            set(summary), f"summary lacks {set(SUMMARY_FIELDS) - set(summary)}"
        if self.run_dir is None:
            return None
        resumed = None
        if self.resumed_step is not None:
            last_only = ATTEMPT_FIELDS + (() if attempts else HISTORY_FIELDS)
            resumed = {"attempts": attempts, "from_step": self.resumed_step,
                       "last_attempt_only": list(last_only)}
        results = {"mode": self.mode, "world_size": self.world_size,
                   "config": dataclasses.asdict(self.cfg), "env": env or environment(),
                   "summary": summary, "resumed": resumed, **extra}
        path = self.run_dir / "results.json"
        write_atomically(path, lambda f: f.write(json.dumps(results, indent=2).encode()))
        return path

    def write_trace(self, rank: int, text: bytes | None) -> Path | None:
        """A rank's profiler trace (Chrome trace JSON): <run folder>/trace_rank<rank>.json."""
        if self.run_dir is None or text is None:
            return None
        path = self.run_dir / TRACE_NAME.format(rank=rank)
        write_atomically(path, lambda f: f.write(text))
        return path

    def save_model(self, state_dict: dict) -> Path | None:
        if self.run_dir is None:
            return None
        path = self.run_dir / "model.pt"
        write_atomically(path, lambda f: torch.save(state_dict, f))
        return path

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
        if self.lock is not None:
            self.lock.close()  # releases the run folder


def write_atomically(path: Path, write) -> None:
    """Write to a temporary file, fsync, rename: a crash, a signal or a full disk leaves the old
    file or the new one, never half of one. The temporary file's name is this process's own, so no
    two writers ever share one. A write the file system refuses raises OSError naming `path` (a
    failed write() names no file, a failed rename the temporary one), which the scripts'
    user_errors turns into one line."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as error:  # named by the file it is about, never by its temporary stand-in
        named = path if error.filename in (None, str(temporary)) else error.filename
        raise OSError(error.errno, error.strerror, str(named)) from None
    finally:
        # left only if the write failed: the old file is untouched
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def load_model_weights(raw_model: torch.nn.Module, path: str) -> None:
    """Weights from a model.pt (a state_dict) into the unwrapped model, refusing anything that is
    not one. Every process reads the file; a model sharded by FSDP keeps its slice."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--evaluate: no file at {file}; give the model.pt a run "
                         "wrote with --save_model")
    try:
        state = load_file(file)
    except Exception:
        raise UsageError(f"--evaluate: {file} is not a PyTorch weights file; give a model.pt "
                         "written with --save_model") from None
    trained_with = model_flags_of(file, state)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a full checkpoint: its model part
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"--evaluate: {file} holds no model weights (state_dict); give a model.pt "
                         "written with --save_model")
    if state and all(key.startswith("module.") for key in state):
        # saved from a wrapped model
        state = {key[len("module."):]: value for key, value in state.items()}
    try:
        load_model_state(raw_model, state)  # under FSDP each rank keeps its slice
    except (RuntimeError, KeyError, ValueError):
        every = ", ".join(f"--{name}" for name in MODEL_FLAGS[:-1]) + f" and --{MODEL_FLAGS[-1]}"
        give = (f"give the model flags it was trained with, {trained_with}" if trained_with else
                f"give the {every} it was trained with")
        raise UsageError(f"--evaluate: the weights in {file} do not "
                         f"fit this model: {give}") from None


def model_flags_of(file: Path, state) -> str | None:
    """The model flags (MODEL_FLAGS) of the run that wrote the weights file `file` (loaded:
    `state`), as flags to paste, with where they were read: a checkpoint's own config, or the
    results.json of the run folder a model.pt lies in. None where neither says."""
    config, source = None, ""
    if isinstance(state, dict) and isinstance(state.get("config"), dict):
        config, source = state["config"], "the checkpoint's config"
    else:
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError, AttributeError):
            config = json.loads((file.parent / "results.json").read_text()).get("config")
            source = str(file.parent / "results.json")
    if not isinstance(config, dict) or any(name not in {**LATER_FLAGS, **config}
                                           for name in MODEL_FLAGS):
        return None
    config = {**LATER_FLAGS, **config}  # written before a flag existed: its default
    words = [word for name in MODEL_FLAGS if config[name] is not None
             for word in (f"--{name}", f"{config[name]:g}" if isinstance(config[name], float)
                          else str(config[name]))]
    return f"{shlex.join(words)} (from {source})"


def window_scalars(sums: Sums, global_batch: int, lr: float, mfu: float | None) -> dict:
    """A log window's run-wide TensorBoard points, each tag naming its unit, each figure as the log
    line prints it (window_line): the loss, the accuracy in %, the rate the window's last step
    trained with, the step's seconds and its wait for data (seconds, and % of the step; the mean
    over ranks in a process group), the global images/s, and MFU in % where the GPU's peak is
    known (`mfu`: a fraction, as results.json's; None on the CPU, where no point is written)."""
    return {"train/loss": sums.loss, "train/acc_pct": percent(sums.acc), "train/lr": lr,
            **time_scalars(sums),
            "throughput/images_per_s": sums.images_per_sec(global_batch),
            "perf/mfu_pct": percent(mfu)}


def time_scalars(sums: Sums, prefix: str = "") -> dict:
    """`time/step_s`, `time/data_wait_s` (seconds per step) and `time/data_wait_pct` (% of the
    step) of a window's Sums, under `prefix` (`rank/<r>/`: one rank's own)."""
    return {f"{prefix}time/step_s": sums.batch_time, f"{prefix}time/data_wait_s": sums.data_time,
            f"{prefix}time/data_wait_pct": percent(sums.data_frac)}


def device_scalars(gpu: dict, ranks: dict[int, Sums] | None = None) -> dict:
    """A window's points of each device: `gpu/<i>/util_pct` and `gpu/<i>/mem_used_gib` for the
    GPUs one process drives (`gpu`: NVML's readings by CUDA index); in a process group (`ranks`:
    each rank's own window, and `gpu` keyed by rank) `rank/<r>/time/...` and `rank/<r>/gpu/...`:
    a value that belongs to a rank is named by it (GPU indices repeat on every node, ranks not)."""
    scalars = {}
    if ranks is None:
        for i, reading in gpu.items():
            scalars.update(gpu_scalars(f"gpu/{i}/", reading))
    for rank, own in (ranks or {}).items():
        scalars.update(time_scalars(own, f"rank/{rank}/"))
        scalars.update(gpu_scalars(f"rank/{rank}/gpu/", gpu.get(rank, (None, None))))
    return scalars


def gpu_scalars(prefix: str, reading: tuple[float | None, float | None]) -> dict:
    """NVML's (utilisation %, memory in use GiB) as `<prefix>util_pct`, `<prefix>mem_used_gib`."""
    util, mem = reading
    return {f"{prefix}util_pct": util, f"{prefix}mem_used_gib": mem}


def percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction


def window_line(epoch: int, epochs: int, step: int, steps: int, loss: float, acc: float,
                batch_time: float | None, data_frac: float | None,
                images_per_sec: float | None, untimed: str = "warming up") -> str:
    """The plain log line: `Epoch 1/3 [120/390] loss 1.464 acc 45.36% batch
    0.052s data 0.1% 4912 img/s`; `untimed` in place of the timing where the window timed no
    step."""
    timing = (untimed if batch_time is None else
              f"batch {batch_time:.3f}s data {100 * data_frac:.1f}% {images_per_sec:.0f} img/s")
    return (f"Epoch {epoch + 1}/{epochs} [{step}/{steps}] loss {loss:.3f} acc "
            f"{100 * acc:.2f}% {timing}")


def start_line(mode: str, cfg: Config, placement: str, steps_per_epoch: int,
               run_dir: Path | None) -> str:
    """The run's first line: `single_gpu: PyramidNet-110 alpha=270 basic, cifar10, augment pad-4
    crop and flip, global batch 128 on cuda:0 (amp bf16, channels_last); lr 0.1 ...; logs in
    runs/...`. `placement` says where the batch goes. An evaluation (--evaluate) trains nothing and
    says so: no schedule, no epochs."""
    if cfg.evaluate:
        return (f"{mode}: evaluating {cfg.evaluate}, {model_line(cfg)}, on {cfg.dataset}'s test "
                f"set, every image once, batch {cfg.batch_size} {placement} "
                f"({describe_fast_path(cfg)}); nothing is trained; results in {run_dir}")
    return (f"{mode}: {model_line(cfg)}, {cfg.dataset}, augment {describe_augmentation(cfg)}, "
            f"global batch {cfg.batch_size} {placement} ({describe_fast_path(cfg)})"
            f"{batch_note(cfg)}; {describe_lr(cfg, steps_per_epoch)}; logs in {run_dir}")


# top-5 accuracy is shown beside top-1 for more classes than this (with 10 or fewer it says little)
TOP5_ABOVE = 10


def shows_top5(cfg: Config) -> bool:
    """Whether a run shows its top-5 test accuracy beside top-1: for more than TOP5_ABOVE
    classes."""
    return dataset_info(cfg).classes > TOP5_ABOVE


def model_line(cfg: Config) -> str:
    """`PyramidNet-110 alpha=270 basic`, or a torchvision model's name, with the images' side where
    it is not the dataset's own."""
    name = (f"PyramidNet-{cfg.depth} alpha={cfg.alpha:g} {cfg.block}" if cfg.model == "pyramidnet"
            else cfg.model)
    return name + (f" at {cfg.image_size}x{cfg.image_size} px" if cfg.image_size else "")


def speed_line(summary: dict) -> str:
    """The run's speed in one line: `speed: 15012 img/s (15012 per GPU), batch
    p50 17.1 ms p90 17.4 ms, ...`."""
    if summary["images_per_sec"] is None:
        return "speed: no timed steps (raise --max_steps or --benchmark_steps above --warmup_steps)"
    figures = [f"speed: {summary['images_per_sec']:.0f} img/s "
               f"({summary['images_per_sec_per_gpu']:.0f} per GPU)",
               f"batch p50 {1e3 * summary['batch_time_p50']:.1f} ms "
               f"p90 {1e3 * summary['batch_time_p90']:.1f} ms",
               f"data wait {100 * summary['data_wait_frac']:.2f}%",
               f"{summary['flops_per_image'] / 1e9:.2f} GFLOP/img"]
    if summary["mfu"] is not None:
        figures.append(f"MFU {100 * summary['mfu']:.1f}%")
    if summary["peak_mem_gb"] is not None:
        figures.append(f"peak mem {summary['peak_mem_gb']:.2f} GB allocated, "
                       f"{summary['peak_mem_reserved_gb']:.2f} GB reserved")
    if summary["compile_time_s"] is not None:
        figures.append(f"compile {summary['compile_time_s']:.1f} s (untimed)")
    if summary.get("compile_wait_s"):
        figures.append(f"{summary['compile_wait_s']:.1f} s waiting for a node's "
                       "first compile (untimed)")
    return ", ".join(figures)


class Console:
    """What a run prints: plain lines, and a tqdm bar per epoch when stdout is a terminal and
    `bar` is set. Disabled (every process but the main one of a process group), it prints
    nothing, so callers need no guard."""

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

    def counted(self, batches, description: str):
        """`batches` (a loader) as they are iterated, counted on a bar of their own as an epoch's
        training steps are (on a terminal, with `bar`): what an evaluation's progress shows."""
        return _Counted(self, batches, description)

    def warn(self, text: str) -> None:
        if self.enabled:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _Counted:
    """A loader whose batches a Console counts on a bar while they are iterated (Console.counted);
    its len is the loader's."""

    def __init__(self, console: Console, batches, description: str):
        self.console, self.batches, self.description = console, batches, description

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        self.console.start(len(self.batches), self.description)
        try:
            for batch in self.batches:
                yield batch
                self.console.update()
        finally:  # the bar goes, however the iteration ends (a stop signal, an error)
            self.console.close()

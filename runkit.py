"""runkit: what every train.py here needs and no lesson teaches, in one file that imports nothing
of this repository: copy it beside a train.py. It takes numbers, dicts, tensors, modules and
paths, never a train.py's flags; `progress` is a train.py's dict of epoch, batch, step, best_acc,
best_epoch and tested_step: what a checkpoint keeps of the loop.

    UsageError, RunError, one_line_errors       a mistake (exit 2), a failed run (exit 1): one line
    ArgumentParser, count, number, refuse_if    flags, their ranges and checks, refused in one line
    StopSignals, stopped_line                   SIGTERM/INT/HUP/USR1: stop at the next window
    check_launch_environment, raise_group_failure, group_failure_in_one_line   process groups
    cuda_device, workers, leave_stops_to_main   the GPU or the CPU; DataLoader workers
    check_image_folder, downloaded, synthetic_images, folder_record, Augmented   the data
    claim_run_folder, default_run_name          the run's folder, made or continued, locked
    checkpoint_to_resume, has_ended, resumed_line, save_checkpoint, load_weights   checkpoints
    rng_states, set_rng_state, optimizer_as_built, copy_atomically   what a resume puts back
    StepTimer, GpuMonitor, peak_memory_gb       step time on the device's clock; NVML; the peaks
    RunLog, speed_summary                       the console, TensorBoard, results.json
    precise_batchnorm, parameter_count, flops_per_image, peak_tflops   measured on the model
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import multiprocessing
import os
import pickle
import platform
import secrets
import shlex
import shutil
import signal
import sys
import threading
import time
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

FORMAT = "pytorch-multigpu checkpoint v3"  # v3: each part's state dict, the progress a dict
MARKER, LOCK = ".pytorch-multigpu-run", ".lock"  # what makes a folder a run's; its writer's lock
WINDOW = ("loss_sum", "correct", "images", "timed_steps", "step_seconds", "data_seconds")
IMAGES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # it reads


# ------------------------------------------------------------------------------- errors and flags
class UsageError(Exception):
    """A mistake the user can fix; a group's ranks all meet it, a `rank_specific` one each rank."""

    def __init__(self, message: str, rank_specific: bool = False):
        super().__init__(message)
        self.rank_specific = rank_specific


class RunError(Exception):
    """A run that cannot go on: a loss that turned NaN, a process group that broke."""


@contextlib.contextmanager
def one_line_errors():
    """Around main(): a UsageError, a RunError, a file system's refusal, Ctrl-C: one line."""
    try:
        yield
    except UsageError as error:
        once = "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("LOCAL_RANK") == "0"
        if error.rank_specific or once:  # torchrun's workers all meet it: said once a node
            print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as error:
        if error.filename is None or error.errno is None:
            raise
        print(f"error: {error.filename}: {error.strerror}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, with a mistake in one line, no abbreviations, and --help the docstring as
    written with each default that says something (not None, not a switch's off)."""

    class Help(argparse.RawDescriptionHelpFormatter):
        def _get_help_string(self, action) -> str:
            text = (action.help or "").replace(" (default: %(default)s)", "")  # Python < 3.13's
            if isinstance(action, argparse.BooleanOptionalAction) and action.default:
                return f"{text} (on by default)".lstrip()
            said = isinstance(action.default, (bool, type(None))) or "default" in text
            if said or action.default == argparse.SUPPRESS:  # nothing a default would add
                return text
            return f"{text} (default: %(default)s)".lstrip()

    def __init__(self, **kwargs):
        super().__init__(formatter_class=self.Help, allow_abbrev=False, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.help is None and not isinstance(action.default, (bool, type(None))):
            action.help = "(default: %(default)s)"  # a flag without help: its default
        return action

    def error(self, message: str):
        if message.endswith("expected one argument"):  # -e alone, or a value that starts with -
            message += " (its value after it: -e PATH; --lr=-1 for one that starts with -)"
        raise UsageError(f"{message} (see --help)")


def count(least: int, most: float = math.inf):
    """An argparse type: a whole number from `least` to `most`."""
    def whole_number(text: str) -> int:
        if not least <= int(text) <= most:
            raise ValueError(text)
        return int(text)
    return whole_number


def number(least=-math.inf, above=-math.inf, below=math.inf):
    """An argparse type: a finite number, at least `least`, above `above` and below `below`."""
    def finite_number(text: str) -> float:
        if not (least <= float(text) < below and float(text) > above):
            raise ValueError(text)
        return float(text)
    return finite_number


def refuse_if(checks) -> None:
    """The first (refused, why) of `checks` that is refused, as a UsageError."""
    why = next((why for refused, why in checks if refused), None)
    if why:
        raise UsageError(why)


# --------------------------------------------------------------------------- signals and devices
class StopSignals:
    """SIGTERM (SLURM, torchrun, kill), SIGINT (Ctrl-C), SIGHUP (a closed terminal), SIGUSR1
    (SLURM's warning before a time limit) set `received`: the loop stops at its next window.
    With `at_once` set (nothing to keep) the process ends there, saying "stopped by <signal>:
    <at_once>" (an empty one: nothing), with 128 + the signal."""

    NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP",
             signal.SIGUSR1: "SIGUSR1"}
    CODES = {name: 128 + number for number, name in NAMES.items()}  # as if killed by it

    def __init__(self):
        self.received: str | None = None
        self.at_once: str | None = None
        self.previous = {number: signal.signal(number, self._handle) for number in self.NAMES}

    def _handle(self, number, frame):
        if self.received == "SIGINT" and number == signal.SIGINT:
            raise KeyboardInterrupt
        if number == signal.SIGHUP:  # the terminal is gone: a line printed there would fail
            for fd in (1, 2):
                os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        if self.at_once is not None:
            if self.at_once:
                print(f"stopped by {self.NAMES[number]}: {self.at_once}", flush=True)
            raise SystemExit(self.CODES[self.NAMES[number]])
        self.received = self.received or self.NAMES[number]

    def restore(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


def stopped_line(signal_name: str, progress: dict, batches: int, checkpoint: Path | None) -> str:
    """Where a stopped run is, and how to go on; a stop after the epoch's last step leaves its
    evaluation (and the results, at the run's end) to the resume."""
    owed = " (the epoch trained, its evaluation owed)" * (progress["batch"] == batches)
    if checkpoint is None:
        return f"stopped by {signal_name} at step {progress['step']}; a --benchmark run keeps none"
    return (f"stopped by {signal_name} at step {progress['step']}{owed}; checkpoint {checkpoint}: "
            f"continue with --resume auto --run_name {shlex.quote(checkpoint.parent.name)}")


def check_launch_environment() -> None:
    """The variables a launcher sets (torchrun, srun, an operator, by hand): one no process could
    run with is refused in one line naming it. A worker of torchrun's agent dies with it (Linux's
    parent-death signal): a `kill -9` of torchrun leaves no orphan training on."""
    if "TORCHELASTIC_RESTART_COUNT" in os.environ and sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    env = os.environ
    bad = next((name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                  "MASTER_PORT") if not env.get(name, "0").isdigit()), None)
    unset = next((name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)), None)
    refuse_if([(bad, f"{bad}={env.get(bad or '')!r}: a launcher sets it to a whole number; "
                "mend it"),
               (("RANK" in env) != ("WORLD_SIZE" in env), "RANK and WORLD_SIZE go together: set "
                "both (a process's place, the job's processes), or neither"),
               (unset, f"{unset} is not set: the host and port of rank 0, which every process "
                "reaches (torchrun sets them)")])
    rank, world, local, port = (int(env.get(name, 0)) for name in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"))
    node = "LOCAL_WORLD_SIZE" if "LOCAL_WORLD_SIZE" in env else "WORLD_SIZE"  # one node without it
    processes = int(env.get(node, 1))
    refuse_if([(world < 1, f"WORLD_SIZE={world}: the job's processes, 1 or more"),
               (processes < 1, f"LOCAL_WORLD_SIZE={processes}: this node's processes, 1 or more"),
               (not 0 < port < 2**16, f"MASTER_PORT={port}: rank 0's port, which every process "
                "reaches, from 1 to 65535 (torchrun's default: 29500)"),
               (rank >= world, f"RANK={rank} is outside WORLD_SIZE={world}: each process a place "
                "from 0 to WORLD_SIZE-1"),
               (local >= processes, f"LOCAL_RANK={local} is outside {node}={processes}: this "
                "node's processes")])


def raise_group_failure(error: BaseException, step: int) -> None:
    """A collective that failed because a peer died or stalled, as one line naming this rank and
    the step (a traceback would say nothing); any other error is left to its caller."""
    text = " ".join(str(error).split())[:200]
    words = ("closed by peer", "connection reset", "broken pipe", "timed out", "timeout", "nccl",
             "gloo", "watchdog", "process group")  # a collective whose peer is gone
    if isinstance(error, torch.distributed.DistError) or any(w in text.lower() for w in words):
        raise RunError(f"rank {os.environ.get('RANK')} stopped at step {step}: the process group "
                       f"failed ({text}); another rank died or stalled, and its own output says "
                       "why") from None


@contextlib.contextmanager
def group_failure_in_one_line():
    try:
        yield
    except (RuntimeError, torch.distributed.DistError) as error:
        raise_group_failure(error, step=0)
        raise


def cuda_device(index: int) -> torch.device:
    """cuda:<index>, or the CPU on a machine without CUDA."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if index >= torch.cuda.device_count():
        raise UsageError(f"--gpu_devices: there is no GPU {index} (GPUs 0-"
                         f"{torch.cuda.device_count() - 1} are visible)", rank_specific=True)
    return torch.device("cuda", index)


def workers(given: int | None) -> int:
    """DataLoader workers a process: `given` (at most twice the cores: each is a process of its
    own), or the process's share of the cores less one for itself, at most 4."""
    cores, processes = len(os.sched_getaffinity(0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if given is not None and given > 2 * cores:
        each = f" for each of {plural(processes, 'process')}" * (processes > 1)
        raise UsageError(f"-j {given}: {plural(cores, 'core')} can run about "
                         f"{plural(cores // processes, 'worker')}{each}: give at most {2 * cores}")
    return given if given is not None else max(0, min(4, cores // processes - 1))


def leave_stops_to_main(worker_id: int) -> None:
    """A DataLoader's worker_init_fn: Ctrl-C signals a terminal's whole group, SLURM and a
    container's stop every process; a worker ignores them and its main process stops at its next
    window. It still ends on its main process's SIGTERM, as a DataLoader ends it."""
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # waited for below, by sender
    main = multiprocessing.parent_process().pid

    def end_on_the_main_processs_sigterm():
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != main:
            pass
        os._exit(0)  # as torch's own handler ends a worker on it

    threading.Thread(target=end_on_the_main_processs_sigterm, daemon=True).start()


# ------------------------------------------------------------------------------------------- data
def check_image_folder(root: Path) -> str:
    """What ImageFolder takes in silence or with a traceback, refused in one line before anything
    is written; returned, the training images in a line a resume compares (their classes, and a
    digest of each file's name and size). Every image is read by one rank a node, LOCAL_RANK 0."""
    splits, files, filled = [root / "train", root / "val"], [], set()
    missing = next((split for split in splits if not split.is_dir()), None)
    refuse_if([(missing, f"--dataset imagefolder: {missing} is not a folder: put the images in "
                f"{root}/train/<class>/ and {root}/val/<class>/")])
    for split in splits:
        for top, folders, names in os.walk(split, followlinks=True):  # as ImageFolder walks it
            here, depth = Path(top), len(Path(top).relative_to(split).parts)
            above = {path.resolve() for path in [here, *here.parents[:depth]]}  # up to the split
            loop = next((here / name for name in folders if (here / name).resolve() in above), None)
            refuse_if([(loop, f"--dataset imagefolder: {loop} is a link to "
                        f"{loop and os.readlink(loop)}, a folder it is in (a loop): remove it")])
            images = [here / name for name in names if Path(name).suffix.lower() in IMAGES]
            files += [(split, path) for path in images if depth]
            filled |= {(split, here.relative_to(split).parts[0])} if images and depth else set()
    dangling = next((path for split in splits for path in split.iterdir()
                     if path.is_symlink() and not path.exists()), None)
    classes = [sorted(path.name for path in split.iterdir() if path.is_dir()) for split in splits]
    nfc = [sorted(unicodedata.normalize("NFC", name) for name in names) for names in classes]
    refuse_if([(dangling, f"{dangling} is a link to {dangling and os.readlink(dangling)}, which "
                "is not there: mend or remove it"),
               (classes != nfc, f"--dataset imagefolder: a class folder of {root} is named in "
                "decomposed Unicode (another split, or a copy, may name it composed): rename it")])
    empty = next((split / name for split in splits for name in classes[0]
                  if (split, name) not in filled), None)
    refuse_if([(classes[0] != classes[1] or len(classes[0]) < 2, f"--dataset imagefolder: train/ "
                f"has the classes {classes[0][:5]} and val/ {classes[1][:5]}: give both the same "
                "class folders, two at least"),
               (empty, f"--dataset imagefolder: {empty} holds no image ({', '.join(IMAGES)}): put "
                "images in it, or remove it")])
    if os.environ.get("LOCAL_RANK", "0") == "0":  # the others would read them all again
        with ThreadPoolExecutor(16) as pool:  # they wait on the disk, or decode in PIL (no GIL)
            why = list(pool.map(unreadable, [path for _, path in files]))
        bad = next(((path, reason) for (_, path), reason in zip(files, why) if reason), None)
        refuse_if([(bad, f"--dataset imagefolder: {bad and bad[0]} cannot be read as an image "
                    f"({bad and bad[1]}): replace it with a readable image, or delete it")])
    train = sorted((path.relative_to(root).as_posix(), path.stat().st_size)
                   for split, path in files if split == splits[0])
    digest = hashlib.sha256(repr(train).encode()).hexdigest()[:12]
    return f"{len(train)} images in {len(classes[0])} classes, digest {digest}"


def unreadable(path: Path) -> str | None:
    """Why PIL cannot read the image `path` to its end (None: it can): a PNG or a JPEG must end
    with its end marker, which one cut short lacks; any other is decoded in full."""
    from PIL import Image

    try:
        with Image.open(path) as image, open(path, "rb") as file:
            file.seek(max(0, os.fstat(file.fileno()).st_size - 4096))
            marker = {"PNG": b"IEND", "JPEG": b"\xff\xd9"}.get(image.format)
            if marker is None or marker not in file.read():
                image.load()
    except Exception as error:  # OSError, SyntaxError, ValueError, DecompressionBombError
        return " ".join(str(error).replace(str(path), "").split()).strip(" :'")[:160] or repr(error)
    return None


def downloaded(kind, root: Path, train: bool):
    """kind(root, train=train, download=True): torchvision's CIFAR10 or MNIST, downloaded into
    `root` when missing; offline, cut short or damaged, one line saying what to put where."""
    try:
        split = kind(root, train=train, download=True)
        refuse_if([(len(split.data) != len(split.targets), f"{len(split.targets)} labels for "
                    f"{len(split.data)} images")])  # torchvision's MNIST reads them unchecked
        return split
    except (OSError, RuntimeError, ValueError, EOFError, AssertionError, IndexError, KeyError,
            UsageError, pickle.UnpicklingError) as error:  # what a cut or foreign file raises
        lines = [line for line in str(error).splitlines() if line.strip()] or [repr(error)]
        if hasattr(kind, "tgz_md5"):  # CIFAR-10: its archive, extracted where it lies
            where, files, source = root, kind.filename, kind.url
        else:  # MNIST: its four files in <root>/MNIST/raw
            where, source = root / kind.__name__ / "raw", kind.mirrors[0]
            files = ", ".join(name for name, _ in kind.resources)
        raise UsageError(f"--data_dir {root}: {kind.__name__} could not be read there nor "
                         f"downloaded ({' '.join(lines[-1].split())[:160]}): put {files} from "
                         f"{source} into {where}/ (a damaged copy deleted first), or train "
                         "offline with --dataset synthetic") from None


def synthetic_images(count: int, seed: int, split: str, classes: int = 10, side: int = 32):
    """(uint8 images, labels), offline: each class a smooth random pattern, each image its class's
    with random contrast, brightness and noise."""
    patterns = torch.rand(classes, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    patterns = torch.nn.functional.interpolate(patterns, size=side, mode="bilinear")
    draws = torch.Generator().manual_seed(2 * seed + (1 if split == "train" else 2))
    labels = torch.randint(classes, (count,), generator=draws)
    contrast = 0.6 + 0.4 * torch.rand(count, 1, 1, 1, generator=draws)
    brightness = 0.2 * torch.rand(count, 1, 1, 1, generator=draws) - 0.1
    noise = 0.4 * torch.randn(count, 3, side, side, generator=draws)
    images = (patterns[labels] - 0.5) * contrast + 0.5 + brightness + noise
    return images.clamp(0, 1).mul(255).round().to(torch.uint8), labels


class Augmented(torch.utils.data.Dataset):
    """dataset[i] through `transform`, drawing from (seed, epoch, i): the same crop whichever
    worker, rank or resumed run loads it. set_epoch before an epoch's iterator (workers copy it)."""

    def __init__(self, dataset, transform, seed: int):
        self.dataset, self.transform, self.seed, self.epoch = dataset, transform, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        image, label = self.dataset[index]
        with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
            key = f"{self.seed}/{self.epoch}/{index}".encode()
            torch.manual_seed(int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "big"))
            return self.transform(image), int(label)


# -------------------------------------------------------------------------- run folder, checkpoints
_held = []  # the run folder's lock, open for as long as this process runs


def claim_run_folder(folder: Path, resume, overwrite: bool) -> Path:
    """The run's `folder`, made anew (continued by `resume`; a run's emptied by `overwrite`) and
    locked: this process's alone."""
    own = Path(resume).absolute().parent if resume not in (None, "auto") else None
    go_on = " (--resume auto continues its training)" * (folder / "checkpoint.pt").exists()
    refuse_if([
        (folder.is_symlink() or folder.exists() and not folder.is_dir(), f"{folder} is a link or a "
         "file, not a run folder: give another --run_name"),
        (folder.is_dir() and own and own.resolve() != folder.resolve(), f"run folder {folder} "
         f"exists already, another run's than {resume}: give a new --run_name, or --run_name "
         f"{shlex.quote(own and own.name)} --log_dir {shlex.quote(str(own and own.parent))} to "
         "continue in the checkpoint's folder"),
        (folder.is_dir() and not (resume or overwrite), f"run folder {folder} exists already: give "
         f"another --run_name, or --overwrite to empty it{go_on}"),
        (folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).is_file(), f"{folder} "
         f"is not a run folder (it has no {MARKER}): it is left as it is; give another "
         "--run_name")])
    try:
        folder.mkdir(parents=True, exist_ok=bool(resume or overwrite))
    except FileExistsError as error:
        link = Path(error.filename)  # a link to nothing on the way, or a run's folder just made
        if link.is_symlink() and not link.exists():
            raise RunError(f"{link} is a link to {os.readlink(link)}, which is not there: mend "
                           "or remove it, or give another --log_dir") from None
        raise UsageError(f"run folder {folder} was made by another run a moment ago: give "
                         "another --run_name") from None
    lock = open(folder / LOCK, "a+")
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a POSIX lock: it dies with its process
    except (BlockingIOError, PermissionError):
        lock.seek(0)
        raise UsageError(f"run folder {folder} is in use by a run still running (pid "
                         f"{lock.read().strip()}): wait for it, or give another "
                         "--run_name") from None
    except OSError:  # a file system without locks (some NFS mounts): the exclusive mkdir guards
        pass
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    _held.append(lock)
    (folder / MARKER).write_text("A run folder of pytorch-multigpu: --overwrite may empty it.\n")
    for path in folder.iterdir():  # a killed writer's temporary files; --overwrite: all but these
        if path.name.endswith(".tmp") or overwrite and path.name not in (LOCK, MARKER):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    best = own and own / "best.pt"
    if best and best.is_file() and own.resolve() != folder.resolve():
        shutil.copyfile(best, folder / "best.pt")  # a checkpoint continued elsewhere: its best too
    return folder


def default_run_name(mode: str, gpus: int) -> str:
    """<mode>-<n>gpu-<date>-<time>-<pid>: two runs started in one second differ."""
    devices = f"{gpus}gpu" if gpus else "cpu"
    return f"{mode}-{devices}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def checkpoint_to_resume(resume: str | None, folder: Path, config: dict, must_match) -> dict | None:
    """The checkpoint --resume names, read with weights_only=True and checked (format, checksum,
    the flags in `must_match`); None: a fresh start. `auto`: `folder`'s, if any, never replacing
    an earlier run's results or weights."""
    path = folder / "checkpoint.pt" if resume == "auto" else Path(resume or "")
    earlier = [name for name in ("results.json", "best.pt", "model.pt") if (folder / name).exists()]
    if resume is None or resume == "auto" and not path.exists():
        refuse_if([(resume and earlier, f"--resume auto: {folder} has no checkpoint.pt but an "
                    f"earlier run's {earlier[:1]}: give another --run_name, or --overwrite to "
                    "start afresh")])
        return None
    try:
        state = read_weights_only(path)
    except Exception:  # missing, cut short, or another kind of file
        raise UsageError(f"--resume: {path} is no intact checkpoint; give the checkpoint.pt a run "
                         "wrote (the last one stays until a new one is whole)") from None
    given = state.get("format") if isinstance(state, dict) else None
    named = {name: "the images:" if name == "data" else f"--{name}" for name in must_match}
    differ = given == FORMAT and [f"{named[name]} {state['config'].get(name)} (now "
                                  f"{config.get(name)})" for name in must_match
                                  if state["config"].get(name) != config.get(name)]
    refuse_if([
        (given != FORMAT, f"--resume: {path} is in the format {given!r}; this version reads "
         f"{FORMAT!r} only (a model.pt holds weights: give it to --evaluate); start afresh"),
        (given == FORMAT and state.pop("checksum", None) != checksum(state), f"--resume: {path} is "
         "damaged: its contents do not match their checksum; resume from another copy, or start "
         "afresh"),
        (differ, f"--resume: {path} was written by another run: {', '.join(differ or [])}; resume "
         "with the flags it was written with")])
    return {**state, "file": str(path)}


def has_ended(checkpoint: dict | None, epochs: int, max_steps: int) -> bool:
    """Whether `checkpoint` has all its steps trained and evaluated, said in one line; if not, a
    resume to fewer epochs than its run was to train is refused (more: the schedule stretches)."""
    progress = (checkpoint or {}).get("progress")
    ended = progress is not None and progress["tested_step"] == progress["step"] and (
        progress["epoch"] >= epochs or 0 < max_steps <= progress["step"])
    if ended:
        print(f"{checkpoint['file']}: this run has ended (step {progress['step']}): nothing left "
              "to train; a larger --epochs or --max_steps trains on", flush=True)
        return True
    trained = checkpoint["config"]["epochs"] if checkpoint else epochs
    refuse_if([(epochs < trained, f"--epochs {epochs}: the run was to train {trained}; a resumed "
                "run may train longer, never shorter")])
    return False


def resumed_line(checkpoint: dict, epochs: int) -> str:
    """The first line of a resumed run: where it resumed, and a longer schedule's change."""
    trained = checkpoint["config"]["epochs"]
    longer = f"; --epochs {trained} made {epochs}, the rate's schedule with it" * (
        trained != epochs)
    return f"resumed at step {checkpoint['progress']['step']} from {checkpoint['file']}{longer}"


def checksum(value, digest=None) -> str:
    """SHA-256 of every tensor's bytes and every value: torch.load checks none."""
    digest = digest or hashlib.sha256()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, (dict, list, tuple)):
        items = sorted(value.items(), key=repr) if isinstance(value, dict) else enumerate(value)
        digest.update(f"{type(value).__name__} {len(value)};".encode())
        for key, item in items:
            checksum(key, digest)
            checksum(item, digest)
    else:  # str, int, float (its repr is exact), bool, None
        digest.update(f"{type(value).__name__} {value!r};".encode())
    return digest.hexdigest()


def write_atomically(path: Path, write) -> Path:
    """write(file) into a temporary file, fsync, rename: never half a file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as error:  # named by the file it is about, not by its stand-in
        raise OSError(error.errno, error.strerror, str(path)) from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return path


def copy_atomically(source: Path, target: Path) -> Path:
    """`source` copied to `target` as write_atomically writes it: never half a copy."""
    return write_atomically(target, lambda file: file.write(Path(source).read_bytes()))


def save_checkpoint(path: Path, state: dict) -> Path:
    """`state` sealed with its format and checksum, atomically; NaN weights never replace good."""
    if not all(value.isfinite().all() for value in state["model"].values()
               if value.is_floating_point()):
        raise RunError(f"the weights are NaN/inf at step {state['progress']['step']}: the training "
                       f"diverged; {path} is left as it was; try a lower --lr")
    sealed = {**state, "format": FORMAT}
    sealed["checksum"] = checksum(sealed)
    return write_atomically(path, lambda file: torch.save(sealed, file))


def read_weights_only(path) -> object:
    """torch.load(weights_only=True), silent: a raw pickle's protocol warning would come first."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        return torch.load(path, map_location="cpu", weights_only=True)


def load_weights(path: str, load) -> None:
    """A model.pt's or a checkpoint's weights handed to `load` (a model's load_state_dict), or
    a refusal in one line."""
    try:
        state = read_weights_only(path)
        state = state.get("model", state)
        load({key.removeprefix("module."): value for key, value in state.items()})
    except Exception as error:
        raise UsageError(f"--evaluate: {path} holds no weights of this model "
                         f"({(str(error) or repr(error)).splitlines()[0][:100]}): give a model.pt "
                         "or checkpoint.pt a run of these model flags wrote") from None


def rng_states() -> dict:
    """This process's torch and CUDA generators: the only ones training draws from."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][:torch.cuda.device_count()])


@contextlib.contextmanager
def optimizer_as_built(optimizer: torch.optim.Optimizer):
    """Around loading an optimizer's state: it keeps this run's kernels (fused, foreach: a CPU
    run's checkpoint resumed on a GPU) and each buffer its parameter's strides (the other
    --channels_last: fused SGD refuses a buffer laid out unlike its parameter)."""
    built = [{key: group[key] for key in ("fused", "foreach") if key in group}
             for group in optimizer.param_groups]
    yield
    for group, flags in zip(optimizer.param_groups, built):
        group.update(flags)
        for param in group["params"]:
            state = optimizer.state[param]
            for name, value in state.items():
                if torch.is_tensor(value) and value.shape == param.shape and \
                        value.stride() != param.stride():
                    state[name] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def plural(number: int, noun: str) -> str:
    """"1 worker", "2 workers", "2 processes": a count as a sentence says it."""
    return f"{number} {noun}{('es' if noun.endswith('s') else 's') * (number != 1)}"


def images(count: int) -> str:
    return plural(count, "image")


# ---------------------------------------------------------------------------- timing and telemetry
class StepTimer:
    """Step time and data wait on the device's clock (CUDA events; perf_counter on the CPU), read
    once a window. Untimed: this attempt's first `warmup_steps` (autotuning, compiling), and the
    steps profile=(first, last, trace path) of the run, which torch.profiler records, each in a
    "step N" range. The peak memory is reset after the warm-up. snapshot=(N, path): the CUDA
    allocator's history of the run's first N steps, for pytorch.org/memory_viz."""

    def __init__(self, device: torch.device, warmup_steps: int, step: int, profile=None,
                 snapshot=None):
        self.device, self.cuda, self.warmup_steps = device, device.type == "cuda", warmup_steps
        self.step, self.steps, self.pending, self.step_seconds = step, 0, [], []
        self.profile, self.snapshot, self.profiler = profile, snapshot, None
        self.first_step_s = None
        if snapshot and step < snapshot[0]:
            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def timed(self, batches):
        """`batches`, each marked when it is asked for and when it is there."""
        iterator = iter(batches)
        while True:
            if self.profile and self.step + 1 == self.profile[0]:
                self.profiler = torch.profiler.profile(activities=[
                    torch.profiler.ProfilerActivity.CPU, *[torch.profiler.ProfilerActivity.CUDA]
                    * self.cuda])
                self.profiler.start()
            if self.profiler is not None:
                self.range = torch.profiler.record_function(f"step {self.step + 1}")
                self.range.__enter__()
            start, self.asked = self.mark(), time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                return
            self.marks = (start, self.mark())
            yield batch

    def step_done(self) -> None:
        self.step, self.steps, done = self.step + 1, self.steps + 1, self.mark()
        if self.steps == 1 and self.cuda:
            torch.cuda.synchronize(self.device)
        self.first_step_s = self.first_step_s or time.perf_counter() - self.asked
        if self.steps == self.warmup_steps and self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.snapshot and self.step == self.snapshot[0]:
            self.close()
        if self.profiler is None and self.steps > self.warmup_steps:
            self.pending.append((*self.marks, done))
        elif self.profiler is not None:
            self.range.__exit__(None, None, None)
            if self.step == self.profile[1]:  # the trace, for Perfetto and comparison/'s split
                self.close()

    def window(self) -> list[float]:
        """[timed steps, their seconds, of which waiting for data] since the last call: one sync."""
        if self.pending and self.cuda:
            self.pending[-1][2].synchronize()
        seconds = (lambda a, b: a.elapsed_time(b) / 1e3) if self.cuda else (lambda a, b: b - a)
        steps = [seconds(start, done) for start, _, done in self.pending]
        data = sum(seconds(start, ready) for start, ready, _ in self.pending)
        self.step_seconds, self.pending = self.step_seconds + steps, []
        return [float(len(steps)), sum(steps), data]

    def close(self) -> None:
        """The memory snapshot and the trace: at their last step, or what a shorter run holds."""
        if self.snapshot and self.steps:
            torch.cuda.memory._dump_snapshot(str(self.snapshot[1]))
            torch.cuda.memory._record_memory_history(enabled=None)
            print(f"memory snapshot of {self.step} steps: {self.snapshot[1]} (open it in "
                  "pytorch.org/memory_viz)", flush=True)
            self.snapshot = None
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler.export_chrome_trace(str(self.profile[2]))
            self.profile, self.profiler = (*self.profile[:2], None), None


class GpuMonitor:
    """window(): {CUDA index: (utilisation %, memory GiB)}, means of NVML's readings every 0.1 s
    ("a kernel ran", not efficiency), each GPU found by its UUID (right under
    CUDA_VISIBLE_DEVICES); mean(): the run's. Without NVML: None."""

    def __init__(self, gpus):
        self.gpus, self.sums, self.run, self.lock = list(gpus), {}, [0.0, 0], threading.Lock()
        self.stopped, self.handles = threading.Event(), {}
        with contextlib.suppress(Exception):  # no driver or no library: no readings
            import pynvml

            pynvml.nvmlInit() if self.gpus else None
            uuids = [str(torch.cuda.get_device_properties(gpu).uuid) for gpu in self.gpus]
            self.handles = {gpu: pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid[:4] in (
                "GPU-", "MIG-") else f"GPU-{uuid}") for gpu, uuid in zip(self.gpus, uuids)}
            self.nvml = pynvml
        if self.handles:
            threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while not self.stopped.wait(0.1):
            for gpu, handle in self.handles.items():
                with contextlib.suppress(Exception), self.lock:
                    reading = (self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                               self.nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30, 1)
                    self.sums[gpu] = [a + b for a, b in zip(self.sums.get(gpu, (0, 0, 0)), reading)]

    def window(self) -> dict:
        with self.lock:
            sums, self.sums = self.sums, {}
        self.run = [self.run[0] + sum(s[0] for s in sums.values()),
                    self.run[1] + sum(s[2] for s in sums.values())]
        return {gpu: (sums[gpu][0] / sums[gpu][2], sums[gpu][1] / sums[gpu][2]) if gpu in sums
                else (None, None) for gpu in self.gpus}

    def mean(self) -> float | None:
        return self.run[0] / self.run[1] if self.run[1] else None

    def close(self) -> None:
        self.stopped.set()


def peak_memory_gb(gpus) -> dict:
    """{CUDA index: [allocated, reserved]}: the caching allocator's high-water marks, in GiB."""
    return {str(gpu): [torch.cuda.max_memory_allocated(gpu) / 2**30,
                       torch.cuda.max_memory_reserved(gpu) / 2**30] for gpu in gpus}


# ------------------------------------------------------------------------------------------ run log
class RunLog:
    """The main process's lines, TensorBoard scalars and results.json; `totals` adds up every
    window. No folder: nothing (every rank but 0). The events are written here, not by a thread
    behind a queue (SummaryWriter's), and flushed each call: a killed run keeps every point; a
    resumed one purges what came after its checkpoint."""

    def __init__(self, run_dir: Path | None, config: dict, checkpoint: dict | None = None):
        self.run_dir, self.config, self.writer, self.last_test = run_dir, config, None, {}
        self.totals, self.epoch, self.epoch_totals = [0.0] * len(WINDOW), None, [0.0] * len(WINDOW)
        if run_dir is not None:
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto.event_pb2 import Event, SessionLog
            from tensorboardX.summary import text

            # named by the nanosecond: an attempt resumed in the second of the one it follows
            # opens a file of its own ("wb" would empty that one's)
            self.writer = EventsWriter(str(run_dir / "events"), f".{time.time_ns()}")
            purge = checkpoint["progress"]["step"] + 1 if checkpoint else None
            if purge is not None:  # TensorBoard drops the points from this step on
                self.write(Event(step=purge, session_log=SessionLog(status=SessionLog.START)))
            self.write(Event(step=purge or 0, summary=text("config", json.dumps(config, indent=1))))
            self.writer.flush()

    def write(self, event) -> None:
        event.wall_time = time.time()
        self.writer.write_event(event)

    def line(self, text: str) -> None:
        if self.run_dir is not None:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        if self.run_dir is not None:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    def scalars(self, step: int, values: dict) -> None:
        if self.writer is not None:
            from tensorboardX.proto.event_pb2 import Event
            from tensorboardX.summary import scalar

            for tag, value in values.items():
                if value is not None:
                    self.write(Event(step=step, summary=scalar(tag, value)))
            self.writer.flush()  # on disk before training goes on

    def window(self, step: int, epoch: int, sums: list, global_batch: int, where: str,
               **more) -> None:
        """A window's sums (WINDOW) on TensorBoard with `more` and in a line; NaN ends the run."""
        self.totals = [a + b for a, b in zip(self.totals, sums)]
        if epoch != self.epoch:
            self.epoch, self.epoch_totals = epoch, [0.0] * len(WINDOW)
        self.epoch_totals = [a + b for a, b in zip(self.epoch_totals, sums)]
        loss_sum, correct, images, steps, seconds, data = sums[:len(WINDOW)]
        if not math.isfinite(loss_sum):
            raise RunError(f"the training loss became NaN/inf by step {step}: stopped, the last "
                           "checkpoint as it was; try a lower --lr")
        timed = {"time/step_s": seconds / steps, "time/data_wait_s": data / steps,
                 "time/data_wait_pct": 100 * data / seconds,
                 "throughput/images_per_s": global_batch * steps / seconds} if steps else {}
        self.scalars(step, {"train/loss": loss_sum / images, "train/acc_pct": 100 * correct /
                            images, **timed, **more})
        timing = (f"batch {seconds / steps:.3f}s data {100 * data / seconds:.1f}% "
                  f"{global_batch * steps / seconds:.0f} img/s" if steps else "warming up")
        self.line(f"{where} loss {loss_sum / images:.3f} acc {100 * correct / images:.2f}% "
                  f"{timing}")

    def tested(self, test: dict, progress: dict, batches: int, epochs: int) -> bool:
        """An evaluation, said and into `progress` (a whole epoch: as the next one's start);
        whether it is the best so far."""
        self.last_test, progress["tested_step"] = test, progress["step"]
        best = progress["best_acc"] is None or test["test_acc"] > progress["best_acc"]
        if best:
            progress.update(best_acc=test["test_acc"], best_epoch=progress["epoch"] + 1)
        self.scalars(progress["step"], {"test/loss": test["test_loss"],
                                        "test/acc_pct": 100 * test["test_acc"]})
        cut = "" if progress["batch"] == batches else f" ({progress['batch']}/{batches} batches)"
        self.line(f"Epoch {progress['epoch'] + 1}/{epochs} test loss {test['test_loss']:.3f} acc "
                  f"{100 * test['test_acc']:.2f}% ({images(test['test_images'])}){cut}")
        if progress["batch"] == batches:
            progress.update(epoch=progress["epoch"] + 1, batch=0)
        return best

    def results(self, summary: dict, **extra) -> None:
        """<run folder>/results.json: `extra`, the config, the environment, `summary`."""
        if self.run_dir is None:
            return
        env = {"torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
               "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
               "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
               "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
        text = json.dumps({**extra, "config": self.config, "env": env, "summary": summary},
                          indent=2).encode()
        path = write_atomically(self.run_dir / "results.json", lambda file: file.write(text))
        self.line(f"results in {path}")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def speed_summary(log: RunLog, timer: StepTimer, global_batch: int, devices: int, flops: int,
                  peak: tuple, monitor: GpuMonitor, gpus) -> dict:
    """results.json's speed figures from the run's windows, its timer and `peak` (for MFU)."""
    _, _, _, steps, seconds, data = log.totals
    loss_sum, correct, images = log.epoch_totals[:3]
    peaks = list(peak_memory_gb(gpus).values())
    rate = global_batch * steps / seconds if steps else None
    p50, p90 = np.percentile(timer.step_seconds, [50, 90]).tolist() if steps else (None, None)
    mfu = rate / devices * flops / (peak[0] * 1e12) if rate and peak[0] else None
    return {"images_per_sec": rate, "images_per_sec_per_gpu": rate and rate / devices,
            "batch_time_p50": p50, "batch_time_p90": p90, "timed_steps": int(steps),
            "data_wait_frac": data / seconds if steps else None, "flops_per_image": flops,
            "mfu": mfu, "mfu_note": None if mfu else peak[1] or "no timed steps",
            "first_step_s": timer.first_step_s, "gpu_util_mean": monitor.mean(),
            "peak_mem_gb": max((p[0] for p in peaks), default=None),
            "peak_mem_reserved_gb": max((p[1] for p in peaks), default=None),
            "train_loss": loss_sum / images if images else None,
            "train_acc": correct / images if images else None,
            "profiled_steps": list(timer.profile[:2]) if timer.profile else None}


# ------------------------------------------------------------------------------------- model facts
@torch.no_grad()
def precise_batchnorm(model: torch.nn.Module, batches, device, memory_format, images=8192):
    """Every BatchNorm's statistics made those of the weights as they are, over the first `images`
    training images (PreciseBN: Wu & Johnson, 2021); the running ones average ten steps' batches,
    each of its own weights: on a small folder early on, far from any (BENCHMARKS.md)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    kept = [(norm.momentum, norm.num_batches_tracked.clone()) for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average
    model.train()
    for seen, (batch, _) in enumerate(batches):
        model(batch.to(device, non_blocking=True, memory_format=memory_format))
        if (seen + 1) * len(batch) >= images:
            break
    for norm, (momentum, tracked) in zip(norms, kept):
        norm.momentum = momentum
        norm.num_batches_tracked.copy_(tracked)


def parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters as its state dict holds them (a fast path may store them padded)."""
    state = model.state_dict()
    return sum(state[name].numel() for name, _ in model.named_parameters())


def flops_per_image(model: torch.nn.Module, images: torch.Tensor) -> int:
    """One training image's FLOPs, forward and backward, counted by FlopCounterMode on `model`
    itself (in eval mode: no statistic moves), before it is wrapped or sharded."""
    from torch.utils.flop_counter import FlopCounterMode

    training = model.training
    with FlopCounterMode(display=False) as counter:
        model.eval()(images).float().sum().backward()
    model.train(training).zero_grad(set_to_none=True)
    return counter.get_total_flops() // len(images)


# Dense peak TFLOP/s (bf16/fp16, TF32: --amp off computes in TF32 on a GPU), from NVIDIA's
# datasheets (SXM unless named; no sparsity)
PEAK_TFLOPS = {"H100 PCIe": (756.5, 378.0), "H100 NVL": (835.5, 417.5), "H200 NVL": (835.5, 417.5),
               "GH200": (989.4, 494.7), "H100": (989.4, 494.7), "H200": (989.4, 494.7),
               "GB200": (2500.0, 1250.0), "B200": (2250.0, 1125.0), "A100": (312.0, 156.0),
               "L40S": (362.05, 183.0), "L4": (121.0, 60.0), "A10": (125.0, 62.5)}


def peak_tflops(device: torch.device, amp: str) -> tuple[float | None, str | None]:
    """(the GPU's dense peak TFLOP/s for `amp`, why there is none)."""
    if device.type != "cuda":
        return None, "CPU: MFU is measured against a GPU's peak"
    words = torch.cuda.get_device_name(device).replace("-", " ").split()
    if "MIG" in words:
        return None, "a MIG slice: a fraction of the chip, whose peak is not known"
    peaks = next((peaks for key, peaks in PEAK_TFLOPS.items()
                  if all(word in words for word in key.split())), None)
    return (peaks[amp == "off"], None) if peaks else (None, f"no peak known for {' '.join(words)}")

"""Checkpoints that resume bit-identically, and stopping cleanly on SIGTERM / SIGINT.

A checkpoint is everything the rest of the run depends on: the unwrapped model, the optimizer, the
learning-rate schedule, the GradScaler, the position (epoch, batches done in it, optimizer steps),
the best test accuracy so far, every rank's RNG states (torch, CUDA, numpy, python), the config, the
run's history (its seconds so far and the epoch's log windows, so that the results of a resumed run
cover the whole run), its extensions (each time --epochs was raised on resuming) and, for an image
folder, its classes in order and each class's files (`data_record`: a resume on a folder changed
since, images added or a class renamed, is refused in one line saying what changed). It is written
by the main process only, atomically (temporary file, fsync, rename), as <run folder>/checkpoint.pt
(the latest) and best.pt (the best test accuracy so far), with the SHA-256 of its contents, checked
on loading. Everything in it is a tensor or a plain Python value, so it loads with
`torch.load(weights_only=True)`: a checkpoint file cannot run code. A checkpoint that does not fit
the run resuming it is refused in one line naming the entry, before anything is written
(load_checkpoint, check_fits). What writes a run's checkpoint and restores one into it
(save_checkpoint, restore) takes the training loop's state, and lives beside it in common/loop.py.

Resuming restores all of it, and the loaders skip the batches the epoch had already consumed. Their
crops and flips are a function of (seed, epoch, image index) alone (common/augmentation.py), so the
remaining images are augmented as before whatever the loader and the number of DataLoader workers,
and a resumed run ends with the weights the uninterrupted run would have had: bit for bit with one
or two processes (on the CPU, or with --deterministic). With more, the first step after a resume
adds the ranks' gradients in another order (DDP lays out its gradient buckets anew in every process,
after its first step, and the all-reduce's order of additions follows the layout), and the weights
differ by float rounding: 2.4e-7 after 24 steps of 4 ranks on the CPU.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import shlex
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common.augmentation import explicit_augmentation
from common.config import MODEL_FLAGS, Config, RunError, UsageError, as_today
from common.errors import file_system_error
from common.folders import folder_change, folder_record
from common.logger import fresh_restart, logged_curves, write_atomically
from common.metrics import Sums
from common.state import load_file, load_optimizer_state
from models.aligned import paper_shapes

FORMAT = "pytorch-multigpu checkpoint v2"  # v2: with the checksum of its contents
# the same contents without a checksum: resumed, unverified
EARLIER_FORMAT = "pytorch-multigpu checkpoint v1"
LAST, BEST, RESULTS, MODEL = "checkpoint.pt", "best.pt", "results.json", "model.pt"
# The flags that decide what training computes: a checkpoint resumes only under the same values,
# except that --epochs may grow (the run is extended: extends). Flags of logging, speed measurement
# and hardware may change (a restart on other GPUs, a longer --max_steps).
MUST_MATCH = (*MODEL_FLAGS, "synthetic_size", "batch_size", "epochs", "lr", "lr_warmup_epochs",
              "momentum", "weight_decay", "nesterov", "shuffle", "augment", "flip", "seed", "amp")


# --------------------------------------------------------------------------------------- RNG states
def rng_state() -> dict:
    """This process's RNG states, as tensors and plain values (weights_only-loadable)."""
    _, keys, position, has_gauss, cached_gauss = np.random.get_state()
    version, python_state, python_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": ([state for state in torch.cuda.get_rng_state_all()]
                 if torch.cuda.is_available() else []),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gauss": float(cached_gauss)},
        "python": {"version": version, "state": list(python_state), "gauss": python_gauss},
    }


def all_rng_states() -> list[dict]:
    """Every rank's RNG states in rank order (gathered in a process
    group), or this process's alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return [rng_state()]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][:torch.cuda.device_count()])
    numpy = state["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached_gauss"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))


# ------------------------------------------------------------------------------------------ writing
def last_checkpoint_note(run_dir: Path | None) -> str:
    """Where the last good checkpoint is, for a message."""
    if run_dir is not None and (run_dir / LAST).exists():
        return f"the last good checkpoint is {run_dir / LAST}"
    return "no checkpoint was written before"


def write_checkpoint(run_dir: Path | None, state: dict, best: bool) -> Path | None:
    """checkpoint.pt, and best.pt when `best`; each replaced atomically, with the checksum of its
    contents. A process with no run folder (every rank but 0) writes nothing."""
    if run_dir is None:
        return None
    path = run_dir / LAST
    sealed = {**state, "checksum": checksum(state)}
    try:
        write_atomically(path, lambda f: torch.save(sealed, f))
        if best:
            with open(path, "rb") as latest:
                write_atomically(run_dir / BEST, lambda f: shutil.copyfileobj(latest, f))
    # a full or read-only disk: what is on it is still whole (write_atomically)
    except OSError as error:
        line = file_system_error(error)
        if line is None:
            raise
        raise RunError(f"could not write {line}; {last_checkpoint_note(run_dir)}; then continue "
                       f"with {continue_flags(run_dir)}") from None
    return path


def carry_best(state: dict, run_dir: Path) -> tuple[bool, str]:
    """The best.pt of the run that `state` (a checkpoint resumed) continues, into its folder
    `run_dir`: a run resumed from a checkpoint file into a new folder copies the best.pt beside
    that file when it holds the best epoch `state` names, so that the folder's best.pt holds the
    best its results report. Whether the folder holds it then (True also where there is no best
    yet), and what to say of it (empty: nothing)."""
    if state["best_acc"] < 0 or (run_dir / BEST).is_file():
        return True, ""
    source = Path(state["file"]).parent / BEST
    best = f"the best epoch's weights (epoch {state.get('best_epoch')})"
    if source.parent.resolve() == run_dir.resolve():
        return False, f"; {best} are not here: this folder's {BEST} is gone"
    try:
        saved = load_file(source)
        holds = (saved["best_acc"], saved.get("best_epoch")) == \
            (state["best_acc"], state.get("best_epoch"))
    except Exception:  # missing, or not a checkpoint: nothing to carry
        holds = False
    if not holds:
        return False, f"; {best} are in no {BEST}: {source} does not hold them"
    try:
        with open(source, "rb") as kept:
            write_atomically(run_dir / BEST, lambda f: shutil.copyfileobj(kept, f))
    except OSError as error:
        line = file_system_error(error)
        if line is None:
            raise
        raise RunError(f"could not write {line}") from None
    return True, f"; {BEST} (epoch {state.get('best_epoch')}) copied from {source}"


def continue_flags(run_dir: Path) -> str:
    """The flags that continue the run in `run_dir`, to add to the command that started it, ready to
    paste: the run's name quoted where a shell would split it."""
    return f"--resume auto --run_name {shlex.quote(run_dir.name)}"


def checksum(state: dict) -> str:
    """SHA-256 of a checkpoint's contents: every tensor's dtype, shape and bytes and every plain
    value, in a fixed order. torch.load checks no checksum of its own, so a byte flipped inside a
    tensor (a disk, a copy) would otherwise resume silently with a wrong weight or momentum."""
    digest = hashlib.sha256()
    _feed(digest, {key: value for key, value in state.items() if key not in ("checksum", "file")})
    return digest.hexdigest()


def _feed(digest, value) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)};".encode())
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)};".encode())
        for item in value:
            _feed(digest, item)
    else:  # str, int, float (repr is exact), bool, None
        digest.update(f"{type(value).__name__} {value!r};".encode())


# ------------------------------------------------------------------------------------------ reading
def resume_file(cfg: Config, run_dir: Path) -> Path | None:
    """The checkpoint --resume names: a path, or with `auto` this run's latest one (None if it has
    none yet: a first start, for instance the first attempt of an elastic job)."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        path = run_dir / LAST
        return path if path.exists() else None
    return Path(cfg.resume)


def resume_checkpoint(cfg: Config, run_dir: Path) -> dict | None:
    """The checkpoint this run resumes from, loaded and checked; None for a fresh start. With
    --resume auto, a run that finished and whose checkpoint.pt was deleted since (to save
    space) is known by its results.json: what it gives is a run that has ended, never a fresh
    start that would replace what it wrote. An unfinished one without its checkpoint.pt is
    refused (refuse_fresh_start)."""
    path = resume_file(cfg, run_dir)
    if path is None and cfg.resume == "auto" and (run_dir / RESULTS).is_file():
        return {"finished": True, "file": str(run_dir / RESULTS)}
    if path is None:
        refuse_fresh_start(cfg, run_dir)
    return load_checkpoint(path, cfg) if path is not None else None


def refuse_fresh_start(cfg: Config, run_dir: Path) -> None:
    """--resume auto on a folder without a checkpoint.pt starts the run afresh, which replaces
    what is there. A folder that holds an earlier run's work (best.pt, model.pt, TensorBoard
    curves) is refused in one line that says what is there and what to do, before anything is
    written: resume from best.pt where these flags can, another --run_name, or --overwrite. A
    later attempt of the job that started the run afresh (a requeue, an elastic restart) whose
    earlier attempts died before their first checkpoint starts afresh again: what they logged is
    lost with their steps (their curves are purged)."""
    if (cfg.resume != "auto" or not run_dir.is_dir() or (run_dir / LAST).exists()
        or (run_dir / RESULTS).exists()):
        return
    weights = [name for name in (BEST, MODEL) if (run_dir / name).is_file()]
    curves = logged_curves(run_dir)
    if not weights and (curves is None or fresh_restart(run_dir)):
        return
    held = [*weights, *([curves] if curves else [])]
    best = resumable(run_dir / BEST, cfg) if BEST in weights else None
    then = (f"continue from {BEST} (step {best['step']}) with --resume "
            f"{shlex.quote(str(run_dir / BEST))} in place of --resume auto, " if best else "")
    raise UsageError(f"--resume auto: run folder {run_dir} has no {LAST} to resume, but "
                     f"{' and '.join(held)} of an earlier run, which a fresh start would "
                     f"replace: {then}choose another --run_name, or start afresh with "
                     "--overwrite in place of --resume auto")


def resumable(path: Path, cfg: Config) -> dict | None:
    """The checkpoint at `path` if this run could resume from it (it loads, fits these flags,
    and has training left); None if not. --amp not yet resolved for a device (a launcher, before
    its workers) is not compared; --augment and --flip are made what they stand for."""
    cfg = explicit_augmentation(cfg)
    try:
        if cfg.amp is None:
            try:
                saved = load_file(path)["config"]["amp"]
            except Exception:  # whatever is wrong with the file, load_checkpoint says it
                saved = None
            cfg = dataclasses.replace(cfg, amp=saved)
        state = load_checkpoint(path, cfg)
    except UsageError:
        return None
    return None if has_ended(state, cfg) else state


# What checkpoint_state writes besides the format, and the type of each: a file
# without one is refused by its name.
CONTENTS = {"config": dict, "epoch": int, "batch": int, "step": int, "best_acc": (int, float),
            "model": dict, "optimizer": dict, "scheduler": dict, "scaler": dict, "rng": list,
            "history": dict}
# v1 checkpoints lack it: the results then cover the last attempt alone
NOT_IN_EARLIER_FORMAT = ("history",)
# What a checkpoint keeps of the attempt that trained, where the run's end is owed
# (Run.attempt_figures)
ATTEMPT_ENTRIES = {"mode", "devices", "summary", "peak_mem_gb_per_gpu",
                   "peak_mem_reserved_gb_per_gpu", "env", "traces"}


def load_checkpoint(path: Path, cfg: Config) -> dict:
    """A checkpoint read with weights_only=True, complete, and checked against this run's config;
    one-line errors (the format's name is no promise that every entry is there: a file edited by
    hand, or by another version)."""
    if not path.is_file():
        raise UsageError(f"--resume: no checkpoint at {path}; give a {LAST} a run wrote, or "
                         "--resume auto with the run's --run_name")
    try:
        state = load_file(path)
    # the weights-only unpickler refuses in many ways (EOFError, UnpicklingError, KeyError...)
    except Exception:
        raise UsageError(f"--resume: {path} is truncated or not a checkpoint; use an intact {LAST} "
                         "(the previous one is kept until a new one is complete)") from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, EARLIER_FORMAT):
        raise UsageError(f"--resume: {path} is not a checkpoint of this suite (a model.pt holds "
                         "only weights: use --evaluate for it)")
    if state["format"] == EARLIER_FORMAT:
        print(f"warning: {path} was written before checkpoints carried a "
              "checksum: resumed unverified",
              file=sys.stderr, flush=True)
    elif state.get("checksum") != checksum(state):
        raise UsageError(f"--resume: {path} is damaged: its contents do not match the checksum "
                         "written with them (a disk or copy error); resume from another copy "
                         f"({BEST}, say) or start afresh")
    for key, kind in CONTENTS.items():
        if state["format"] == EARLIER_FORMAT and key in NOT_IN_EARLIER_FORMAT:
            continue
        # rng: one entry per rank
        if not isinstance(state.get(key), kind) or key == "rng" and not state[key]:
            raise UsageError(f"--resume: {path} has {'a damaged' if key in state else 'no'} "
                             f"{key!r} entry; use a {LAST} as a run wrote it, or start "
                             "afresh without --resume")
    # a checkpoint from before a flag existed: the value it trained with
    saved = as_today(state["config"])
    absent = [name for name in MUST_MATCH if name not in saved]
    if absent:
        raise UsageError(f"--resume: {path} has no --{absent[0]} in its config; use a {LAST} as a "
                         "run wrote it, or start afresh without --resume")
    # first: a folder's batch follows its size (common/config.py, fit_batch)
    changed = folder_change(state.get("data"), cfg.data_dir) if cfg.dataset == "imagefolder" \
        else None
    if changed:
        raise UsageError(f"--resume: {path} was written on another image folder: {changed}; "
                         "resume on the folder as it was, or start a new run (another --run_name)")
    differ = [name for name in MUST_MATCH if _as_saved(getattr(cfg, name)) != saved.get(name)
              and not (name == "epochs" and extends(saved, cfg))]
    if differ:
        changes = ", ".join(f"--{name} {saved.get(name)} (now {getattr(cfg, name)})"
                            for name in differ)
        more = " (--epochs may be raised: that extends the run)" if "epochs" in differ else ""
        raise UsageError(f"--resume: {path} was written by a different run: {changes}; resume "
                         f"with the same flags{more}")
    wrong = misfit_entry(state, cfg)
    if wrong:
        raise UsageError(f"--resume: {path} has a damaged {wrong}; use a {LAST} as a run wrote it, "
                         "or start afresh without --resume")
    state["file"] = str(path)  # for messages; not written back
    return state


def data_record(cfg: Config) -> dict | None:
    """What a checkpoint records of the data it trained on beyond its flags: an image folder's
    classes and files (folder_record), which load_checkpoint compares with the folder a resume
    finds; None for the other datasets, which their flags decide."""
    return folder_record(cfg.data_dir) if cfg.dataset == "imagefolder" else None


def misfit_entry(state: dict, cfg: Config) -> str | None:
    """The first entry of `state` whose value no run under `cfg` could have written ("'name'
    entry (why)"), or None. Each would otherwise fail deep inside restore() with a
    traceback, or resume at a position that does not exist. What depends on the model and
    the loader is checked by check_fits."""
    epoch, batch, step, best = state["epoch"], state["batch"], state["step"], state["best_acc"]
    scheduler, scaler = state["scheduler"], state["scaler"]
    checks = [
        ("epoch", 0 <= epoch <= cfg.epochs,
         f"{epoch}, where this run has epochs 0 to {cfg.epochs}"),
        ("batch", batch >= 0, f"{batch}, a negative position"),
        ("step", step >= 0, f"{step}, a negative step count"),
        ("best_acc", -1 <= best <= 1, f"{best}, not an accuracy"),
        ("scheduler",
         scheduler.get("last_epoch") == step and isinstance(scheduler.get("base_lrs"), list),
         f"the schedule's position {scheduler.get('last_epoch')}, where the run is at step {step}"),
        ("scaler", cfg.amp != "fp16" or isinstance(scaler.get("scale"), float),
         "no loss scale, which --amp fp16 resumes"),
    ]
    checks += [(f"rng[{rank}]", _is_rng_state(entry), "not the random generators' states")
               for rank, entry in enumerate(state["rng"])]
    if "history" in state:
        checks.append(("history", _is_history(state["history"]),
                       "not the run's seconds and windows"))
    if "extended" in state:  # absent from checkpoints written before runs could be extended
        checks.append(("extended", _is_extensions(state["extended"]),
                       "not a list of the run's extensions"))
    # absent from checkpoints written before a stop could leave an epoch's end owed
    checks.append(("end_owed", isinstance(state.get("end_owed", False), bool), "not true or false"))
    attempt = state.get("trained_attempt")
    checks.append(("trained_attempt", attempt is None or isinstance(attempt, dict)
                   and ATTEMPT_ENTRIES <= attempt.keys() and isinstance(attempt["summary"], dict),
                   "not an attempt's figures"))
    return next((f"{name!r} entry ({why})" for name, holds, why in checks if not holds), None)


def _is_rng_state(entry) -> bool:
    """Whether `entry` has the shape rng_state() gives: what set_rng_state reads."""
    if not isinstance(entry, dict):
        return False
    numpy, python = entry.get("numpy"), entry.get("python")
    return (isinstance(entry.get("torch"), torch.Tensor) and entry["torch"].dtype == torch.uint8
            and isinstance(entry.get("cuda"), list) and isinstance(numpy, dict)
            and isinstance(python, dict) and isinstance(numpy.get("keys"), torch.Tensor)
            and numpy["keys"].numel() == 624
            and all(isinstance(numpy.get(key), int) for key in ("position", "has_gauss"))
            and isinstance(numpy.get("cached_gauss"), float)
            and isinstance(python.get("version"), int) and isinstance(python.get("state"), list)
            and len(python["state"]) == 625)


def _is_extensions(extended) -> bool:
    """Whether `extended` has the shape Run.extended gives it: what results.json repeats."""
    keys = {"at_step", "epochs_from", "epochs_to"}
    return isinstance(extended, list) and all(
        isinstance(entry, dict) and set(entry) == keys
        and all(isinstance(entry[key], int) for key in keys)
        for entry in extended)


def extends(saved: dict, cfg: Config) -> bool:
    """Whether `cfg` extends the run whose config a checkpoint saved: more --epochs than it
    was set to train. A run, ended or not, may be extended (--max_steps, a ceiling, may be
    raised anyway); the learning-rate schedule is then that of the new --epochs from the
    checkpoint's step on (restore)."""
    epochs = saved.get("epochs")
    return isinstance(epochs, int) and cfg.epochs > epochs


def _is_history(history: dict) -> bool:
    """Whether `history` has the shape checkpoint_state() gives it: what RunClock.load and
    restore() read. An epoch's seconds may be None (not known); the epochs' list may be longer than
    the epochs done, as an earlier version wrote it when --max_steps had cut an epoch
    (RunClock.load sorts that out)."""
    def seconds(value, unknown=False) -> bool:
        if value is None:
            return unknown
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and 0 <= value < math.inf)

    times, sums, attempts = (history.get("epoch_times_s"), history.get("epoch_sums"),
                             history.get("attempts"))
    return ((attempts is None or isinstance(attempts, int) and attempts >= 1)
            and seconds(history.get("wall_time_s"))
            and seconds(history.get("epoch_time_s"), unknown=True) and isinstance(times, list)
            and all(seconds(value, unknown=True) for value in times) and isinstance(sums, list)
            and len(sums) == Sums.SIZE and all(isinstance(value, (int, float)) for value in sums))


def check_fits(state: dict | None, raw_model: torch.nn.Module, steps_per_epoch: int) -> None:
    """Refuse, in one line naming the entry, a checkpoint to resume (`state`; None: a fresh
    start) whose weights or momentum do not have this model's names and shapes, or whose
    position lies past the end of this run's epoch. Called before the run folder is claimed, so
    a refusal leaves nothing behind."""
    if state is None:
        return
    expected = {name: tuple(shape) for name, shape in paper_shapes(raw_model).items()}
    saved = {name: tuple(value.shape) for name, value in state["model"].items()
             if torch.is_tensor(value)}
    wrong = next((name for name in expected.keys() | saved.keys()
                  if expected.get(name) != saved.get(name)), None)
    if wrong:
        refuse(state, f"its 'model' entry does not fit this model: {wrong} is "
                      f"{saved.get(wrong, 'missing')} where this model has "
                      f"{expected.get(wrong, 'none')}")
    # the optimizer's order
    shapes = [tuple(expected[name]) for name, _ in raw_model.named_parameters()]
    moments = state["optimizer"].get("state")
    groups = state["optimizer"].get("param_groups")
    positions = sorted(index for group in groups or [] for index in group.get("params", []))
    if not isinstance(moments, dict) or positions != list(range(len(shapes))):
        refuse(state, f"its 'optimizer' entry does not fit this model ({len(positions)} parameters "
                      f"where this model has {len(shapes)})")
    for index, buffers in moments.items():
        momentum = buffers.get("momentum_buffer") if isinstance(buffers, dict) else None
        if index not in range(len(shapes)) or not torch.is_tensor(momentum):
            refuse(state, f"its 'optimizer' entry holds no momentum for parameter {index}")
        if tuple(momentum.shape) != shapes[index]:
            refuse(state, "its 'optimizer' entry does not fit this model: parameter "
                          f"{index}'s momentum is {tuple(momentum.shape)} where the "
                          f"parameter is {shapes[index]}")
    # an epoch whose end a stop left owed is kept at its last batch
    last = steps_per_epoch if state.get("end_owed") else steps_per_epoch - 1
    if state["batch"] > last:
        refuse(state, f"its 'batch' entry ({state['batch']}) lies past the end of this run's epoch "
                      f"of {steps_per_epoch} batches")


def refuse(state: dict, why: str):
    raise UsageError(f"--resume: {state['file']}: {why}; use a {LAST} this run's flags wrote, or "
                     "start afresh without --resume")


def has_ended(state: dict | None, cfg: Config) -> bool:
    """A checkpoint with nothing left to do under this config: every epoch done, or --max_steps
    reached (a ceiling, so a lower --max_steps on resume ends the run too), and no epoch's end
    owed (a stop at its last window leaves its evaluation, and at the run's end its results, to
    the resume); or a finished run without its checkpoint."""
    if state is None:
        return False
    if state.get("end_owed"):
        return False
    return (state.get("finished") or state["epoch"] >= cfg.epochs
            or cfg.reached_max_steps(state["step"]))


def ended_line(state: dict, cfg: Config) -> str:
    """What a run resumed after its end says before it exits, having written
    nothing: and how to train on."""
    if state.get("finished"):
        return (f"{state['file']}: this run has finished, and its {LAST} is gone: nothing to "
                "resume or extend; its folder is left as it is (to train again, start a new run: "
                "another --run_name, without --resume)")
    if state["epoch"] >= cfg.epochs:
        where, more = f"all {cfg.epochs} epochs done", "a larger --epochs extends it"
    else:
        where, more = (f"--max_steps {cfg.max_steps} reached",
                       "a larger --max_steps (or 0: no limit) trains on")
    return (f"{state['file']}: this run has ended ({where}, step {state['step']}): nothing left to "
            f"train; its folder is left as it is ({more}, with --resume auto)")


def stopped_line(signal_name: str, step: int, path: Path | None, run_dir: Path | None,
                 owed: str | None = None) -> str:
    """What a run stopped by a signal says: where its checkpoint is and how to continue, and what
    of an epoch's end the resume owes first (`owed`: stopped at the epoch's last window). A
    --benchmark run writes none (it measures speed only): nothing to continue."""
    if path is None:
        return f"stopped by {signal_name} at step {step}; a --benchmark run keeps no checkpoint"
    owed = f" ({owed})" if owed else ""
    return (f"stopped by {signal_name} at step {step}{owed}; checkpoint {path}: continue with "
            f"{continue_flags(run_dir)}")


def _as_saved(value):
    return list(value) if isinstance(value, tuple) else value


# How an optimizer computes, as opposed to what it has learnt: these stay as this run built them. A
# checkpoint written on the CPU holds `fused: None`; loaded as it is on a GPU it would turn fused
# SGD off, and under fp16 the GradScaler (which decided at construction that this SGD takes its
# scale) would then hand `grad_scale` to the unfused SGD, which refuses it.
IMPLEMENTATION = ("fused", "foreach", "differentiable", "capturable")


def restore_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      saved: dict) -> None:
    """`optimizer.load_state_dict(saved)` (through common/state.py, which also serves a model
    sharded by FSDP), except that the optimizer stays the kind this run built (fused or not) and
    every state tensor is laid out like its parameter. load_state_dict keeps the saved tensors'
    strides, so a momentum buffer written under the other --channels_last would be NCHW beside an
    NHWC parameter, which CUDA's fused SGD refuses at the first step."""
    built = [{key: group[key] for key in IMPLEMENTATION if key in group}
             for group in optimizer.param_groups]
    load_optimizer_state(model, optimizer, saved)
    for group, implementation in zip(optimizer.param_groups, built):
        group.update(implementation)
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if (torch.is_tensor(value) and value.shape == param.shape
                and value.stride() != param.stride()):
                state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


# ------------------------------------------------------------------------------------------ signals
# A folder the self-launch gives its workers: rank 0 marks in it that it listens for signals
# (TRAINING), then what a stop by one left (STOPPED); the self-launch cannot see how its
# workers ended (common/launcher.py).
STOP_REPORT, TRAINING, STOPPED = "PYTORCH_MULTIGPU_STOP_REPORT", "training", "stopped"


class StopSignals:
    """From creation to `restore()`: SIGTERM (SLURM preemption, torchrun shutting a job down,
    `kill`), SIGINT (Ctrl-C), SIGHUP (the terminal closed) and SIGUSR1 (SLURM's warning before a
    time limit, `--signal=USR1@T`) ask the run to stop at the next log window, where every rank
    agrees to stop, the main process writes a checkpoint and the process group is destroyed;
    --evaluate stops at the next batch. A second Ctrl-C stops at once. SIGUSR1 stops, it does not
    checkpoint and go on: torch's elastic agent ends its workers after any signal it passes on to
    them, and a time limit ends the job anyway (docs/interruptions.md)."""

    NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP",
             signal.SIGUSR1: "SIGUSR1"}
    EXIT_CODES = {name: 128 + number for number, name in NAMES.items()}  # as if killed by it

    def __init__(self):
        self.received: str | None = None
        self.previous = {number: signal.signal(number, self._handle) for number in self.NAMES}
        if os.environ.get("RANK", "0") == "0":  # from here on a signal stops the run with its line
            tell_self_launch(TRAINING, "listening for signals")

    def restore(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame):
        if self.received == "SIGINT" and number == signal.SIGINT:
            raise KeyboardInterrupt
        # the terminal may be gone: writing to it would fail, and end the run
        if number == signal.SIGHUP:
            silence_lost_outputs()
        self.received = self.received or self.NAMES[number]

    def vote(self) -> list[float]:
        """This process's vote in a process group: one entry per signal, 1 for the one received.
        The ranks' votes are reduced by their maximum (1 for each signal some rank received), then
        `agreed` on."""
        return [float(self.received == name) for name in self.NAMES.values()]

    @classmethod
    def agreed(cls, votes) -> str | None:
        """The signal that stops every rank, from the votes reduced over ranks: the one with the
        most votes, the first in NAMES' order on a tie (a maximum over ranks ties every signal
        received), or None when no rank received one."""
        names = list(cls.NAMES.values())
        counts = [int(count) for count in votes[:len(names)]]
        return names[counts.index(max(counts))] if max(counts) else None


def silence_lost_outputs() -> None:
    """Standard output and error that lead nowhere any more (a terminal that hung up, a pipe
    whose reader ended: poll says POLLERR or POLLHUP) are sent to /dev/null, so that the run's
    lines cannot make it fail (EIO, EPIPE) before its stop checkpoint is written. Outputs that
    still work are left as they are."""
    import select

    for fd in (1, 2):
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        events = poll.poll(0)
        if events and events[0][1] & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
            nowhere = os.open(os.devnull, os.O_WRONLY)
            os.dup2(nowhere, fd)
            os.close(nowhere)


def until_stopped(loader, signals: StopSignals | None):
    """`loader`'s batches until a stop signal (checked between two batches) ends
    --evaluate (stop_evaluation); without `signals` (an epoch's evaluation, which its
    checkpoint follows), `loader` itself."""
    if signals is None:
        return loader
    return _until_stopped(loader, signals)


def _until_stopped(loader, signals: StopSignals):
    total = len(loader)
    for done, batch in enumerate(loader):
        if signals.received:
            raise stop_evaluation(signals.received, done, total, says=True)
        yield batch


def until_any_rank_stopped(loader, signals: StopSignals | None, device: torch.device):
    """`loader`'s batches (this rank's evaluation shard) until a stop signal to any rank ends
    --evaluate: before each batch every rank votes, as many times on every rank (a shard may have a
    batch fewer), so that all stop at the same batch, together (stop_evaluation; rank 0 says it).
    Without `signals` (an epoch's evaluation, which its checkpoint follows), `loader` itself."""
    return loader if signals is None else UntilAnyRankStopped(loader, signals, device)


class UntilAnyRankStopped:
    """until_any_rank_stopped's batches: as long as the loader, every rank's
    vote taken before each batch."""

    def __init__(self, loader, signals: StopSignals, device: torch.device):
        self.loader, self.signals, self.device = loader, signals, device

    def __len__(self):  # this rank's batches, as the loader's
        return len(self.loader)

    def __iter__(self):
        longest = torch.tensor([len(self.loader)], device=self.device)
        # every rank votes as often as the longest shard has
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        most = int(longest.item())  # batches
        batches = iter(self.loader)
        for done in range(most):
            votes = torch.tensor(self.signals.vote(), device=self.device)
            dist.all_reduce(votes, op=dist.ReduceOp.MAX)  # a signal to any rank stops every rank
            stopped = StopSignals.agreed(votes.tolist())
            if stopped:
                stop = stop_evaluation(stopped, done, most, says=dist.get_rank() == 0)
                dist.barrier()  # rank 0 has told the self-launch before any rank exits
                raise stop
            batch = next(batches, None)
            if batch is not None:
                yield batch


# what to do after a stop during --evaluate: the same command again, into the same folder
EVALUATE_AGAIN = "to evaluate, run the same command with --overwrite"


def stop_evaluation(signal_name: str, done: int, total: int, says: bool) -> SystemExit:
    """--evaluate stopped by `signal_name` after `done` of `total` batches: one line (by the process
    that `says` it, which tells a self-launch too), and the exit to raise, with the status of a stop
    by that signal (nothing is written)."""
    if says:  # its run folder holds what the evaluation wrote so far: --overwrite replaces it
        print(f"stopped by {signal_name} during the evaluation, after {done} of {total} batches: "
              f"no results written; {EVALUATE_AGAIN}", flush=True)
        tell_self_launch(STOPPED, f"during the evaluation, after {done} of {total} "
                                  f"batches\nno results written; {EVALUATE_AGAIN}")
    return SystemExit(StopSignals.EXIT_CODES[signal_name])


def tell_self_launch(name: str, text: str) -> None:
    """Tell the self-launch, which cannot see how its workers ended, that rank 0 listens for signals
    (TRAINING), or what a stop by one left and what to do then, a line each (STOPPED). Under
    torchrun nothing is listening, and nothing is written."""
    folder = os.environ.get(STOP_REPORT)
    if folder:
        Path(folder, name).write_text(f"{text}\n")

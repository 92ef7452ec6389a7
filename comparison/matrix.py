"""The runs of a comparison: which configurations, and the exact command line and environment of
each.

Every run gets the same model, data, global batch, learning rate and seed; only the parallelism
(mode, GPU count, backend) and the settings being compared (--amp, --sync_bn,
--reshard_after_forward) differ. Each is started the way a user would start it: `python
single_gpu/train.py`, `python data_parallel/train.py`, `torchrun dist_parallel/train.py`, `torchrun
fsdp/train.py`, `torchrun pipeline_parallel/train.py`.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from comparison import train_files
from comparison.errors import UsageError
from comparison.model_shapes import model_refusal, training_images
from comparison.rules import launch_refusal
from comparison.train_files import GROUP_MODES, MODES, script, without

BACKENDS = ("nccl", "gloo")
# a run's name as PlannedRun.name makes it ('03-dist_parallel-2gpu-nccl-r1', --verify's
# '05-fsdp-2cpu-gloo-first_half'): its folder in runs/ and its log in logs/ are compare.py's
RUN_NAME = re.compile(rf"\d{{2,}}-({'|'.join(MODES)})-\d+(gpu|cpu)(-[a-z0-9_]+)+")


@dataclass(frozen=True)
class PlannedRun:
    """One run of the matrix as planned: which script, on how many GPUs (or CPU processes), with
    which of the settings being compared."""
    mode: str
    gpus: int               # GPUs (CPU processes without GPUs) the run uses
    backend: str | None     # dist_parallel and fsdp only
    amp: str | None         # None: the script's default for the device
    sync_bn: bool           # dist_parallel only
    batch_size: int         # the global batch
    repeat: int             # 1..--repeat
    index: int = 0          # position in the matrix, 1-based
    unit: str = "gpu"       # what `gpus` counts: gpu, or cpu (processes) without GPUs
    # compare.py --verify: what the run is for, in place of the repeat in its name
    label: str | None = None
    # fsdp only: ZeRO-3-like (True) or ZeRO-2-like (False)
    reshard_after_forward: bool | None = None

    @property
    def setting(self) -> tuple:
        """What identifies the configuration, repeats aside."""
        return (self.mode, self.gpus, self.backend, self.amp, self.sync_bn, self.batch_size,
                self.reshard_after_forward)

    @property
    def name(self) -> str:
        parts = [f"{self.index:02d}", self.mode, f"{self.gpus}{self.unit}", self.backend,
                 self.amp and f"amp_{self.amp}", self.sync_bn and "syncbn",
                 self.reshard_after_forward is False and "zero2", self.label or f"r{self.repeat}"]
        return "-".join(p for p in parts if p)

    def describe(self) -> str:
        units = {"gpu": ("GPU", "GPUs"), "cpu": ("CPU process", "CPU processes")}[self.unit]
        text = f"{self.mode} on {self.gpus} {units[self.gpus > 1]}"
        reshard = {True: "reshard after forward (ZeRO-3)",
                   False: "no reshard after forward (ZeRO-2)", None: None}
        extras = [self.backend, self.amp and f"amp {self.amp}", self.sync_bn and "SyncBatchNorm",
                  reshard[self.reshard_after_forward]]
        extras = ", ".join(e for e in extras if e)
        return f"{text} ({extras})" if extras else text


def plan(modes, gpu_counts, backends, amps, sync_bns, repeat: int, cuda: bool,
         batch_size: int | None, batch_per_gpu: int | None, reshards=(True,)) -> list[PlannedRun]:
    """Every configuration asked for, each `repeat` times in a row. single_gpu runs on one GPU; on
    the CPU, data_parallel has nothing to split over and runs as one process. dist_parallel runs on
    each GPU count over each backend (with and without SyncBatchNorm, as asked), fsdp likewise with
    each `reshards` setting (SyncBatchNorm is dist_parallel's), pipeline_parallel on each GPU count
    of two or more (a stage a GPU) over each backend. The global batch is `batch_size` in every run,
    or `batch_per_gpu` times the run's GPUs."""
    batch = (lambda gpus: batch_per_gpu * gpus) if batch_per_gpu else (lambda gpus: batch_size)
    runs = []
    for amp in amps:
        if "single_gpu" in modes:
            runs.append(("single_gpu", 1, None, amp, False, batch(1), None))
        for gpus in gpu_counts:
            if "data_parallel" in modes and (cuda or gpus == gpu_counts[0]):
                runs.append(("data_parallel", gpus if cuda else 1, None, amp, False,
                             batch(gpus if cuda else 1), None))
            if "dist_parallel" in modes:
                runs += [("dist_parallel", gpus, backend, amp, sync_bn, batch(gpus), None)
                         for backend in backends for sync_bn in sync_bns]
            if "fsdp" in modes:
                runs += [("fsdp", gpus, backend, amp, False, batch(gpus), reshard)
                         for backend in backends for reshard in reshards]
            if "pipeline_parallel" in modes and gpus > 1:  # one stage has nothing to pipeline
                runs += [("pipeline_parallel", gpus, backend, amp, False, batch(gpus), None)
                         for backend in backends]
    planned = [PlannedRun(*setting[:6], repeat=k, reshard_after_forward=setting[6])
               for setting in dict.fromkeys(runs) for k in range(1, repeat + 1)]
    unit = "gpu" if cuda else "cpu"
    return [PlannedRun(**{**r.__dict__, "index": i, "unit": unit})
            for i, r in enumerate(planned, 1)]


def mode_flags(run: PlannedRun, group_flags: dict[str, list[str]]) -> list[str]:
    """The flags that make a process-group run this configuration: the user's flags passed on to
    its mode (`group_flags`: mode -> flags, as compare.py builds them), its backend,
    SyncBatchNorm, no resharding."""
    flags = [*group_flags.get(run.mode, []), "--backend", run.backend]
    flags += ["--sync_bn"] if run.sync_bn else []
    return flags + (["--no-reshard_after_forward"] if run.reshard_after_forward is False else [])


def run_flags(run: PlannedRun, shared: list[str], group_flags: dict[str, list[str]],
              log_dir: Path, cuda: bool) -> list[str]:
    """The train.py flags of one run: the shared flags, then what makes this run this
    configuration (its global batch, its run folder, its --amp, its GPUs or its process group's
    settings)."""
    flags = [*without(shared, "batch_size", "b"), "--batch_size", str(run.batch_size),
             "--log_dir", str(log_dir), "--run_name", run.name]
    if run.amp:
        flags += ["--amp", run.amp]
    if run.mode in GROUP_MODES:
        return flags + mode_flags(run, group_flags)
    return flags + (["--gpu_devices", *map(str, range(run.gpus))] if cuda else [])


def command(run: PlannedRun, flags: list[str], self_launch: bool = False) -> list[str]:
    """The command line of one run of `flags` (run_flags'), as a user would start it: `python
    <mode>/train.py`; dist_parallel and fsdp under torchrun, or with `self_launch` as `python
    <mode>/train.py --nproc_per_node N`, which starts torch's elastic launcher itself."""
    if run.mode not in GROUP_MODES:
        return [sys.executable, str(script(run.mode)), *flags]
    if self_launch:
        return [sys.executable, str(script(run.mode)), *flags, "--nproc_per_node", str(run.gpus)]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(run.gpus)]
    return [*launcher, str(script(run.mode)), *flags]


def run_environment(run: PlannedRun, cuda: bool) -> dict:
    """The run's environment: unbuffered output; on the CPU one thread per process, so that a
    process stands in for a GPU and two processes do not fight over the same cores (unless
    OMP_NUM_THREADS gives another number: cpu_threads)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not cuda:
        env["OMP_NUM_THREADS"] = str(cpu_threads())
    return env


def cpu_threads() -> int:
    """The intra-op threads of each run on the CPU: OMP_NUM_THREADS, or 1 where it is unset or
    not a positive whole number. torch ignores such a value (libgomp warns) and takes every core,
    which is not what compare.py says a run on the CPU does; so those runs get 1 thread, as where
    it is unset."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else 1


@dataclass(frozen=True)
class Cores:
    """The CPU cores a comparison's CPU runs share, and the intra-op threads each of their
    processes takes (one run at a time: a run's processes are all there is). More threads than
    cores oversubscribe the machine: the processes take turns, and the run's speed measures that
    contention, not the parallelism."""
    available: int
    threads: int

    @property
    def fit(self) -> int:
        """The most processes that keep a core for every thread."""
        return max(1, self.available // self.threads)

    def crowded(self, runs) -> list[PlannedRun]:
        """The CPU runs among `runs` with more threads than cores (a GPU run's processes wait on
        their GPUs, not on the cores)."""
        return [run for run in runs
                if run.unit == "cpu" and run.gpus * self.threads > self.available]


def cores_here() -> Cores:
    """This process's cores (those it may run on, as a container or taskset allows) and
    cpu_threads()."""
    if hasattr(os, "sched_getaffinity"):
        return Cores(len(os.sched_getaffinity(0)), cpu_threads())
    return Cores(os.cpu_count() or 1, cpu_threads())


def check_run(run: PlannedRun, flags: list[str], cuda: bool, model: bool = False):
    """The run's train.py flags as its train file's own parser reads them (get_args), or the one
    line that refuses them; then the rules of the matrix (comparison/rules.py: the backend and
    SyncBatchNorm against the machine, the global batch dividing over the run's GPUs, DataParallel
    on several GPUs not compiled, fsdp without CUDA graphs, compiled DDP's buckets no smaller than
    its first), a batch no larger than the training set, and with `model` whether the model takes
    the data's images (checked on the meta device: every run trains the same model on the same
    data, so once is enough). Returns the parsed flags."""
    try:
        args = train_files.parse(run.mode, flags)
    except UsageError as refusal:
        raise UsageError(f"{run.mode}/train.py refuses the flags of {run.describe()}: "
                         f"{refusal}") from None
    config = vars(args)
    refusal = model_refusal(config) if model else None
    refusal = refusal or launch_refusal(run.mode, run.gpus, args, cuda)
    images = training_images(config) if not args.evaluate else None
    if refusal is None and images is not None and args.batch_size > images:
        refusal = (f"--batch_size {args.batch_size} is more than the {images} training images: "
                   "give a smaller one")
    if refusal is not None:
        raise UsageError(f"{refusal} ({run.describe()})")
    return args


def check_runs(runs: list[PlannedRun], shared: list[str], group_flags: dict[str, list[str]],
               log_dir: Path, cuda: bool) -> None:
    """Refuse, before anything starts, a matrix that some run would refuse (check_run, each run's
    flags as it will get them, its folder under `log_dir`)."""
    for index, run in enumerate(runs):
        check_run(run, run_flags(run, shared, group_flags, log_dir, cuda), cuda, model=index == 0)

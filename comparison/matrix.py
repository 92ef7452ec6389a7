"""The runs of a comparison: which configurations, and the exact command line and environment of each.

Every run gets the same model, data, global batch, learning rate and seed; only the parallelism (mode, GPU count,
backend) and the settings being compared (--amp, --sync_bn) differ. Each is started the way a user would start it:
`python single_gpu/train.py`, `python data_parallel/train.py`, `torchrun dist_parallel/train.py`.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from common.config import REPO_ROOT, Config, UsageError, parse_config

MODES = ("single_gpu", "data_parallel", "dist_parallel")
BACKENDS = ("nccl", "gloo")


@functools.cache
def dist_config_class() -> type[Config]:
    """dist_parallel's config (Config plus its inline DDP flags), read from the script itself."""
    spec = importlib.util.spec_from_file_location("dist_parallel_train", REPO_ROOT / "dist_parallel" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DistConfig


@dataclass(frozen=True)
class Run:
    mode: str
    gpus: int               # GPUs (CPU processes without GPUs) the run uses
    backend: str | None     # dist_parallel only
    amp: str | None         # None: the script's default for the device
    sync_bn: bool           # dist_parallel only
    batch_size: int         # the global batch
    repeat: int             # 1..--repeat
    index: int = 0          # position in the matrix, 1-based
    unit: str = "gpu"       # what `gpus` counts: gpu, or cpu (processes) without GPUs
    label: str | None = None  # compare.py --verify: what the run is for, in place of the repeat in its name

    @property
    def setting(self) -> tuple:
        """What identifies the configuration, repeats aside."""
        return self.mode, self.gpus, self.backend, self.amp, self.sync_bn, self.batch_size

    @property
    def name(self) -> str:
        parts = [f"{self.index:02d}", self.mode, f"{self.gpus}{self.unit}", self.backend,
                 self.amp and f"amp_{self.amp}", self.sync_bn and "syncbn", self.label or f"r{self.repeat}"]
        return "-".join(p for p in parts if p)

    def describe(self) -> str:
        units = {"gpu": ("GPU", "GPUs"), "cpu": ("CPU process", "CPU processes")}[self.unit]
        text = f"{self.mode} on {self.gpus} {units[self.gpus > 1]}"
        extras = [self.backend, self.amp and f"amp {self.amp}", self.sync_bn and "SyncBatchNorm"]
        extras = ", ".join(e for e in extras if e)
        return f"{text} ({extras})" if extras else text


def plan(modes, gpu_counts, backends, amps, sync_bns, repeat: int, cuda: bool, batch_size: int | None,
         batch_per_gpu: int | None) -> list[Run]:
    """Every configuration asked for, each `repeat` times in a row. single_gpu runs on one GPU; on the CPU,
    data_parallel has nothing to split over and runs as one process. The global batch is `batch_size` in every
    run, or `batch_per_gpu` times the run's GPUs."""
    batch = (lambda gpus: batch_per_gpu * gpus) if batch_per_gpu else (lambda gpus: batch_size)  # noqa: E731
    runs = []
    for amp in amps:
        if "single_gpu" in modes:
            runs.append(("single_gpu", 1, None, amp, False, batch(1)))
        for gpus in gpu_counts:
            if "data_parallel" in modes and (cuda or gpus == gpu_counts[0]):
                runs.append(("data_parallel", gpus if cuda else 1, None, amp, False, batch(gpus if cuda else 1)))
            if "dist_parallel" in modes:
                runs += [("dist_parallel", gpus, backend, amp, sync_bn, batch(gpus))
                         for backend in backends for sync_bn in sync_bns]
    planned = [Run(*setting, repeat=k) for setting in dict.fromkeys(runs) for k in range(1, repeat + 1)]
    unit = "gpu" if cuda else "cpu"
    return [Run(**{**r.__dict__, "index": i, "unit": unit}) for i, r in enumerate(planned, 1)]


def command(run: Run, shared: list[str], dist_only: list[str], log_dir: Path, cuda: bool,
            self_launch: bool = False) -> list[str]:
    """The command line of one run: the shared flags, then what makes this run this configuration. dist_parallel
    runs under torchrun, or with `self_launch` as `python dist_parallel/train.py --nproc_per_node N`, which starts
    torch's elastic launcher itself."""
    script = str(REPO_ROOT / run.mode / "train.py")
    flags = [*shared, "--batch_size", str(run.batch_size), "--log_dir", str(log_dir), "--run_name", run.name,
             "--no_progress"]
    if run.amp:
        flags += ["--amp", run.amp]
    if run.mode == "dist_parallel":
        flags += [*dist_only, "--backend", run.backend] + (["--sync_bn"] if run.sync_bn else [])
        if self_launch:
            return [sys.executable, script, *flags, "--nproc_per_node", str(run.gpus)]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(run.gpus)]
        return [*launcher, script, *flags]
    if cuda:
        flags += ["--gpu_devices", *map(str, range(run.gpus))]
    return [sys.executable, script, *flags]


def run_environment(run: Run, cuda: bool) -> dict:
    """The run's environment: unbuffered output; on the CPU one thread per process, so that a process stands in
    for a GPU and two processes do not fight over the same cores (unless OMP_NUM_THREADS is already set)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not cuda:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def check_runs(runs: list[Run], shared: list[str], dist_only: list[str]) -> None:
    """Refuse, before anything starts, a matrix that some run would refuse: the flags each script would get
    must parse, the global batch must divide over every GPU count, and DataParallel on several GPUs is not
    compiled (the report would call compiled what ran eager)."""
    dist_class = dist_config_class()
    for run in runs:
        if run.mode != "single_gpu" and run.batch_size % run.gpus:
            raise UsageError(f"--batch_size {run.batch_size} does not divide over {run.gpus} GPUs ({run.mode}): "
                             f"give a batch that every --gpu_counts value divides")
        if run.mode == "data_parallel" and run.gpus > 1 and run.unit == "gpu" and "--compile" in shared:
            raise UsageError(f"--compile with data_parallel on {run.gpus} GPUs would compile nothing (TorchDynamo "
                             f"does not trace DataParallel's replica threads): leave out --compile, or data_parallel "
                             f"(--modes single_gpu dist_parallel)")
        extra = ["--amp", run.amp] if run.amp else []
        extra += ["--batch_size", str(run.batch_size)]
        if run.mode == "dist_parallel":
            parse_config(dist_class, [*shared, *dist_only, *extra, "--backend", run.backend])  # sync_bn: a bool
        else:
            parse_config(Config, [*shared, *extra])


"""Bad input, run the way a user runs it (a subprocess per launch), against the product's contract:

- exactly one line on stderr that starts with "error: " and says what to do (torch's own C++
  log output does not count), with no warning before it: the CPU-fallback and DataLoader
  warnings come only once training starts;
- a non-zero exit status: 2 for a usage error, 1 for a run that could not go on (a NaN loss);
- no Python traceback;
- nothing overwritten: every file that existed (run folders, checkpoints, the dataset, a rendezvous
  file) keeps its bytes and its mtime, and a refused launch creates no run folder.

The cases: --resume of a missing, truncated, foreign, incomplete or differently configured
checkpoint and the flags it excludes; reusing a run name; a corrupt or missing CIFAR-10; repeated
and nonexistent --gpu_devices in every mode; a --log_dir that is a file; values outside their
flag's domain (tests/test_config.py holds every flag's, at its edges; here a few, in each mode, as
a user meets them); the rendezvous failures of a process started by hand (port in use, master
unreachable, stale file:// rendezvous); a loss that turns NaN; --overwrite and --resume of a folder
no run made or of a symbolic link, a --log_dir through a dangling or looping link; a checkpoint
with a flipped byte (its checksum) or with entries of another model or version (before any run
folder is made); a usage error with RANK/LOCAL_RANK in the shell; torchrun starting single_gpu
twice. Also what must NOT be refused: --resume auto for a run folder without a checkpoint (a fresh
start), and with one (it continues).

Speed: a launch costs ~2.5 s of CPU, nearly all of it importing torch. The refused launches
share one real run folder (module-scoped). Those that need an environment of their own (the
rendezvous cases, no network) and a few of every other kind run as subprocesses, two at a time;
the rest run in this process through the scripts' own main() meanwhile
(conftest.refuse_in_process), the same code without the start-up.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from common.checkpoint import CONTENTS, EARLIER_FORMAT, checksum, load_checkpoint, misfit_entry
from common.config import Config, UsageError, parse_config
from common.domains import most_worker_processes
from common.errors import NAME_MAX
from common.guards import check_rendezvous_file
from common.launch_env import (AgentLaunch, agent_launch, local_rank, processes_on_this_node,
                               torchrun_node, worker_launch)
from common.logger import MARKER
from common.metrics import TrainMeter
from conftest import REPO, TINY, free_port, read_results, refuse_in_process, run_script
from models import pyramidnet
from test_data import write_cifar10

SINGLE, DATA, DIST, FSDP = ("single_gpu/train.py", "data_parallel/train.py",
                            "dist_parallel/train.py", "fsdp/train.py")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # several launches share two cores
# A run with a checkpoint and weights to misuse: 3 of the 8 steps of TINY's epoch.
TRAINED_FLAGS = ["--max_steps", "3", "--save_model"]
FIRST_ATTEMPT_NOTES = ("left in the run folder by a first attempt that died "
                       "before its first checkpoint")
# CIFAR-10 cases: the tiny model of TINY, on --dataset cifar10 (TINY
# itself names --dataset synthetic).
CIFAR = ("--dataset", "cifar10", "--depth", "8", "--alpha", "12", "--batch_size", "4", "--epochs",
         "1", "--max_steps", "1", "--loader", "gpu", "--num_workers", "0", "--warmup_steps", "0")
# --num_workers's most with two training processes on this node (TINY's batch of 32-pixel images)
MOST_WORKERS_FOR_2 = most_worker_processes(2, 16 * 3 * 32 * 32 * 4)[0]
# torch's C++ logging (glog format) and the C++ stack it may print: not the product's lines.
TORCH_LOG = re.compile(r"\[[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ \S+:\d+\] |Exception raised from |frame "
                       r"#\d+: |<omitting python frames>$|$")


# ------------------------------------------------------------------------------------------ helpers
def message_lines(stderr: str) -> list[str]:
    """stderr without torch's own log output: what the contract allows is one
    error line (a warning included)."""
    return [line for line in stderr.splitlines() if not TORCH_LOG.match(line)]


def assert_refused(done: subprocess.CompletedProcess, *named: str, code: int = 2) -> str:
    """The contract for bad input; returns the error line, which must
    contain every string in `named`."""
    lines = message_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def no_network() -> dict[str, str]:
    """Environment under which every HTTP(S) download fails at once, as on a
    machine without a network: urllib (torchvision's downloader) goes through a
    proxy on a port where nobody listens."""
    proxy = f"http://127.0.0.1:{free_port()}"
    return {"http_proxy": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy, "HTTPS_PROXY": proxy,
            "no_proxy": "", "NO_PROXY": ""}


def snapshot(root: Path) -> dict[str, object]:
    """Every path under `root`: a file as (sha256 of its bytes, mtime in ns), a folder as "folder",
    a symbolic link as where it points."""
    def state(path: Path):
        if path.is_symlink():
            return "link", os.readlink(path)
        if path.is_dir():
            return "folder"
        return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    return {str(path.relative_to(root)): state(path) for path in sorted(root.rglob("*"))}


def differences(before: dict, after: dict) -> list[str]:
    return sorted(path for path in before.keys() | after.keys()
                  if before.get(path) != after.get(path))


def tensors(value):
    """Every tensor in a nested checkpoint (dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors(item)


# --------------------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The module's folder: runs/ (the --log_dir of every case), inputs/ (files
    to misuse), data/ (a dataset)."""
    return tmp_path_factory.mktemp("bad_input")


@pytest.fixture(scope="module")
def first_start(work) -> tuple[Path, subprocess.CompletedProcess]:
    """runs/a: a real TINY run of 3 steps with --save_model, so it holds checkpoint.pt and
    model.pt. It is started as an elastic job's restart would be, with --resume auto in a
    run folder that exists without a checkpoint (a first attempt died before writing one):
    (run folder, completed process)."""
    run_dir = work / "runs" / "a"
    run_dir.mkdir(parents=True)
    (run_dir / MARKER).write_text("")  # the first attempt claimed the folder
    (run_dir / "notes.txt").write_text(FIRST_ATTEMPT_NOTES)
    done = run_script(SINGLE, *TINY, *TRAINED_FLAGS, "--resume", "auto", "--log_dir",
                      run_dir.parent, "--run_name", run_dir.name, env=ONE_THREAD)
    return run_dir, done


@pytest.fixture(scope="module")
def trained(first_start) -> Path:
    """The run folder of `first_start`, which must have succeeded."""
    run_dir, done = first_start
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run_dir / "checkpoint.pt").is_file() and (run_dir / "model.pt").is_file()
    return run_dir


# ----------------------------------------------------------------------------------------- refusals
@dataclasses.dataclass(frozen=True)
class Refusal:
    """One refused launch: `script` with the `base` flags (TINY unless told), --log_dir, --run_name
    `run_name` (default: the case's id, a folder that must not appear; "": no --run_name) and
    `flags`. In flags and env values, {work} is the module's folder, {busy_port} a port this test
    listens on, {closed_port} one where nobody listens. `network=False`: downloads fail at once. The
    error line must contain every string in `named`."""
    id: str
    script: str
    flags: tuple
    named: tuple
    run_name: str | None = None
    base: tuple = tuple(TINY)
    log_dir: str | None = "{work}/runs"  # None: no --log_dir (compare.py has none)
    env: tuple = ()
    network: bool = True
    # a subprocess, as a user runs it (forced by env and network); else in-process
    as_a_user: bool = False
    # variables the user's shell holds: set in this process for an in-process case
    shell: tuple = ()

    def argv(self, where: dict) -> list[str]:
        flags = [str(flag).format(**where) for flag in self.flags]
        name = [] if self.run_name == "" else ["--run_name", self.run_name or self.id]
        log_dir = [] if self.log_dir is None else ["--log_dir", self.log_dir.format(**where)]
        return [*self.base, *log_dir, *name, *flags]

    @property
    def subprocess(self) -> bool:
        return self.as_a_user or bool(self.env) or not self.network

    def environment(self, where: dict) -> dict[str, str]:
        env = {**ONE_THREAD, **{key: value.format(**where) for key, value in self.env}}
        return env if self.network else {**env, **no_network()}


def by_hand(rank: int, port: str, world_size: int = 2, **more: str) -> tuple:
    """The environment of one dist_parallel process of a `world_size`-process job started by hand,
    without torchrun, with the `more` variables (any of them in place of its own)."""
    given = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port, **more}
    return tuple(given.items())


CHECKPOINT = "{work}/runs/a/checkpoint.pt"
REFUSALS = [
    # 1-3: --resume of something that is not a usable checkpoint
    Refusal("resume-missing", SINGLE, ("--resume", "{work}/inputs/missing.pt"),
            ("no checkpoint at", "missing.pt")),
    Refusal("resume-truncated", SINGLE, ("--resume", "{work}/inputs/truncated.pt"),
            ("truncated.pt", "truncated")),
    Refusal("resume-text-file", SINGLE, ("--resume", "{work}/inputs/notes.txt"),
            ("notes.txt", "not a checkpoint")),
    Refusal("resume-text-file-hello", SINGLE, ("--resume", "{work}/inputs/hello.txt"),
            ("hello.txt", "not a checkpoint")),
    Refusal("resume-model-pt", SINGLE, ("--resume", "{work}/runs/a/model.pt"),
            ("model.pt", "--evaluate")),
    # 4: a checkpoint of a different config, resumed into its own run folder:
    # that folder must stay unchanged
    Refusal("resume-other-depth", SINGLE, ("--resume", CHECKPOINT, "--depth", "14"),
            ("--depth 8 (now 14)",), run_name="a"),
    Refusal("resume-other-batch", SINGLE, ("--resume", CHECKPOINT, "--batch_size", "16"),
            ("--batch_size 32 (now 16)",), run_name="a"),
    # 5: flags --resume excludes or needs
    Refusal("resume-auto-without-run-name", SINGLE, ("--resume", "auto"), ("--run_name",),
            run_name=""),
    Refusal("resume-auto-with-overwrite", SINGLE, ("--resume", "auto", "--overwrite"),
            ("--overwrite",), run_name="a"),
    Refusal("resume-with-benchmark", SINGLE, ("--resume", CHECKPOINT, "--benchmark"),
            ("--benchmark",)),
    # 7: an existing run name without --resume
    Refusal("existing-run-name", SINGLE, (), ("--overwrite", "--resume auto"), run_name="a"),
    # 8: CIFAR-10 that cannot be read, and no network to download it
    Refusal("cifar10-corrupt", SINGLE, ("--data_dir", "{work}/data"), ("corrupt", "delete"),
            base=CIFAR, network=False),
    Refusal("cifar10-missing", SINGLE, ("--data_dir", "{work}/inputs/no-data/here"),
            ("--dataset synthetic",), base=CIFAR, network=False),
    # 9: --gpu_devices on a machine without CUDA, in every mode
    Refusal("gpus-repeated-single", SINGLE, ("--gpu_devices", "0", "0"),
            ("--gpu_devices", "more than once")),
    Refusal("gpus-repeated-data-parallel", DATA, ("--gpu_devices", "0", "0"),
            ("--gpu_devices", "more than once")),
    Refusal("gpus-repeated-dist-parallel", DIST,
            ("--nproc_per_node", "2", "--gpu_devices", "0", "0"),
            ("--gpu_devices", "more than once"), as_a_user=True),
    Refusal("gpu-missing-single", SINGLE, ("--gpu_devices", "7"), ("--gpu_devices", "no GPU 7")),
    Refusal("gpu-missing-data-parallel", DATA, ("--gpu_devices", "7"),
            ("--gpu_devices", "no GPU 7")),
    Refusal("gpu-missing-dist-parallel", DIST, ("--nproc_per_node", "2", "--gpu_devices", "7"),
            ("--gpu_devices", "no GPU 7")),
    Refusal("gpu-missing-fsdp", FSDP, ("--nproc_per_node", "2", "--gpu_devices", "7"),
            ("--gpu_devices", "no GPU 7")),
    # 9b: what fsdp cannot run here or with these flags, refused before its workers start
    Refusal("batch-not-dividing-fsdp", FSDP, ("--nproc_per_node", "3"),
            ("--batch_size 32", "multiple of 3")),
    Refusal("nccl-without-gpus-fsdp", FSDP, ("--backend", "nccl", "--nproc_per_node", "2"),
            ("--backend nccl", "--backend gloo")),
    Refusal("sync-bn-fsdp", FSDP, ("--sync_bn",), ("unrecognized arguments: --sync_bn", "--help")),
    # 10: a --log_dir that is a file
    Refusal("log-dir-is-a-file", SINGLE, (), ("--log_dir", "is a file"),
            log_dir="{work}/inputs/notes.txt"),
    # 10b: values outside their flag's domain, refused where they are parsed, before anything starts
    Refusal("momentum-0-with-nesterov", SINGLE, ("--momentum", "0"),
            ("--momentum 0", "--no_nesterov")),
    Refusal("dist-timeout-nan", DIST, ("--dist_timeout", "nan"), ("--dist_timeout", "not nan")),
    Refusal("seed-above-numpy", DATA, ("--seed", str(2**32)), ("--seed", "at most 4294967295")),
    Refusal("lr-overflows", SINGLE, ("--lr", "1e308", "--batch_size", "256"),
            ("--lr 1e+308", "smaller --lr")),
    Refusal("nproc-per-node-0", DIST, ("--nproc_per_node", "0"),
            ("--nproc_per_node", "at least 1")),
    Refusal("max-restarts-negative", DIST, ("--max_restarts=-1",),
            ("--max_restarts", "at least 0")),
    Refusal("bucket-cap-nan", DIST, ("--bucket_cap_mb", "nan"), ("--bucket_cap_mb", "not nan")),
    # -j 1000 meant as -j 10: forked a thousand workers, and the memory ran out
    Refusal("num-workers-past-the-machine", SINGLE, ("-j", "1000"),
            ("--num_workers 1000", "at most", "per usable core", "leave --num_workers out"),
            as_a_user=True),
    Refusal("num-workers-past-the-machine-for-2-workers", DIST,
            ("--nproc_per_node", "2", "-j", str(MOST_WORKERS_FOR_2 + 1)),
            (f"at most {MOST_WORKERS_FOR_2} per training process", "shared by 2")),
    Refusal("synthetic-size-beyond-memory", DATA, ("--synthetic_size", str(10**13)),
            ("--synthetic_size", "images on this machine")),
    Refusal("model-beyond-memory", DIST, ("--alpha", "1e7"), ("--alpha 1e+07", "smaller --depth")),
    Refusal("log-dir-under-proc", SINGLE, (), ("--log_dir", "outside /proc"), log_dir="/proc/runs"),
    Refusal("log-dir-empty", DATA, (), ("--log_dir", "not empty"), log_dir=""),
    Refusal("data-dir-empty", SINGLE, ("--data_dir", ""), ("--data_dir", "not empty")),
    Refusal("run-name-too-long", SINGLE, (), ("--run_name", f"at most {NAME_MAX} bytes"),
            run_name="x" * (NAME_MAX + 1)),
    Refusal("resume-missing-entry", SINGLE, ("--resume", "{work}/inputs/no-optimizer.pt"),
            ("no-optimizer.pt", "no 'optimizer' entry")),
    # 10c: what --overwrite and --resume must not touch: a folder no run
    # made, another run through a link
    Refusal("overwrite-a-folder-no-run-made", SINGLE, ("--overwrite",),
            ("runs/data", "not a run folder"), run_name="data"),
    Refusal("overwrite-through-a-symlink", SINGLE, ("--overwrite",), ("runs/link", "symbolic link"),
            run_name="link"),
    Refusal("resume-through-a-symlink", DATA, ("--resume", "auto"), ("runs/link", "symbolic link"),
            run_name="link"),
    Refusal("resume-into-a-folder-no-run-made", SINGLE, ("--resume", "auto"), ("not a run folder",),
            run_name="data"),
    Refusal("log-dir-dangling-symlink", SINGLE, (), ("inputs/dangling", "leads nowhere"),
            log_dir="{work}/inputs/dangling/runs"),
    Refusal("log-dir-symlink-loop", DATA, (), ("inputs/loop", "leads nowhere"),
            log_dir="{work}/inputs/loop"),
    # 10d: checkpoints damaged on disk, or of another model or version:
    # refused before a run folder is made
    Refusal("resume-flipped-byte", SINGLE, ("--resume", "{work}/inputs/flipped.pt"),
            ("flipped.pt", "checksum")),
    Refusal("resume-other-depth-weights", SINGLE, ("--resume", "{work}/inputs/depth-14-weights.pt"),
            ("depth-14-weights.pt", "'model' entry does not fit")),
    Refusal("resume-negative-epoch", DATA, ("--resume", "{work}/inputs/negative-epoch.pt"),
            ("'epoch' entry",)),
    Refusal("resume-batch-past-the-epoch", SINGLE, ("--resume", "{work}/inputs/batch-past.pt"),
            ("'batch' entry", "past the end")),
    Refusal("resume-empty-scheduler", SINGLE, ("--resume", "{work}/inputs/empty-scheduler.pt"),
            ("'scheduler' entry",)),
    Refusal("resume-empty-rng-entry", SINGLE, ("--resume", "{work}/inputs/empty-rng.pt"),
            ("'rng[0]' entry",)),
    Refusal("lr-overflows-float32", SINGLE, ("--lr", "1e300"),
            ("--lr 1e+300", "float32", "smaller --lr")),
    # 10e: RANK / LOCAL_RANK in the shell (inside a job, say) of a process
    # no launcher started: still said
    Refusal("usage-error-with-local-rank-set-single", SINGLE, ("--bogus",), ("--bogus",),
            shell=(("LOCAL_RANK", "1"), ("RANK", "1"))),
    Refusal("usage-error-with-rank-set-data-parallel", DATA, ("--bogus",), ("--bogus",),
            shell=(("RANK", "3"),)),
    Refusal("usage-error-with-local-rank-set-compare", "compare.py", ("--repeat", "0"),
            ("--repeat",), base=(), log_dir=None, run_name="",
            shell=(("LOCAL_RANK", "1"), ("RANK", "1"))),
    # 10f: torch.compile's flags (tests/test_compile.py has why), in the
    # scripts and in compare.py's matrix
    Refusal("compile-cuda-graphs-fsdp", FSDP, ("--nproc_per_node", "2", "--compile",
                                               "--compile_mode", "reduce-overhead"),
            ("--compile_mode reduce-overhead", "FSDP2", "default or max-autotune-no-cudagraphs")),
    Refusal("compile-small-buckets-dist-parallel", DIST, ("--nproc_per_node", "2", "--compile",
                                                          "--bucket_cap_mb", "0.5"),
            ("--bucket_cap_mb 0.5 with --compile", "--bucket_cap_mb 1 or more")),
    Refusal("compile-mode-without-compile", SINGLE, ("--compile_mode", "max-autotune"),
            ("--compile_mode max-autotune", "without --compile")),
    Refusal("compile-cache-without-compile", DATA, ("--compile_cache", "{work}/cache"),
            ("--compile_cache", "without --compile")),
    Refusal("compile-cache-is-a-file", SINGLE,
            ("--compile", "--compile_cache", "{work}/inputs/notes.txt"),
            ("--compile_cache", "notes.txt is a file, not a folder")),
    Refusal("compile-cache-dangling-symlink", DIST, ("--nproc_per_node", "2", "--compile",
                                                     "--compile_cache", "{work}/inputs/dangling"),
            ("inputs/dangling is a symbolic link", "does not exist")),
    Refusal("compile-default-cache-is-a-file", DATA, ("--compile",), ("--log_dir", "is a file"),
            log_dir="{work}/inputs/notes.txt"),
    Refusal("compare-compile-cuda-graphs-fsdp", "compare.py", ("--modes", "fsdp", "--compile",
                                                              "--compile_mode", "max-autotune",
                                                              "--out", "{work}/compared"),
            ("--compile_mode max-autotune", "(fsdp on 2 CPU processes"), base=(), log_dir=None,
            run_name=""),
    Refusal("compare-compile-small-buckets", "compare.py", ("--modes", "dist_parallel", "--compile",
                                                           "--bucket_cap_mb", "0.5", "--out",
                                                           "{work}/compared"),
            ("--bucket_cap_mb 0.5", "(dist_parallel on 2 CPU processes"), base=(), log_dir=None,
            run_name=""),
    Refusal("compare-compile-mode-without-compile", "compare.py", ("--modes", "single_gpu",
                                                                  "--compile_mode",
                                                                  "reduce-overhead", "--out",
                                                                  "{work}/compared"),
            ("--compile_mode reduce-overhead", "without --compile"), base=(), log_dir=None,
            run_name=""),
    Refusal("compare-compile-cache-is-a-file", "compare.py", ("--modes", "single_gpu", "--compile",
                                                             "--compile_cache",
                                                             "{work}/inputs/notes.txt", "--out",
                                                             "{work}/compared"),
            ("--compile_cache", "notes.txt is a file, not a folder"), base=(), log_dir=None,
            run_name=""),
    # 11: one process of a 2-process job started by hand, whose rendezvous fails
    Refusal("rendezvous-port-in-use", DIST, ("--dist_timeout", "10"),
            ("already in use", "MASTER_PORT"), env=by_hand(0, "{busy_port}")),
    Refusal("rendezvous-master-unreachable", DIST, ("--dist_timeout", "5"),
            ("could not reach the master",), env=by_hand(1, "{closed_port}")),
    Refusal("rendezvous-stale-file", DIST,
            ("--init_method", "file://{work}/inputs/rdzv", "--dist_timeout", "30"),
            ("left over", "delete"), env=by_hand(0, "{closed_port}")),
    # 11b: a variable a launcher sets (torchrun, a PyTorchJob, or the user's shell), empty, not a
    # whole number or out of its range: named with its value, before any int() or rendezvous (each
    # variable's cases: test_each_bad_launch_variable_is_named_with_its_value). As real processes:
    # a traceback, an unnamed MASTER_PORT, a LOCAL_RANK that trained, a half-set launch that started
    # a worker; the rest in this process (--dist_timeout bounds a rendezvous they once waited for)
    Refusal("launch-local-world-size-empty", DIST, (),
            ("LOCAL_WORLD_SIZE='' in the environment", "processes on this node", "unset it"),
            env=by_hand(0, "{closed_port}", world_size=1, LOCAL_WORLD_SIZE="")),
    Refusal("launch-master-port-not-a-port", DIST, (),
            ("MASTER_PORT='abc' in the environment", "a TCP port", "e.g. 29500"),
            env=by_hand(0, "abc", world_size=1)),
    Refusal("launch-local-rank-negative", DIST, (),
            ("LOCAL_RANK='-1' in the environment", "(here only 0)"),
            env=by_hand(0, "{closed_port}", world_size=1, LOCAL_RANK="-1")),
    Refusal("launch-world-size-without-rank", DIST, (), ("RANK is not set but WORLD_SIZE is",),
            env=(("WORLD_SIZE", "2"),)),
    Refusal("launch-local-rank-past-the-node", DIST, ("--dist_timeout", "5"),
            ("LOCAL_RANK='2' in the environment", "LOCAL_WORLD_SIZE=2", "from 0 to 1"),
            shell=by_hand(2, "29500", world_size=4, LOCAL_WORLD_SIZE="2", LOCAL_RANK="2")),
    Refusal("self-launch-agent-timeout-not-a-number", DIST, ("--nproc_per_node", "1"),
            ("PET_SHUTDOWN_TIMEOUT='abc' in the environment", "whole number of seconds"),
            shell=(("PET_SHUTDOWN_TIMEOUT", "abc"),)),
    Refusal("launch-local-world-size-not-a-number", DIST, (),
            ("LOCAL_WORLD_SIZE='abc' in the environment", "processes on this node"),
            shell=by_hand(0, "29500", world_size=1, LOCAL_WORLD_SIZE="abc")),
    Refusal("launch-world-size-0", DIST, (), ("WORLD_SIZE='0' in the environment", "1 or more"),
            shell=by_hand(0, "29500", world_size=0)),
    Refusal("launch-rank-empty", FSDP, (), ("RANK='' in the environment",),
            shell=by_hand("", "29500", world_size=1)),
    # the self-launch's flags in a process it did not start: ignored there, yet recorded (a real
    # torchrun: test_torchrun_with_the_self_launchs_flags_is_refused_once)
    Refusal("self-launch-flag-by-hand", DIST, ("--nproc_per_node", "2", "--dist_timeout", "5"),
            ("--nproc_per_node 2 is for `python train.py` without torchrun", "started by hand",
             "leave it out"), shell=by_hand(1, "1")),
    Refusal("launch-rank-past-the-job", FSDP, (),
            ("RANK='2' in the environment", "WORLD_SIZE=2", "from 0 to 1"),
            shell=by_hand(2, "29500")),
]


def make_inputs(work: Path, checkpoint: Path) -> None:
    """inputs/: a checkpoint cut to half its bytes, one without its optimizer, text files, a stale
    rendezvous file; data/: a CIFAR-10 whose data_batch_1 is cut to half."""
    inputs = work / "inputs"
    inputs.mkdir()
    raw = checkpoint.read_bytes()
    (inputs / "truncated.pt").write_bytes(raw[:len(raw) // 2])
    (inputs / "flipped.pt").write_bytes(flip_a_weight_byte(checkpoint))
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    with torch.device("meta"):
        depth_14 = pyramidnet(14, 12, "basic").state_dict()
    misfits = {"no-optimizer": {"optimizer": None}, "negative-epoch": {"epoch": -1},
               "batch-past": {"batch": 8}, "empty-scheduler": {"scheduler": {}},
               "empty-rng": {"rng": [{}]},
               "depth-14-weights": {"model": {k: torch.zeros(v.shape)
                                              for k, v in depth_14.items()}}}
    for name, changes in misfits.items():  # each as a run of another version would write it: sealed
        misfit = {**state, **changes}
        misfit = {key: value for key, value in misfit.items() if value is not None}
        torch.save({**misfit, "checksum": checksum(misfit)}, inputs / f"{name}.pt")
    (work / "runs" / "data").mkdir()
    (work / "runs" / "data" / "images.bin").write_bytes(b"a user's own data, in the runs' folder")
    (work / "runs" / "link").symlink_to(work / "runs" / "a")
    (inputs / "dangling").symlink_to(inputs / "nowhere")
    (inputs / "loop").symlink_to(inputs / "loop")
    (inputs / "notes.txt").write_text("not a checkpoint: notes about run a\n")
    (inputs / "hello.txt").write_text("hello\n")
    rendezvous = inputs / "rdzv"
    rendezvous.write_bytes(b"a file:// rendezvous of a crashed run")
    an_hour_ago = time.time() - 3600
    os.utime(rendezvous, (an_hour_ago, an_hour_ago))
    write_cifar10(work / "data")
    batch = work / "data" / "cifar-10-batches-py" / "data_batch_1"
    raw = batch.read_bytes()
    batch.write_bytes(raw[:len(raw) // 2])


def flip_a_weight_byte(checkpoint: Path) -> bytes:
    """The checkpoint's bytes with one bit flipped inside its largest tensor's data (a disk or copy
    error): the zip archive and the pickle stay readable, so only a checksum can tell."""
    raw = bytearray(checkpoint.read_bytes())
    with zipfile.ZipFile(checkpoint) as archive:
        largest = max((entry for entry in archive.infolist() if "/data/" in entry.filename),
                      key=lambda entry: entry.file_size)
    # local header
    name_length, extra_length = struct.unpack_from("<HH", raw, largest.header_offset + 26)
    raw[largest.header_offset + 30 + name_length + extra_length + largest.file_size // 2] ^= 0x40
    return bytes(raw)


def refused_run(script: str, argv: list[str], env: dict | None,
                shell: tuple = ()) -> subprocess.CompletedProcess:
    """A subprocess with `env` (stopped after 120 s: a refusal that hangs), or with env None, in
    this process with the `shell` variables set."""
    if env is not None:
        return run_script(script, *argv, env=env, timeout=120)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in shell:
            patch.setenv(name, value)
        return refuse_in_process(script, *argv)


@pytest.fixture(scope="module")
def refusals(work, trained) -> tuple[dict, dict, dict]:
    """Every REFUSALS launch while this test listens on {busy_port}, the subprocesses two at a time
    and the others in this process meanwhile: ({id: completed process}, snapshot of the module's
    folder before, snapshot after)."""
    make_inputs(work, trained / "checkpoint.pt")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        where = {"work": work, "busy_port": busy.getsockname()[1], "closed_port": free_port()}
        before = snapshot(work)
        slowest_first = sorted((case for case in REFUSALS if case.subprocess),
                               key=lambda case: case.id != "rendezvous-master-unreachable")
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {case.id: pool.submit(refused_run, case.script, case.argv(where),
                                            case.environment(where))
                       for case in slowest_first}
            outcomes = {case.id: refused_run(case.script, case.argv(where), None)
                        for case in REFUSALS if not case.subprocess and not case.shell}
            outcomes.update({case_id: future.result() for case_id, future in futures.items()})
        # once no subprocess is being started: the variables set here would reach it
        outcomes.update({case.id: refused_run(case.script, case.argv(where), None, case.shell)
                         for case in REFUSALS if case.shell})
    return outcomes, before, snapshot(work)


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.id)
def test_bad_input_is_refused_with_one_line(refusals, case):
    """One "error: " line naming the problem and its fix, exit status 2, no traceback, and no hang
    (the unreachable master: its --dist_timeout of 5 s, twice at most)."""
    assert_refused(refusals[0][case.id], *case.named)


def test_refused_launches_change_no_file_and_create_no_run_folder(refusals, work):
    """After every refusal: run folder a/ (whose checkpoint was resumed with other flags, whose name
    was reused), its checkpoint.pt and model.pt, the truncated copy, the text files, the corrupt
    CIFAR-10 and the stale rendezvous file keep their bytes and mtimes, and no run folder or file
    appeared (a missing data folder that torchvision creates for its download attempt lies outside
    the runs and is not counted)."""
    _, before, after = refusals
    changed = [path for path in differences(before, after) if not path.startswith("inputs/no-data")]
    assert not changed, changed
    assert ("runs/a/checkpoint.pt" in before and "inputs/rdzv" in before
            and "data/cifar-10-batches-py" in before)
    assert "runs/data/images.bin" in before and before["runs/link"] == ("link",
                                                                        str(work / "runs" / "a"))
    runs_after = sorted(path for path in after if path.count("/") == 1 and path.startswith("runs/"))
    assert runs_after == ["runs/a", "runs/data", "runs/link"]


# -------------------------------------------------------------------------------------- checkpoints
def test_load_checkpoint_requires_every_entry_a_run_writes(trained):
    """CONTENTS is what a real checkpoint holds (besides its format), each of its type."""
    state = torch.load(trained / "checkpoint.pt", map_location="cpu", weights_only=True)
    # extended, best_epoch, best_acc_top5, end_owed, trained_attempt, data: optional (older
    # checkpoints lack them); data is an image folder's classes and files, None for other datasets
    assert set(state) == {"format", "checksum", "extended", "best_epoch", "best_acc_top5",
                          "end_owed", "trained_attempt", "data", *CONTENTS}
    assert state["data"] is None
    assert state["checksum"] == checksum(state)
    assert all(isinstance(state[key], kind) for key, kind in CONTENTS.items())


@pytest.mark.parametrize("entry", [*CONTENTS, "config.depth", "epoch=text", "rng=[]"])
def test_a_checkpoint_without_an_entry_is_refused_naming_it(trained, tmp_path, entry):
    """A checkpoint of the right format without one of its entries (or with one of
    the wrong type, or without a config value resuming checks): one line that names
    it, not a KeyError at restore()."""
    state = torch.load(trained / "checkpoint.pt", map_location="cpu", weights_only=True)
    if entry == "config.depth":
        del state["config"]["depth"]
        named = "no --depth in its config"
    elif entry == "epoch=text":
        state["epoch"] = "three"
        named = "a damaged 'epoch' entry"
    elif entry == "rng=[]":  # no rank's RNG states: restore() would index an empty list
        state["rng"] = []
        named = "a damaged 'rng' entry"
    else:
        del state[entry]
        named = f"no {entry!r} entry"
    path = tmp_path / "checkpoint.pt"
    # as another version would write it: sealed
    torch.save({**state, "checksum": checksum(state)}, path)
    with pytest.raises(UsageError) as error:
        load_checkpoint(path, Config())
    message = str(error.value)
    assert "\n" not in message and str(path) in message and named in message, message


@pytest.mark.parametrize("entry, value", [("end_owed", "yes"), ("trained_attempt", []),
                                          ("trained_attempt", {"summary": {}})])
def test_a_damaged_entry_of_a_stop_at_a_last_window_is_named(trained, entry, value):
    """What a stop at an epoch's last window adds to its checkpoint (the end owed, the figures of
    the attempt that trained), damaged: named, as every entry is, before restore() reads it."""
    state = torch.load(trained / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert misfit_entry(state, Config()) is None
    assert misfit_entry({**state, entry: value}, Config()).startswith(f"{entry!r} entry")


def test_a_checkpoint_of_the_format_before_checksums_resumes_with_a_warning(trained, tmp_path,
                                                                             capsys):
    """A run started before checkpoints carried a checksum continues after an update: its file is
    read unverified, and the warning says so."""
    state = torch.load(trained / "checkpoint.pt", map_location="cpu", weights_only=True)
    earlier = {**{key: value for key, value in state.items() if key != "checksum"},
               "format": EARLIER_FORMAT}
    torch.save(earlier, tmp_path / "v1.pt")
    # as the run resolved it on the CPU
    cfg = dataclasses.replace(parse_config(Config, TINY), amp="off", augment="pad", flip=True)
    loaded = load_checkpoint(tmp_path / "v1.pt", cfg)
    assert loaded["step"] == state["step"] and "resumed unverified" in capsys.readouterr().err


def test_torchrun_starting_single_gpu_twice_is_refused_once(tmp_path):
    """`torchrun --nproc_per_node 2 single_gpu/train.py`: each process would train the whole
    model alone (and one was refused in silence, its name taken by the other). Both are
    refused, and the line is said once."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(REPO / SINGLE), *TINY, "--log_dir",
                           str(tmp_path), "--run_name", "twice"],
                          cwd=REPO, env={**os.environ, **ONE_THREAD}, capture_output=True,
                          text=True, timeout=120)
    errors = [line for line in (done.stdout + done.stderr).splitlines()
              if line.startswith("error: ")]
    assert done.returncode != 0 and len(errors) == 1, done.stdout + done.stderr
    assert ("trains in one process and torchrun started 2" in errors[0]
            and "dist_parallel" in errors[0])
    assert list(tmp_path.iterdir()) == []


def test_torchrun_with_the_self_launchs_flags_is_refused_once(tmp_path):
    """`torchrun ... dist_parallel/train.py --nproc_per_node 2 --max_restarts 1`: the flags of
    `python train.py`'s own launch, which torchrun's workers ignored and their run recorded as
    if they had taken effect. Refused in one line, said once, that gives torchrun's own flags;
    nothing is written."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "1", str(REPO / DIST), *TINY, "--log_dir",
                           str(tmp_path), "--run_name", "ignored", "--nproc_per_node", "2",
                           "--max_restarts", "1"],
                          cwd=REPO, env={**os.environ, **ONE_THREAD}, capture_output=True,
                          text=True, timeout=120)
    errors = [line for line in (done.stdout + done.stderr).splitlines()
              if line.startswith("error: ")]
    assert done.returncode != 0 and errors == [
        "error: --nproc_per_node 2 and --max_restarts 1 are for `python train.py` without "
        "torchrun, which starts its own workers, and this process was started by torchrun, where "
        "they would be ignored: give torchrun --nproc_per_node 2 --max-restarts 1 before train.py, "
        "and leave them out after it"], done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------------- resume auto
def test_resume_auto_without_a_checkpoint_is_a_fresh_start(first_start):
    """--resume auto --run_name a, where a/ exists without a checkpoint, is not an
    error: it starts afresh (exit 0, no "resumed"), trains to --max_steps and keeps
    the files already in the folder."""
    run_dir, done = first_start
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed" not in done.stdout and "Traceback" not in done.stderr
    assert read_results(run_dir)["summary"]["steps"] == 3
    assert (run_dir / "notes.txt").read_text() == FIRST_ATTEMPT_NOTES


def test_resume_auto_continues_from_the_checkpoint(trained, tmp_path):
    """A copy of run folder a/ (checkpoint at step 3), run again with --resume auto and a longer
    --max_steps: it says where it resumed and ends at step 5."""
    run_dir = tmp_path / "runs" / "a"
    shutil.copytree(trained, run_dir)
    done = run_script(SINGLE, *TINY, "--max_steps", "5", "--resume", "auto", "--log_dir",
                      run_dir.parent, "--run_name", run_dir.name, env=ONE_THREAD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed at step 3 " in done.stdout
    assert read_results(run_dir)["summary"]["steps"] == 5


# --------------------------------------------------------------------------------------- a NaN loss
NAN_STEP = re.compile(r"error: the training loss became NaN/inf at step (\d+)\b")
DIVERGING = ["--lr", "1e30", "--max_steps", "8", "--log_interval", "2"]


@pytest.fixture(scope="module")
def diverged(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """TINY with --lr 1e30 (its first update sends the loss to NaN), and a checkpoint after every
    step so that one is written before the NaN: (completed process, run folder)."""
    run_dir = tmp_path_factory.mktemp("diverged") / "runs" / "nan"
    done = run_script(SINGLE, *TINY, *DIVERGING, "--checkpoint_interval", "1", "--log_dir",
                      run_dir.parent, "--run_name", run_dir.name, env=ONE_THREAD)
    return done, run_dir


def test_a_nan_loss_stops_the_run_naming_the_step(diverged):
    """Exit status 1, one error line naming the first step whose loss was NaN/inf (at most 8), no
    traceback; the checkpoint the run wrote before holds only finite tensors (the diverged weights
    never replace it), and the line points to it."""
    done, run_dir = diverged
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    match = NAN_STEP.match(errors[0])
    assert match and 1 <= int(match.group(1)) <= 8, errors[0]
    assert "lower --lr" in errors[0]
    checkpoint = run_dir / "checkpoint.pt"
    assert checkpoint.is_file() and str(checkpoint) in errors[0]
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert state["step"] < int(match.group(1))
    floats = [t for t in tensors(state) if t.is_floating_point()]
    assert floats and all(torch.isfinite(t).all() for t in floats)


def test_a_nan_loss_prints_only_the_error_line(diverged):
    """The NaN stop meets the whole contract: besides the warning that training started on the CPU,
    its error line is all stderr holds."""
    done, _ = diverged
    assert done.stderr.startswith("warning: no CUDA GPU found: running on the CPU\n")
    assert_refused(subprocess.CompletedProcess(done.args, done.returncode, done.stdout,
                                               done.stderr.split("\n", 1)[1]), "NaN/inf", code=1)


def test_first_nonfinite_step_names_the_first_bad_update_of_the_window():
    """TrainMeter records, on the device, the first update of a window whose loss is not
    finite: a window of 4 after 4 good steps, with a NaN at its 3rd update and an inf at
    its 4th, reports step 4 + 3 = 7."""
    meter = TrainMeter(torch.device("cpu"))
    logits, labels = torch.zeros(2, 10), torch.tensor([0, 1])
    for _ in range(4):
        meter.update(torch.tensor(2.3), logits, labels)
    meter.take()
    for loss in (2.2, 2.1, float("nan"), float("inf")):
        meter.update(torch.tensor(loss), logits, labels)
    totals = meter.take()
    assert not torch.isfinite(totals[0])
    assert meter.first_nonfinite_step(step=8) == 7


# ---------------------------------------------------------------------------------- rendezvous file
def test_only_an_old_rendezvous_file_is_refused(tmp_path):
    """A file:// rendezvous path that does not exist yet, or a file as new as this
    launch (another rank of it may have created it), is accepted; one older than
    --dist_timeout is refused as a leftover."""
    path = tmp_path / "rdzv"
    check_rendezvous_file(path, timeout_s=30)
    path.write_bytes(b"written by rank 1 of this launch")
    check_rendezvous_file(path, timeout_s=30)
    an_hour_ago = time.time() - 3600
    os.utime(path, (an_hour_ago, an_hour_ago))
    with pytest.raises(UsageError, match="left over"):
        check_rendezvous_file(path, timeout_s=30)
    assert path.read_bytes() == b"written by rank 1 of this launch"  # refused, not deleted


# -------------------------------------------------------------------------------- launch variables
ONE_BY_HAND = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
BAD_LAUNCHES = [  # (the variables changed, what the line must say)
    ({"WORLD_SIZE": ""}, "WORLD_SIZE='' in the environment is not the job's number of processes"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
    ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),  # it blamed RANK
    ({"WORLD_SIZE": None}, "WORLD_SIZE is not set but RANK is"),
    ({"RANK": None}, "RANK is not set but WORLD_SIZE is"),
    ({"RANK": "1.0"}, "RANK='1.0'"),
    ({"RANK": "1"}, "RANK='1' in the environment is not this process's place among the job's "
                    "WORLD_SIZE=1 (here only 0)"),
    ({"RANK": "-1"}, "RANK='-1'"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),  # the CPU, or another rank's GPU
    ({"LOCAL_RANK": ""}, "LOCAL_RANK=''"),
    ({"LOCAL_RANK": "1"}, "LOCAL_RANK='1' in the environment is not this process's place among "
                          "its node's WORLD_SIZE=1"),
    ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"},
     "LOCAL_RANK='2' in the environment is not this process's place among its node's "
     "LOCAL_WORLD_SIZE=2 (a whole number from 0 to 1)"),
    ({"LOCAL_WORLD_SIZE": ""}, "LOCAL_WORLD_SIZE=''"),  # a traceback, int('')
    ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc'"),
    ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0'"),
    ({"LOCAL_WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE='2' in the environment is not the number of "
                                "processes on this node, of the job's WORLD_SIZE=1"),
    ({"GROUP_RANK": "node0"}, "GROUP_RANK='node0'"),
    ({"TORCHELASTIC_RESTART_COUNT": "x"}, "TORCHELASTIC_RESTART_COUNT='x'"),
    ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc' in the environment is not a TCP port"),  # unnamed
    ({"MASTER_PORT": "65536"}, "MASTER_PORT='65536'"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT='0'"),
    ({"MASTER_PORT": None}, "MASTER_PORT is not set, and --init_method env:// reads it"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR='' in the environment is not a host name or IP address"),
    ({"MASTER_ADDR": None, "MASTER_PORT": None}, "MASTER_ADDR and MASTER_PORT are not set"),
]


def with_changes(base: dict, changes: dict) -> dict:
    return {name: value for name, value in {**base, **changes}.items() if value is not None}


@pytest.mark.parametrize("changes, named", BAD_LAUNCHES, ids=lambda case: ascii(case)[:40])
def test_each_bad_launch_variable_is_named_with_its_value(changes, named):
    """Each variable a launcher sets, as a process-group worker reads it (CheckedLaunch, in one
    place: common/launch_env.py): a bad value is one line that names the variable, its value, its
    range and what to do, said by the process whose environment it is."""
    with pytest.raises(UsageError) as error:
        worker_launch(with_changes(ONE_BY_HAND, changes))
    message = str(error.value)
    assert named in message and "\n" not in message and error.value.rank_specific, message
    assert any(advice in message for advice in ("set ", "give ", "unset")), message


def test_good_launch_variables_are_read_as_the_launchers_mean_them():
    """torchrun's set, a PyTorchJob pod's (no LOCAL_RANK), and a rendezvous that is not env://
    (MASTER_* are not read)."""
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
                "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "2",
                "TORCHELASTIC_USE_AGENT_STORE": "True"}
    launch = worker_launch(torchrun)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.local_world_size,
            launch.node, launch.nodes, launch.master_addr, launch.master_port, launch.restart,
            launch.agent_store, launch.by_torchrun) == (5, 8, 1, 4, 1, 2, "node0", 29500, 2,
                                                        True, True)
    pod = worker_launch({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0",
                         "MASTER_PORT": "23456"})
    assert (pod.local_rank, pod.local_world_size, pod.nodes, pod.restart) == (None, None, 1, None)
    assert worker_launch({"RANK": "0", "WORLD_SIZE": "2"}, env_rendezvous=False).master_port is None
    # read alone once the group is made (a group made by hand, in a test, has neither)
    assert (local_rank({}), torchrun_node({}), local_rank(torchrun), torchrun_node(torchrun)) == \
        (None, None, 1, 1)


@pytest.mark.parametrize("variables, named", [
    ({"PET_NNODES": "abc"}, "PET_NNODES='abc'"),
    ({"PET_NNODES": "0"}, "PET_NNODES='0'"),
    ({"PET_NNODES": "1:"}, "PET_NNODES='1:'"),
    ({"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGBOGUS"}, "SIGBOGUS is no signal"),
    ({"PET_SIGNALS_TO_HANDLE": ""}, "an empty name is no signal"),
    ({"PET_SHUTDOWN_TIMEOUT": "abc"}, "PET_SHUTDOWN_TIMEOUT='abc'"),  # torchrun's usage text
    ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "-5"}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT='-5'"),  # traceback
], ids=lambda case: ascii(case)[:40])
def test_the_self_launchs_agent_variables_are_checked(variables, named):
    """What `python train.py` hands torch's agent from the environment: a bad value is one line
    before any worker starts, where the agent printed its usage text, a traceback, or a warning
    and then passed no signal on. Good values pass, as Kubeflow writes them."""
    with pytest.raises(UsageError, match=re.escape(named)):
        agent_launch(variables)
    agent = agent_launch({"PET_NNODES": "1:3", "PET_SIGNALS_TO_HANDLE": "SIGTERM, SIGUSR1",
                          "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"})
    assert (agent.nodes, agent.shutdown_timeout) == (3, True)
    assert agent_launch({}) == AgentLaunch(nodes=None, signals=None, shutdown_timeout=False)


def test_a_one_process_mode_shares_the_cores_by_valid_variables_only(monkeypatch):
    """single_gpu and data_parallel do not read the launch variables but for the cores their loader
    workers share: some other job's bad LOCAL_WORLD_SIZE in the shell counts as one process, where
    it was a traceback."""
    for bad in ("", "abc", "0", "-2"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        assert processes_on_this_node() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert processes_on_this_node() == 3


def test_a_folder_of_one_class_and_a_truncated_bmp_are_refused_by_a_real_process(tmp_path):
    """Two image folders a user could hand over, each refused in one line before anything is
    written, by the script itself: one of a single class (a classifier needs two), and one whose BMP
    was cut short (no end marker to look for: decoded to its end up front, where it used to pass
    and stop the run at the step that read it)."""
    from PIL import Image

    from conftest import two_at_a_time

    roots = {name: tmp_path / name for name in ("one_class", "truncated_bmp")}
    for name, root in roots.items():
        for split in ("train", "val"):
            for label in ("cat",) if name == "one_class" else ("cat", "dog"):
                (root / split / label).mkdir(parents=True)
                for i in range(2):
                    Image.new("RGB", (20, 20), (40 * i, 80, 120)).save(
                        root / split / label / f"{i}.bmp")
    cut = roots["truncated_bmp"] / "train" / "dog" / "1.bmp"
    cut.write_bytes(cut.read_bytes()[:700])

    def launch(name):
        return run_script(SINGLE, "--dataset", "imagefolder", "--data_dir", roots[name],
                          "--image_size", "16", "--depth", "8", "--alpha", "12", "--batch_size",
                          "2", "--epochs", "1", "--num_workers", "0",
                          "--log_dir", tmp_path / "runs", env=ONE_THREAD)

    one_class, truncated = two_at_a_time(lambda: launch("one_class"),
                                         lambda: launch("truncated_bmp"))
    assert_refused(one_class, f"{roots['one_class'] / 'train'} has one class folder, cat: a "
                              "classifier needs two classes or more")
    assert_refused(truncated, f"{cut} cannot be read as an image (image file is truncated",
                   "replace it with a readable image, or delete it")
    assert not (tmp_path / "runs").exists()

"""Helpers shared by the tests: run a train.py the way a user does,
and read what a run left behind."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A tiny model on a small synthetic set: 8 steps of 32 images an epoch, a window every 4 steps,
# 51 test images; a run takes seconds on two CPU cores.
TINY = ["--dataset", "synthetic", "--synthetic_size", "256", "--depth", "8", "--alpha", "12",
        "--batch_size", "32", "--epochs", "1", "--log_interval", "4", "--warmup_steps", "1",
        "--num_workers", "0"]
MODES = ("single_gpu", "data_parallel", "dist_parallel", "fsdp", "pipeline_parallel")


@functools.cache
def train_file(mode: str):
    """`<mode>/train.py` imported by its path as a module of its own name (`<mode>_train`: the
    files do not shadow one another), once: importing it runs nothing but its imports and
    definitions; it puts the repository and models/ on sys.path itself."""
    spec = importlib.util.spec_from_file_location(f"{mode}_train", REPO / mode / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(script: str, *args, cwd=REPO, timeout=300, env=None) -> subprocess.CompletedProcess:
    """`python <script> args...` in a subprocess, output captured; `script` is relative to the
    repository. One intra-op thread unless `env` says otherwise: the suite runs a file per core, and
    a second thread per process would only contend (and spin) for a core another run is using."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    """A TCP port on the loopback that no process holds now (a rendezvous's, say)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def at_epoch(loader, epoch: int, skip: int = 0):
    """`loader` set to epoch `epoch` from its batch `skip` on, as every train.py's loop sets it:
    the sampler's order of the epoch (an evaluation shard has none), then the loader's
    augmentation of it. Returns the loader."""
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    loader.start_epoch(epoch, skip)
    return loader


def two_at_a_time(*launches):
    """Call each of `launches` (functions that start a run and wait for it), two at a time,
    and return their results in order: a one-thread run leaves the other core idle. The first
    error is raised once all are done."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(launch) for launch in launches]
        return [future.result() for future in futures]


def refuse_in_process(script: str, *args) -> subprocess.CompletedProcess:
    """`python <script> args...` for a launch that is refused before anything starts, run
    inside this process as the script's `__main__` block runs it (under runkit.one_line_errors(),
    stdout and stderr captured): the user's path without the ~3 s of starting Python and
    importing torch. The process-group modes without RANK in the environment take the self-launch's
    path (get_args, then launch_workers), where starting a worker fails the test; with RANK, main(),
    the group destroyed after it. Only for launches that stop before training; a few of every kind
    are also run as real subprocesses."""
    import torch.distributed as dist
    import torch.distributed.run

    module = train_file(script.split("/")[0])
    argv = [str(arg) for arg in args]
    out, err = io.StringIO(), io.StringIO()

    def no_workers(*_, **__):
        raise AssertionError(f"{script} {' '.join(argv)} started its workers: it was not refused")

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.distributed.run, "run", no_workers)
        for name in ("PYTORCH_MULTIGPU_SELF_LAUNCH", "OMP_NUM_THREADS"):  # what the launch sets:
            unset = name not in os.environ  # restored after, set or not
            patch.setenv(name, os.environ.get(name, ""))
            if unset:
                patch.delenv(name)
        try:
            with module.runkit.one_line_errors():
                try:
                    if hasattr(module, "launch_workers") and "RANK" not in os.environ:
                        code = module.launch_workers(module.get_args(argv),
                                                     [str(REPO / script), *argv])
                    else:
                        code = module.main(argv)
                finally:
                    if dist.is_initialized():
                        dist.destroy_process_group()
                    while module.runkit._held:  # the run folder's lock, held until a process ends
                        module.runkit._held.pop().close()
        except SystemExit as exit_:
            code = exit_.code
    return subprocess.CompletedProcess([script, *argv], code or 0, out.getvalue(),
                                       err.getvalue())


def train_in_process(script: str, *args,
                     sigterm_at: int | None = None) -> subprocess.CompletedProcess:
    """`python <script> args...` of single_gpu or data_parallel run inside this process, as
    refuse_in_process runs it, but to the end of its training: a tiny run without the ~3 s of
    starting Python and importing torch. With `sigterm_at`, a SIGTERM is noted at the log window of
    that step, as the signal handler notes one: the run stops there with its checkpoint. (The
    signals themselves are tested on real processes.)"""
    module = train_file(script.split("/")[0])
    log_window = module.log_window

    def signal_then_log(run, epoch):
        if run.progress["step"] == sigterm_at:
            run.signals.received = "SIGTERM"
        log_window(run, epoch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "log_window", signal_then_log)
        return refuse_in_process(script, *args)


def read_results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's TensorBoard event files as TensorBoard shows it: read with its
    own EventAccumulator, which drops the points a restarted run purged (every point kept: no
    sampling)."""
    return {tag: [(event.step, event.value) for event in events]
            for tag, events in scalar_events(run_dir).items()}


def scalar_events(run_dir: Path) -> dict:
    """{tag: [ScalarEvent(wall_time, step, value)]}, from TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()[SCALARS]}


# The files whose tests launch the most runs, heaviest first (as measured with --durations). The
# suite is spread over the cores a file at a time (pytest.ini); started first, the long files do not
# leave one core working alone at the end while the short ones fill in beside them.
HEAVIEST_FIRST = ("test_parallel.py", "test_reliability.py", "test_compare.py",
                  "test_compare_front_door.py", "test_tensorboard.py", "test_breakdown.py",
                  "test_fast_path.py", "test_signals.py", "test_models.py",
                  "test_compile.py", "test_bad_input.py", "test_single_gpu.py", "test_slurm.py",
                  "test_aligned_channels.py", "test_imagefolder.py", "test_pipeline.py",
                  "test_mnist.py", "test_vscode.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    # stable: each file's own order is kept
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to reach the network fails as it does without one
    (torchvision's download helpers)."""
    import urllib.error

    import torchvision.datasets.utils

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets.utils, "_urlretrieve", no_network)
    monkeypatch.setattr(torchvision.datasets.utils, "_get_redirect_url", no_network)
    monkeypatch.setattr(torchvision.datasets.utils, "_is_remote_location_available", lambda: False,
                        raising=False)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """In-process tests: tiny convolutions run ~100x faster on one intra-op thread than on two
    contended ones (2-core machine). Subprocesses are not affected."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


HIDDEN = "<hidden: reads as 'does not exist'>"
_OPTION_NAMES: dict[str, list[str]] = {}  # each config module's options, read once at the start


def compile_options() -> dict[str, object]:
    """Every option of TorchDynamo's and inductor's config modules as a reader sees it: a copy of
    its value, or HIDDEN where reading it raises (what a delattr leaves: unittest.mock's and
    pytest's undo delete an attribute they found missing from the module's __dict__)."""
    import copy
    import warnings

    import torch._dynamo.config
    import torch._inductor.config

    options = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated options warn when read
        for module in (torch._dynamo.config, torch._inductor.config):
            # get_config_copy() itself raises on a hidden option up to torch 2.13: the names come
            # from its first call, before any test ran
            if module.__name__ not in _OPTION_NAMES:
                _OPTION_NAMES[module.__name__] = list(module.get_config_copy())
            for name in _OPTION_NAMES[module.__name__]:
                try:
                    value = copy.deepcopy(getattr(module, name))
                except AttributeError:
                    value = HIDDEN
                options[f"{module.__name__}.{name}"] = value
    return options


def options_changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """'name: before -> after' for each option that differs."""
    return [f"{name}: {before.get(name)!r} -> {after.get(name)!r}"
            for name in sorted(before.keys() | after.keys())
            if before.get(name, HIDDEN) != after.get(name, HIDDEN)]


@pytest.fixture(autouse=True)
def torch_left_as_found():
    """Every test leaves torch's compile options as it found them: a test that patches one does
    it with torch's own `config.patch(...)`, which restores it, and never with monkeypatch, whose
    undo can leave the option hidden (it did, on torch 2.14 with pytest 9.2) and so fail later
    tests inside torch's own compile. A test that leaves one changed errors at its teardown."""
    before = compile_options()
    yield
    changed = options_changed(before, compile_options())
    if changed:
        pytest.fail("this test left torch's compile options changed (patch them with "
                    "torch's own config.patch): " + "; ".join(changed), pytrace=False)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(options) -> a fresh tmpfs folder, unmounted after the test. The test is skipped where
    mounting fails (not root, no mount namespace), with the reason."""
    mounted = []

    def mount(options: str) -> Path:
        folder = tmp_path / f"tmpfs{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"a small tmpfs cannot be mounted here ({done.stderr.strip()}), so no "
                        f"read-only or full file system can be made (needs root)")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=False)

"""Bad input, against the product's contract, run the way a user meets it:

- exactly one line on stderr that starts with "error: " and says what to do (torch's own C++
  log output does not count), with no warning before it;
- a non-zero exit status: 2 for a usage error, 1 for a run that could not go on (a NaN loss, a
  file system that refuses: runkit.one_line_errors);
- no Python traceback;
- nothing overwritten: every file that existed (run folders, checkpoints, the user's own files)
  keeps its bytes and its mtime, and a refused launch creates no run folder.

The cases: --resume of a missing, truncated, foreign, damaged or differently configured checkpoint
and the flags it excludes or needs; reusing a run name; --overwrite and --resume of a folder no run
made or of a symbolic link; a --log_dir that is a file or leads nowhere; values outside their
flag's type or choices (tests/test_config.py holds each flag's, here a few in each mode as a user
meets them) and the checks between flags; -j far past the machine; -e alone; --augment off --flip;
the variables a launcher sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_PORT, empty,
not a number, negative, out of range, one without the other); the self-launch's flags under
torchrun; the rendezvous of a process started by hand; a loss that turns NaN; an image folder of
one class or with an unreadable image; CIFAR-10 offline. Also what must NOT be refused: --resume
auto for a run folder without a checkpoint (a fresh start), and with one (it continues).

Speed: a launch costs ~3 s of CPU, nearly all of it importing torch. The refused launches share
one real run folder (module-scoped). A few of every kind run as real processes, two at a time; the
rest run in this process through the scripts' own main() meanwhile (conftest.refuse_in_process:
the __main__ block's path, without the start-up), a process-group mode's with the launcher's
variables set in this process as a worker has them.
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
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import runkit
from conftest import (REPO, TINY, free_port, read_results, refuse_in_process, run_script,
                      train_in_process, two_at_a_time)

SINGLE, DATA, DIST, FSDP = ("single_gpu/train.py", "data_parallel/train.py",
                            "dist_parallel/train.py", "fsdp/train.py")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # several launches share two cores
# A run with a checkpoint and weights to misuse: 3 of the 8 steps of TINY's epoch.
TRAINED_FLAGS = ["--max_steps", "3", "--save_model"]
FIRST_ATTEMPT_NOTES = ("left in the run folder by a first attempt that died "
                       "before its first checkpoint")
NAME_MAX = os.pathconf("/", "PC_NAME_MAX")
# torch's C++ logging (glog format) and the C++ stack it may print: not the product's lines.
TORCH_LOG = re.compile(r"\[[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ \S+:\d+\] |Exception raised from |frame "
                       r"#\d+: |<omitting python frames>$|$")
# What a run prints on a machine without CUDA once the refusals are behind (a NaN loss comes after
# it): left out of the one line here; test_no_warning_comes_before_a_refusal says it never comes
# before a refusal.
CPU_WARNING = "warning: no CUDA GPU found: running on the CPU"


# ------------------------------------------------------------------------------------------ helpers
def message_lines(stderr: str) -> list[str]:
    """stderr without torch's own log output (and the CPU warning): what the contract allows is one
    error line."""
    return [line for line in stderr.splitlines()
            if not TORCH_LOG.match(line) and line != CPU_WARNING]


def assert_refused(done: subprocess.CompletedProcess, *named: str, code: int = 2) -> str:
    """The contract for bad input; returns the error line, which must contain every string in
    `named`."""
    lines = message_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)
    for text in named:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def no_network() -> dict[str, str]:
    """Environment under which every HTTP(S) download fails at once, as on a machine without a
    network: urllib (torchvision's downloader) goes through a proxy on a port where nobody
    listens."""
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
    """The module's folder: runs/ (the --log_dir of every case), inputs/ (files to misuse)."""
    return tmp_path_factory.mktemp("bad_input")


@pytest.fixture(scope="module")
def first_start(work) -> tuple[Path, subprocess.CompletedProcess]:
    """runs/a: a real TINY run of 3 steps with --save_model, so it holds checkpoint.pt and
    model.pt. It is started as an elastic job's restart would be, with --resume auto in a run folder
    that exists without a checkpoint (a first attempt died before writing one): (run folder,
    completed run)."""
    run_dir = work / "runs" / "a"
    run_dir.mkdir(parents=True)
    (run_dir / runkit.MARKER).write_text("")  # the first attempt claimed the folder
    (run_dir / "notes.txt").write_text(FIRST_ATTEMPT_NOTES)
    done = train_in_process(SINGLE, *TINY, *TRAINED_FLAGS, "--resume", "auto", "--log_dir",
                            run_dir.parent, "--run_name", run_dir.name)
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
    listens on, {closed_port} one where nobody listens. The error line must contain every string in
    `named`, and the exit status be `code`. `env`: a real process with these variables; `shell`: in
    this process, with these variables set (a process-group worker's, when RANK is one of them);
    `as_a_user`: a real process."""
    id: str
    script: str
    flags: tuple
    named: tuple
    code: int = 2
    run_name: str | None = None
    base: tuple = tuple(TINY)
    log_dir: str = "{work}/runs"
    env: tuple = ()
    network: bool = True
    as_a_user: bool = False
    shell: tuple = ()

    def argv(self, where: dict) -> list[str]:
        flags = [str(flag).format(**where) for flag in self.flags]
        name = [] if self.run_name == "" else ["--run_name", self.run_name or self.id]
        return [*self.base, "--log_dir", self.log_dir.format(**where), *name, *flags]

    @property
    def subprocess(self) -> bool:
        return self.as_a_user or bool(self.env) or not self.network

    def environment(self, where: dict) -> dict[str, str]:
        env = {**ONE_THREAD, **{key: value.format(**where) for key, value in self.env}}
        return env if self.network else {**env, **no_network()}


def worker(rank="0", world_size="1", port="{closed_port}", **more: str) -> tuple:
    """The variables of one process of a process-group job started by hand (or by a launcher), with
    the `more` variables (any of them in place of its own; None: unset)."""
    given = {"RANK": rank, "WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port, **more}
    return tuple((name, value) for name, value in given.items() if value is not None)


def xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


CHECKPOINT = "{work}/runs/a/checkpoint.pt"
REFUSALS = [
    # --resume of something that is not a usable checkpoint
    Refusal("resume-missing", SINGLE, ("--resume", "{work}/inputs/missing.pt"), ("missing.pt",)),
    Refusal("resume-truncated", SINGLE, ("--resume", "{work}/inputs/truncated.pt"),
            ("truncated.pt",)),
    Refusal("resume-text-file", SINGLE, ("--resume", "{work}/inputs/notes.txt"), ("notes.txt",)),
    Refusal("resume-model-pt", SINGLE, ("--resume", "{work}/runs/a/model.pt"),
            ("model.pt", "--evaluate")),
    Refusal("resume-flipped-byte", SINGLE, ("--resume", "{work}/inputs/flipped.pt"),
            ("flipped.pt", "checksum")),
    Refusal("resume-earlier-format", DATA, ("--resume", "{work}/inputs/earlier-format.pt"),
            ("earlier-format.pt", "pytorch-multigpu checkpoint v2")),  # named by its format
    # a checkpoint of a different config, resumed into its own run folder: it stays unchanged
    Refusal("resume-other-depth", SINGLE, ("--resume", CHECKPOINT, "--depth", "14"),
            ("--depth 8 (now 14)",), run_name="a"),
    Refusal("resume-other-batch", DATA, ("--resume", CHECKPOINT, "--batch_size", "16"),
            ("--batch_size 32 (now 16)",), run_name="a"),
    # flags --resume excludes or needs
    Refusal("resume-auto-without-run-name", SINGLE, ("--resume", "auto"), ("--run_name",),
            run_name=""),
    Refusal("resume-auto-with-overwrite", SINGLE, ("--resume", "auto", "--overwrite"),
            ("--overwrite",), run_name="a"),
    Refusal("evaluate-with-resume", DATA, ("--evaluate", "{work}/runs/a/model.pt", "--resume",
                                           CHECKPOINT), ("--evaluate", "--resume")),
    # an existing run name without --resume
    Refusal("existing-run-name", SINGLE, (), ("--overwrite", "--resume auto"), run_name="a"),
    # what --overwrite and --resume must not touch: a folder no run made, another run's via a link
    Refusal("overwrite-a-folder-no-run-made", SINGLE, ("--overwrite",),
            ("runs/data", "not a run folder"), run_name="data"),
    Refusal("overwrite-through-a-symlink", SINGLE, ("--overwrite",), ("runs/link", "link"),
            run_name="link"),
    Refusal("resume-through-a-symlink", DATA, ("--resume", "auto"), ("runs/link", "link"),
            run_name="link"),
    Refusal("resume-into-a-folder-no-run-made", SINGLE, ("--resume", "auto"),
            ("not a run folder",), run_name="data"),
    # a --log_dir that cannot hold a run folder: the file system's refusal, in one line naming it
    Refusal("log-dir-is-a-file", SINGLE, (), ("inputs/notes.txt",), code=1,
            log_dir="{work}/inputs/notes.txt"),
    Refusal("log-dir-dangling-symlink", DATA, (), ("inputs/dangling",), code=1,
            log_dir="{work}/inputs/dangling/runs"),
    Refusal("run-name-too-long", SINGLE, (), ("File name too long",), code=1,
            run_name="x" * (NAME_MAX + 1)),
    # values outside a flag's type or choices, and the checks between flags
    Refusal("batch-size-0", SINGLE, ("--batch_size", "0"), ("--batch_size", "'0'")),
    Refusal("lr-nan", DATA, ("--lr", "nan"), ("--lr", "'nan'")),
    Refusal("dist-timeout-inf", DIST, ("--dist_timeout", "inf"), ("--dist_timeout", "'inf'")),
    Refusal("seed-above-numpy", DATA, ("--seed", str(2**32)), ("--seed", str(2**32))),
    Refusal("nproc-per-node-0", DIST, ("--nproc_per_node", "0"), ("--nproc_per_node", "'0'")),
    Refusal("max-restarts-negative", FSDP, ("--max_restarts=-1",), ("--max_restarts", "'-1'")),
    Refusal("bucket-cap-nan", DIST, ("--bucket_cap_mb", "nan"), ("--bucket_cap_mb", "'nan'")),
    Refusal("dataset-unknown", FSDP, ("--dataset", "imagenet"), ("--dataset", "'imagenet'")),
    Refusal("model-unknown", SINGLE, ("--model", "resnt18"), ("--model resnt18",)),
    Refusal("sync-bn-fsdp", FSDP, ("--sync_bn",), ("unrecognized arguments: --sync_bn",)),
    Refusal("depth-neither-block-has", SINGLE, ("--depth", "109"), ("--depth 109", "6n+2")),
    Refusal("batch-past-the-images", DATA, ("--batch_size", "512"), ("--batch_size 512", "256")),
    Refusal("augment-off-with-flip", SINGLE, ("--augment", "off", "--flip"),
            ("--augment off", "--flip")),
    Refusal("compile-mode-without-compile", DATA, ("--compile_mode", "max-autotune"),
            ("--compile_mode", "--compile")),
    Refusal("memory-snapshot-without-a-gpu", SINGLE, ("--memory_snapshot", "2"),
            ("--memory_snapshot", "GPU")),
    Refusal("usage-error-with-local-rank-set-single", SINGLE, ("--bogus",), ("--bogus",),
            shell=(("LOCAL_RANK", "1"), ("RANK", "1"))),
    Refusal("usage-error-with-rank-set-data-parallel", DATA, ("--bogus",), ("--bogus",),
            shell=(("RANK", "3"),)),
    # -j 1000, meant as -j 10: forked a thousand workers, and the memory ran out (issue 44)
    Refusal("num-workers-past-the-machine", SINGLE, ("-j", "1000"), ("-j 1000", "at most"),
            as_a_user=True),
    Refusal("num-workers-past-the-machine-for-a-worker-of-2", DIST, ("-j", "1000"),
            ("-j 1000", "2 process"), shell=worker(LOCAL_WORLD_SIZE="2")),
    # what a process-group worker refuses before it joins the group
    Refusal("sync-bn-without-gpus", DIST, ("--sync_bn",), ("--sync_bn", "GPU"), shell=worker()),
    Refusal("nccl-without-gpus-fsdp", FSDP, ("--backend", "nccl"), ("--backend nccl", "gloo"),
            shell=worker()),
    Refusal("compile-cuda-graphs-fsdp", FSDP, ("--compile", "--compile_mode", "reduce-overhead"),
            ("FSDP2", "--compile_mode default"), shell=worker()),
    Refusal("compile-small-buckets-dist-parallel", DIST, ("--compile", "--bucket_cap_mb", "0.5"),
            ("--bucket_cap_mb", "at least 1"), shell=worker()),
    # the self-launch's flags in a process it did not start: ignored there, yet recorded (issue 44;
    # under a real torchrun: test_torchrun_with_the_self_launchs_flags_is_refused_once)
    Refusal("self-launch-flag-by-hand", DIST, ("--nproc_per_node", "2"),
            ("--nproc_per_node", "torchrun"), shell=worker("1", "2", "1")),
    Refusal("self-launch-flag-by-hand-fsdp", FSDP, ("--max_restarts", "1"),
            ("--max_restarts", "torchrun"), shell=worker()),
    # the variables a launcher sets, each bad value named with its value before any int() or
    # rendezvous (issue 44); the rest of them: test_each_bad_launch_variable_is_named_with_its_value
    Refusal("launch-local-world-size-empty", DIST, (), ("LOCAL_WORLD_SIZE=''",),
            env=worker(LOCAL_WORLD_SIZE="")),  # a traceback, int('')
    # a rendezvous of a process started by hand that cannot succeed: one line, within its timeout
    Refusal("rendezvous-port-in-use", DIST, ("--dist_timeout", "10"), ("rank 0", "process group"),
            code=1, shell=worker(port="{busy_port}")),
    Refusal("rendezvous-master-unreachable", DIST, ("--dist_timeout", "5"),
            ("rank 1", "process group"), code=1, env=worker("1", "2")),
    # CIFAR-10 that is not there, and no network to download it: where to put it, or what else
    Refusal("cifar10-offline", SINGLE, ("--dataset", "cifar10", "--data_dir", "{work}/no-data"),
            ("cifar", "--dataset synthetic"), network=False),
]
# Each case that fails today, the behaviour missing from the train files or runkit.py: what it does
XFAIL: dict[str, str] = {}


def make_inputs(work: Path, checkpoint: Path) -> None:
    """inputs/: a checkpoint cut to half its bytes, one with a flipped byte, one of the earlier
    format, text files, links; runs/: a folder no run made, a link to run a."""
    inputs = work / "inputs"
    inputs.mkdir()
    raw = checkpoint.read_bytes()
    (inputs / "truncated.pt").write_bytes(raw[:len(raw) // 2])
    (inputs / "flipped.pt").write_bytes(flip_a_weight_byte(checkpoint))
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    earlier = {"format": "pytorch-multigpu checkpoint v2", "model": state["model"], "step": 3,
               "epoch": 0, "batch": 3, "config": state["config"]}  # v2: the progress at the top
    torch.save(earlier, inputs / "earlier-format.pt")
    (work / "runs" / "data").mkdir()
    (work / "runs" / "data" / "images.bin").write_bytes(b"a user's own data, in the runs' folder")
    (work / "runs" / "link").symlink_to(work / "runs" / "a")
    (inputs / "dangling").symlink_to(inputs / "nowhere")
    (inputs / "notes.txt").write_text("not a checkpoint: notes about run a\n")


def flip_a_weight_byte(checkpoint: Path) -> bytes:
    """The checkpoint's bytes with one bit flipped inside its largest tensor's data (a disk or copy
    error): the zip archive and the pickle stay readable, so only a checksum can tell."""
    raw = bytearray(checkpoint.read_bytes())
    with zipfile.ZipFile(checkpoint) as archive:
        largest = max((entry for entry in archive.infolist() if "/data/" in entry.filename),
                      key=lambda entry: entry.file_size)
    name_length, extra_length = struct.unpack_from("<HH", raw, largest.header_offset + 26)
    raw[largest.header_offset + 30 + name_length + extra_length + largest.file_size // 2] ^= 0x40
    return bytes(raw)


def offline_downloads(patch: pytest.MonkeyPatch) -> None:
    """torchvision's download helpers fail as they do without a network (conftest's `offline`)."""
    import urllib.error

    import torchvision.datasets.utils

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    for name in ("_urlretrieve", "_get_redirect_url"):
        patch.setattr(torchvision.datasets.utils, name, no_network)


def refused_run(case: Refusal, where: dict, inside: bool) -> subprocess.CompletedProcess:
    """A real process (stopped after 120 s: a refusal that hangs), or the case in this process
    with its `shell` variables set and, without a network, no download."""
    if not inside:
        return run_script(case.script, *case.argv(where), env=case.environment(where), timeout=120)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            patch.delenv(name, raising=False)
        for name, value in case.shell:
            patch.setenv(name, value.format(**where))
        if not case.network:
            offline_downloads(patch)
        return in_process(case.script, *case.argv(where))


def in_process(script: str, *argv) -> subprocess.CompletedProcess:
    """conftest.refuse_in_process, an exception that escapes the script's __main__ block shown as
    the interpreter would show it: a traceback, exit status 1."""
    import traceback

    try:
        return refuse_in_process(script, *argv)
    except Exception as error:  # what a user would see: a traceback
        shown = "".join(traceback.format_exception(error))
        return subprocess.CompletedProcess([script, *argv], 1, "", shown)


@pytest.fixture(scope="module")
def refusals(work, trained) -> tuple[dict, dict, dict]:
    """Every REFUSALS launch while this test listens on {busy_port}: the real processes two at a
    time, the others in this process meanwhile (those with variables of their own once no process
    is being started: a subprocess would inherit them): ({id: completed process}, snapshot of the
    module's folder before, snapshot after)."""
    make_inputs(work, trained / "checkpoint.pt")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        where = {"work": work, "busy_port": busy.getsockname()[1], "closed_port": free_port()}
        before = snapshot(work)
        real = [case for case in REFUSALS if case.subprocess and case.network]
        offline = [case for case in REFUSALS if not case.network]  # patched here, not a process
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {case.id: pool.submit(refused_run, case, where, False) for case in real}
            outcomes = {case.id: refused_run(case, where, True) for case in REFUSALS
                        if not case.subprocess and not case.shell}
            outcomes.update({case_id: future.result() for case_id, future in futures.items()})
        outcomes.update({case.id: refused_run(case, where, True) for case in REFUSALS
                         if case.shell or case in offline})
    return outcomes, before, snapshot(work)


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id, marks=[xfail(XFAIL[case.id])]
                                               if case.id in XFAIL else [])
                                  for case in REFUSALS])
def test_bad_input_is_refused_with_one_line(refusals, case):
    """One "error: " line naming the problem and its fix, the exit status of its kind, no
    traceback, and no hang (the unreachable master: its --dist_timeout of 5 s)."""
    assert_refused(refusals[0][case.id], *case.named, code=case.code)


def test_refused_launches_change_no_file_and_create_no_run_folder(refusals, work):
    """After every refusal: run folder a/ (whose checkpoint was resumed with other flags, whose name
    was reused), its checkpoint.pt and model.pt, the damaged copies, the text file and the user's
    folder in runs/ keep their bytes and mtimes, and no run folder or file appeared."""
    _, before, after = refusals
    changed = [path for path in differences(before, after) if not path.startswith("no-data")]
    assert not changed, changed
    assert "runs/a/checkpoint.pt" in before and "runs/data/images.bin" in before
    assert before["runs/link"] == ("link", str(work / "runs" / "a"))
    runs_after = sorted(path for path in after if path.count("/") == 1 and path.startswith("runs/"))
    assert runs_after == ["runs/a", "runs/data", "runs/link"]


def test_no_warning_comes_before_a_refusal(refusals):
    """The CPU warning comes once training starts, never before a refusal: the one line is all
    stderr holds."""
    warned = [case for case, done in refusals[0].items() if CPU_WARNING in done.stderr]
    assert not warned, warned


# --------------------------------------------------------------------------------- launch variables
BAD_LAUNCHES = [  # (the variables changed, None: unset; what the line must say)
    ({"RANK": ""}, "RANK=''"),
    ({"RANK": "abc"}, "RANK='abc'"),
    ({"RANK": "-1"}, "RANK='-1'"),
    ({"RANK": "1"}, "RANK=1"),  # outside WORLD_SIZE=1
    ({"WORLD_SIZE": ""}, "WORLD_SIZE=''"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'"),
    ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1'"),
    ({"WORLD_SIZE": None}, "RANK and WORLD_SIZE"),  # RANK without WORLD_SIZE
    ({"LOCAL_RANK": ""}, "LOCAL_RANK=''"),
    ({"LOCAL_RANK": "abc"}, "LOCAL_RANK='abc'"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),  # on a GPU node: the CPU, or another rank's GPU
    ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"}, "LOCAL_RANK=2"),
    ({"LOCAL_WORLD_SIZE": ""}, "LOCAL_WORLD_SIZE=''"),  # a traceback, int('')
    ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc'"),  # a traceback
    ({"LOCAL_WORLD_SIZE": "-2"}, "LOCAL_WORLD_SIZE='-2'"),
    ({"MASTER_PORT": ""}, "MASTER_PORT=''"),
    ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc'"),  # unnamed
    ({"MASTER_PORT": "-1"}, "MASTER_PORT='-1'"),
    ({"MASTER_ADDR": None}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),  # once blamed RANK: 'RANK=0 is outside WORLD_SIZE=0'
    ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE"),  # once blamed LOCAL_RANK
    ({"LOCAL_RANK": "1"}, "LOCAL_RANK"),  # outside WORLD_SIZE=1, once 'LOCAL_WORLD_SIZE=None'
    ({"MASTER_PORT": "65536"}, "MASTER_PORT"),  # a traceback in init_process_group
    ({"MASTER_PORT": "0"}, "MASTER_PORT"),  # a port no other rank can reach: a one-rank run trained
    ({"MASTER_PORT": None}, "MASTER_PORT"),  # a traceback in init_process_group
]


@pytest.mark.parametrize("mode", ["dist_parallel", "fsdp"])
@pytest.mark.parametrize("changes, named", BAD_LAUNCHES,
                         ids=lambda case: ascii(case)[:40])
def test_each_bad_launch_variable_is_named_with_its_value(monkeypatch, tmp_path, mode, changes,
                                                          named):
    """Each variable a launcher sets, as a worker of a process-group mode reads it (in this process,
    as its __main__ block runs main()): a bad value is one line that names the variable, its value
    where it has one, exit 2, before any rendezvous (--dist_timeout 5 bounds one that would wait),
    and nothing is written."""
    variables = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port()), **changes}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    if "RANK" not in os.environ:  # the self-launch's path: get_args, then launch_workers
        pytest.fail("a case without RANK belongs in test_world_size_without_rank_is_refused")
    done = in_process(f"{mode}/train.py", *TINY, "--max_steps", "1", "--log_dir",
                      tmp_path / "runs", "--dist_timeout", "5")
    line = assert_refused(done, named)
    assert line.startswith(f"error: {named}") and "None" not in line, line
    assert not (tmp_path / "runs").exists()


def test_world_size_without_rank_is_refused(monkeypatch, tmp_path):
    """WORLD_SIZE=2 in the shell and no RANK: half a launch, refused in one line before any worker
    starts (conftest.refuse_in_process fails a test whose launch starts one)."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    done = refuse_in_process(DIST, *TINY, "--log_dir", tmp_path / "runs")
    assert_refused(done, "WORLD_SIZE", "RANK")


def test_the_self_launch_in_a_job_of_two_nodes_is_refused_not_left_hanging(monkeypatch, tmp_path):
    """`python dist_parallel/train.py --nproc_per_node 2` in a pod of a two-node Kubeflow job
    (PET_NNODES=2, as its torch plugin sets it): one line at once, no worker started."""
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.delenv("RANK", raising=False)
    done = refuse_in_process(DIST, *TINY, "--nproc_per_node", "2", "--log_dir", tmp_path)
    assert_refused(done, "PET_NNODES")


def test_a_gpu_that_is_not_there_is_refused_naming_those_that_are(monkeypatch):
    """--gpu_devices 7 on a node of two GPUs (here pretended: this machine has none)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(runkit.UsageError, match=r"^--gpu_devices: there is no GPU 7 \(GPUs 0-1 "
                                                r"are visible\)$"):
        runkit.cuda_device(7)
    assert runkit.cuda_device(1) == torch.device("cuda", 1)


# ------------------------------------------------------------------------------- under torchrun
def torchrun(*argv, processes: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(processes), *map(str, argv)],
                          cwd=REPO, env={**os.environ, **ONE_THREAD}, capture_output=True,
                          text=True, timeout=120)


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines()
            if line.startswith("error: ")]


def test_torchrun_with_the_self_launchs_flags_is_refused_once(tmp_path):
    """`torchrun ... dist_parallel/train.py --nproc_per_node 2 --max_restarts 1`: the flags of
    `python train.py`'s own launch, which torchrun's workers ignored and their run recorded as if
    they had taken effect (issue 44). Refused in one line, said once for the node's two workers,
    that gives torchrun's own flags; nothing is written."""
    done = torchrun(REPO / DIST, *TINY, "--log_dir", tmp_path / "runs", "--run_name", "ignored",
                    "--nproc_per_node", "2", "--max_restarts", "1")
    errors = error_lines(done)
    assert done.returncode != 0 and len(errors) == 1, done.stdout + done.stderr
    assert "--nproc_per_node" in errors[0] and "--max_restarts" in errors[0], errors[0]
    assert "--nproc-per-node" in errors[0] and "--max-restarts" in errors[0], errors[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", [SINGLE, DATA])
def test_a_one_process_mode_started_by_torchrun_is_refused(monkeypatch, tmp_path, script):
    """`torchrun --nproc_per_node 2 single_gpu/train.py`: each process would train the whole model
    alone, into one run folder. A worker of such a launch (in this process, with the variables
    torchrun gives it) is refused in one line naming dist_parallel, nothing written."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job"}.items():
        monkeypatch.setenv(name, value)
    done = in_process(script, *TINY, "--max_steps", "1", "--log_dir", tmp_path / "runs")
    assert_refused(done, "dist_parallel")
    assert not (tmp_path / "runs").exists()


# -------------------------------------------------------------------------------------- resume auto
def test_resume_auto_without_a_checkpoint_is_a_fresh_start(first_start):
    """--resume auto --run_name a, where a/ exists without a checkpoint, is not an error: it starts
    afresh (exit 0, no "resumed"), trains to --max_steps and keeps the files already there."""
    run_dir, done = first_start
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed" not in done.stdout and "Traceback" not in done.stderr
    assert read_results(run_dir)["summary"]["step"] == 3
    assert (run_dir / "notes.txt").read_text() == FIRST_ATTEMPT_NOTES


def test_resume_auto_continues_from_the_checkpoint(trained, tmp_path):
    """A copy of run folder a/ (checkpoint at step 3), run again with --resume auto and a longer
    --max_steps: it says where it resumed and ends at step 5."""
    run_dir = tmp_path / "runs" / "a"
    shutil.copytree(trained, run_dir)
    done = train_in_process(SINGLE, *TINY, "--max_steps", "5", "--resume", "auto", "--log_dir",
                            run_dir.parent, "--run_name", run_dir.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed at step 3 " in done.stdout
    assert read_results(run_dir)["summary"]["step"] == 5


# --------------------------------------------------------------------------------------- a NaN loss
@pytest.fixture(scope="module")
def diverged(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """TINY with --lr 1e30 (its first update sends the weights past float32), a checkpoint after
    every step: (completed run, run folder)."""
    run_dir = tmp_path_factory.mktemp("diverged") / "runs" / "nan"
    done = train_in_process(SINGLE, *TINY, "--lr", "1e30", "--max_steps", "8", "--log_interval",
                            "2", "--checkpoint_interval", "1", "--log_dir", run_dir.parent,
                            "--run_name", run_dir.name)
    return done, run_dir


def test_a_nan_loss_stops_the_run_in_one_line(diverged):
    """Exit status 1, one error line that names the step (at most 8) and says to lower --lr, no
    traceback; no checkpoint of NaN weights replaces a good one: whatever checkpoint.pt the run
    holds has finite tensors only."""
    done, run_dir = diverged
    line = assert_refused(done, "NaN/inf", "lower --lr", code=1)
    step = int(re.search(r"step (\d+)", line).group(1))
    assert 1 <= step <= 8, line
    if (run_dir / "checkpoint.pt").exists():
        state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
        assert state["progress"]["step"] < step
        floats = [t for t in tensors(state) if t.is_floating_point()]
        assert floats and all(torch.isfinite(t).all() for t in floats)


# ------------------------------------------------------------------------------------ image folders
@pytest.fixture(scope="module")
def image_folders(tmp_path_factory) -> dict:
    """Two image folders a user could hand over, each given to single_gpu/train.py as a real
    process, side by side: one of a single class, one whose BMP was cut short: {name: (completed
    process, folder, its --log_dir)}."""
    from PIL import Image

    work = tmp_path_factory.mktemp("image_folders")
    roots = {name: work / name for name in ("one_class", "truncated_bmp")}
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
                          "--log_dir", work / f"runs-{name}", env=ONE_THREAD)

    done = two_at_a_time(*(lambda name=name: launch(name) for name in roots))
    return {name: (outcome, roots[name], work / f"runs-{name}")
            for name, outcome in zip(roots, done)}


def test_a_folder_of_one_class_is_refused_by_a_real_process(image_folders):
    """A classifier needs two classes: one line naming the one there is, nothing written."""
    done, _, runs = image_folders["one_class"]
    assert_refused(done, "cat", "two")
    assert not runs.exists()


def test_an_unreadable_image_is_refused_by_a_real_process_before_anything_is_written(
        image_folders):
    """A BMP cut short (no end marker to look for): decoded up front and refused in one line that
    names it, before anything is written."""
    done, root, runs = image_folders["truncated_bmp"]
    assert_refused(done, str(root / "train" / "dog" / "1.bmp"))
    assert not runs.exists()


# --------------------------------------------------------------------------------------- counting
def test_a_count_is_said_in_words(refusals):
    """A refusal's counts read as a sentence does: "1 process", "2 processes", never "(es)"."""
    lines = {case: message_lines(done.stderr) for case, done in refusals[0].items()}
    wrong = {case: said for case, said in lines.items()
             if any(re.search(r"\(e?s\)|\b1 [a-z]+s\b", line) for line in said)}
    assert not wrong, wrong

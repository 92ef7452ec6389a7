"""Run every mode alike and write the comparison: report.md, projection.md, results.csv and plots.

    # every mode on every GPU here: DDP and FSDP on NCCL and Gloo
    python compare.py
    # a scaling sweep (the same global batch in every run)
    python compare.py --gpu_counts 1 2 4 8
    # each GPU keeps 128 images (weak scaling)
    python compare.py --gpu_counts 1 2 4 8 --batch_per_gpu 128
    python compare.py --modes dist_parallel --backends nccl gloo --repeat 3
    python compare.py --amp bf16 off --sync_bn off on
    # DDP, FSDP ZeRO-3 and ZeRO-2
    python compare.py --modes dist_parallel fsdp --reshard_after_forward on off
    # train for 30 epochs and compare test accuracy too
    python compare.py --epochs 30 --dataset cifar10
    # any flag compare.py does not take is a train.py flag, given to every run
    python compare.py --depth 56 --alpha 84
    # any classification model torchvision lists
    python compare.py --model resnet50 --image_size 224
    # prove the modes agree here: a verdict per check, verify.md
    python compare.py --verify --deterministic

Each configuration runs as its own subprocess, started as a user would start it (`python
single_gpu/train.py`, `python data_parallel/train.py`, `torchrun dist_parallel/train.py`, `torchrun
fsdp/train.py`, `torchrun pipeline_parallel/train.py`), with the same model, data, global batch,
learning rate and seed; by default in `--benchmark` mode (speed only, on synthetic data; with
--dataset imagefolder on the folder's own images, read as a training run reads them). fsdp is in
the default --modes where there are two GPUs or more (one GPU has nothing to shard over); `--modes
fsdp` runs it anywhere. pipeline_parallel, a stage a GPU, runs on two GPUs or more, or two CPU
processes, where it takes the model and the flags (PyramidNet; not --compile, --channels_last or
--amp fp16); its step's split shows its bubble, the wait for its neighbour. Every run's
command line is read by its own train file's parser before any run starts (comparison/
train_files.py): a refusal there, or of the matrix's rules (comparison/rules.py), is one line and
nothing runs. Each run is read back from its run folder (results.json, each rank's profiler trace)
and everything goes to `--out` (default results/<timestamp>): report.md
(the model, the mode to use here and why, the table and what it says, first), results.csv, the
plots, each run's log and run folder, and projection.md: projections past this machine (DDP's and
FSDP's scaling, and the memory per GPU of this model, and of wider ones for PyramidNet). A model
that cannot take the images is refused before any run. A run that fails is kept in the report with
its error. Without GPUs the same matrix runs as CPU processes over Gloo with a tiny PyramidNet, one
thread per process standing in for a GPU.

`--out` is compare.py's: before any run it writes its marker there (MARKER), so that a folder it
cannot write is refused at once. `--overwrite` replaces only a folder that holds the marker, and
only the files compare.py writes (in runs/ and logs/, its runs' folders and logs). Ctrl-C,
SIGTERM, SIGHUP and SIGUSR1 stop every run and still write the report, the interrupted run marked
as such; a kill -9 of compare.py kills its runs too (comparison/runner.py).

`--verify` runs, instead of the comparison, the checks the tests run on the CPU
(comparison/verify.py), comparing the runs' checkpoints with one another: the modes end with the
same weights and momentum on one device, DDP and FSDP on N processes end alike, the evaluation is
exact for any number of processes, the ranks stay in sync, a resumed run ends where an
uninterrupted one ends, and the pipeline on N stages ends with DDP's weights. Each check's figure,
tolerance and verdict go to verify.md (and verify.json); a failed check makes the exit status
non-zero and is named in the last line.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python compare.py` from anywhere

import torch

from comparison import environment as machine
from comparison import model_shapes, train_files
from comparison.errors import UsageError, file_system_problem, plural, user_errors
from comparison.matrix import (BACKENDS, RUN_NAME, Cores, check_runs, command, cores_here, plan,
                               run_flags)
from comparison.projection import (fsdp_units, gradient_bytes, memory_per_gpu, memory_projection,
                                   model_size, pipeline_pieces, pipeline_projection)
from comparison.report.breakdown import breakdown_section
from comparison.report.environment import environment_section
from comparison.report.files import EARLIER_PICTURES, PICTURES, write_file
from comparison.report.findings import findings, oversubscription_title, untimed_note
from comparison.report.formatting import fmt_seconds, listed
from comparison.report.measured import groups
from comparison.report.model import model_line, model_title, run_config
from comparison.report.outcome import Outcome
from comparison.report.projection_memory import memory_section
from comparison.report.projection_pipeline import pipeline_section
from comparison.report.projection_scaling import (fabric_of_runs, projection_inputs,
                                                  projection_section)
from comparison.report.recommendation import recommendation
from comparison.report.results_table import TABLE_NOTE, table_header, table_row
from comparison.report.rows import fill_rows, write_csv
from comparison.rules import machine_refusal
from comparison.runner import (
    run_all, signal_name, signal_of, signals_deferred, start, stop_signals)
from comparison.train_files import GROUP_MODES, MODES, REPO, flag_name
from comparison.verify import Verification
from comparison.verify_plan import (DEFAULT_STEPS, defaults as verify_defaults, images_in_test_set,
                                    images_in_training_set)

# ------------------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class CompareConfig:
    """compare.py's own flags, as build_compare_parser reads them (resolve() fills in what depends
    on the machine)."""
    out: str | None = None
    verify: bool = False
    modes: tuple[str, ...] | None = None
    gpu_counts: tuple[int, ...] | None = None
    backends: tuple[str, ...] | None = None
    amp: tuple[str | None, ...] | None = None
    sync_bn: tuple[str, ...] = ("off",)
    reshard_after_forward: tuple[str, ...] = ("on",)
    repeat: int = 1
    profile_steps: int = 3
    epochs: int = 0
    batch_per_gpu: int | None = None
    run_timeout: int | None = None
    overwrite: bool = False


# train.py flags compare.py sets itself for every run, named as typed after their leading dashes
# (hyphens read as underscores): each with what to give compare.py instead
CONTROLLED = {
    "gpu_devices": "--gpu_counts (the runs take the first GPUs)",
    "log_dir": "--out (each run's folder is <out>/runs/<run>)",
    "run_name": "--out (compare.py names its runs)", "resume": "nothing: every run starts afresh",
    "evaluate": "nothing: `compare.py --verify` evaluates the runs' weights itself",
    "e": "nothing: `compare.py --verify` evaluates the runs' weights itself",
    "save_model": "nothing: --verify saves what it compares",
    "checkpoint_interval": "nothing: compare.py keeps what its runs need",
    "benchmark": "--epochs 0 (the default: every run a --benchmark)",
    "backend": "--backends", "no_reshard_after_forward": "--reshard_after_forward off",
    "nproc_per_node": "--gpu_counts", "max_restarts": "nothing: a run that fails is reported",
}
# the process-group modes' own flags that compare.py passes on, and which modes take each
GROUP_PASSED = {"bucket_cap_mb": ("dist_parallel",), "dist_timeout": GROUP_MODES}
AMPS = ("bf16", "fp16", "off")
# --run_timeout on GPUs, unless given: what the run must do, at a pace far below any GPU's, so that
# only a run that is stuck reaches it (an hour, the default before, let one stuck run hold the GPU,
# and every run after it, that long, and stopped any training that needs longer). On an H200 a
# PyramidNet-110 run starts in about 30 s, compiles in 109 s and steps at about 130 TFLOP/s (4,679
# images/s of 28.3 GFLOP; an H100's fp32 path at 50 TFLOP/s).
RUN_START_S = 300  # imports, CUDA, the data, cuDNN's autotuning
COMPILE_S = 600  # --compile's compile
SLOW_TFLOPS = 5.0  # the pace of each training step and evaluation batch, on one GPU
SLOW_STEP_S = 0.2  # a step of a small model: its kernels' launches
CPU_RUN_TIMEOUT = 3600  # without GPUs, where a step's pace varies too much with the CPU and model

# without GPUs, the train.py flags every run is given before the user's own (which win): a model
# and run small enough for a few seconds per run on a laptop's CPU
CPU_DEFAULTS = ["--depth", "8", "--alpha", "12", "--batch_size", "32", "--synthetic_size", "512",
                "--benchmark_steps", "20", "--warmup_steps", "3", "--log_interval", "5"]
# and the loader's workers, but for an image folder, read as a training run reads it there
CPU_WORKERS = ["--num_workers", "0"]
PASSED_ON = ("Any other flag is a train.py flag (`python single_gpu/train.py --help`: the model, "
             "the data, --batch_size, --max_steps, --compile, --deterministic ...), passed to "
             "every run as given, after compare.py's defaults for this machine, and checked by "
             "each mode's own parser before any run starts.")


def count(least: int):
    """An argparse type: a whole number, at least `least`."""
    def whole_number(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"{text} is not a whole number of {least} or more")
        return int(text)
    return whole_number


def positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"invalid {text}: give a number above 0")
    return value


class Parser(argparse.ArgumentParser):
    """A mistake in compare.py's flags is one line (a UsageError) naming the flag as it was typed;
    no abbreviations."""

    typed: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self.typed = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        def as_typed(match: re.Match) -> str:
            spellings = match.group(1).split("/")
            typed = {token.split("=")[0] for token in self.typed}
            return f"argument {next((s for s in spellings if s in typed), spellings[0])}:"

        message = re.sub(r"argument (-[\w-]+(?:/-[\w-]+)+):", as_typed, message)
        raise UsageError(f"{message} (see python compare.py --help)")


class HelpFormatter(argparse.HelpFormatter):
    """--help with each flag's first spelling alone (its hyphenated alias is accepted too) and its
    default where it has one the help does not already give."""

    def _format_action_invocation(self, action):
        spellings = [s for s in action.option_strings if "-" not in s.lstrip("-")]
        if action.nargs == 0:
            return ", ".join(spellings)
        return f"{spellings[0]} {self._format_args(action, action.dest.upper())}"

    def _get_help_string(self, action):
        shown = not any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
        if shown and "default" not in (action.help or ""):
            default = " ".join(action.default) if isinstance(action.default, list) \
                else action.default
            return f"{action.help} (default: {default})"
        return action.help


def build_compare_parser() -> Parser:
    """compare.py's flags and the process-group flags it passes on (docs/flags.py prints its
    --help); any other flag is a train.py flag (PASSED_ON)."""
    parser = Parser(description=__doc__.split("\n\n")[0], epilog=PASSED_ON,
                    formatter_class=HelpFormatter, allow_abbrev=False)
    add = parser.add_argument
    add("--out", help="folder for everything compare.py writes (default: results/<timestamp>)")
    add("--verify", action="store_true",
        help="instead of the comparison: check that the modes agree (weights, evaluation, ranks "
             "in sync, resume, the pipeline's weights against DDP's), each check a verdict in "
             "verify.md; --max_steps default 24")
    add("--modes", nargs="+", choices=MODES, metavar="MODE",
        help=f"which modes to run, of {', '.join(MODES)} (default: all five with two GPUs or "
             "more, and with --verify; on one GPU without fsdp and pipeline_parallel; without "
             "GPUs without fsdp; in the comparison, pipeline_parallel where it takes the model "
             "and flags)")
    add("--gpu_counts", "--gpu-counts", nargs="+", type=count(1),
        help="GPU counts for data_parallel, dist_parallel and fsdp (default: every GPU here; "
             "without GPUs, 2 CPU processes)")
    add("--backends", nargs="+", choices=BACKENDS,
        help="dist_parallel's and fsdp's backends (default: nccl and gloo with GPUs, gloo without)")
    add("--amp", nargs="+", choices=AMPS,
        help="--amp settings to compare (default: each run's default for the device)")
    add("--sync_bn", "--sync-bn", nargs="+", choices=("off", "on"), default=["off"],
        help="dist_parallel with BatchNorm (off), SyncBatchNorm (on), or both")
    add("--reshard_after_forward", "--reshard-after-forward", nargs="+", choices=("on", "off"),
        default=["on"], help="fsdp freeing each block's gathered parameters after forward, "
                             "gathered again in backward (on, ZeRO-3-like), keeping them to "
                             "backward (off, ZeRO-2-like), or both")
    add("--repeat", type=count(1), default=1,
        help="runs of each configuration; the report gives mean ± std")
    add("--profile_steps", "--profile-steps", type=count(0), default=3,
        help="steps of every run recorded by torch.profiler after its timed steps (never "
             "timed): the report splits each rank's step into compute, communication hidden and "
             "exposed, data and optimizer; 0: off")
    add("--epochs", type=count(0), default=0,
        help="0: --benchmark runs (speed only, on synthetic data, or on an image folder's own "
             "images); N: train N epochs on --dataset and compare test accuracy too")
    add("--batch_per_gpu", "--batch-per-gpu", type=count(1),
        help="images per GPU in every run, so the global batch grows with the GPUs (weak "
             "scaling); instead of --batch_size")
    add("--run_timeout", "--run-timeout", type=count(1),
        help="seconds a run may take before it is stopped and reported as failed (default: on "
             "GPUs, sized to the run: 5 minutes to start, 10 more with --compile, and the FLOPs "
             "of each step and evaluation batch at 5 TFLOP/s, at least 0.2 s each; without GPUs, "
             "an hour)")
    add("--overwrite", action="store_true",
        help="replace the comparison an --out folder holds: what compare.py wrote there, nothing "
             "else")
    group = parser.add_argument_group("passed to dist_parallel/train.py (--dist_timeout to "
                                      "fsdp/train.py and pipeline_parallel/train.py too)")
    group.add_argument("--bucket_cap_mb", "--bucket-cap-mb", type=positive,
                       help="DDP's gradient buckets, MiB (default: dist_parallel's)")
    group.add_argument("--dist_timeout", "--dist-timeout", type=positive,
                       help="seconds a collective waits for the other ranks (default: the "
                            "train files')")
    return parser


def given(train: list[str], *names: str) -> bool:
    """Whether the train.py flags the user gave (`train`) name one of `names`."""
    return any(flag_name(token) in names for token in train)


def parse(argv=None) -> tuple[CompareConfig, list[str], dict]:
    """compare.py's own flags, the train.py flags given (passed to every run, as typed) and the
    process-group modes' own flags given (passed to their runs: GROUP_PASSED)."""
    own, train = build_compare_parser().parse_known_args(argv)
    own = vars(own)
    group_only = {name: own.pop(name) for name in GROUP_PASSED if own[name] is not None}
    for name in GROUP_PASSED:
        own.pop(name, None)
    for name in ("modes", "gpu_counts", "backends", "amp", "sync_bn", "reshard_after_forward"):
        own[name] = tuple(dict.fromkeys(own[name])) if own[name] is not None else None
    controlled = next((token for token in train if flag_name(token) in CONTROLLED), None)
    if controlled is not None:
        raise UsageError(f"{controlled.split('=')[0]} is compare.py's to set for every run: "
                         f"give {CONTROLLED[flag_name(controlled)]}")
    return CompareConfig(**own), train, group_only


def train_values(train: list[str]) -> dict:
    """Every train.py flag, as single_gpu/train.py's own parser reads the flags every run is given
    (`train`; a flag not given, its default), or the one line that refuses them."""
    try:
        return vars(train_files.parse("single_gpu", train))
    except UsageError as refusal:
        if "unrecognized arguments" not in str(refusal):
            raise UsageError(f"{refusal} (single_gpu/train.py's parser, reading the flags "
                             "compare.py passes to every run)") from None
        raise UsageError(f"{refusal}: compare.py passes every flag it does not know to every "
                         "train.py (python compare.py --help, python single_gpu/train.py "
                         "--help)") from None


def resolve(cc: CompareConfig, train: list[str], cuda: bool, gpus_here: int,
            group_only=()) -> CompareConfig:
    """Defaults that depend on the machine, and the mistakes between flags to refuse before any run
    starts (each flag's own domain was checked when it was parsed); `train`: the train.py flags
    given, `group_only`: the process-group flags given. fsdp is a default mode of the comparison
    from two GPUs on: with one there is nothing to shard over, and on the CPU its gloo processes
    would only repeat dist_parallel's point. pipeline_parallel is one from two processes on (two
    GPUs; without GPUs, 2 CPU processes), a stage each, where it takes the model and the flags
    (pipeline_takes). --verify checks every mode wherever it runs: pipeline_parallel from two
    processes on."""
    counts = cc.gpu_counts or ((gpus_here,) if cuda else (2,))
    backends = cc.backends or (BACKENDS if cuda else ("gloo",))
    runs_here = {"fsdp": cc.verify or (cuda and gpus_here >= 2),
                 "pipeline_parallel": cc.verify and max(counts) >= 2
                 or not cc.verify and pipeline_takes(cc, train, max(counts), cuda)}
    modes = cc.modes or tuple(m for m in MODES if runs_here.get(m, True))
    checks = [
        (not cuda or max(counts) <= gpus_here,
         f"--gpu_counts {max(counts)} is more GPUs than the {gpus_here} visible here"),
        ("off" not in cc.reshard_after_forward or "fsdp" in modes,
         "--reshard_after_forward off is fsdp's setting: add fsdp to --modes"),
        *[(any(mode in modes for mode in GROUP_PASSED[name]),
           f"--{name} is passed to {listed(list(GROUP_PASSED[name]))} only: add "
           f"{listed(list(GROUP_PASSED[name]), 'or')} to --modes, or leave --{name} out")
          for name in group_only],
        (cc.batch_per_gpu is None or not given(train, "batch_size", "b"),
         "--batch_size fixes the global batch and --batch_per_gpu each GPU's: give one of them"),
        (cc.epochs or cc.verify or not given(train, "max_steps"),
         "--max_steps applies to training: give it with --epochs N"),
        (not cc.verify or cc.repeat == 1,
         "--repeat is for the comparison: --verify runs each check once"),
        (not cc.verify or cc.batch_per_gpu is None,
         "--verify compares runs of one global batch: give --batch_size instead of "
         "--batch_per_gpu"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    # the backends and SyncBatchNorm against the machine, refused as train.py refuses them
    refusal = machine_refusal(cuda, backends, "on" in cc.sync_bn)
    if refusal is not None:
        raise UsageError(refusal)
    return dataclasses.replace(cc, modes=modes, gpu_counts=counts, backends=backends,
                               amp=cc.amp or (None,))


def pipeline_takes(cc: CompareConfig, train: list[str], processes: int, cuda: bool) -> bool:
    """Whether pipeline_parallel is a default mode here: with two GPUs or more (or CPU processes),
    PyramidNet with a piece for each stage of the most GPUs run, and the flags its parser and its
    rules take (not --compile, --channels_last or --amp fp16 in this version). Named in --modes, it
    refuses them in one line instead. `train`: the train.py flags given (after CPU_DEFAULTS'
    model on the CPU, as the runs get them)."""
    if processes < 2 or "fp16" in (cc.amp or ()):
        return False
    try:
        args = train_files.parse("pipeline_parallel", [*([] if cuda else CPU_DEFAULTS), *train])
    except UsageError:
        return False
    pieces = model_shapes.pipeline_piece_count(vars(args))  # None: no PyramidNet
    return pieces is not None and pieces >= processes


MARKER = ".pytorch-multigpu-comparison"  # written first into every --out; --overwrite looks for it
# what compare.py writes into --out: what --overwrite removes there, and nothing else
WRITTEN = (MARKER, "report.md", "projection.md", "results.csv", *PICTURES, *EARLIER_PICTURES,
           "verify.md", "verify.json")
# and in these folders, each run's own (matrix.RUN_NAME and this ending)
RUN_FILES = {"logs": ".log", "runs": ""}


def output_folder(cc: CompareConfig) -> Path:
    """The --out folder, absolute (the runs start in the repository, wherever compare.py was
    started). Refused before anything is written: a file; a folder with files but no MARKER (not a
    comparison, or one written before the marker: --overwrite never replaces it); an earlier
    comparison, unless --overwrite."""
    timestamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(os.path.realpath(cc.out)) if cc.out else REPO / "results" / timestamp
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a folder")
    try:
        holds_files = out.is_dir() and any(out.iterdir())
    except OSError as error:
        raise UsageError(out_error(out, error)) from None
    if holds_files and not is_comparison(out):
        raise UsageError(f"--out {out} holds files but no comparison (no {MARKER}, which "
                         f"compare.py writes first): give a new or empty folder (--overwrite "
                         f"replaces only an earlier comparison)")
    if holds_files and not cc.overwrite:
        raise UsageError(f"--out {out} already holds a comparison: give another --out, or "
                         f"--overwrite to replace it")
    return out


def is_comparison(out: Path) -> bool:
    """Whether compare.py wrote `out`: its MARKER is there, a file, not a symbolic link to one."""
    marker = out / MARKER
    return marker.is_file() and not marker.is_symlink()


def prepare_output(out: Path, argv: list[str]) -> None:
    """Make `out` this comparison's before any run starts: the folder; its MARKER, written first, so
    that a folder that cannot be written (read-only, full) is refused now rather than after an hour
    of runs; an earlier comparison's files removed (output_folder lets one through only with
    --overwrite); logs/ and runs/. A failure is one line, and a folder made for nothing is
    removed."""
    made = not (out.exists() or out.is_symlink())
    marker = (f"A comparison folder of pytorch-multigpu, written by `python compare.py "
              f"{shlex.join(argv)}`: --overwrite replaces what compare.py wrote here, nothing "
              f"else.\n")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_file(out / MARKER, marker.encode())
        remove_earlier(out)
        for folder in RUN_FILES:  # kept where a user's own files are in it
            (out / folder).mkdir(exist_ok=True)
    except OSError as error:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise UsageError(out_error(out, error)) from None


def remove_earlier(out: Path) -> None:
    """An earlier comparison's files (WRITTEN, the new MARKER aside) and the temporary files of a
    write it did not finish; in logs/ and runs/ its runs' logs and folders (RUN_FILES), a user's
    own files beside them kept. logs/ or runs/ as a symbolic link
    (compare.py makes none) is removed, and a link among the rest too, never followed."""
    for name in WRITTEN:
        if name != MARKER:
            remove(out / name)
        for temporary in out.glob(f".{name}.*.tmp"):  # files.write_file's
            temporary.unlink()
    for folder in RUN_FILES:
        if (out / folder).is_symlink():
            (out / folder).unlink()
        elif (out / folder).is_dir():
            for path in (out / folder).iterdir():
                if runs_own(folder, path.name):
                    remove(path)


def runs_own(folder: str, name: str) -> bool:
    """Whether a run of compare.py's wrote `name` into its `folder` (logs or runs): a run's log or
    folder, named as the matrix names runs (RUN_FILES)."""
    ending = RUN_FILES[folder]
    return name.endswith(ending) and RUN_NAME.fullmatch(name.removesuffix(ending)) is not None


def remove(path: Path) -> None:
    """A file or a folder and all it holds; a symbolic link removed, not what it points to."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # which removes the links inside it, not what they point to
    elif path.is_symlink() or path.exists():
        path.unlink()


def out_error(out: Path, error: OSError) -> str:
    """The one line for an --out that the file system refuses: where, why, and what to do."""
    where = f" ({error.filename})" if error.filename and Path(error.filename) != out else ""
    problem = (file_system_problem(error)
               or f"{error.strerror}: give another --out, a folder this user can write")
    return f"cannot write --out {out}{where}: {problem}"


# ------------------------------------------------------------------------------------------- report

def write_report(cc: CompareConfig, outcomes: list[Outcome], out: Path, cuda: bool, argv: list[str],
                 train: list[str], env: dict, topology: str | None, elapsed: float) -> list[Path]:
    """The pictures, results.csv, projection.md, then report.md, each written whole or not at all
    (files.write_file): a report.md that exists is complete. `train`: the train.py flags every run
    was given."""
    fill_rows(outcomes, out)
    ok = [o for o in outcomes if o.status == "ok"]
    config = run_config(ok[0].results["config"] if ok else train_values(train))
    device = device_name(env, cuda)
    model = model_shapes.model_on_meta(config)
    grads = gradient_bytes(model)
    bucket_cap_mb = next((o.results["config"].get("bucket_cap_mb") for o in ok
                          if o.run.mode == "dist_parallel"),
                         25.0)
    channels, size, _ = model_shapes.data_shape(config)
    projection = projection_inputs(outcomes, grads, bucket_cap_mb,
                                   fsdp_units(model, channels, size))
    amp = projection["amp"] if projection else (config.get("amp") or ("bf16" if cuda else "off"))
    model_name = model_title(config)
    # only PyramidNet has a width (alpha) to sweep
    sweep = config["model"] == model_shapes.PYRAMIDNET
    memory = memory_projection(lambda alpha: model_shapes.model_on_meta(config, alpha)
                               if sweep else model,
                               config["alpha"] if sweep else None, amp, config["momentum"] != 0,
                               gpu_memory_bytes(cuda))
    memory["name"] = model_name
    pieces = memory["pieces"] = pipeline_pieces(model, channels, size)  # PyramidNet's; else None
    pipeline = pipeline_projection(pieces, config["batch_size"], amp, config["momentum"] != 0) \
        if pieces else []
    whole_state = sum(memory_per_gpu(model_size(model), 1, "dist_parallel", amp=amp,
                                     momentum=config["momentum"] != 0).values())
    differs = model_shapes.projected_model_differs(model, [o.results for o in ok])
    # matplotlib: a second's import, for pictures only
    from comparison.plots import pictures_section, write_plots

    # the projected curves from a GPU's step only: from a CPU process's, they say
    # nothing (projection.md says why)
    cores = None if cuda else cores_here()  # what CPU runs share; GPU runs wait on their GPUs
    pictures = write_plots(outcomes, out, device, cuda, projection if cuda else None, cores)
    write_csv(outcomes, out / "results.csv")
    profiled = cc.profile_steps
    source = ("the image folder's own images" if config["dataset"] == "imagefolder"
              else "synthetic data")
    what = (f"`--benchmark`: {source}, {config['warmup_steps']} untimed then "
            f"{config['benchmark_steps']} timed steps per run"
            + (f", then {profiled} profiled (not timed)" if profiled else "") if not cc.epochs
            else f"training for {cc.epochs} epochs on {config['dataset']}")
    modes = listed(list(dict.fromkeys(o.run.mode for o in outcomes)))
    projection_page = [
        f"# Projection past this machine: {model_name}, from the runs on {device}",
        "",
        "**A projection, not a measurement**: what the runs of [report.md](report.md) imply for "
        "more GPUs than this machine has" + (", and for wider models" if sweep else "")
        + ", by the cost models of `comparison/projection.py` (which lists what they assume, "
        "with their sources).",
        *(["", f"**Not the runs' model:** {differs}; the figures below are of the model built "
           "here (`comparison/model_shapes.py`), not of the one measured."] if differs else []),
        "",
        "## Scaling past this machine",
        "",
        *projection_section(outcomes, projection, cuda, fabric_of_runs(outcomes, topology)),
        "",
        "## Memory per GPU: what fits",
        "",
        *memory_section(memory, outcomes, device if cuda else None),
        "",
        "## Pipeline: more stages and micro-batches",
        "",
        *pipeline_section(pipeline, whole_state, memory["gpu_bytes"], outcomes),
    ]
    write_file(out / "projection.md", ("\n".join(projection_page) + "\n").encode())
    report_page = [
        f"# {modes}: {model_name} on {device}{oversubscription_title(outcomes, cores)}",
        "",
        f"`{shlex.join(['python', 'compare.py', *argv])}` — {datetime.now():%Y-%m-%d %H:%M}, "
        f"{plural(len(outcomes), 'run')} in {fmt_seconds(elapsed)}; {what}; the same seed "
        f"({config['seed']}) and learning rate rule (--lr {config['lr']:g} per 128 images of "
        "global batch) in every run.",
        "",
        model_line(config, outcomes, sum(p.numel() for p in model.parameters())),
        "",
        recommendation(outcomes, memory),
        "",
        "## Results",
        "",
        TABLE_NOTE,
        "",
        table_header(outcomes),
        "|" + "---|" * table_header(outcomes).count(" | ") + "---|",
        *[table_row(group, outcomes) for group in groups(outcomes)],
        "",
        *findings(outcomes, cores),
        "",
        *untimed_note(outcomes, config["warmup_steps"]),
        "## Where a step goes",
        "",
        *breakdown_section(outcomes, cc.profile_steps),
        "",
        "## Pictures",
        "",
        *pictures_section(outcomes, pictures),
        "",
        "Every run's figures, unrounded, are in `results.csv`; its log in `logs/`, its run folder "
        "(results.json, TensorBoard events, each rank's profiler trace) in `runs/`.",
        "",
        "How to read this report: `docs/comparing.md` in the repository, section \"Reading the "
        "report\" (what each column means, and why GPU utilisation is not efficiency).",
        "",
        "[projection.md](projection.md): a projection past this machine, labelled so (DDP's and "
        "FSDP's scaling on more GPUs, and the memory per GPU of this model"
        + (" and wider ones)." if sweep else ")."),
        "",
        "## Environment",
        "",
        *environment_section(env, topology),
    ]
    write_file(out / "report.md", ("\n".join(report_page) + "\n").encode())
    return [out / "report.md", out / "projection.md", out / "results.csv", *pictures]


def gpu_memory_bytes(cuda: bool) -> int | None:
    """The first GPU's memory, which the memory projection weighs the model against; None without
    GPUs."""
    return torch.cuda.get_device_properties(0).total_memory if cuda else None


def device_name(env: dict, cuda: bool) -> str:
    if cuda and env.get("gpus"):
        return machine.gpu_summary(env)
    return f"CPU ({env.get('cpu')}, {env.get('cpu_count')} cores), no GPU"


# --------------------------------------------------------------------------------------------- main

def configure(argv: list[str]) -> tuple[CompareConfig, list[str], dict[str, list[str]], bool]:
    """The flags resolved for this machine: compare.py's own, the train.py flags of every run
    (compare.py's defaults for this machine first, the user's after them: a flag given twice takes
    its last value, so the user's win), the flags passed on to each process-group mode (mode ->
    arguments), and whether there are GPUs."""
    cc, given_flags, group_only = parse(argv)
    cuda = torch.cuda.is_available()
    cc = resolve(cc, given_flags, cuda, torch.cuda.device_count(), group_only)
    train = list(given_flags)
    if cc.verify:  # its own defaults first, so that compare.py's CPU defaults do not override them
        train = [*verify_defaults(cuda), *train]
    if not cuda:
        # an image folder is read as a training run reads it: its default loader workers
        folder = train_values(train)["dataset"] == "imagefolder"
        train = [*CPU_DEFAULTS, *([] if folder else CPU_WORKERS), *train]
    train_values(train)  # refused here, in one line, where no train file takes them
    group_flags = {mode: [token for name, value in group_only.items()
                          if mode in GROUP_PASSED[name] for token in (f"--{name}", f"{value:g}")]
                   for mode in GROUP_MODES}
    return cc, train, group_flags, cuda


def main(argv=None) -> int:
    """The comparison, or with --verify the checks. Ctrl-C, SIGTERM, SIGHUP and SIGUSR1 stop it
    (runner.stop_signals): the runs are stopped, and the report written. The exit status is then 128
    + the signal (130 for Ctrl-C, 143 for SIGTERM), as the train scripts give and as a shell shows a
    process that the signal ended: `timeout`, a scheduler or a script can tell which it was."""
    argv = sys.argv[1:] if argv is None else argv
    with stop_signals():
        try:
            return compare(argv)
        except KeyboardInterrupt as interruption:  # before any run started: nothing to report
            signum = signal_of(interruption)
            print(f"interrupted by {signal_name(signum)}", file=sys.stderr)
            return 128 + signum


def compare(argv: list[str]) -> int:
    """Every run planned (or refused in one line) and --out made ready before any run starts; then
    the runs."""
    interruption = None
    with user_errors():
        try:
            cc, train, group_flags, cuda = configure(argv)
            out = output_folder(cc)
            if cc.verify:  # the checks instead of the comparison
                verification = Verification(cc, train, group_flags, cuda, out)
            else:
                shared, runs = plan_matrix(cc, train, group_flags, cuda, out)
            check_dataset(cc, train)  # once the runs themselves are known to be possible
            prepare_output(out, argv)
        except KeyboardInterrupt as caught:  # for main, which tells the signals apart
            interruption = caught
    if interruption is not None:
        raise interruption
    try:
        cc = dataclasses.replace(cc, run_timeout=run_timeout(
            cc, verification.train if cc.verify else train, cuda))
        if cc.verify:
            device = device_name(machine.environment(), cuda)
            return verification.main(cc.run_timeout, argv, device)
        return run_matrix(cc, argv, train, shared, group_flags, runs, out, cuda)
    except OSError as error:  # --out refused a write during the runs (a disk that filled up)
        if not error.filename or not Path(error.filename).is_relative_to(out):
            raise
        print(f"error: {out_error(out, error)}; what was written before is in {out}, without "
              f"a report", file=sys.stderr)
        return 1


def run_timeout(cc: CompareConfig, train: list[str], cuda: bool) -> int:
    """--run_timeout, or where it is not given: without GPUs CPU_RUN_TIMEOUT; on GPUs what the
    longest run must do at a pace no working GPU run falls below: RUN_START_S, COMPILE_S with
    --compile, and SLOW_STEP_S or more for each training step and evaluation batch, the FLOPs of
    the most images one GPU takes in a step (the global batch, or --batch_per_gpu) at SLOW_TFLOPS.
    `train`: the flags of every run (--verify's with its --max_steps and --epochs)."""
    if cc.run_timeout is not None:
        return cc.run_timeout
    if not cuda:
        return CPU_RUN_TIMEOUT
    values = train_values(train)
    images = cc.batch_per_gpu or values["batch_size"]
    channels, size, _ = model_shapes.data_shape(values)
    flops = model_shapes.flops_per_image(model_shapes.model_on_meta(values), channels, size)
    step_s = max(SLOW_STEP_S, flops * images / (SLOW_TFLOPS * 1e12))
    return math.ceil(RUN_START_S + COMPILE_S * values["compile"]
                     + steps_of_a_run(cc, values) * step_s)


def steps_of_a_run(cc: CompareConfig, values: dict) -> int:
    """The training steps and evaluation batches of the longest run (`values`: the train.py flags
    of every run, as read): a --benchmark run's untimed, timed and profiled steps; a trained one's
    steps (up to --max_steps; the profiled ones among them), and a test set's batches after each
    epoch."""
    if not (cc.epochs or cc.verify):
        return values["warmup_steps"] + values["benchmark_steps"] + cc.profile_steps
    batch = cc.batch_per_gpu or values["batch_size"]
    epochs = cc.epochs or values["epochs"] or 1
    steps = epochs * math.ceil(images_in_training_set(values) / batch)
    limit = values["max_steps"] or (DEFAULT_STEPS if cc.verify else None)
    steps = min(steps, limit) if limit else steps
    return steps + epochs * math.ceil(images_in_test_set(values) / batch)


def check_dataset(cc: CompareConfig, train: list[str]) -> None:
    """The dataset the runs train on, read here once before any run when they would read or
    download it (cifar10, mnist: with --epochs, or --verify given one): downloaded into
    --data_dir if it is missing and the network allows, as the train files download it, or refused
    in one line, rather than every configuration starting only to fail alike; an image folder that
    torchvision's ImageFolder cannot read, refused likewise. --benchmark runs (the default) and
    synthetic data need nothing."""
    values = train_values(train)
    dataset, root = values["dataset"], values["data_dir"]
    if not (cc.epochs or cc.verify) and dataset != "imagefolder" or dataset == "synthetic":
        return
    if dataset == "imagefolder":
        if model_shapes.image_folder(root) is None:
            raise UsageError(f"--dataset imagefolder: {root} holds no train/ and val/ folders of "
                             "class folders of images: put the images in "
                             f"{root}/train/<class>/ and {root}/val/<class>/")
        return
    import torchvision

    kind = {"cifar10": torchvision.datasets.CIFAR10, "mnist": torchvision.datasets.MNIST}[dataset]
    try:
        for train_split in (True, False):
            kind(root, train=train_split, download=True)
    except (OSError, RuntimeError) as error:  # no network (URLError is an OSError), a bad file
        reason = " ".join(str(error).split())[:120] or type(error).__name__
        raise UsageError(f"--dataset {dataset}: {Path(root) / DATASET_FILES[dataset]} is not "
                         f"there and cannot be downloaded here ({reason}): put it there, or give "
                         "--dataset synthetic") from None


# what torchvision reads of each dataset it downloads, in --data_dir
DATASET_FILES = {"cifar10": "cifar-10-python.tar.gz", "mnist": "MNIST/raw"}


def plan_matrix(cc: CompareConfig, train: list[str], group_flags: dict[str, list[str]],
                cuda: bool, out: Path | None = None) -> tuple[list[str], list]:
    """The flags every run shares and the runs, or the one line that refuses them (each run checked
    as it will run, its folder under `out`)."""
    shared = [*train, *(["--epochs", str(cc.epochs)] if cc.epochs else ["--benchmark"]),
              "--profile_steps", str(cc.profile_steps)]
    batch = train_values(train)["batch_size"]
    sync_bns = [s == "on" for s in cc.sync_bn]
    reshards = [s == "on" for s in cc.reshard_after_forward]
    runs = plan(cc.modes, cc.gpu_counts, cc.backends, cc.amp, sync_bns, cc.repeat, cuda, batch,
                cc.batch_per_gpu, reshards)
    if not runs:
        raise UsageError("--modes/--gpu_counts/--backends leave nothing to run")
    check_runs(runs, shared, group_flags, (out or REPO / "results") / "runs", cuda)
    return shared, runs


def run_matrix(cc: CompareConfig, argv: list[str], train: list[str], shared: list[str],
               group_flags: dict[str, list[str]], runs: list, out: Path, cuda: bool) -> int:
    """Every run, one at a time, then the report. Exit status: 1 if a run did not succeed, 128 + the
    signal if one stopped compare.py."""
    env, topology = machine.environment(), machine.topology()
    device = device_name(env, cuda)
    print(f"compare: {plural(len(runs), 'run')} on {device} -> {out}; each stopped after "
          f"{cc.run_timeout} s (--run_timeout)", flush=True)
    warning = oversubscription_warning(runs, cores_here())
    if warning:
        print(warning, flush=True)
    began = time.monotonic()

    def begin(run):
        elapsed = fmt_seconds(time.monotonic() - began)
        print(f"[{run.index}/{len(runs)}] {run.describe()}, global batch {run.batch_size}"
              + (f", repeat {run.repeat}/{cc.repeat}" if cc.repeat > 1 else "")
              + f" — {len(runs) - run.index} left after it, {elapsed} elapsed", flush=True)
        flags = run_flags(run, shared, group_flags, out / "runs", cuda)
        return start(run, command(run, flags), out, cuda)

    def finished(run, outcome: Outcome) -> None:
        print(f"    {progress(outcome)} ({fmt_seconds(outcome.seconds)})", flush=True)

    def not_run(run, why: str) -> Outcome:
        return Outcome(run, "not run", error=why)

    by_run, signum = run_all(runs, begin, lambda run: [], 1, not_run, cc.run_timeout, finished)
    outcomes = [by_run[run] for run in runs]
    with signals_deferred() as received:  # a signal now waits for the report, not cut it short
        elapsed = time.monotonic() - began
        paths = write_report(cc, outcomes, out, cuda, argv, train, env, topology, elapsed)
    signum = signum if signum is not None else next(iter(received), None)
    failed = sum(o.status != "ok" for o in outcomes)
    written = ", ".join(str(p.relative_to(out)) for p in paths)
    unsuccessful = f"; {failed} of {plural(len(outcomes), 'run')} did not succeed (see report.md)"
    stopped = f"; compare.py was interrupted by {signal_name(signum)}" if signum else ""
    print(f"wrote {written} in {out}{unsuccessful if failed else ''}{stopped}", flush=True)
    if signum is not None:
        return 128 + signum
    return 1 if failed else 0


def oversubscription_warning(runs: list, cores: Cores) -> str | None:
    """The line compare.py prints before CPU runs with more threads than `cores` (report.md says it
    again, first): their speed will measure the processes' contention for the cores."""
    crowded = cores.crowded(runs)
    if not crowded:
        return None
    counts = listed(sorted({str(run.gpus) for run in crowded}, key=int))
    return (f"compare: warning: {max(run.gpus for run in crowded)} CPU processes on "
            f"{cores.available} cores oversubscribe this machine (runs of {counts} processes): "
            f"their speed will measure the contention, not the parallelism; --gpu_counts up to "
            f"{cores.fit} keeps a core for every thread")


def progress(outcome: Outcome) -> str:
    """A run's outcome on its progress line."""
    if outcome.status != "ok":
        return f"{outcome.status.upper()}: {outcome.error}"
    speed = outcome.results["summary"]["images_per_sec"]
    if speed is None:
        profiled = " and the --profile_steps after them" if outcome.results["summary"].get(
            "profiled_steps") else ""
        return f"ok, no timed steps (it ended within its --warmup_steps{profiled})"
    return f"{speed:,.0f} images/s"


if __name__ == "__main__":
    sys.exit(main())

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
    # any model/data flag of train.py goes to every run
    python compare.py --depth 56 --alpha 84
    # any classification model torchvision lists
    python compare.py --model resnet50 --image_size 224
    # prove the modes agree here: a verdict per check, verify.md
    python compare.py --verify --deterministic

Each configuration runs as its own subprocess, started as a user would start it (`python
single_gpu/train.py`, `python data_parallel/train.py`, `torchrun dist_parallel/train.py`, `torchrun
fsdp/train.py`), with the same model, data, global batch, learning rate and seed; by default in
`--benchmark` mode (speed only, on synthetic data; with --dataset imagefolder on the folder's own
images, read as a training run reads them). fsdp is in the default --modes where there are two
GPUs or more (one GPU has nothing to shard over); `--modes fsdp` runs it anywhere. Each run's
results.json is read back and everything goes to `--out` (default results/<timestamp>): report.md
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
(comparison/verify.py): the modes end with the same weights on one device, N processes with what one
process computes from the same shares, the evaluation is exact for any number of processes, the
ranks stay in sync, and a resumed run ends where an uninterrupted one ends. Each check's figure,
tolerance and verdict go to verify.md (and verify.json); a failed check makes the exit status
non-zero and is named in the last line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import shutil
import sys
import time
import types
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python compare.py` from anywhere

import torch

from common.command_line import HelpFormatter, _OneLineParser, add_flags, config_argv
from common.config import REPO_ROOT, AMPS, Config, UsageError, flag, parse_config
from common.domains import check_domains
from common.errors import file_system_problem, plural, user_errors
from common import performance
from common.data import dataset_info, load_datasets
from common.rules import machine_refusal
from comparison import environment as machine
from comparison.matrix import (BACKENDS, GROUP_MODES, MODES, RUN_NAME, Cores,
                               check_runs, command, config_class, cores_here, plan)
from comparison.projection import fsdp_units, gradient_bytes, memory_projection
from comparison.report.breakdown import breakdown_section
from comparison.report.environment import environment_section
from comparison.report.files import EARLIER_PICTURES, PICTURES, write_file
from comparison.report.findings import findings, oversubscription_title, untimed_note
from comparison.report.formatting import fmt_seconds, listed
from comparison.report.measured import groups
from comparison.report.model import model_line, model_title, run_config
from comparison.report.outcome import Outcome
from comparison.report.projection_memory import memory_section
from comparison.report.projection_scaling import (fabric_of_runs, projection_inputs,
                                                  projection_section)
from comparison.report.recommendation import recommendation
from comparison.report.results_table import TABLE_NOTE, table_header, table_row
from comparison.report.rows import fill_rows, write_csv
from comparison.runner import (
    run_all, signal_name, signal_of, signals_deferred, start, stop_signals)
from comparison.verify import Verification
from comparison.verify_plan import (DEFAULT_STEPS, defaults as verify_defaults, images_in_test_set,
                                    images_in_training_set)
from models import PYRAMIDNET

# ------------------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class CompareConfig:
    out: str | None = flag(None, "folder for everything compare.py writes "
                                 "(default: results/<timestamp>)",
                           check="folder")
    verify: bool = flag(False, "instead of the comparison: check that the modes agree (weights, "
                               "evaluation, ranks in sync, resume), each check a verdict in "
                               "verify.md; --max_steps default 24")
    modes: tuple[str, ...] | None = flag(None, "which modes to run (default: all four with "
                                               "two GPUs or more, and with --verify; without "
                                               "fsdp on one GPU or none)", nargs="+",
                                         choices=MODES)
    gpu_counts: tuple[int, ...] | None = flag(None, "GPU counts for data_parallel, dist_parallel "
                                                    "and fsdp (default: every GPU here; without "
                                                    "GPUs, 2 CPU processes)", nargs="+",
                                              at_least=1)
    backends: tuple[str, ...] | None = flag(None, "dist_parallel's and fsdp's backends (default: "
                                                  "nccl and gloo with GPUs, gloo without)",
                                            nargs="+", choices=BACKENDS)
    amp: tuple[str, ...] | None = flag(None, "--amp settings to compare (default: each run's "
                                             "default for the device)", nargs="+", choices=AMPS)
    sync_bn: tuple[str, ...] = flag(("off",), "dist_parallel with BatchNorm (off), "
                                              "SyncBatchNorm (on), or both",
                                    nargs="+", choices=("off", "on"))
    reshard_after_forward: tuple[str, ...] = flag(("on",), "fsdp freeing each block's gathered "
                                                           "parameters after forward, gathered "
                                                           "again in backward (on, ZeRO-3-like), "
                                                           "keeping them to backward (off, "
                                                           "ZeRO-2-like), or both",
                                                  nargs="+", choices=("on", "off"))
    repeat: int = flag(1, "runs of each configuration; the report gives mean ± std", at_least=1)
    profile_steps: int = flag(3, "steps of every run recorded by torch.profiler after its "
                                 "timed steps (never timed): the report splits each rank's step "
                                 "into compute, communication hidden and exposed, data and "
                                 "optimizer; 0: off",
                              at_least=0)
    epochs: int = flag(0, "0: --benchmark runs (speed only, on synthetic data, or on an image "
                          "folder's own images); N: train N epochs on --dataset and compare test "
                          "accuracy too", at_least=0)
    batch_per_gpu: int | None = flag(None, "images per GPU in every run, so the global "
                                           "batch grows with the GPUs (weak scaling); "
                                           "instead of --batch_size", at_least=1)
    run_timeout: int | None = flag(None, "seconds a run may take before it is stopped and "
                                         "reported as failed (default: on GPUs, sized to the "
                                         "run: 5 minutes to start, 10 more with --compile, and "
                                         "the FLOPs of each step and evaluation batch at 5 "
                                         "TFLOP/s, at least 0.2 s each; without GPUs, an hour)",
                                   at_least=1)
    overwrite: bool = flag(False, "replace the comparison an --out folder holds: what compare.py "
                                  "wrote there, nothing else")

    def __post_init__(self):
        check_domains(self)  # each flag against its domain, as train.py's are


# train.py flags that compare.py sets itself for every run, rather than passing the user's value on
CONTROLLED = {"amp", "epochs", "overwrite", "gpu_devices", "log_dir", "run_name", "resume",
              "evaluate", "save_model", "checkpoint_interval", "benchmark", "progress",
              "profile_steps"}
# the process-group modes' own flags that are passed on to their runs, and which modes take each
GROUP_PASSED = {"bucket_cap_mb": ("dist_parallel",), "dist_timeout": GROUP_MODES}
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

# without GPUs, unless given: a model and run small enough for a few
# seconds per run on a laptop's CPU
CPU_DEFAULTS = {"depth": 8, "alpha": 12.0, "batch_size": 32, "synthetic_size": 512,
                "benchmark_steps": 20, "warmup_steps": 3, "log_interval": 5, "loader": "gpu",
                "num_workers": 0}


def build_compare_parser() -> _OneLineParser:
    """compare.py's flags, then the train.py flags it passes on: the parser parse() reads
    (docs/flags.py prints its --help)."""
    parser = _OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add_flags(parser, CompareConfig)
    group = parser.add_argument_group("passed to every train.py (their defaults unless given)")
    add_flags(group, Config, skip=CONTROLLED, defaults=False)
    # it has every flag of GROUP_PASSED; fsdp's are the same fields
    dist_class = config_class("dist_parallel")
    dist_group = parser.add_argument_group("passed to dist_parallel/train.py "
                                           "(--dist_timeout to fsdp/train.py too)")
    add_flags(dist_group, dist_class, skip=[f.name for f in dataclasses.fields(dist_class)
                                            if f.name not in GROUP_PASSED], defaults=False)
    return parser


def parse(argv=None) -> tuple[CompareConfig, dict, dict]:
    """compare.py's own flags, the train.py flags given (passed to every run) and the process-group
    modes' own flags given (passed to their runs: GROUP_PASSED)."""
    parser = build_compare_parser()
    args = vars(parser.parse_args(argv))
    own = {f.name: args.pop(f.name) for f in dataclasses.fields(CompareConfig)}
    for name in ("modes", "gpu_counts", "backends", "amp", "sync_bn", "reshard_after_forward"):
        own[name] = tuple(dict.fromkeys(own[name])) if own[name] is not None else None
    group_only = {name: args.pop(name) for name in GROUP_PASSED if name in args}
    with parser.spelled_as_typed():  # a refusal names the flags as the user typed them
        return CompareConfig(**own), args, group_only


def resolve(cc: CompareConfig, train: dict, cuda: bool, gpus_here: int,
            group_only=()) -> CompareConfig:
    """Defaults that depend on the machine, and the mistakes between flags to refuse before any run
    starts (each flag's own domain was checked when the config was built); `group_only`: the
    process-group flags given. fsdp is a default mode of the comparison from two GPUs on: with one
    there is nothing to shard over, and on the CPU its gloo processes would only repeat
    dist_parallel's point. --verify checks every mode wherever it runs."""
    counts = cc.gpu_counts or ((gpus_here,) if cuda else (2,))
    backends = cc.backends or (BACKENDS if cuda else ("gloo",))
    modes = cc.modes or tuple(m for m in MODES
                              if m != "fsdp" or cc.verify or (cuda and gpus_here >= 2))
    checks = [
        (not cuda or max(counts) <= gpus_here,
         f"--gpu_counts {max(counts)} is more GPUs than the {gpus_here} visible here"),
        ("off" not in cc.reshard_after_forward or "fsdp" in modes,
         "--reshard_after_forward off is fsdp's setting: add fsdp to --modes"),
        *[(any(mode in modes for mode in GROUP_PASSED[name]),
           f"--{name} is passed to {' and '.join(GROUP_PASSED[name])} only: add "
           f"{' or '.join(GROUP_PASSED[name])} to --modes, or leave --{name} out")
          for name in group_only],
        (cc.batch_per_gpu is None or "batch_size" not in train,
         "--batch_size fixes the global batch and --batch_per_gpu each GPU's: give one of them"),
        (cc.epochs or cc.verify or "max_steps" not in train,
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
    refusal = machine_refusal(cuda, backends, "on" in cc.sync_bn, flag="--backends")
    if refusal is not None:
        raise UsageError(refusal)
    return dataclasses.replace(cc, modes=modes, gpu_counts=counts, backends=backends,
                               amp=cc.amp or (None,))


MARKER = ".pytorch-multigpu-comparison"  # written first into every --out; --overwrite looks for it
# what compare.py writes into --out: what --overwrite removes there, and nothing else
WRITTEN = (MARKER, "report.md", "projection.md", "results.csv", *PICTURES, *EARLIER_PICTURES,
           "verify.md", "verify.json")
# and in these folders, each run's own (matrix.RUN_NAME and this ending); the runs' compile cache
# (--compile without --compile_cache: <log_dir>/.compile_cache) in runs/
RUN_FILES = {"logs": ".log", "runs": ""}
COMPILE_CACHE = ".compile_cache"


def output_folder(cc: CompareConfig) -> Path:
    """The --out folder, absolute (the runs start in the repository, wherever compare.py was
    started). Refused before anything is written: a file; a folder with files but no MARKER (not a
    comparison, or one written before the marker: --overwrite never replaces it); an earlier
    comparison, unless --overwrite."""
    timestamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(os.path.realpath(cc.out)) if cc.out else REPO_ROOT / "results" / timestamp
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
    write it did not finish; in logs/ and runs/ its runs' logs and folders (RUN_FILES) and their
    compile cache, a user's own files beside them kept. logs/ or runs/ as a symbolic link
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
    folder, named as the matrix names runs (RUN_FILES), or the runs' compile cache."""
    ending = RUN_FILES[folder]
    return (name.endswith(ending) and RUN_NAME.fullmatch(name.removesuffix(ending)) is not None
            or folder == "runs" and name == COMPILE_CACHE)


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
                 train: dict, env: dict, topology: str | None, elapsed: float) -> list[Path]:
    """The pictures, results.csv, projection.md, then report.md, each written whole or not at all
    (files.write_file): a report.md that exists is complete."""
    fill_rows(outcomes, out)
    ok = [o for o in outcomes if o.status == "ok"]
    config = (ok[0].results["config"] if ok
              else {**{f.name: f.default for f in dataclasses.fields(Config)}, **train})
    device = device_name(env, cuda)
    model = model_on_meta(config)
    grads = gradient_bytes(model)
    bucket_cap_mb = next((o.results["config"].get("bucket_cap_mb") for o in ok
                          if o.run.mode == "dist_parallel"),
                         25.0)
    data = dataset_info(run_config(config))
    projection = projection_inputs(outcomes, grads, bucket_cap_mb,
                                   fsdp_units(model, data.channels, data.size))
    amp = projection["amp"] if projection else (config.get("amp") or ("bf16" if cuda else "off"))
    model_name = model_title(config)
    # only PyramidNet has a width (alpha) to sweep
    sweep = config.get("model", PYRAMIDNET) == PYRAMIDNET
    memory = memory_projection(lambda alpha: model_on_meta({**config, "alpha": alpha})
                               if sweep else model,
                               config["alpha"] if sweep else None, amp, config["momentum"] != 0,
                               gpu_memory_bytes(cuda))
    memory["name"] = model_name
    # matplotlib: a second's import, for pictures only
    from comparison.plots import pictures_section, write_plots

    # the projected curves from a GPU's step only: from a CPU process's, they say
    # nothing (projection.md says why)
    cores = None if cuda else cores_here()  # what CPU runs share; GPU runs wait on their GPUs
    pictures = write_plots(outcomes, out, device, cuda, projection if cuda else None, cores)
    write_csv(outcomes, out / "results.csv")
    profiled = cc.profile_steps if profiling_flag() else 0
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
        "",
        "## Scaling past this machine",
        "",
        *projection_section(outcomes, projection, cuda, fabric_of_runs(outcomes, topology)),
        "",
        "## Memory per GPU: what fits",
        "",
        *memory_section(memory, outcomes, device if cuda else None),
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
        *breakdown_section(outcomes, cc.profile_steps if profiling_flag() else None),
        "",
        "## Pictures",
        "",
        *pictures_section(outcomes, pictures),
        "",
        "Every run's figures, unrounded, are in `results.csv`; its log in `logs/`, its run folder "
        "(results.json, TensorBoard events) in `runs/`.",
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


def model_on_meta(config: dict) -> torch.nn.Module:
    """The model the runs trained (results.json's config; a field it lacks, written before the field
    existed, takes its default), built without memory, to count its gradients."""
    fields = {field.name: field.default for field in dataclasses.fields(Config)}
    with uninitialised():
        return performance.model_on_meta(
            types.SimpleNamespace(**{**fields, **config, "align_channels": 0}))


@contextlib.contextmanager
def uninitialised():
    """torch.nn.init's functions do nothing while the block runs. On the meta device they compute
    nothing anyway, yet take two thirds of a model's build, and a report builds some 50 models (the
    memory projection's search over widths): seconds of every comparison."""
    # the in-place ones (torch.nn.init has no __all__ before torch 2.7)
    names = [name for name, value in vars(torch.nn.init).items()
             if name.endswith("_") and not name.startswith("_") and callable(value)]
    originals = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(torch.nn.init, name, function)


def gpu_memory_bytes(cuda: bool) -> int | None:
    """The first GPU's memory, which the memory projection weighs the model against; None without
    GPUs."""
    return torch.cuda.get_device_properties(0).total_memory if cuda else None


def device_name(env: dict, cuda: bool) -> str:
    if cuda and env.get("gpus"):
        return machine.gpu_summary(env)
    return f"CPU ({env.get('cpu')}, {env.get('cpu_count')} cores), no GPU"


# --------------------------------------------------------------------------------------------- main

def configure(argv: list[str]) -> tuple[CompareConfig, dict, dict[str, list[str]], bool]:
    """The flags resolved for this machine: compare.py's own, the train.py flags of every run, the
    flags passed on to each process-group mode (mode -> arguments), and whether there are GPUs."""
    cc, train, group_only = parse(argv)
    cuda = torch.cuda.is_available()
    cc = resolve(cc, train, cuda, torch.cuda.device_count(), group_only)
    if cc.verify:  # its own defaults first, so that compare.py's CPU defaults do not override them
        train = {**verify_defaults(cuda), **train}
    if not cuda:
        # an image folder is read as a training run reads it: its default loader and workers
        folder = train.get("dataset") == "imagefolder"
        train = {**{k: v for k, v in CPU_DEFAULTS.items()
                    if not (folder and k in ("loader", "num_workers"))}, **train}
    # GROUP_PASSED's fields, as parse() read them
    group_flags = {mode: config_argv(config_class("dist_parallel"),
                                     {k: v for k, v in group_only.items()
                                      if mode in GROUP_PASSED[k]})
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


def run_timeout(cc: CompareConfig, train: dict, cuda: bool) -> int:
    """--run_timeout, or where it is not given: without GPUs CPU_RUN_TIMEOUT; on GPUs what the
    longest run must do at a pace no working GPU run falls below: RUN_START_S, COMPILE_S with
    --compile, and SLOW_STEP_S or more for each training step and evaluation batch, the FLOPs of
    the most images one GPU takes in a step (the global batch, or --batch_per_gpu) at SLOW_TFLOPS.
    `train`: the flags of every run (--verify's with its --max_steps and --epochs)."""
    if cc.run_timeout is not None:
        return cc.run_timeout
    if not cuda:
        return CPU_RUN_TIMEOUT
    cfg = parse_config(Config, config_argv(Config, train))
    images = cc.batch_per_gpu or cfg.batch_size
    step_s = max(SLOW_STEP_S, performance.flops_per_image(cfg) * images / (SLOW_TFLOPS * 1e12))
    return math.ceil(RUN_START_S + COMPILE_S * cfg.compile + steps_of_a_run(cc, train) * step_s)


def steps_of_a_run(cc: CompareConfig, train: dict) -> int:
    """The training steps and evaluation batches of the longest run: a --benchmark run's untimed,
    timed and profiled steps; a trained one's steps (up to --max_steps; the profiled ones among
    them), and a test set's batches after each epoch."""
    given = {field.name: train.get(field.name, field.default)
             for field in dataclasses.fields(Config)}
    if not (cc.epochs or cc.verify):
        return given["warmup_steps"] + given["benchmark_steps"] + cc.profile_steps
    batch = cc.batch_per_gpu or given["batch_size"]
    epochs = cc.epochs or given["epochs"] or 1
    steps = epochs * math.ceil(images_in_training_set(given) / batch)
    limit = given["max_steps"] or (DEFAULT_STEPS if cc.verify else None)
    steps = min(steps, limit) if limit else steps
    return steps + epochs * math.ceil(images_in_test_set(given) / batch)


def check_dataset(cc: CompareConfig, train: dict) -> None:
    """The dataset the runs train on, read here once before any run when they would read or
    download it (cifar10, mnist: with --epochs, or --verify given one): downloaded into
    --data_dir if it is missing and the network allows, or refused in one line
    (common/data.py's), rather than every configuration starting only to fail alike. --benchmark
    runs (the default) and synthetic data need nothing."""
    dataset = train.get("dataset", Config.dataset)
    if (cc.epochs or cc.verify) and dataset != "synthetic":
        load_datasets(dataset, train.get("data_dir", Config.data_dir), 0, 0)


def plan_matrix(cc: CompareConfig, train: dict, group_flags: dict[str, list[str]],
                cuda: bool, out: Path | None = None) -> tuple[list[str], list]:
    """The flags every run shares and the runs, or the one line that refuses them (each run checked
    as it will run, its folder under `out`)."""
    train["epochs"] = cc.epochs if cc.epochs else None
    shared = config_argv(Config, {k: v for k, v in train.items() if k != "batch_size"})
    shared += [] if cc.epochs else ["--benchmark"]
    shared += ["--profile_steps", str(cc.profile_steps)] if profiling_flag() else []
    batch = train.get("batch_size", Config.batch_size)
    sync_bns = [s == "on" for s in cc.sync_bn]
    reshards = [s == "on" for s in cc.reshard_after_forward]
    runs = plan(cc.modes, cc.gpu_counts, cc.backends, cc.amp, sync_bns, cc.repeat, cuda, batch,
                cc.batch_per_gpu, reshards)
    if not runs:
        raise UsageError("--modes/--gpu_counts/--backends leave nothing to run")
    check_runs(runs, shared, group_flags, out / "runs" if out is not None else None)
    return shared, runs


def profiling_flag() -> bool:
    """Whether every train.py here takes --profile_steps (compare.py passes its own on to every
    run): the runs then record the split of their steps that the report's "Where a step goes"
    shows."""
    return all(any(f.name == "profile_steps" for f in dataclasses.fields(config_class(mode)))
               for mode in MODES)


def run_matrix(cc: CompareConfig, argv: list[str], train: dict, shared: list[str],
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
        return start(run, command(run, shared, group_flags, out / "runs", cuda), out, cuda)

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

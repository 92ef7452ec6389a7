"""Run every mode the same way and write the comparison: report.md, results.csv and plots.

    python compare.py                              # every mode on every GPU here: DDP and FSDP on NCCL and Gloo
    python compare.py --gpu_counts 1 2 4 8         # a scaling sweep (the same global batch in every run)
    python compare.py --gpu_counts 1 2 4 8 --batch_per_gpu 128   # each GPU keeps 128 images (weak scaling)
    python compare.py --modes dist_parallel --backends nccl gloo --repeat 3
    python compare.py --amp bf16 off --sync_bn off on
    python compare.py --modes dist_parallel fsdp --reshard_after_forward on off   # DDP, FSDP ZeRO-3 and ZeRO-2
    python compare.py --epochs 30 --dataset cifar10   # train for 30 epochs and compare test accuracy too
    python compare.py --depth 56 --alpha 84           # any model/data flag of train.py goes to every run
    python compare.py --verify --deterministic        # prove the modes agree here: a verdict per check, verify.md

Each configuration runs as its own subprocess, started as a user would start it (`python single_gpu/train.py`,
`python data_parallel/train.py`, `torchrun dist_parallel/train.py`, `torchrun fsdp/train.py`), with the same model,
data, global batch, learning rate and seed; by default in `--benchmark` mode (synthetic data, speed only). fsdp is
in the default --modes where there are two GPUs or more (one GPU has nothing to shard over); `--modes fsdp` runs it
anywhere. Each run's results.json is read back and everything goes to `--out` (default results/<timestamp>):
report.md, results.csv, the plots, each run's log and run folder, and projections past this machine (DDP's and
FSDP's scaling, and the memory per GPU of this model and wider ones). A run that fails is kept in the report with
its error. Without GPUs the same matrix runs as CPU processes over Gloo with a tiny PyramidNet, one thread per
process standing in for a GPU.

`--verify` runs, instead of the comparison, the checks the tests run on the CPU (comparison/verify.py): the modes
end with the same weights on one device, N processes with what one process computes from the same shares, the
evaluation is exact for any number of processes, the ranks stay in sync, and a resumed run ends where an
uninterrupted one ends. Each check's figure, tolerance and verdict go to verify.md (and verify.json); a failed
check makes the exit status non-zero and is named in the last line.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python compare.py` from anywhere

import torch  # noqa: E402

from common.config import (REPO_ROOT, AMPS, Config, UsageError, _OneLineParser, add_flags,  # noqa: E402
                           check_domains, config_argv, flag, user_errors)
from common.data import DATASET_INFO  # noqa: E402
from comparison import environment as machine  # noqa: E402
from comparison.matrix import BACKENDS, GROUP_MODES, MODES, check_runs, command, config_class, plan  # noqa: E402
from comparison.projection import fsdp_units, gradient_bytes, memory_projection  # noqa: E402
from comparison.report import (READING, TABLE_HEADER, Outcome, environment_section, fabric_of_runs,  # noqa: E402
                               failures, fill_rows, fmt_seconds, groups, memory_section, projection_inputs,
                               projection_section, table_row, write_csv)
from comparison.runner import run_one  # noqa: E402
from comparison.verify import Verification, defaults as verify_defaults  # noqa: E402
from models.pyramidnet import pyramidnet  # noqa: E402

# ------------------------------------------------------------------------------------------------------ config

@dataclass(frozen=True)
class CompareConfig:
    out: str | None = flag(None, "folder for everything compare.py writes (default: results/<timestamp>)",
                           check="folder")
    verify: bool = flag(False, "instead of the comparison: check that the modes agree (weights, evaluation, ranks "
                               "in sync, resume), each check a verdict in verify.md; --max_steps default 24")
    modes: tuple[str, ...] | None = flag(None, "which modes to run (default: all four with two GPUs or more, and "
                                               "with --verify; without fsdp on one GPU or none)", nargs="+",
                                         choices=MODES)
    gpu_counts: tuple[int, ...] | None = flag(None, "GPU counts for data_parallel, dist_parallel and fsdp (default: "
                                                    "every GPU here; without GPUs, 2 CPU processes)", nargs="+",
                                              at_least=1)
    backends: tuple[str, ...] | None = flag(None, "dist_parallel's and fsdp's backends (default: nccl and gloo with "
                                                  "GPUs, gloo without)", nargs="+", choices=BACKENDS)
    amp: tuple[str, ...] | None = flag(None, "--amp settings to compare (default: each run's default for the "
                                             "device)", nargs="+", choices=AMPS)
    sync_bn: tuple[str, ...] = flag(("off",), "dist_parallel with BatchNorm (off), SyncBatchNorm (on), or both",
                                    nargs="+", choices=("off", "on"))
    reshard_after_forward: tuple[str, ...] = flag(("on",), "fsdp freeing each block's gathered parameters after "
                                                           "forward, gathered again in backward (on, ZeRO-3-like), "
                                                           "keeping them to backward (off, ZeRO-2-like), or both",
                                                  nargs="+", choices=("on", "off"))
    repeat: int = flag(1, "runs of each configuration; the report gives mean ± std", at_least=1)
    epochs: int = flag(0, "0: --benchmark runs (synthetic data, speed only); N: train N epochs on --dataset and "
                          "compare test accuracy too", at_least=0)
    batch_per_gpu: int | None = flag(None, "images per GPU in every run, so the global batch grows with the GPUs "
                                           "(weak scaling); instead of --batch_size", at_least=1)
    run_timeout: int = flag(3600, "seconds a run may take before it is stopped and reported as failed", at_least=1)
    overwrite: bool = flag(False, "write into an --out folder that already holds a comparison")

    def __post_init__(self):
        check_domains(self)  # each flag against its domain, as train.py's are


# train.py flags that compare.py sets itself for every run, rather than passing the user's value on
CONTROLLED = {"amp", "epochs", "overwrite", "gpu_devices", "log_dir", "run_name", "resume", "evaluate", "save_model",
              "checkpoint_interval", "benchmark", "progress"}
# the process-group modes' own flags that are passed on to their runs, and which modes take each
GROUP_PASSED = {"bucket_cap_mb": ("dist_parallel",), "dist_timeout": GROUP_MODES}
# without GPUs, unless given: a model and run small enough for a few seconds per run on a laptop's CPU
CPU_DEFAULTS = {"depth": 8, "alpha": 12.0, "batch_size": 32, "synthetic_size": 512, "benchmark_steps": 20,
                "warmup_steps": 3, "log_interval": 5, "loader": "gpu", "num_workers": 0}


def parse(argv=None) -> tuple[CompareConfig, dict, dict]:
    """compare.py's own flags, the train.py flags given (passed to every run) and the process-group modes' own
    flags given (passed to their runs: GROUP_PASSED)."""
    parser = _OneLineParser(description=__doc__.split("\n\n")[0])
    add_flags(parser, CompareConfig)
    group = parser.add_argument_group("passed to every train.py (their defaults unless given)")
    add_flags(group, Config, skip=CONTROLLED, defaults=False)
    dist_class = config_class("dist_parallel")  # it has every flag of GROUP_PASSED; fsdp's are the same fields
    dist_group = parser.add_argument_group("passed to dist_parallel/train.py (--dist_timeout to fsdp/train.py too)")
    add_flags(dist_group, dist_class, skip=[f.name for f in dataclasses.fields(dist_class)
                                            if f.name not in GROUP_PASSED], defaults=False)
    args = vars(parser.parse_args(argv))
    own = {f.name: args.pop(f.name) for f in dataclasses.fields(CompareConfig)}
    for name in ("modes", "gpu_counts", "backends", "amp", "sync_bn", "reshard_after_forward"):
        own[name] = tuple(dict.fromkeys(own[name])) if own[name] is not None else None
    group_only = {name: args.pop(name) for name in GROUP_PASSED if name in args}
    return CompareConfig(**own), args, group_only


def resolve(cc: CompareConfig, train: dict, cuda: bool, gpus_here: int, group_only=()) -> CompareConfig:
    """Defaults that depend on the machine, and the mistakes between flags to refuse before any run starts (each
    flag's own domain was checked when the config was built); `group_only`: the process-group flags given. fsdp is
    a default mode of the comparison from two GPUs on: with one there is nothing to shard over, and on the CPU its
    gloo processes would only repeat dist_parallel's point. --verify checks every mode wherever it runs."""
    counts = cc.gpu_counts or ((gpus_here,) if cuda else (2,))
    backends = cc.backends or (BACKENDS if cuda else ("gloo",))
    modes = cc.modes or tuple(m for m in MODES if m != "fsdp" or cc.verify or (cuda and gpus_here >= 2))
    checks = [
        (not cuda or max(counts) <= gpus_here,
         f"--gpu_counts {max(counts)} is more GPUs than the {gpus_here} visible here"),
        (cuda or "nccl" not in backends, "--backends nccl needs CUDA GPUs; without them use --backends gloo"),
        (cuda or "on" not in cc.sync_bn, "--sync_bn on needs GPUs (PyTorch's SyncBatchNorm refuses CPU modules)"),
        ("off" not in cc.reshard_after_forward or "fsdp" in modes,
         "--reshard_after_forward off is fsdp's setting: add fsdp to --modes"),
        *[(any(mode in modes for mode in GROUP_PASSED[name]), f"--{name} is passed to "
           f"{' and '.join(GROUP_PASSED[name])} only: add {' or '.join(GROUP_PASSED[name])} to --modes, or leave "
           f"--{name} out") for name in group_only],
        (cc.batch_per_gpu is None or "batch_size" not in train,
         "--batch_size fixes the global batch and --batch_per_gpu each GPU's: give one of them"),
        (cc.epochs or cc.verify or "max_steps" not in train,
         "--max_steps applies to training: give it with --epochs N"),
        (not cc.verify or cc.repeat == 1, "--repeat is for the comparison: --verify runs each check once"),
        (not cc.verify or cc.batch_per_gpu is None,
         "--verify compares runs of one global batch: give --batch_size instead of --batch_per_gpu"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    return dataclasses.replace(cc, modes=modes, gpu_counts=counts, backends=backends, amp=cc.amp or (None,))


def output_folder(cc: CompareConfig) -> Path:
    """The --out folder, absolute: the runs start in the repository, wherever compare.py was started."""
    out = Path(cc.out).resolve() if cc.out else REPO_ROOT / "results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a folder")
    if out.is_dir() and any(out.iterdir()) and not cc.overwrite:
        raise UsageError(f"--out {out} already holds files: give another --out, or --overwrite to replace them")
    return out


# ----------------------------------------------------------------------------------------------------- report

def write_report(cc: CompareConfig, outcomes: list[Outcome], out: Path, cuda: bool, argv: list[str],
                 train: dict, env: dict, topology: str | None, elapsed: float) -> list[Path]:
    fill_rows(outcomes, out)
    write_csv(outcomes, out / "results.csv")
    ok = [o for o in outcomes if o.status == "ok"]
    config = ok[0].results["config"] if ok else {**{f.name: f.default for f in dataclasses.fields(Config)}, **train}
    device = device_name(env, cuda)
    model = model_on_meta(config)
    grads = gradient_bytes(model)
    bucket_cap_mb = next((o.results["config"].get("bucket_cap_mb") for o in ok if o.run.mode == "dist_parallel"),
                         25.0)
    data = DATASET_INFO[config["dataset"]]
    projection = projection_inputs(outcomes, grads, bucket_cap_mb, fsdp_units(model, data.channels, data.size))
    amp = projection["amp"] if projection else (config.get("amp") or ("bf16" if cuda else "off"))
    memory = memory_projection(lambda alpha: model_on_meta({**config, "alpha": alpha}), config["alpha"], amp,
                               config["momentum"] != 0, gpu_memory_bytes(cuda))
    from comparison.plots import pictures_section, write_plots  # matplotlib: a second's import, for pictures only

    pictures = write_plots(outcomes, out, device, cuda, projection)
    what = (f"`--benchmark`: synthetic data, {config['warmup_steps']} untimed then {config['benchmark_steps']} timed "
            f"steps per run" if not cc.epochs else f"training for {cc.epochs} epochs on {config['dataset']}")
    lines = [
        f"# Comparison: PyramidNet-{config['depth']} α={config['alpha']:g} ({config['block']}) — {device}",
        "",
        f"`python compare.py {' '.join(argv)}` — {datetime.now():%Y-%m-%d %H:%M}, {len(outcomes)} runs in "
        f"{fmt_seconds(elapsed)}; {what}; the same seed ({config['seed']}) and learning rate rule (--lr "
        f"{config['lr']:g} per 128 images of global batch) in every run.",
        "",
        "## Results",
        "",
        TABLE_HEADER,
        "|" + "---|" * TABLE_HEADER.count(" | ") + "---|",
        *[table_row(group) for group in groups(outcomes)],
        "",
        *failures(outcomes),
        "",
        READING,
        "",
        *pictures_section(outcomes, pictures),
        "",
        "Every run's figures, unrounded, are in `results.csv`; its log in `logs/`, its run folder (results.json, "
        "TensorBoard events) in `runs/`.",
        "",
        "## Projection past this machine",
        "",
        *projection_section(outcomes, projection, cuda, fabric_of_runs(outcomes, topology)),
        "",
        *memory_section(memory, outcomes, device if cuda else None),
        "",
        "## Environment",
        "",
        *environment_section(env, topology),
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return [out / "report.md", out / "results.csv", *pictures]


def model_on_meta(config: dict) -> torch.nn.Module:
    """The model the runs trained, built without memory, to count its gradients."""
    data = DATASET_INFO[config["dataset"]]
    with torch.device("meta"):
        return pyramidnet(config["depth"], config["alpha"], config["block"], num_classes=data.classes,
                          in_channels=data.channels, width_multiple=config["width_multiple"])


def gpu_memory_bytes(cuda: bool) -> int | None:
    """The first GPU's memory, which the memory projection weighs the model against; None without GPUs."""
    return torch.cuda.get_device_properties(0).total_memory if cuda else None


def device_name(env: dict, cuda: bool) -> str:
    if cuda and env.get("gpus"):
        return machine.gpu_summary(env)
    return f"CPU ({env.get('cpu')}, {env.get('cpu_count')} cores), no GPU"


# ------------------------------------------------------------------------------------------------------- main

def configure(argv: list[str]) -> tuple[CompareConfig, dict, dict[str, list[str]], bool]:
    """The flags resolved for this machine: compare.py's own, the train.py flags of every run, the flags passed on
    to each process-group mode (mode -> arguments), and whether there are GPUs."""
    cc, train, group_only = parse(argv)
    cuda = torch.cuda.is_available()
    cc = resolve(cc, train, cuda, torch.cuda.device_count(), group_only)
    if cc.verify:  # its own defaults first, so that compare.py's CPU defaults do not override them
        train = {**verify_defaults(cuda), **train}
    if not cuda:
        train = {**CPU_DEFAULTS, **train}
    group_flags = {mode: config_argv(config_class("dist_parallel"),  # GROUP_PASSED's fields, as parse() read them
                                     {k: v for k, v in group_only.items() if mode in GROUP_PASSED[k]})
                   for mode in GROUP_MODES}
    return cc, train, group_flags, cuda


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with user_errors():
        cc, train, group_flags, cuda = configure(argv)
        if cc.verify:  # the checks instead of the comparison: every run planned (or refused) before any starts
            verification = Verification(cc, train, group_flags, cuda, output_folder(cc))
            return verification.main(cc.run_timeout, argv, device_name(machine.environment(), cuda))
        train["epochs"] = cc.epochs if cc.epochs else None
        shared = config_argv(Config, {k: v for k, v in train.items() if k != "batch_size"})
        shared += [] if cc.epochs else ["--benchmark"]
        batch = train.get("batch_size", Config.batch_size)
        runs = plan(cc.modes, cc.gpu_counts, cc.backends, cc.amp, [s == "on" for s in cc.sync_bn], cc.repeat, cuda,
                    batch, cc.batch_per_gpu, [s == "on" for s in cc.reshard_after_forward])
        if not runs:
            raise UsageError("--modes/--gpu_counts/--backends leave nothing to run")
        check_runs(runs, shared, group_flags)
        out = output_folder(cc)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env, topology = machine.environment(), machine.topology()
    device = device_name(env, cuda)
    print(f"compare: {len(runs)} runs on {device} -> {out}", flush=True)
    started, outcomes = time.monotonic(), []
    interrupted = False
    for run in runs:
        print(f"[{run.index}/{len(runs)}] {run.describe()}, global batch {run.batch_size}"
              + (f", repeat {run.repeat}/{cc.repeat}" if cc.repeat > 1 else "")
              + f" — {len(runs) - run.index} left after it, {fmt_seconds(time.monotonic() - started)} elapsed",
              flush=True)
        try:
            outcome = run_one(run, command(run, shared, group_flags, out / "runs", cuda), out, cuda, cc.run_timeout)
        except KeyboardInterrupt:
            interrupted = True
            outcomes += [Outcome(r, "not run", error="compare.py was interrupted") for r in runs[run.index - 1:]]
            break
        outcomes.append(outcome)
        summary = (f"{outcome.results['summary']['images_per_sec']:,.0f} images/s" if outcome.status == "ok"
                   else f"FAILED: {outcome.error}")
        print(f"    {summary} ({fmt_seconds(outcome.seconds)})", flush=True)
    paths = write_report(cc, outcomes, out, cuda, argv, train, env, topology, time.monotonic() - started)
    failed = sum(o.status != "ok" for o in outcomes)
    print(f"wrote {', '.join(str(p.relative_to(out)) for p in paths)} in {out}"
          + (f"; {failed} of {len(outcomes)} runs did not succeed (see report.md)" if failed else ""), flush=True)
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""From the runs' results.json files to the comparison: one CSV row per run; report.md, answers
first: one table row per configuration (mean ± std over repeats of one named statistic per
column), what the table says in sentences computed from its figures (whether the fastest
configuration can be told apart from the rest, the scaling, the run-to-run spread, the failed
runs), where a step goes on every rank (the profiler's measured split of the step: compute,
communication hidden and exposed, data, optimizer), then the pictures and the environment; and
projection.md beside it, the projections past this machine (scaling, memory), labelled so.

Every figure of a configuration's speed is made from one statistic, its step: the mean of the
timed steps (each run's, results.csv's step_time_mean_s), averaged over its runs, ± their standard
deviation. Its images/s is the global batch ÷ that step, its epoch the run's training images ÷
those images/s, its speedup those images/s ÷ single_gpu's, its scaling efficiency the speedup ÷
its GPUs (one GPU's too); the ± of each is the step's std as the same share of the figure. The
table, the sentences and the pictures all take them from `Measured`. The split of a step is the
mean over ranks of the profiled steps (`summary.breakdown`); one function (step_split) computes
what the split's table, its sentences and step_breakdown.png show."""
from __future__ import annotations

import csv
import dataclasses
import io
import statistics
import types
from dataclasses import dataclass, field
from pathlib import Path

from common.config import Config
from common.data import dataset_info
from common.errors import UsageError
from common.folders import image_folder
from common.logger import write_atomically
from comparison import environment as machine
from comparison.environment import gpu_summary
from comparison.matrix import GROUP_MODES, Cores, PlannedRun
from comparison.projection import (AUTOCAST, FABRICS, MEMORY_GPU_COUNTS, PROJECTED_GPU_COUNTS,
                                   SYNC_ALLOWANCE, bytes_sent_per_gpu, fsdp_projected_efficiency,
                                   memory_per_gpu, projected_efficiency)
from models import PYRAMIDNET

# the training sets' images (torchvision's CIFAR10 and MNIST, train=True): one epoch of each
TRAIN_IMAGES = {"cifar10": 50_000, "mnist": 60_000}


@dataclass
class Outcome:
    run: PlannedRun
    status: str                    # ok, failed, interrupted (compare.py stopped), not run
    seconds: float = 0.0
    error: str | None = None
    results: dict | None = None
    log: Path | None = None
    row: dict = field(default_factory=dict)


# the parts a step splits into (summary.breakdown's keys): they add up to the profiled step
SPLIT_PARTS = ("compute_ms", "comm_exposed_ms", "data_ms", "optimizer_ms", "other_ms")
SPLIT_KEYS = ("step_ms", *SPLIT_PARTS, "comm_ms")
SPLIT_COLUMNS = ("ranks", *(f"split_{key}" for key in SPLIT_KEYS), "split_comm_hidden_ms",
                 "split_work_ms_per_rank", "split_slowest_rank")
COLUMNS = ("run", "mode", "gpus", "backend", "amp", "sync_bn", "reshard_after_forward", "repeat",
           "status", "error", "global_batch", "per_gpu_batch", "step_time_mean_s",
           "batch_time_p50_s", "batch_time_p90_s", "train_images", "epoch_time_s",
           "images_per_sec",
           "images_per_sec_per_gpu", "speedup", "scaling_efficiency", "data_wait_frac",
           "gpu_util_mean", "peak_mem_gb_per_gpu", "peak_mem_reserved_gb_per_gpu", "mfu",
           "test_acc", "train_loss", "model", "parameters", "flops_per_image", "wall_time_s",
           "run_time_s", "profiled_steps",
           *SPLIT_COLUMNS, "log")


def fill_rows(outcomes: list[Outcome], out: Path) -> None:
    """Each outcome's CSV row: the results.json figures as they are, plus what is derived from
    them: the mean step (global batch ÷ images/s, which is the mean of the timed steps), the epoch
    of the run's own training set at that step, speedup (over single_gpu's images/s: baseline)
    and scaling efficiency (speedup ÷ GPUs, one GPU's too), the run's time start to end as
    compare.py timed it, and the step's split averaged over the ranks (split_row)."""
    for o in outcomes:
        r, res = o.run, o.results or {}
        summary, config = res.get("summary", {}), res.get("config", {})
        ips = summary.get("images_per_sec")
        batch = config.get("batch_size")
        images = train_images(config) if config else None
        memory, reserved = (res.get("peak_mem_gb_per_gpu") or {},
                            res.get("peak_mem_reserved_gb_per_gpu") or {})
        o.row = {
            "run": r.name, "mode": r.mode, "gpus": r.gpus, "backend": r.backend or "",
            "amp": config.get("amp", r.amp), "sync_bn": r.sync_bn,
            "reshard_after_forward": r.reshard_after_forward, "repeat": r.repeat,
            "status": o.status, "error": o.error or "", "global_batch": config.get("batch_size"),
            "per_gpu_batch": config["batch_size"] // r.gpus if config else None,
            "step_time_mean_s": batch / ips if ips and batch else None,
            "batch_time_p50_s": summary.get("batch_time_p50"),
            "batch_time_p90_s": summary.get("batch_time_p90"),
            "train_images": images, "epoch_time_s": images / ips if ips and images else None,
            "images_per_sec": ips,
            "images_per_sec_per_gpu": ips / r.gpus if ips else None, "speedup": None,
            "scaling_efficiency": None, "data_wait_frac": summary.get("data_wait_frac"),
            "gpu_util_mean": summary.get("gpu_util_mean"),
            "peak_mem_gb_per_gpu": " ".join(f"{memory[k]:.3f}" for k in sorted(memory, key=int))
                                   or None,
            "peak_mem_reserved_gb_per_gpu": " ".join(f"{reserved[k]:.3f}"
                                                     for k in sorted(reserved, key=int)) or None,
            "mfu": summary.get("mfu"), "test_acc": summary.get("test_acc"),
            "train_loss": summary.get("train_loss"),
            "model": model_title(config) if config else None,
            "parameters": summary.get("parameters"),
            "flops_per_image": summary.get("flops_per_image"),
            "wall_time_s": summary.get("wall_time_s"),
            "run_time_s": o.seconds if o.status != "not run" else None,
            "profiled_steps": config.get("profile_steps"), **split_row(summary),
            "log": str(o.log.relative_to(out)) if o.log else "",
        }
    for o in outcomes:  # speedup against single_gpu with the same --amp
        base = baseline(outcomes, o.row["amp"])
        if base and o.row["images_per_sec"]:
            o.row["speedup"] = o.row["images_per_sec"] / base
            # on one GPU too: data_parallel at 1.36× one GPU's speed is 136 % efficient
            o.row["scaling_efficiency"] = o.row["speedup"] / o.run.gpus


def train_images(config: dict) -> int | None:
    """The images of the training set a run's results.json config names, one epoch of which the
    table's epoch column times: --synthetic_size for the synthetic set, CIFAR-10's and MNIST's
    own, an image folder's train/ images (None where it can no longer be listed)."""
    cfg = run_config(config)
    if cfg.dataset == "synthetic":
        return cfg.synthetic_size
    if cfg.dataset == "imagefolder":
        try:
            return image_folder(cfg.data_dir).images["train"]
        except UsageError:
            return None
    return TRAIN_IMAGES.get(cfg.dataset)


def split_row(summary: dict) -> dict:
    """A run's step split for its CSV row (SPLIT_COLUMNS), from results.json's
    `summary.breakdown` ({rank: {step_ms, compute_ms, ...}}): each part averaged over the ranks,
    the communication hidden behind compute (comm_ms less comm_exposed_ms), each rank's work (its
    step less its exposed communication: the time it was not waiting for the others) and the
    slowest rank, the one with the most work. All None where the run recorded no breakdown
    (profiling off, or a results.json written before it), or one that lacks a part."""
    breakdown = summary.get("breakdown")
    ranks = sorted(breakdown, key=int) if isinstance(breakdown, dict) else []
    whole = lambda split: isinstance(split, dict) and all(  # noqa: E731
        isinstance(split.get(key), (int, float)) for key in SPLIT_KEYS)
    if not ranks or not all(whole(breakdown[r]) for r in ranks):
        return dict.fromkeys(SPLIT_COLUMNS)
    mean = {key: statistics.fmean(breakdown[r][key] for r in ranks) for key in SPLIT_KEYS}
    work = {r: breakdown[r]["step_ms"] - breakdown[r]["comm_exposed_ms"] for r in ranks}
    return {"ranks": len(ranks), **{f"split_{key}": mean[key] for key in SPLIT_KEYS},
            "split_comm_hidden_ms": mean["comm_ms"] - mean["comm_exposed_ms"],
            "split_work_ms_per_rank": " ".join(f"{work[r]:.3f}" for r in ranks),
            "split_slowest_rank": int(max(ranks, key=lambda r: work[r]))}


def run_config(config: dict) -> types.SimpleNamespace:
    """A results.json config with every field: one it lacks (written before the
    field existed) takes its default."""
    return types.SimpleNamespace(**{**{f.name: f.default for f in dataclasses.fields(Config)},
                                    **config})


def model_title(config: dict) -> str:
    """The model a run trained (its results.json config), as the report names it: 'PyramidNet-110
    α=270 (basic)', or torchvision's name, 'resnet50'."""
    cfg = run_config(config)
    if cfg.model == PYRAMIDNET:
        return f"PyramidNet-{cfg.depth} α={cfg.alpha:g} ({cfg.block})"
    return cfg.model


def model_line(config: dict, outcomes: list[Outcome], parameters: int) -> str:
    """What the runs trained, for the report's first screen: the model, its parameters and FLOPs
    per image (a successful run's results.json summary; without one, `parameters` as counted
    here and no FLOPs) and the data."""
    cfg, data = run_config(config), dataset_info(run_config(config))
    summary = next((o.results["summary"] for o in outcomes if o.status == "ok"), {})
    parameters = summary.get("parameters") or parameters
    flops = summary.get("flops_per_image")
    origin = "" if cfg.model == PYRAMIDNET else ", torchvision's, without pretrained weights"
    figures = f"{fmt_count(parameters)} parameters" + (f", {fmt_flops(flops)} per image "
                                                       "(forward and backward)"
                                                      if flops else "")
    return (f"Model: {model_title(config)}{origin}: {figures}. Data: {data_source(cfg)}, "
            f"{data.size}×{data.size} images, {data.channels} channel{'s' * (data.channels > 1)}, "
            f"{data.classes} classes.")


def data_source(cfg) -> str:
    """The data the runs read, as the Data line names it: the dataset, or an image folder with its
    path and images (what --benchmark runs read too)."""
    if cfg.dataset != "imagefolder":
        return cfg.dataset
    try:
        images = image_folder(cfg.data_dir).images
    except UsageError:  # gone since the runs read it: named alone
        return f"the image folder {cfg.data_dir}"
    return (f"the image folder {cfg.data_dir} ({images['train']:,} training and "
            f"{images['val']:,} validation images)")


def fmt_flops(flops: float) -> str:
    """FLOPs in three figures with their prefix: '2.75 MFLOPs', '1.82 GFLOPs', '562 GFLOPs'."""
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        value = flops / size
        if value >= 0.9995:
            return f"{value:,.{2 if value < 9.995 else 1 if value < 99.95 else 0}f} {prefix}FLOPs"
    return f"{flops:,.0f} FLOPs"


def baseline(outcomes: list[Outcome], amp) -> float | None:
    """single_gpu's images/s with this --amp, as its table row has it: the global batch ÷ the
    mean step of its successful runs (not the mean of each run's images/s)."""
    rows = [o.row for o in outcomes
            if o.run.mode == "single_gpu" and o.row["amp"] == amp and o.row["images_per_sec"]]
    if not rows:
        return None
    return rows[0]["global_batch"] / statistics.fmean(row["step_time_mean_s"] for row in rows)


def write_csv(outcomes: list[Outcome], path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    for o in outcomes:
        writer.writerow({k: "" if o.row[k] is None else o.row[k] for k in COLUMNS})
    write_file(path, text.getvalue().encode())


def write_file(path: Path, data: bytes) -> None:
    """`data` into `path`, whole or not at all (common.logger.write_atomically): an
    earlier file stays as it was whatever stops the write (a full disk, a signal, a
    crash), and an OSError names the file."""
    write_atomically(path, lambda f: f.write(data))


# The pictures compare.py may draw (comparison/plots.py draws those it has figures for)
PICTURES = ("images_per_sec.png", "scaling_efficiency.png", "step_breakdown.png",
            "memory_per_gpu.png")
EARLIER_PICTURES = ("step_time.png",)  # what earlier versions drew: --overwrite removes them too


# --- report.md ------------------------------------------------------------------------------------

def spread(values: list, digits: int, scale: float = 1.0, unit: str = "") -> str:
    """mean ± std (sample std over repeats) of the values that were measured; '—' when none were."""
    values = [v * scale for v in values if v is not None]
    if not values:
        return "—"
    mean = statistics.fmean(values)
    text = f"{mean:,.{digits}f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):,.{digits}f}"
    return text + unit


def groups(outcomes: list[Outcome]) -> list[list[Outcome]]:
    by_setting: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        by_setting.setdefault(o.run.setting, []).append(o)
    return list(by_setting.values())


def fine_digits(value: float) -> int:
    """Decimals for a step in ms or an epoch in s, three figures or more ('402.3', '78.4', '6.84',
    '0.684'): the images/s beside a step, the global batch ÷ that step, can be checked from it."""
    return 1 if value >= 10 else 2 if value >= 1 else 3


def fmt_spread(mean: float, std: float, digits: int, runs: int, unit: str = "") -> str:
    """A configuration's figure as the table shows it: 'mean ± std', the std with more than one
    run only."""
    text = f"{mean:,.{digits}f}"
    if runs > 1:
        text += f" ± {std:,.{digits}f}"
    return text + unit


def table_header(outcomes: list[Outcome]) -> str:
    """The results table's header, each column's statistic named: the step is the mean of the
    timed steps, and the figures made from it say so; the epoch is of the runs' own training
    set, its images counted in the header."""
    counts = {o.row["train_images"] for o in outcomes if o.row.get("train_images")}
    epoch = (f"epoch of {next(iter(counts)):,} images, s" if len(counts) == 1 else
             "epoch of the run's training set, s")
    return ("| mode | GPUs | backend | amp | global batch | per-GPU batch | step, ms (mean of "
            f"timed steps) | {epoch} (at that step) | images/s (global batch ÷ that step) | "
            "speedup (÷ single_gpu's images/s) | scaling efficiency (speedup ÷ GPUs) | data wait "
            "(share of timed steps) | GPU util (mean) | peak mem GB per GPU, allocated (reserved) "
            "| MFU (timed steps) | test acc | run time, s (each run, start to end) | runs |")


TABLE_NOTE = ("Each cell is the mean ± std over the configuration's runs (`--repeat`). The step "
              "is each run's mean of its timed steps (after `--warmup_steps`), averaged over the "
              "runs; the epoch, images/s, speedup and scaling efficiency are that step seen other "
              "ways, their ± the step's std as the same share of the figure. The other columns "
              "are each run's own figure, averaged.")


# what each --amp runs as: every mode casts under torch.autocast (fsdp too,
# not FSDP's MixedPrecisionPolicy)
AMP_CELLS = {"bf16": "bf16 autocast", "fp16": "fp16 autocast + GradScaler", "off": "off"}
# fsdp's --reshard_after_forward
RESHARD_CELLS = {True: ", reshard", False: ", no reshard", None: ""}


def memory_per_gpu_gb(rows: list[dict], key: str = "peak_mem_gb_per_gpu") -> list[list[float]]:
    """Each GPU's peak memory in GB (`key`: allocated, or peak_mem_reserved_gb_per_gpu) in each
    of the runs' rows that recorded it: [[run 1's GPU 0, GPU 1, ...], ...]."""
    per_run = [[float(gb) for gb in (row.get(key) or "").split()] for row in rows]
    return [gbs for gbs in per_run if gbs]


def memory_cell(rows: list[dict]) -> str:
    """Each GPU's peak memory over the configuration's runs, `allocated (reserved)` in GB, the
    GPUs separated by slashes: the tensors' high-water mark, ± its std over the runs where that
    shows at two decimals (memory_per_gpu.png's error bar), and the caching allocator's, which
    alone shows what CUDA graphs hold in their private pools."""
    allocated = memory_per_gpu_gb(rows)
    reserved = memory_per_gpu_gb(rows, "peak_mem_reserved_gb_per_gpu")
    if not allocated:
        return "—"
    cells = []
    for gpu in range(len(allocated[0])):
        values = [gbs[gpu] for gbs in allocated if len(gbs) > gpu]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        cell = f"{statistics.fmean(values):.2f}" + (f" ± {std:.2f}" if std >= 0.005 else "")
        held = [gbs[gpu] for gbs in reserved if len(gbs) > gpu]
        # results written before reserved memory was recorded have none
        if len(reserved) == len(allocated) and len(held) == len(values):
            cell += f" ({statistics.fmean(held):.2f})"
        cells.append(cell)
    return " / ".join(cells)


def table_row(group: list[Outcome], outcomes: list[Outcome]) -> str:
    """A configuration's row of the results table: its speed from its Measured (`outcomes`: the
    whole comparison, for single_gpu's images/s), the rest each run's own figure averaged."""
    run, ok = group[0].run, [o.row for o in group if o.status == "ok"]
    col = lambda key: [r[key] for r in ok]  # noqa: E731
    memory = memory_cell(ok) if ok else "—"
    m = next((m for m in measured(outcomes) if m.run.setting == run.setting), None)
    speed = ([m.step_cell(), m.epoch_cell(), m.speed(), m.speedup_cell(), m.efficiency_cell()]
             if m else ["—"] * 5)
    backend = ((run.backend or "") + (" + SyncBN" if run.sync_bn else "")
               + RESHARD_CELLS[run.reshard_after_forward])
    amp = (ok[0]["amp"] if ok else group[0].row["amp"]) or "default"
    amp = AMP_CELLS.get(amp, amp)
    untimed = [row for row in ok if row["images_per_sec"] is None]
    runs = f"{len(ok)} ok" + (", no timed steps" if untimed and len(untimed) == len(ok) else
                              f", {len(untimed)} without timed steps" if untimed else "")
    for status in ("failed", "interrupted", "not run"):
        count = sum(o.status == status for o in group)
        runs += f", **{count} {status}**" if count else ""
    cells = [run.mode, str(run.gpus), backend or "—", amp, str(group[0].row["global_batch"] or "—"),
             str(group[0].row["per_gpu_batch"] or "—"), *speed,
             spread(col("data_wait_frac"), 1, 100, " %"),
             spread(col("gpu_util_mean"), 0, 1, " %"), memory, spread(col("mfu"), 1, 100, " %"),
             spread(col("test_acc"), 2, 100, " %"), spread(col("run_time_s"), 1), runs]
    return "| " + " | ".join(cells) + " |"


# --- report.md: what the table says ---------------------------------------------------------------

# what a run's `gpus` counts
UNITS = {"gpu": ("GPU", "GPUs"), "cpu": ("CPU process", "CPU processes")}
PARALLEL_MODES = ("data_parallel", "dist_parallel", "fsdp")


@dataclass
class Measured:
    """A configuration as its table row sums it up: its successful runs that timed steps (their
    CSV rows) and single_gpu's images/s with the same --amp (`base`; None: not measured). Every
    figure of its speed is made from one statistic, its step (step_s, ± step_std_s): the table's
    cells, the sentences and the pictures all read them here."""
    run: PlannedRun  # the configuration's first run
    rows: list[dict]
    base: float | None = None

    def mean(self, key: str) -> float | None:
        values = [row[key] for row in self.rows if row[key] is not None]
        return statistics.fmean(values) if values else None

    @property
    def step_s(self) -> float:
        """The mean of the timed steps (each run's), averaged over the runs: the table's step."""
        return self.mean("step_time_mean_s")

    @property
    def step_std_s(self) -> float:
        """The sample standard deviation of the runs' steps (0 with one run)."""
        steps = [row["step_time_mean_s"] for row in self.rows]
        return statistics.stdev(steps) if len(steps) > 1 else 0.0

    @property
    def share(self) -> float:
        """The step's std as a share of the step: the same share of every figure made from it."""
        return self.step_std_s / self.step_s

    @property
    def images_per_sec(self) -> float:
        """The global batch ÷ the step (not the mean of each run's images/s)."""
        return self.rows[0]["global_batch"] / self.step_s

    @property
    def images_per_sec_std(self) -> float:
        return self.images_per_sec * self.share

    @property
    def speedup(self) -> float | None:
        """Its images/s ÷ single_gpu's (the same --amp); None where single_gpu timed no step."""
        return self.images_per_sec / self.base if self.base else None

    @property
    def efficiency(self) -> float | None:
        """The speedup ÷ the GPUs used: on one GPU what its speedup says."""
        return self.speedup / self.run.gpus if self.base else None

    @property
    def amp(self) -> str | None:
        return self.rows[0]["amp"]

    @property
    def per_gpu_batch(self) -> int:
        return self.rows[0]["per_gpu_batch"]

    @property
    def low(self) -> float:
        """The bottom of the configuration's range of images/s: mean − std, as the table shows
        it."""
        return self.images_per_sec - self.images_per_sec_std

    @property
    def high(self) -> float:
        return self.images_per_sec + self.images_per_sec_std

    def cell(self, value: float, digits: int, unit: str = "") -> str:
        """A figure made from the step, ± the step's share of it."""
        return fmt_spread(value, value * self.share, digits, len(self.rows), unit)

    def speed(self) -> str:
        """Its images/s as the table's cell has it: '1,200 ± 50'."""
        return self.cell(self.images_per_sec, 0)

    def step_cell(self) -> str:
        ms = 1000 * self.step_s
        return fmt_spread(ms, 1000 * self.step_std_s, fine_digits(ms), len(self.rows))

    def epoch_cell(self) -> str:
        images = self.rows[0]["train_images"]
        if not images:
            return "—"
        epoch = images / self.images_per_sec
        return self.cell(epoch, fine_digits(epoch))

    def speedup_cell(self) -> str:
        return self.cell(self.speedup, 2, "×") if self.base else "—"

    def efficiency_cell(self) -> str:
        return self.cell(100 * self.efficiency, 0, " %") if self.base else "—"

    def name(self, count: bool = True) -> str:
        """The configuration in a sentence, as PlannedRun.describe() has it: 'dist_parallel on 2
        GPUs (nccl)'; without its count, 'dist_parallel (nccl)'; single_gpu without its one GPU."""
        described = self.run.describe()
        counted = described.split(" (")[0]
        if count and self.run.mode != "single_gpu":
            return described
        return self.run.mode + described[len(counted):]


def measured(outcomes: list[Outcome]) -> list[Measured]:
    """The configurations with a timed step, in the table's order, each with single_gpu's
    images/s (baseline) beside it."""
    timed = []
    for group in groups(outcomes):
        rows = [o.row for o in group if o.status == "ok" and o.row["images_per_sec"] is not None]
        if rows:
            timed.append(Measured(group[0].run, rows, baseline(outcomes, rows[0]["amp"])))
    return timed


def fmt_percent(fraction: float, signed: bool = False) -> str:
    """A share in per cent as the table writes it ('71 %'), a decimal below 10 %; with its sign
    if `signed`."""
    digits = 1 if abs(fraction) < 0.1 else 0
    return f"{fraction * 100:{'+' if signed else ''}.{digits}f} %"


def findings(outcomes: list[Outcome], cores: Cores | None = None) -> list[str]:
    """What the table says, as a list of sentences computed from its figures: runs with more
    processes than cores (their figures measure contention), whether the fastest configuration can
    be told apart from the rest (and by how much), DataParallel on the CPU (which wraps nothing),
    the difference this run can resolve (noise_line), the parallel configurations no faster than
    one GPU (no_gain_line), the scaling efficiency at the most GPUs run, which configurations the
    run-to-run spread cannot tell apart, and the runs that failed and why (each with its log).
    `cores`: the CPU cores the runs shared (None: not known, nothing said of them)."""
    timed = measured(outcomes)
    crowded = oversubscription_line(outcomes, cores)
    if not timed:
        nothing = "- **No run timed a step**, so there is nothing to compare."
        return [line for line in (crowded, nothing) if line] + failures(outcomes)
    lines = [crowded, verdict_line(timed), wraps_nothing_line(timed), noise_line(timed),
             no_gain_line(timed), scaling_line(timed, cores), spread_line(timed)]
    return [line for line in lines if line] + failures(outcomes)


def wraps_nothing(m: Measured) -> bool:
    """data_parallel on the CPU: nn.DataParallel without GPUs calls the model itself (nothing to
    scatter, replicate or gather), so it is single_gpu's computation, and is not ranked among the
    modes."""
    return m.run.mode == "data_parallel" and m.run.unit == "cpu"


def contenders(timed: list[Measured]) -> list[Measured]:
    """The configurations ranked by speed, fastest first: every one that timed a step but
    data_parallel on the CPU (wraps_nothing). The verdict, the spread line and the recommendation
    rank these alike."""
    return sorted((m for m in timed if not wraps_nothing(m)), key=lambda m: m.images_per_sec,
                  reverse=True)


def oversubscription_line(outcomes: list[Outcome], cores: Cores | None) -> str | None:
    """Whether some CPU runs had more processes (times their threads) than the cores they shared:
    such processes take turns on the cores, so the runs' speed measures that contention, not the
    parallelism."""
    crowded = cores.crowded([o.run for o in outcomes]) if cores else []
    if not crowded:
        return None
    counts = sorted({run.gpus for run in crowded})
    threads = ("one thread each" if cores.threads == 1 else
               f"{cores.threads} threads each (OMP_NUM_THREADS)")
    return (f"- **Oversubscribed: up to {counts[-1]} CPU processes on {cores.available} cores.** "
            f"The runs on {listed([str(n) for n in counts])} CPU processes ({threads}) had more "
            "threads than this machine has cores, so their processes took turns on the cores: "
            "their images/s, speedup and scaling efficiency measure that contention, not the "
            f"parallelism. `--gpu_counts` up to {cores.fit} keeps a core for every thread here.")


def oversubscription_title(outcomes: list[Outcome], cores: Cores | None) -> str:
    """The report's title's end where some CPU runs were oversubscribed: ' — oversubscribed: 8
    processes on 2 cores'; '' otherwise."""
    crowded = cores.crowded([o.run for o in outcomes]) if cores else []
    if not crowded:
        return ""
    most = max(run.gpus for run in crowded)
    return f" — oversubscribed: {most} processes on {cores.available} cores"


def verdict_line(timed: list[Measured]) -> str:
    """The first thing the table says: the fastest configuration, named only where its range of
    images/s (mean ± std over its runs, as the table shows it) lies above every other's; otherwise
    which configurations cannot be told apart, and why (one run each measures no spread; or their
    ranges overlap)."""
    ranked = contenders(timed)
    if not ranked:
        return ("- **Nothing to rank:** only data_parallel on the CPU timed a step, and without "
                "GPUs it is single_gpu's computation.")
    first = ranked[0]
    if len(ranked) == 1:
        return (f"- **Only {first.name()} timed a step** ({first.speed()} images/s): nothing to "
                "compare it with.")
    once = [m for m in ranked if len(m.rows) < 2]
    if once:
        figures = "; ".join(f"{m.name()} {m.speed()}" for m in ranked)
        apart = "**The configurations cannot be told apart"
        which = (f"{apart}: one run each**" if len(once) == len(ranked) else
                 f"{apart}:** {listed([m.name() for m in once])} timed one run only, which")
        return (f"- {which} measures no run-to-run spread, so no difference between them is shown "
                "to be more than noise (`--repeat 3` measures it). Images/s in their runs, fastest "
                f"first: {figures}.")
    runs, floor = run_counts(ranked), noise_floor(timed)
    tied = [first, *[m for m in ranked[1:] if ties(first, m, floor)]]
    if len(tied) > 1:
        figures = "; ".join(f"{m.name()} {m.speed()}" for m in tied)
        within = f" or lie within the {fmt_percent(floor[0])} noise floor" if floor else ""
        return (f"- **{listed([m.name() for m in tied])} cannot be told apart:** their images/s "
                f"(mean ± std over {runs} runs) overlap{within}: {figures}.")
    second = ranked[1]
    text = (f"- **Fastest: {first.name()}**, {first.speed()} images/s: "
            f"{first.images_per_sec / second.images_per_sec:.2f}× the next fastest, "
            f"{second.name()} at {second.speed()}")
    single = next((m for m in ranked if m.run.mode == "single_gpu" and m.amp == first.amp), None)
    if first.run.mode != "single_gpu" and single is not None and single is not second:
        text += (f", and {first.images_per_sec / single.images_per_sec:.2f}× {single.name()} at "
                 f"{single.speed()} (the speedup column)")
    text += f"; its range (mean ± std over {runs} runs) lies above every other's"
    if floor:
        text += f", by more than the {fmt_percent(floor[0])} noise floor"
    if first.run.mode == "single_gpu":
        return text + f": no parallel mode beat one {UNITS[first.run.unit][0]} here."
    return text + "."


def run_counts(timed: list[Measured]) -> str:
    """How many runs each configuration has: '3', or '2–3'."""
    counts = sorted({len(m.rows) for m in timed})
    return f"{counts[0]}–{counts[-1]}" if len(counts) > 1 else f"{counts[0]}"


def wraps_nothing_line(timed: list[Measured]) -> str | None:
    """What data_parallel on the CPU is (wraps_nothing), in place of a rank among the modes."""
    wrapped = next((m for m in timed if wraps_nothing(m)), None)
    if wrapped is None:
        return None
    single = next((m for m in timed if m.run.mode == "single_gpu" and m.amp == wrapped.amp), None)
    against = (f"; its {wrapped.speed()} images/s against single_gpu's {single.speed()} is no "
               "measure of DataParallel" if single else "")
    return (f"- **{wrapped.name()} is single_gpu's computation:** without GPUs nn.DataParallel "
            f"calls the model itself, with nothing to scatter, replicate or gather{against}, so it "
            "is left out of the ranking.")


def scaling_line(timed: list[Measured], cores: Cores | None = None) -> str | None:
    """The scaling efficiency of each configuration at the most GPUs run, and whether that many
    CPU processes oversubscribed the cores; None when one GPU count ran."""
    if len({m.run.gpus for m in timed}) < 2:
        return None
    most = max(m.run.gpus for m in timed)
    at_most = [m for m in timed if m.run.gpus == most]
    unit, units = UNITS[at_most[0].run.unit]
    text = f"- **Scaling at {most} {units}**, the most run: "
    known = [(m, m.efficiency) for m in at_most if m.efficiency is not None]
    if not known:
        return (text + "no single_gpu run with the same `--amp` timed a step, so there is no "
                "scaling efficiency.")
    parts = [f"{fmt_percent(efficiency)} for {m.name(count=False)}" for m, efficiency in known]
    single = next((m for m in timed if m.run.mode == "single_gpu" and m.amp == known[0][0].amp),
                  None)
    batch = known[0][0].per_gpu_batch
    if single is None or single.per_gpu_batch == batch:
        share = f"each {unit} with {batch} images, as many as single_gpu"
    else:
        share = f"each {unit} with {batch} of the {batch * most} images single_gpu takes alone"
    crowded = (f"; {most} processes on {cores.available} cores are oversubscribed, so this "
               "efficiency measures their contention"
               if cores and cores.crowded([m.run for m in at_most]) else "")
    return (text + f"scaling efficiency (speedup ÷ {units}) " + listed(parts)
            + f"; {share}{crowded}.")


def spread_line(timed: list[Measured]) -> str | None:
    """With repeats, which configurations' images/s ranges (mean ± std over their runs) overlap,
    the fastest first: their differences cannot be told from run-to-run noise. None with one run
    each (the verdict says so)."""
    ranked = contenders(timed)
    if len(ranked) < 2 or any(len(m.rows) < 2 for m in ranked):
        return None
    runs = run_counts(ranked)
    overlapping = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:] if overlap(a, b)]
    if not overlapping:
        return ("- **Spread:** no two configurations' images/s overlap (mean ± std over their "
                "runs): every difference above is larger than the run-to-run spread, as far as "
                f"{runs} runs each can tell.")
    shown = [f"{a.name()} at {a.speed()} images/s and {b.name()} at {b.speed()}"
             for a, b in overlapping[:3]]
    more = f", and {len(overlapping) - 3} more pairs" if len(overlapping) > 3 else ""
    return (f"- **Within the run-to-run spread** ({runs} runs each): " + "; ".join(shown) + more
            + ". Their images/s (mean ± std) overlap: the difference between them cannot be told "
            "from run-to-run noise.")


def overlap(a: Measured, b: Measured) -> bool:
    """Whether two configurations' ranges of images/s (mean ± std over their runs, as the table
    shows them) overlap: their difference cannot be told from run-to-run noise. The verdict, the
    spread line and the recommendation all judge by it."""
    return a.low <= b.high and b.low <= a.high


def ties(a: Measured, b: Measured, floor: tuple | None) -> bool:
    """Whether two configurations cannot be told apart: their ranges overlap, or their images/s
    differ by no more than the noise floor (noise_floor; None: not measured). The verdict, the
    no-gain line and the recommendation judge by it."""
    apart = max(a.images_per_sec, b.images_per_sec) / min(a.images_per_sec, b.images_per_sec)
    return overlap(a, b) or (floor is not None and apart - 1 <= floor[0])


def same_computation(timed: list[Measured]) -> list[tuple[Measured, Measured]]:
    """The pairs of configurations that do the same computation: single_gpu and data_parallel on
    one GPU (nn.DataParallel on one device calls the model itself), or on the CPU (where it always
    does), with the same --amp and global batch. What they measured apart is noise."""
    pairs = []
    for single in (m for m in timed if m.run.mode == "single_gpu"):
        pairs += [(single, m) for m in timed
                  if m.run.mode == "data_parallel" and (m.run.gpus == 1 or m.run.unit == "cpu")
                  and m.amp == single.amp and m.rows[0]["global_batch"] ==
                  single.rows[0]["global_batch"]]
    return pairs


def noise_floor(timed: list[Measured]) -> tuple[float, Measured, Measured] | None:
    """The difference between configurations that this run cannot resolve, where two of them did
    the same computation (same_computation): the share by which their images/s differ (the
    faster ÷ the slower, less 1), with the pair; the widest such gap where there are several.
    None where no such pair was measured."""
    gaps = [(max(a.images_per_sec, b.images_per_sec) / min(a.images_per_sec, b.images_per_sec)
             - 1, a, b) for a, b in same_computation(timed)]
    return max(gaps, key=lambda gap: gap[0]) if gaps else None


def noise_line(timed: list[Measured]) -> str | None:
    """The difference this run can resolve, stated where it was measured: the gap between two
    configurations that did the same computation (noise_floor), and the spread of the repeats
    (each configuration's std over its runs, as a share of its images/s). None where neither was
    measured (one run each, no such pair: the verdict says so)."""
    floor = noise_floor(timed)
    repeated = [m for m in timed if len(m.rows) > 1]
    widest = max(repeated, key=lambda m: m.share) if repeated else None
    spread_text = (f"up to {fmt_percent(widest.share)} of a configuration's images/s (the std over "
                   f"its {run_counts(repeated)} runs, {widest.name()}'s)" if widest else "")
    if floor is None:
        if widest is None:
            return None
        return (f"- **Noise floor: the spread of the repeats,** {spread_text}: configurations "
                "whose ranges (mean ± std) overlap are not told apart here.")
    share, a, b = floor
    why = ("nn.DataParallel without GPUs calls the model itself" if b.run.unit == "cpu" else
           "nn.DataParallel on one GPU moves the batch onto it and calls the model itself")
    runs = ("The repeats vary too: " + spread_text + "." if widest else
            "One run each: `--repeat 3` measures the spread of the repeats too.")
    return (f"- **Noise floor: {fmt_percent(share)}.** {a.name()} and {b.name()} do the same "
            f"computation ({why}), yet measured {a.speed()} and {b.speed()} images/s, "
            f"{fmt_percent(share)} apart: differences of less than {fmt_percent(share)} between "
            "configurations are not shown to be more than noise here, and the sentences and the "
            f"recommendation judge so. {runs}")


def no_gain(timed: list[Measured], floor: tuple | None) -> list[tuple[Measured, str]]:
    """The parallel configurations no faster than single_gpu (the same --amp), with why: their
    range of speedup includes 1×, or overlaps single_gpu's, or lies within the noise floor (ties).
    Judged only where it can be: both repeated, or a noise floor measured."""
    found = []
    for m in contenders(timed):
        single = next((s for s in timed if s.run.mode == "single_gpu" and s.amp == m.amp), None)
        if m.run.mode == "single_gpu" or single is None or not ties(m, single, floor):
            continue
        if (len(m.rows) < 2 or len(single.rows) < 2) and floor is None:
            continue
        if len(m.rows) > 1 and abs(m.speedup - 1) <= m.speedup * m.share:
            why = "its range includes 1× single_gpu's"
        elif overlap(m, single):
            why = f"its range overlaps single_gpu's {single.speedup_cell()}"
        else:
            why = f"within the {fmt_percent(floor[0])} noise floor of 1×"
        found.append((m, why))
    return found


def no_gain_line(timed: list[Measured]) -> str | None:
    """The parallel configurations no faster than one GPU (no_gain), named as such."""
    found = no_gain(timed, noise_floor(timed))
    if not found:
        return None
    unit = UNITS[found[0][0].run.unit][0]
    named = "; ".join(f"{m.name()} at {m.speedup_cell()} one {unit} ({why})" for m, why in found)
    return (f"- **No gain:** {named}: no faster than one {unit}, as far as this run can tell.")


# --- report.md: where a step goes --------------------------------------------------------------

PART_NAMES = {"compute_ms": "compute", "comm_exposed_ms": "exposed communication",
              "data_ms": "data", "optimizer_ms": "optimizer", "other_ms": "other"}
# what each parallel mode communicates
COLLECTIVES = {"dist_parallel": "gradient all-reduce", "fsdp": "all-gathers and reduce-scatters",
               "data_parallel": "scatter, replication and gather"}
STRAGGLER_SHARE = 0.10  # ranks whose work differs by more than this share of the step: named


@dataclass
class Split:
    """A configuration's step as the split's table, its sentences and step_breakdown.png all show
    it (step_split computes it once): ms per step, each the mean over the configuration's runs of
    the mean over its ranks of the profiled steps."""
    parts: dict[str, float]  # SPLIT_PARTS: they add up to step_ms
    comm_ms: float           # all communication, hidden behind compute or not
    hidden_ms: float         # comm_ms less the exposed part: overlapped with compute, not added
    step_ms: float
    step_std_ms: float       # over the runs (0 with one)
    runs: int                # the runs that recorded a split
    work: dict[int, float]   # rank -> its step less its exposed communication (time not waiting)
    profiled_steps: int | None

    def step_cell(self) -> str:
        """The profiled step as the split's table shows it, and step_breakdown.png at its bar's
        end, with its error bar: '43.6 ± 2.1', mean ± std over the runs."""
        return fmt_spread(self.step_ms, self.step_std_ms, 1, self.runs)

    @property
    def slowest(self) -> int:
        return max(self.work, key=self.work.get)

    @property
    def least(self) -> int:
        return min(self.work, key=self.work.get)

    @property
    def straggler(self) -> bool:
        """Whether the ranks' work differs notably (more than STRAGGLER_SHARE of the step)."""
        spread_ms = self.work[self.slowest] - self.work[self.least]
        return spread_ms > STRAGGLER_SHARE * self.step_ms


def step_split(m: Measured) -> Split | None:
    """The configuration's split (Split), from the CSV rows of its runs that recorded one; None
    where none did."""
    rows = [row for row in m.rows if row.get("split_step_ms") is not None]
    if not rows:
        return None
    mean = lambda key: statistics.fmean(row[key] for row in rows)  # noqa: E731
    per_rank = [[float(w) for w in row["split_work_ms_per_rank"].split()] for row in rows]
    ranks = min(len(work) for work in per_rank)
    steps = [row["split_step_ms"] for row in rows]
    return Split(parts={part: mean(f"split_{part}") for part in SPLIT_PARTS},
                 comm_ms=mean("split_comm_ms"), hidden_ms=mean("split_comm_hidden_ms"),
                 step_ms=mean("split_step_ms"),
                 step_std_ms=statistics.stdev(steps) if len(steps) > 1 else 0.0, runs=len(rows),
                 work={r: statistics.fmean(work[r] for work in per_rank) for r in range(ranks)},
                 profiled_steps=rows[0].get("profiled_steps"))


SPLIT_HEADER = ("| configuration | step, ms (mean of timed steps, as above) | profiled step, ms "
                "(mean ± std over the runs) | "
                "compute | communication exposed | data | optimizer | other | communication "
                "hidden behind compute (not added) | slowest rank: work, ms (least) |")


def breakdown_section(outcomes: list[Outcome], profiling: int | None) -> list[str]:
    """report.md's "Where a step goes": each configuration's split (step_split) as a table, then a
    sentence per parallel configuration at its mode's most GPUs. `profiling`: the --profile_steps
    the runs were given (None: the train scripts here take no such flag), which says why a split
    is missing."""
    timed = measured(outcomes)
    splits = [(m, step_split(m)) for m in timed]
    if not any(split for _, split in splits):
        return [not_recorded(profiling, bool(timed))]
    steps = sorted({split.profiled_steps for _, split in splits if split and split.profiled_steps})
    counted = f"{listed([str(n) for n in steps])} steps" if steps else "a few steps"
    lines = [
        f"Each rank's step over {counted} recorded by torch.profiler after the timed steps "
        "(`--profile_steps`, never timed), split into compute, exposed communication (the step "
        "waiting for it), waiting for data, the optimizer and the rest: these add up to the "
        "profiled step. The communication hidden behind compute ran while other work did, so it "
        "is shown beside the parts, not added to them. **ms per step, the mean over ranks** (and "
        "over a configuration's runs). The profiled steps are a few, with the profiler's own "
        "overhead: the timed step of the results table stands beside them. The slowest rank is "
        "the one with the most work (its step less its exposed communication: the time it did "
        "not wait for the others). Each rank's trace is in its run folder, "
        "`runs/<run>/trace_rank<r>.json` (Perfetto, chrome://tracing, TensorBoard's profile "
        "plugin).",
        "",
        SPLIT_HEADER,
        "|" + "---|" * SPLIT_HEADER.count(" | ") + "---|",
    ]
    for m, split in splits:
        timed_step = m.step_cell()
        if split is None:
            lines.append(f"| {m.name()} | {timed_step} | not recorded | | | | | | | |")
            continue
        parts = [f"{split.parts[part]:.1f}" for part in SPLIT_PARTS]
        slowest = (f"rank {split.slowest}: {split.work[split.slowest]:.1f} (rank {split.least}: "
                   f"{split.work[split.least]:.1f})" if len(split.work) > 1 else "—")
        lines.append(f"| {m.name()} | {timed_step} | {split.step_cell()} | " + " | ".join(parts)
                     + f" | {split.hidden_ms:.1f} | {slowest} |")
    sentences = [split_line(m, split, timed) for m, split in splits
                 if split and m in compared(timed)]
    missing = [m for m, split in splits if split is None]
    if missing:
        why = not_recorded(profiling, True).removeprefix("Not recorded: ")
        sentences.append(f"- Not recorded for {listed([m.name() for m in missing])}: {why}")
    return lines + ([""] + sentences if sentences else [])


def not_recorded(profiling: int | None, timed: bool) -> str:
    """Why no split of the step is there."""
    if not timed:
        return "Not recorded: no run timed a step, so none was profiled."
    if profiling is None:
        return ("Not recorded: the train scripts here take no `--profile_steps`, so no run "
                "profiled its steps.")
    if profiling == 0:
        return ("Not recorded: `--profile_steps 0` left the profiler off; by default compare.py "
                "profiles 3 steps of every run and splits them here.")
    return ("Not recorded: no run's results.json has a split of its step (`summary.breakdown`): "
            "they were written without the profiler.")


def compared(timed: list[Measured]) -> list[Measured]:
    """The parallel configurations given a sentence: every one at its mode's most GPUs (each
    backend, --amp and setting there), data_parallel on the CPU aside (it wraps nothing)."""
    chosen = []
    for mode in PARALLEL_MODES:
        of_mode = [m for m in timed if m.run.mode == mode and not wraps_nothing(m)]
        if of_mode:
            most = max(m.run.gpus for m in of_mode)
            chosen += [m for m in of_mode if m.run.gpus == most]
    return chosen


def split_line(m: Measured, split: Split, timed: list[Measured]) -> str:
    """What separates a parallel configuration's step from single_gpu's (the same --amp): its
    communication, hidden and exposed; its compute against single_gpu's (the per-GPU batch
    shrinks it); the part that grew most; and the slowest rank where the ranks' work differs
    notably (a straggler the others wait for)."""
    collective = COLLECTIVES[m.run.mode]
    exposed = split.parts["comm_exposed_ms"]
    clauses = [f"{split.hidden_ms:.1f} ms of its {split.comm_ms:.1f} ms of {collective} hidden "
               f"behind compute, {exposed:.1f} ms exposed" if split.comm_ms > 0 else
               "no communication recorded"]
    single = next((s for s in timed if s.run.mode == "single_gpu" and s.amp == m.amp), None)
    reference = step_split(single) if single else None
    if reference is not None:
        unit = UNITS[m.run.unit][0]
        batch = (f" for {m.per_gpu_batch} images per {unit}, against {single.per_gpu_batch}"
                 if m.per_gpu_batch != single.per_gpu_batch else "")
        change = lambda part: (f"{PART_NAMES[part]} {reference.parts[part]:.1f} → "  # noqa: E731
                               f"{split.parts[part]:.1f} ms")
        grown = {part: split.parts[part] - reference.parts[part] for part in SPLIT_PARTS}
        most = max(grown, key=grown.get)
        compute_grew_most = most == "compute_ms" and grown[most] > 0  # said once, below
        text = (f"against single_gpu, its profiled step {reference.step_ms:.1f} → "
                f"{split.step_ms:.1f} ms{batch}: "
                + ("" if compute_grew_most else change("compute_ms") + "; "))
        clauses.append(text + (f"the part that grew most, {change(most)}" if grown[most] > 0 else
                               "no part grew"))
    if split.straggler:
        clauses.append(f"rank {split.slowest} is the slowest, {split.work[split.slowest]:.1f} ms "
                       f"of work per step against {split.work[split.least]:.1f} ms on rank "
                       f"{split.least}, which waits for it in exposed communication")
    return f"- **{m.name()}:** " + "; ".join(clauses) + "."


def listed(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def failures(outcomes: list[Outcome]) -> list[str]:
    """The runs that did not succeed, each with its error and its log (runs not started for the same
    reason together), or that every run succeeded."""
    failed = [o for o in outcomes if o.status != "ok"]
    if not failed:
        return ["- Every run succeeded."]
    lines = [f"- **{len(failed)} of {len(outcomes)} runs did not succeed:**"]
    merged: list[tuple[list[Outcome], str]] = []
    for o in failed:
        if (merged and o.status == "not run" and merged[-1][0][-1].status == "not run"
            and merged[-1][1] == o.error):
            merged[-1][0].append(o)
        else:
            merged.append(([o], o.error))
    for together, error in merged:
        o = together[0]
        names = ", ".join(f"`{each.run.name}`" for each in together)
        log = f" (log: `{o.row['log']}`)" if o.row.get("log") else ""
        after = f" after {o.seconds:.1f} s" if o.status != "not run" else ""
        lines.append(f"  - {names}: {o.status}{after} — {error}{log}")
    return lines


def untimed_note(outcomes: list[Outcome], warmup_steps: int) -> list[str]:
    """What a row of runs without timed steps means and what to do about it; nothing when every run
    timed steps."""
    if not any(o.status == "ok" and o.row["images_per_sec"] is None for o in outcomes):
        return []
    return [f"*no timed steps*: the run succeeded but ended within its {warmup_steps} warm-up "
            f"steps (`--warmup_steps`) and the profiled steps after them (`--profile_steps`), "
            f"which are not timed, so it measured no speed. Give it more steps (more `--epochs`, a "
            f"larger `--synthetic_size`) or fewer `--warmup_steps` or `--profile_steps`.", ""]


# --- report.md: the recommendation ----------------------------------------------------------------

MODE_NAMES = {"single_gpu": "single_gpu", "data_parallel": "data_parallel (nn.DataParallel)",
              "dist_parallel": "dist_parallel (DDP)", "fsdp": "fsdp (FSDP2)"}
# among modes whose speeds cannot be told apart: DDP first (WHY_DDP);
# DataParallel last, PyTorch's own advice
PREFERENCE = ("dist_parallel", "fsdp", "single_gpu", "data_parallel")
WHY_DDP = ("DDP is the default where modes tie: PyTorch recommends it over DataParallel even on "
           "one machine, it scales past one node, and FSDP spends traffic to save memory this "
           "model does not need saved (docs/guide.md)")


def recommendation(outcomes: list[Outcome], memory: dict) -> str:
    """The report's `Recommendation:` line: the mode to use on this machine for this model, and why,
    from the table's figures (images/s and speedup as Measured has them; two configurations told
    apart only where their images/s ranges, mean ± std, do not overlap and differ by more than the
    noise floor, as the verdict judges: `ties`; data_parallel on the CPU, which wraps nothing, not
    among them: `contenders`) and the model state each mode needs per GPU (memory_projection's
    arithmetic). A mode that was run and timed no step (failed, stopped, not reached: lost_mode)
    is never recommended, and is named for what happened to it. The rules, in order:

    1. Memory: where DDP's model state outgrows one GPU (the projection), or a dist_parallel run
       ran out of memory, fsdp, on the fewest GPUs that hold the state; none of these modes where
       FSDP does not hold it on 64 GPUs, or where fsdp was run and failed.
    2. No configuration timed a step: nothing to choose by.
    3. A configuration with one run: no spread was measured, so no mode is shown faster:
       dist_parallel, the default (WHY_DDP).
    4. The fastest configuration's range above every other's: its mode. data_parallel is
       recommended over dist_parallel only so, on measured cause; dist_parallel that was not run
       is still the default.
    5. Otherwise the modes that tie with the fastest: the first of them in PREFERENCE
       (dist_parallel where it is among them, data_parallel only where it ties with nothing
       else), the rest named.
    Where dist_parallel was run and timed no step, rules 3 to 5 choose among the modes measured,
    in PREFERENCE. A parallel mode recommended whose every configuration showed no gain over one
    GPU (no_gain) says so; one some of whose runs failed says how many. On the CPU, a sentence on
    what CPU processes standing in for GPUs can and cannot tell."""
    timed, unit = measured(outcomes), UNITS[outcomes[0].run.unit]
    text = (memory_choice(outcomes, memory, unit)
            or speed_choice(timed, memory, unit, outcomes))
    if outcomes[0].run.unit == "cpu":
        text += (" On this CPU-only machine each \"GPU\" is a CPU process with one thread: its "
                 "figures show the modes' mechanics (processes over gloo, the split batch, each "
                 "wrapper's own cost), not what GPUs would gain, nor NCCL, nor GPU memory "
                 "(projected, not measured); run compare.py on GPUs to choose for them.")
    return "Recommendation: " + text


def lost_mode(outcomes: list[Outcome], mode: str) -> str | None:
    """Why `mode`, which the comparison ran, timed no step: 'dist_parallel (DDP) failed here
    (`03-dist_parallel-2gpu-nccl-r1`: exit status 1: ...; its log `logs/...`)', or was stopped,
    was not run (compare.py stopped first), timed no step; None where it timed a step, or was not
    among the modes run."""
    runs = [o for o in outcomes if o.run.mode == mode]
    if not runs or any(o.status == "ok" and o.row["images_per_sec"] is not None for o in runs):
        return None
    first = next((o for o in runs if o.status != "ok"), runs[0])
    how = {"failed": "failed", "interrupted": "was stopped", "not run": "was not run",
           "ok": "timed no step"}[first.status]
    error = first.error or "it ended within its --warmup_steps"
    log = f"; its log `{first.row['log']}`" if first.row.get("log") else ""
    return f"{MODE_NAMES[mode]} {how} here (`{first.run.name}`: {error}{log})"


def state_per_gpu(memory: dict, gpus: int, mode: str, reshard: bool = True) -> float:
    """Bytes per GPU of the runs' model state under `mode` (projection.memory_per_gpu)."""
    return sum(memory_per_gpu(memory["models"][0], gpus, mode, reshard, memory["amp"],
                              memory["momentum"]).values())


def capacity_text(memory: dict) -> str:
    """The GPU memory the state is weighed against: "its 79.2 GiB", or "an
    assumed 80.0 GiB" (no GPU here)."""
    return f"{'an assumed' if memory['assumed'] else 'its'} {fmt_bytes(memory['gpu_bytes'])}"


# what projection.md counts as the model state, named alike there and here
STATE_PARTS = "weights, gradients and optimizer state"


def fits_text(memory: dict) -> str:
    """The model state under DDP on one GPU, named as projection.md names it."""
    assumed = " (assumed: no GPU here)" if memory["assumed"] else ""
    return (f"the model state under DDP, {fmt_bytes(state_per_gpu(memory, 1, 'dist_parallel'))} "
            f"per GPU ({STATE_PARTS}; projection.md), fits one GPU of "
            f"{fmt_bytes(memory['gpu_bytes'])}{assumed}")


def memory_choice(outcomes: list[Outcome], memory: dict, unit: tuple[str, str]) -> str | None:
    """Rule 1 of recommendation(): fsdp where DDP cannot hold the model state; None where it can."""
    ddp = state_per_gpu(memory, 1, "dist_parallel")
    ran_out = [o for o in outcomes if o.run.mode == "dist_parallel" and o.status == "failed"
               and "out of memory" in (o.error or "").lower()
               and not any(p.status == "ok" and p.run.mode == o.run.mode
                           and p.run.gpus == o.run.gpus for p in outcomes)]
    if ddp <= memory["gpu_bytes"] and not ran_out:
        return None
    fsdp = measured([o for o in outcomes if o.run.mode == "fsdp"])
    lost = lost_mode(outcomes, "fsdp")
    if ran_out:
        why = (f"dist_parallel ran out of memory (`{ran_out[0].run.name}`, its log in "
               f"`{ran_out[0].row.get('log') or 'logs/'}`)")
        if lost:
            return (f"none of the modes run here: {why}, and {lost}: see what stopped it in its "
                    "log, and run compare.py again.")
        where = (f"fsdp ran ({fsdp[0].name()}, {fsdp[0].images_per_sec:,.0f} images/s)" if fsdp else
                 "fsdp shards the model state over the GPUs: add it to --modes")
        return f"fsdp (FSDP2): {why} and {where}."
    gpus = memory["runs_fsdp_gpus"][True]
    need = (f"under DDP each GPU would need {fmt_bytes(ddp)} for the model state alone "
            f"({STATE_PARTS}), more than {capacity_text(memory)}")
    if gpus is None:
        most = MEMORY_GPU_COUNTS[-1]
        return (f"none of these modes: {need}, and FSDP on {most} GPUs still "
                f"{fmt_bytes(state_per_gpu(memory, most, 'fsdp'))} each (projection.md); a smaller "
                "model, or a parallelism this suite does not have (tensor, pipeline).")
    each = fmt_bytes(state_per_gpu(memory, gpus, "fsdp"))
    if lost:
        return (f"none of the modes run here: {need}; FSDP would hold it on {gpus} GPUs or more "
                f"({each} each), but {lost}: see what stopped it in its log, and run compare.py "
                "again.")
    return (f"fsdp (FSDP2): {need}; FSDP holds it on {gpus} GPUs or more ({each} each, resharding "
            "after forward), activations on top (projection.md).")


def speed_text(m: Measured, unit: tuple[str, str]) -> str:
    """A configuration's speed as the table has it: its speedup over one GPU,
    else its images/s (mean ± std)."""
    if m.speedup is not None and m.run.mode != "single_gpu":
        return f"{m.speedup_cell()} one {unit[0]}"
    return f"{m.speed()} images/s"


def caveats(mode: str, timed: list[Measured], outcomes: list[Outcome], floor,
            unit: tuple[str, str]) -> str:
    """What the recommendation adds of the mode it chose: that none of its configurations gained
    over one GPU (no_gain), and how many of its runs did not succeed."""
    text = ""
    ones = [m for m in timed if m.run.mode == mode]
    lacking = [(m, why) for m, why in no_gain(timed, floor) if m.run.mode == mode]
    if mode != "single_gpu" and ones and len(lacking) == len(ones):
        named = "; ".join(f"{m.name()} at {speed_text(m, unit)} ({why})" for m, why in lacking)
        text += f" No gain over one {unit[0]} was measured here: {named}."
    runs = [o for o in outcomes if o.run.mode == mode]
    failed = [o for o in runs if o.status != "ok"]
    if failed:
        text += (f" {len(failed)} of its {len(runs)} runs did not succeed "
                 f"({listed([f'`{o.run.name}`' for o in failed])}: below).")
    return text


def speed_choice(timed: list[Measured], memory: dict, unit: tuple[str, str],
                 outcomes: list[Outcome]) -> str:
    """Rules 2 to 5 of recommendation(), the model state fitting one GPU under DDP."""
    text, mode = speed_rules(timed, memory, unit, outcomes)
    return text + (caveats(mode, timed, outcomes, noise_floor(timed), unit) if mode else "")


def speed_rules(timed: list[Measured], memory: dict, unit: tuple[str, str],
                outcomes: list[Outcome]) -> tuple[str, str | None]:
    """Rules 2 to 5 of recommendation(): the text, and the mode it recommends (None: none)."""
    if not timed:
        return ("none: no run timed a step, so nothing was measured to choose by (the failed "
                "runs are listed below).", None)
    fits = fits_text(memory)
    ranked = contenders(timed)  # data_parallel on the CPU is single_gpu's computation
    lost = lost_mode(outcomes, "dist_parallel")
    if not ranked:
        if lost:
            return (f"none: {fits}, but only data_parallel on the CPU timed a step, which is "
                    f"single_gpu's computation there, and {lost}.", None)
        return (f"dist_parallel (DDP), not run here (add it to --modes): {fits}; only "
                "data_parallel on the CPU timed a step, which is single_gpu's computation there, "
                f"and {WHY_DDP}.", "dist_parallel")
    best, others = ranked[0], ranked[1:]
    ddp = next((m for m in ranked if m.run.mode == "dist_parallel"), None)
    not_run = "" if ddp else ", not run here (add it to --modes)"
    floor = noise_floor(timed)

    def default(why: str, among: list[Measured]) -> tuple[str, str]:
        """DDP, the default (WHY_DDP); where DDP was run and timed no step, the first mode of
        `among` in PREFERENCE, DDP named for what happened to it."""
        if lost is None:
            return f"dist_parallel (DDP){not_run}: {fits}; {why}, and {WHY_DDP}.", "dist_parallel"
        modes = {m.run.mode for m in among}
        chosen = next(mode for mode in PREFERENCE if mode in modes)
        return (f"{MODE_NAMES[chosen]}: {fits}; {why}; {lost}, so it is not recommended, and "
                f"among the modes measured {chosen} comes first in the order used where modes tie "
                "(fsdp, single_gpu, then data_parallel, which PyTorch advises against: "
                "docs/guide.md).", chosen)

    if not others:
        return default(f"only {best.name()} timed a step ({speed_text(best, unit)}), nothing to "
                       "compare", ranked)
    if any(len(m.rows) < 2 for m in ranked):
        return default("one run per configuration measures no spread, so no mode is shown faster "
                       f"than another ({best.name()} was fastest in its run, "
                       f"{speed_text(best, unit)}; `--repeat 3` measures the spread)", ranked)
    tied = [best, *[m for m in others if ties(best, m, floor)]]
    within = f" by more than the {fmt_percent(floor[0])} noise floor" if floor else ""
    if len(tied) == 1:
        beyond = (f"its range (mean ± std over {len(best.rows)} runs) above every other "
                  f"configuration's{within}")
        if best.run.mode == "dist_parallel":
            return (f"dist_parallel (DDP): {fits}, and DDP was fastest: {best.name()} at "
                    f"{speed_text(best, unit)}, {beyond}.", "dist_parallel")
        if best.run.mode == "fsdp":
            return (f"fsdp (FSDP2): fastest, {best.name()} at {speed_text(best, unit)}, {beyond}, "
                    f"DDP's included, though {fits}.", "fsdp")
        if best.run.mode == "single_gpu":
            return ("single_gpu: faster than every parallel configuration here "
                    f"({speed_text(best, unit)}, {beyond}): for this model and batch the parallel "
                    "modes cost this machine more than they bring; with more GPUs or a larger "
                    "batch, dist_parallel (DDP).", "single_gpu")
        fastest = (f"data_parallel (nn.DataParallel): fastest, {best.name()} at "
                   f"{speed_text(best, unit)}, {beyond}")
        if lost:
            return f"{fastest}; {lost}, so it is not recommended.", "data_parallel"
        if ddp is None:
            return default(f"data_parallel was fastest ({speed_text(best, unit)}) but "
                           "dist_parallel was not measured beside it", ranked)
        return (f"{fastest}, dist_parallel's ({speed_text(ddp, unit)}) included: the measured "
                "cause to prefer it on this machine; DDP still scales past one node "
                "(docs/guide.md).", "data_parallel")
    modes = [m.run.mode for m in tied]
    chosen = next(mode for mode in PREFERENCE if mode in modes)
    ranges = "; ".join(f"{m.name()} {m.speed()}" for m in tied)
    noise = f" or lie within the {fmt_percent(floor[0])} noise floor" if floor else ""
    tie = (f"no difference measurable between {listed([m.name() for m in tied])}: their images/s "
           f"(mean ± std over the repeats) overlap{noise} ({ranges}), so any of them")
    if ddp is None or chosen == "dist_parallel":
        return default(tie, tied)
    return (f"{MODE_NAMES[chosen]}: {tie}; dist_parallel was slower beyond the "
            f"spread{within} ({ddp.name()} at {speed_text(ddp, unit)}), the measured cause "
            f"to prefer {chosen} here.", chosen)


def modelled_backend(run: PlannedRun) -> bool:
    """Whether a dist_parallel or fsdp run's backend is the one the projection models: on GPUs NCCL
    only, as Gloo stages every collective through host memory (even in one process); without GPUs
    Gloo, the only backend there."""
    return run.unit != "gpu" or run.backend == "nccl"


def projection_inputs(outcomes: list[Outcome], grads: list[int], bucket_cap_mb: float,
                      units=None) -> dict | None:
    """What the projection starts from: the mean single_gpu step (the first --amp's), the mean
    one-process DDP step of the modelled backend (None when not measured), the gradients' bytes and
    the bucket size; FSDP's units (projection.fsdp_units; None: no FSDP projection) and the mean
    one-process fsdp step of the modelled backend by --reshard_after_forward (those measured). None
    without a successful single_gpu run."""
    timed = [o for o in outcomes if o.status == "ok" and o.row["step_time_mean_s"] is not None]
    single = [o.row for o in timed if o.run.mode == "single_gpu"]
    if not single:
        return None
    amp = single[0]["amp"]
    one = lambda mode: [o for o in timed if o.run.mode == mode  # noqa: E731
                        and o.run.gpus == 1 and o.row["amp"] == amp and not o.run.sync_bn
                        and modelled_backend(o.run)]
    ddp1 = [o.row["step_time_mean_s"] for o in one("dist_parallel")]
    fsdp1 = {reshard: statistics.fmean(steps) for reshard in (True, False)
             if (steps := [o.row["step_time_mean_s"] for o in one("fsdp")
                           if o.run.reshard_after_forward == reshard])}
    return {"amp": amp, "batch": single[0]["per_gpu_batch"], "grads": grads,
            "bucket_cap_mb": bucket_cap_mb,
            "step_s": statistics.fmean(r["step_time_mean_s"] for r in single if r["amp"] == amp),
            "ddp1_step_s": statistics.fmean(ddp1) if ddp1 else None, "units": units,
            "fsdp1_step_s": fsdp1}


def fabric_of_runs(outcomes: list[Outcome], topology: str | None) -> str | None:
    """The fabric under the measured DDP and FSDP runs: of the GPUs the runs with the
    most GPUs used (the first N visible), not of every GPU in the node. None when
    unknown (see environment.fabric)."""
    counts = [o.run.gpus for o in outcomes if o.status == "ok" and o.run.mode in GROUP_MODES
              and o.run.unit == "gpu" and modelled_backend(o.run)]
    return machine.fabric(topology, max(counts)) if counts else None


def projection_section(outcomes: list[Outcome], inputs: dict | None, cuda: bool,
                       fabric_name: str | None) -> list[str]:
    """projection.md's scaling: DDP's projected efficiency by fabric and GPU count, FSDP's beside it
    (with the units in `inputs`), and the NCCL runs measured here beside their projection. Only from
    a GPU's step: without GPUs, what it would need and the method in brief."""
    if not cuda:
        return cpu_projection(inputs)
    if inputs is None:
        return ["No single_gpu run timed a step, so there is no step time to project from."]
    amp, batch, grads, bucket_cap_mb = (inputs["amp"], inputs["batch"], inputs["grads"],
                                        inputs["bucket_cap_mb"])
    step, ddp1 = inputs["step_s"], inputs["ddp1_step_s"]
    ddp_step = ddp1 or step
    lines = [
        "**A projection, not a measurement.** DDP's scaling efficiency past this machine, from the "
        f"measured single_gpu step ({step * 1000:.1f} ms for {batch} images, `--amp {amp}`), the "
        f"model's {fmt_bytes(sum(grads), 1000)} of gradients in DDP's buckets (1 MiB, then "
        f"{bucket_cap_mb:g} MiB) and a ring all-reduce cost model that lets each bucket's "
        "all-reduce overlap the rest of backward. Each GPU keeps the single-GPU batch (weak "
        "scaling). "
        + ("DDP's own overhead comes from the measured one-process dist_parallel step "
           f"({ddp_step * 1000:.1f} ms). " if ddp1 else
           "DDP's own one-process overhead was not measured (add `--gpu_counts 1 ...`"
           + (" with the nccl backend" if cuda else "") + " to include it). ")
        + f"An allowance of {SYNC_ALLOWANCE:.1%} of the step for keeping ranks in lock-step is "
        "fitted to PyTorch's published DDP benchmark; the model is checked against its ResNet-50 "
        "result on 8 V100s (93 %, NVLink). The model is in `comparison/projection.py`.",
        "",
    ]
    lines += ["| fabric | assumed bus bandwidth | "
              + " | ".join(f"{n} GPUs" for n in PROJECTED_GPU_COUNTS) + " |",
              "|---|---|" + "---|" * len(PROJECTED_GPU_COUNTS)]
    for fabric in FABRICS:
        cells = [f"{projected_efficiency(step, ddp_step, grads, n, fabric, bucket_cap_mb):.0%}"
                 if n in fabric.gpu_counts else "—" for n in PROJECTED_GPU_COUNTS]
        lines.append(f"| {fabric.name}: {fabric.setup} | {fabric.bus_bandwidth_gbs:g} GB/s | "
                     + " | ".join(cells) + " |")
    lines += ["", "Bus bandwidths assumed (nccl-tests' `busbw` of an all-reduce, large messages):"]
    lines += [f"- {fabric.name}: {fabric.source}" for fabric in FABRICS]
    if inputs.get("units"):
        lines += ["", *fsdp_projection(inputs, cuda)]
    measured = [o for o in outcomes if o.status == "ok" and o.run.mode in GROUP_MODES
                and o.run.gpus > 1 and o.row["amp"] == amp
                and o.row["scaling_efficiency"] is not None and modelled_backend(o.run)
                and (o.run.mode == "dist_parallel" or inputs.get("units"))]
    if measured and cuda:
        fabric = next(f for f in FABRICS if f.name == (fabric_name or "PCIe"))
        known = (f"its fabric ({fabric.name})" if fabric_name
                 else "PCIe, as `nvidia-smi topo -m` could not be matched to the GPUs used, so "
                      "their fabric is not known")
        lines += ["", f"The NCCL runs measured on this machine beside the projection for {known}:",
                  "", "| run | GPUs | per-GPU batch | measured efficiency | projected |",
                  "|---|---|---|---|---|"]
        for o in measured:
            if o.run.mode == "fsdp":
                reshard = o.run.reshard_after_forward
                projected = fsdp_projected_efficiency(step,
                                                      inputs["fsdp1_step_s"].get(reshard, step),
                                                      inputs["units"], o.run.gpus, fabric, reshard)
            else:
                projected = projected_efficiency(step, ddp_step, grads, o.run.gpus, fabric,
                                                 bucket_cap_mb)
            lines.append(f"| {o.run.name} | {o.run.gpus} | {o.row['per_gpu_batch']} | "
                         f"{o.row['scaling_efficiency']:.0%} | {projected:.0%} |")
        if any(o.row["per_gpu_batch"] != batch for o in measured):
            lines += ["", f"The projection keeps {batch} images per GPU; runs whose per-GPU batch "
                          "is smaller do less work per step for the same communication, so they "
                          "fall below it. Compare like with like with `--batch_per_gpu`."]
    return lines


def cpu_projection(inputs: dict | None) -> list[str]:
    """In place of the scaling projection without GPUs: that it needs a GPU's
    step time, and how it is made."""
    step = (f" ({inputs['step_s'] * 1000:.1f} ms here for {inputs['batch']} images, with "
            f"{fmt_bytes(sum(inputs['grads']), 1000)} of gradients for DDP to all-reduce)" if inputs
            else "")
    return [
        "**No scaling projection: it needs a GPU's step time, and no GPU ran here.** A CPU "
        "process's step" + step + " is many times a GPU's: against it, the communication would "
        "weigh next to nothing on any fabric, and every cell of the projection would read much the "
        "same, figures that say nothing about GPUs. Run compare.py on a GPU for them.",
        "",
        "The method, in brief: from the measured single_gpu step, DDP's gradients in their buckets "
        "and FSDP's per-block gathers and reduce-scatters go through a ring-collective cost model "
        "(NVLink, PCIe and InfiniBand, at bus bandwidths published for each) in which "
        "communication overlaps backward and only what it does not hide adds to the step, plus an "
        "allowance for keeping ranks in lock-step fitted to PyTorch's published DDP benchmark; the "
        "efficiency at N GPUs is the single-GPU step over the projected one. "
        "`comparison/projection.py` has the model, its assumptions and its sources.",
    ]


FSDP_SETTINGS = (("reshard", True), ("no reshard", False))  # --reshard_after_forward on, off


def fsdp_projection(inputs: dict, cuda: bool) -> list[str]:
    """FSDP's traffic beside DDP's, and FSDP's projected scaling efficiency
    (projection.fsdp_exposed's model)."""
    units, step, fsdp1 = inputs["units"], inputs["step_s"], inputs["fsdp1_step_s"]
    param_bytes, grad_bytes = sum(u.param_bytes for u in units), sum(inputs["grads"])
    measured = ", ".join(f"{fsdp1[r] * 1000:.1f} ms {name}" for name, r in FSDP_SETTINGS
                         if r in fsdp1)
    most_sent = bytes_sent_per_gpu(param_bytes, grad_bytes, PROJECTED_GPU_COUNTS[-1], "fsdp", True)
    unit, size = byte_unit(most_sent, 1000)  # one unit for the table, the one its largest cell fits
    lines = [
        "**FSDP, projected the same way.** FSDP's units ("
        + (f"the model's {len(units) - 1} repeated blocks, as `models.repeated_blocks` finds them, "
           "and the root: what no block holds, stem, final norm, classifier" if len(units) > 1 else
           "one, the whole model: `models.repeated_blocks` finds nothing repeated in it")
        + ") all-gather their parameters before their forward, one unit ahead of the compute, "
        "again before their backward when they reshard after forward, and reduce-scatter their "
        "gradients as their backward ends, all in fp32 (the runs use autocast, not FSDP's "
        "MixedPrecisionPolicy); each unit computes its share of the model's FLOPs, and only what "
        "the compute does not hide adds to the step. A ring's latency grows with N and is paid per "
        "collective: FSDP issues two or three per unit where DDP issues one per bucket. "
        + (f"FSDP's own overhead comes from the measured one-process fsdp step ({measured}); a "
           "setting not measured takes the single_gpu step. " if measured else
           "FSDP's own one-process overhead was not measured (add fsdp to `--modes` "
           "with `--gpu_counts 1 ...`"
           + (" and the nccl backend" if cuda else "") + " to include it). ")
        + f"The lock-step allowance is DDP's {SYNC_ALLOWANCE:.1%}, fitted to DDP, not to FSDP.",
        "",
        f"What each GPU sends per step, in {unit} (P: the parameters' "
        f"{fmt_bytes(param_bytes, 1000)}; G: the gradients', as many):",
        "",
        "| collectives (ring) | " + " | ".join(f"{n} GPUs" for n in PROJECTED_GPU_COUNTS) + " |",
        "|---|" + "---|" * len(PROJECTED_GPU_COUNTS),
    ]
    traffic = [("DDP: all-reduce of the gradients, 2(N−1)/N × G", "dist_parallel", True),
               ("FSDP, reshard: all-gather in forward and in backward, reduce-scatter, "
                "(N−1)/N × (2P + G)", "fsdp", True),
               ("FSDP, no reshard: all-gather in forward, reduce-scatter, (N−1)/N × (P + G)",
                "fsdp", False)]
    for name, mode, reshard in traffic:
        cells = [f"{bytes_sent_per_gpu(param_bytes, grad_bytes, n, mode, reshard) / size:,.1f}"
                 for n in PROJECTED_GPU_COUNTS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "FSDP's projected scaling efficiency:", "",
              "| fabric | FSDP | " + " | ".join(f"{n} GPUs" for n in PROJECTED_GPU_COUNTS) + " |",
              "|---|---|" + "---|" * len(PROJECTED_GPU_COUNTS)]
    for fabric in FABRICS:
        for name, reshard in FSDP_SETTINGS:
            one = fsdp1.get(reshard, step)  # the measured one-process fsdp step, else single_gpu's
            cells = [f"{fsdp_projected_efficiency(step, one, units, n, fabric, reshard):.0%}"
                     if n in fabric.gpu_counts else "—" for n in PROJECTED_GPU_COUNTS]
            lines.append(f"| {fabric.name} | {name} | " + " | ".join(cells) + " |")
    return lines


GIB = 1024**3
MEMORY_SETTINGS = (("DDP", "dist_parallel", True), ("FSDP, reshard", "fsdp", True),
                   ("FSDP, no reshard", "fsdp", False))


UNIT_NAMES = {1024: ("B", "KiB", "MiB", "GiB", "TiB"), 1000: ("B", "kB", "MB", "GB", "TB")}
# a model whose state takes less of the GPU than this in every setting says nothing: left out
TRIVIAL_SHARE = 0.01
# past this, a model of the family is no model anyone trains: no crossover is stated
REALISTIC_PARAMETERS = 100e9


def byte_unit(nbytes: float, base: int = 1024) -> tuple[str, float]:
    """The unit (and its size in bytes) in which `nbytes` reads from 1 to 999: B to TiB, or B to TB
    with `base` 1000 (traffic, as bandwidths are given)."""
    names = UNIT_NAMES[base]
    power = 0
    while power + 1 < len(names) and nbytes >= 999.5 * base**power:
        power += 1
    return names[power], base**power


def fmt_bytes(nbytes: float, base: int = 1024) -> str:
    """Bytes in the unit that fits them, three figures or so: '355 KiB',
    '1.3 MiB', '80.0 GiB', '121 kB'."""
    unit, size = byte_unit(nbytes, base)
    value = nbytes / size
    if unit == "B" or value >= 99.95:
        return f"{value:,.0f} {unit}"
    return f"{value:,.1f} {unit}"


def fmt_count(count: float) -> str:
    """A count in three figures with K, M or B (thousands, millions,
    billions): '30.3K', '1.02M', '7.16B'."""
    for suffix, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        value = count / size
        if value >= 0.9995:
            digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
            return f"{value:,.{digits}f}{suffix}"
    return f"{count:,.0f}"


def memory_section(memory: dict, outcomes: list[Outcome], gpu: str | None) -> list[str]:
    """The memory projection (projection.memory_projection) as a table per model and setting by GPU
    count (the models whose state takes under TRIVIAL_SHARE of the GPU in every setting left out),
    where FSDP lets a model fit that DDP cannot, and the activations it leaves out as far as a run
    measured them. `gpu`: the GPUs' name, None without GPUs (the capacity is then assumed)."""
    capacity, amp, momentum = memory["gpu_bytes"], memory["amp"], memory["momentum"]
    total = lambda size, n, mode, reshard: sum(  # noqa: E731
        memory_per_gpu(size, n, mode, reshard, amp, momentum).values())
    against = (f"{fmt_bytes(capacity)} ({gpu})" if not memory["assumed"] else
               f"{fmt_bytes(capacity)}, an H100 80GB's, assumed: no GPU here")
    half = amp in AUTOCAST
    largest = {size: max(total(size, n, mode, reshard) for _, mode, reshard in MEMORY_SETTINGS
                         for n in MEMORY_GPU_COUNTS) for size in memory["models"]}
    shown = [size for size in memory["models"] if largest[size] >= TRIVIAL_SHARE * capacity]
    models = ("the runs' depth and block at their α and wider, each built on the meta device"
              if memory["sweep"] else f"the runs' model, {model_name(memory)}, built on the "
                                      "meta device; no wider models: only PyramidNet has a "
                                      "width (α) to sweep here")
    lines = [
        f"**A projection, not a measurement: arithmetic on parameter counts** ({models}). Per GPU: "
        "the fp32 parameters, gradients and "
        + ("SGD momentum" if momentum else "no momentum (`--momentum 0`)") + ", replicated by DDP, "
        "a 1/N shard each under FSDP, which also holds what it gathers: the root's parameters "
        "(what no repeated block holds: stem, final norm, classifier) and, resharding after "
        "forward, two blocks' (the one computing, the next prefetched) and the computing block's "
        "gradients before their reduce-scatter; without, every parameter from forward to backward. "
        + (f"Under {amp} autocast every mode also keeps a 2-byte copy of every convolution, linear "
           "and attention weight from forward to backward (autograd saves the casts; FSDP frees "
           "its gathered fp32 parameters, not these), unsharded. " if half else "")
        + "**Activations are left out**: they do not shard under FSDP, grow with the per-GPU "
        "batch, and are usually most of a CNN's memory, so a model state that fits is necessary, "
        "not sufficient. "
        + (f"✗: more than the GPU's memory, here {against}. " if shown
           else f"Against a GPU of {against}. ")
        + "The model is in `comparison/projection.py`.",
        "",
        *trivial_line(memory, shown, total, capacity),
    ]
    if shown:
        lines += ["| model | parameters | per GPU | "
                  + " | ".join(f"{n} GPU{'s' * (n > 1)}" for n in MEMORY_GPU_COUNTS) + " |",
                  "|---|---|---|" + "---|" * len(MEMORY_GPU_COUNTS)]
    else:
        lines.pop()  # the blank line the table would have followed
    for size in shown:
        for first, (name, mode, reshard) in enumerate(MEMORY_SETTINGS):
            label = size_label(memory, size) if first == 0 else ""
            cells = [fmt_bytes(b) + (" ✗" if b > capacity else "")
                     for b in (total(size, n, mode, reshard) for n in MEMORY_GPU_COUNTS)]
            lines.append(f"| {label} | "
                         f"{fmt_count(size.parameters) if first == 0 else ''} | {name} | "
                         + " | ".join(cells) + " |")
    # without a table or a width sweep, trivial_line has said it
    fits = fit_lines(memory, total, half) if shown or memory["sweep"] else []
    lines += [*(["", *fits] if fits else []), "", activation_line(memory, outcomes, total)]
    return lines


# each setting of the memory table as a sentence names it
SETTING_NAMES = {("dist_parallel", True): "DDP", ("fsdp", True): "FSDP resharding after forward",
                 ("fsdp", False): "FSDP without resharding"}


def trivial_line(memory: dict, shown: list, total, capacity: float) -> list[str]:
    """What the models left out of the memory table (their state under TRIVIAL_SHARE of the GPU)
    come to, each figure named for what it counts: the runs' model under DDP on one GPU (the
    figure report.md's recommendation weighs, fits_text), and the most any of them needs in any
    setting, with the model, setting and GPU count that need it."""
    left_out = [size for size in memory["models"] if size not in shown]
    if not left_out:
        return []
    runs_alpha = memory["models"][0].alpha
    names = [(f"α={size.alpha:g}" if memory["sweep"] else memory["name"])
             + f" ({fmt_count(size.parameters)} parameters"
             + (", the runs'" if size.alpha == runs_alpha else f", ×{size.alpha / runs_alpha:g}")
             + ")"
             for size in (left_out[0], left_out[-1])]
    many = len(left_out) > 1
    models = (f"The models from {names[0]} to {names[1]} need" if many
              else f"The model {names[0]} needs")
    needs = [(total(size, n, mode, reshard), size, mode, reshard, n) for size in left_out
             for _, mode, reshard in MEMORY_SETTINGS for n in MEMORY_GPU_COUNTS]
    most, size, mode, reshard, gpus = max(needs, key=lambda need: need[0])
    where = ((f"α={size.alpha:g} under " if many else "") + SETTING_NAMES[mode, reshard]
             + f" on {gpus} GPU{'s' * (gpus > 1)}"
             + (", which holds what it gathers beside its shard" if mode == "fsdp" else ""))
    them = "them" if many else "it"
    lines = []
    if memory["models"][0] in left_out:
        runs = memory["models"][0]
        model = f"α={runs_alpha:g}" if memory["sweep"] else memory["name"]
        lines.append(f"The runs' model, {model} ({fmt_count(runs.parameters)} parameters), needs "
                     f"{fmt_bytes(total(runs, 1, 'dist_parallel', True))} per GPU under DDP "
                     f"({STATE_PARTS}): the figure report.md's recommendation weighs.")
    text = (f"{models} at most {fmt_bytes(most)} per GPU in any setting, DDP or FSDP on 1 to "
            f"{MEMORY_GPU_COUNTS[-1]} GPUs ({where}), under {TRIVIAL_SHARE * 100:g} % of the GPU's "
            f"{fmt_bytes(capacity)}: memory is no reason to shard {them}")
    lines.append(text + (f", and the table leaves {them} out." if shown
                         else f", so there is no table of {them}."))
    return [" ".join(lines), ""]


def fit_lines(memory: dict, total, half: bool) -> list[str]:
    """Where FSDP lets a model fit that DDP cannot, and how wide a model FSDP holds on
    the most GPUs projected; past REALISTIC_PARAMETERS, only that DDP fits every model
    of the family up to that size."""
    crossover, runs_alpha, most = (memory["crossover"], memory["models"][0].alpha,
                                   MEMORY_GPU_COUNTS[-1])
    capacity = fmt_bytes(memory["gpu_bytes"])
    if not memory["sweep"]:
        return [runs_fit_line(memory, total)]
    if crossover is None:
        return ["No width of this model up to α=2²⁴ outgrows one GPU under DDP."]
    if crossover.parameters > REALISTIC_PARAMETERS:
        return [f"DDP's model state fits one GPU's {capacity} for any model of this family up to "
                f"{fmt_count(REALISTIC_PARAMETERS)} parameters: memory is no reason to shard it."]

    def on(reshard: bool) -> str:
        n, how = memory["fsdp_gpus"][reshard], "resharding" if reshard else "without resharding"
        return (f"on {n} GPUs {how} ({fmt_bytes(total(crossover, n, 'fsdp', reshard))} each)" if n
                else f"on none of up to {most} GPUs {how}")

    def wide(size) -> str:
        """A model of the projection: its width, as a multiple of the runs'
        where wider, and its parameters."""
        times = size.alpha / runs_alpha
        factor = f", {times:,.{1 if times < 10 else 0}f}× the runs' α" if times >= 2 else ""
        return f"α={size.alpha:g} ({fmt_count(size.parameters)} parameters{factor})"

    runs = f", the runs' α={runs_alpha:g} among them" if crossover.alpha <= runs_alpha else ""
    text = (f"**Where FSDP lets a model fit that DDP cannot:** from {wide(crossover)}{runs} "
            f"DDP's model state outgrows one GPU's {capacity}; FSDP holds that model "
            f"{on(True)}, and {on(False)}.")
    limits = [f"{wide(size)} {name}" for name, size in (("resharding", memory["fsdp_limit"][True]),
                                                         ("without resharding",
                                                          memory["fsdp_limit"][False]))
              if size and size.parameters <= REALISTIC_PARAMETERS]
    if limits:
        unsharded = "the gathered parameters" + (" and autocast's 2-byte copies" if half else "")
        text += (f" On {most} GPUs FSDP holds models up to " + ", and ".join(limits)
                 + f": beyond, what it does not shard ({unsharded}) alone outgrows the GPU.")
    return [text]


def model_name(memory: dict) -> str:
    """The runs' model as the memory projection names it (compare.py gives it its title)."""
    return memory.get("name", "the runs' model")


def size_label(memory: dict, size) -> str:
    """A model's cell in the memory table: its α (and how much wider than the
    runs'), or the runs' model's name."""
    if not memory["sweep"]:
        return f"{model_name(memory)} (the runs')"
    factor = size.alpha / memory["models"][0].alpha
    return f"α={size.alpha:g} " + ("(the runs')" if factor == 1 else f"(×{factor:g})")


def runs_fit_line(memory: dict, total) -> str:
    """Without a width sweep: whether DDP holds the runs' model state on one GPU, and else on how
    many GPUs FSDP does."""
    size, capacity = memory["models"][0], fmt_bytes(memory["gpu_bytes"])
    ddp = total(size, 1, "dist_parallel", True)
    model = f"{model_name(memory)} ({fmt_count(size.parameters)} parameters)"
    if ddp <= memory["gpu_bytes"]:
        return (f"DDP holds the model state of {model} on one GPU: {fmt_bytes(ddp)} of its "
                f"{capacity}, the rest left to the activations.")
    fewest = memory["runs_fsdp_gpus"]
    on = [f"on {fewest[reshard]} GPUs {how} "
          f"({fmt_bytes(total(size, fewest[reshard], 'fsdp', reshard))} each)"
          for reshard, how in ((True, "resharding"), (False, "without resharding"))
          if fewest[reshard]]
    fsdp = ("FSDP holds it " + " and ".join(on) if on else
            f"FSDP does not hold it on up to {MEMORY_GPU_COUNTS[-1]} GPUs either")
    return (f"**Where FSDP lets a model fit that DDP cannot:** DDP's model state of {model} takes "
            f"{fmt_bytes(ddp)} per GPU, more than one GPU's {capacity}; {fsdp}.")


def activation_line(memory: dict, outcomes: list[Outcome], total) -> str:
    """The activations the projection leaves out, as single_gpu's measured peak
    memory shows them (GPUs only)."""
    peaks = [(float(o.row["peak_mem_gb_per_gpu"].split()[0]) * GIB, o.row["per_gpu_batch"])
             for o in outcomes
             if o.status == "ok" and o.run.mode == "single_gpu" and o.row.get("peak_mem_gb_per_gpu")
             and o.row["amp"] == memory["amp"]]
    if not peaks:
        return ("The activations left out would be estimated from single_gpu's measured peak "
                "memory, which only a run on a GPU has: not here.")
    peak, batch = statistics.fmean(p for p, _ in peaks), peaks[0][1]
    state = total(memory["models"][0], 1, "dist_parallel", True)
    return (f"single_gpu's measured peak, {fmt_bytes(peak)} at {batch} images per GPU, is "
            f"{fmt_bytes(peak - state)} above its model state ({fmt_bytes(state)}): activations "
            "and workspace, which the projection leaves out. They are the same under DDP and FSDP "
            "at the same per-GPU batch"
            + (", and grow about as the widths (α) for a wider model." if memory["sweep"] else "."))


def environment_section(env: dict, topology: str | None) -> list[str]:
    lines = [f"- GPUs: {gpu_summary(env) or 'none'}",
             f"- driver {env.get('driver') or '—'}, CUDA {env.get('cuda') or '—'}, cuDNN "
             f"{env.get('cudnn') or '—'}, NCCL {env.get('nccl') or '—'}, torch {env.get('torch')}, "
             f"Python {env.get('python')}",
             f"- CPU: {env.get('cpu')}, {env.get('cpu_count')} cores; host {env.get('hostname')}",
             ""]
    if topology:
        lines += ["`nvidia-smi topo -m` (NV# = # bonded NVLinks; PIX/PXB/PHB/NODE/SYS = PCIe "
                  "paths, slowest last):", "", "```", topology.rstrip(), "```"]
    else:
        lines.append("`nvidia-smi topo -m`: not available on this machine (no NVIDIA driver).")
    return lines


def fmt_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f} s"


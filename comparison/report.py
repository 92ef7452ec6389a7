"""From the runs' results.json files to the comparison: one CSV row per run, and report.md with one table row per
configuration (mean ± std over repeats), the failed runs, the projection and the environment."""
from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from comparison import environment as machine
from comparison.environment import gpu_summary
from comparison.matrix import Run
from comparison.projection import FABRICS, PROJECTED_GPU_COUNTS, SYNC_ALLOWANCE, projected_efficiency

CIFAR10_TRAIN_IMAGES = 50_000


@dataclass
class Outcome:
    run: Run
    status: str                    # ok, failed, not run
    seconds: float = 0.0
    error: str | None = None
    results: dict | None = None
    log: Path | None = None
    row: dict = field(default_factory=dict)


COLUMNS = ("run", "mode", "gpus", "backend", "amp", "sync_bn", "repeat", "status", "error", "global_batch",
           "per_gpu_batch", "batch_time_p50_s", "batch_time_p90_s", "epoch_time_50k_s", "images_per_sec",
           "images_per_sec_per_gpu", "speedup", "scaling_efficiency", "data_wait_frac", "gpu_util_mean",
           "peak_mem_gb_per_gpu", "mfu", "test_acc", "train_loss", "wall_time_s", "log")


def fill_rows(outcomes: list[Outcome], out: Path) -> None:
    """Each outcome's CSV row: the results.json figures as they are, plus what is derived from them."""
    for o in outcomes:
        r, res = o.run, o.results or {}
        summary, config = res.get("summary", {}), res.get("config", {})
        ips = summary.get("images_per_sec")
        memory = res.get("peak_mem_gb_per_gpu") or {}
        o.row = {
            "run": r.name, "mode": r.mode, "gpus": r.gpus, "backend": r.backend or "", "amp": config.get("amp", r.amp),
            "sync_bn": r.sync_bn, "repeat": r.repeat, "status": o.status, "error": o.error or "",
            "global_batch": config.get("batch_size"),
            "per_gpu_batch": config["batch_size"] // r.gpus if config else None,
            "batch_time_p50_s": summary.get("batch_time_p50"), "batch_time_p90_s": summary.get("batch_time_p90"),
            "epoch_time_50k_s": CIFAR10_TRAIN_IMAGES / ips if ips else None,
            "images_per_sec": ips, "images_per_sec_per_gpu": ips / r.gpus if ips else None,
            "speedup": None, "scaling_efficiency": None,
            "data_wait_frac": summary.get("data_wait_frac"), "gpu_util_mean": summary.get("gpu_util_mean"),
            "peak_mem_gb_per_gpu": " ".join(f"{memory[k]:.3f}" for k in sorted(memory, key=int)) or None,
            "mfu": summary.get("mfu"), "test_acc": summary.get("test_acc"), "train_loss": summary.get("train_loss"),
            "wall_time_s": summary.get("wall_time_s"), "log": str(o.log.relative_to(out)) if o.log else "",
        }
    for o in outcomes:  # speedup against single_gpu with the same --amp
        base = baseline(outcomes, o.row["amp"])
        if base and o.row["images_per_sec"]:
            o.row["speedup"] = o.row["images_per_sec"] / base
            o.row["scaling_efficiency"] = o.row["speedup"] / o.run.gpus


def baseline(outcomes: list[Outcome], amp) -> float | None:
    """Mean images/s of the successful single_gpu runs with this --amp."""
    values = [o.row["images_per_sec"] for o in outcomes
              if o.run.mode == "single_gpu" and o.row["amp"] == amp and o.row["images_per_sec"]]
    return statistics.fmean(values) if values else None


def write_csv(outcomes: list[Outcome], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for o in outcomes:
            writer.writerow({k: "" if o.row[k] is None else o.row[k] for k in COLUMNS})


# --- report.md ---------------------------------------------------------------------------------------------------

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


TABLE_HEADER = ("| mode | GPUs | backend | amp | global batch | per-GPU batch | batch time (ms) | epoch of 50k (s) | "
                "images/s | speedup | scaling efficiency | data wait | GPU util | peak mem GB per GPU | MFU | "
                "test acc | runs |")


def table_row(group: list[Outcome]) -> str:
    run, ok = group[0].run, [o.row for o in group if o.status == "ok"]
    col = lambda key: [r[key] for r in ok]  # noqa: E731
    memory = ok[0]["peak_mem_gb_per_gpu"] if ok else None
    memory = " / ".join(f"{float(v):.2f}" for v in memory.split()) if memory else "—"
    backend = (run.backend or "") + (" + SyncBN" if run.sync_bn else "")
    amp = (ok[0]["amp"] if ok else group[0].row["amp"]) or "default"
    failed = len(group) - len(ok)
    runs = f"{len(ok)} ok" + (f", **{failed} failed**" if failed else "")
    cells = [run.mode, str(run.gpus), backend or "—", amp, str(group[0].row["global_batch"] or "—"),
             str(group[0].row["per_gpu_batch"] or "—"), spread(col("batch_time_p50_s"), 1, 1000),
             spread(col("epoch_time_50k_s"), 1), spread(col("images_per_sec"), 0), spread(col("speedup"), 2, unit="×"),
             spread(col("scaling_efficiency"), 0, 100, " %"), spread(col("data_wait_frac"), 1, 100, " %"),
             spread(col("gpu_util_mean"), 0, 1, " %"), memory, spread(col("mfu"), 1, 100, " %"),
             spread(col("test_acc"), 2, 100, " %"), runs]
    return "| " + " | ".join(cells) + " |"


def failures(outcomes: list[Outcome]) -> list[str]:
    failed = [o for o in outcomes if o.status != "ok"]
    if not failed:
        return ["Every run succeeded."]
    lines = [f"**{len(failed)} of {len(outcomes)} runs did not succeed:**", ""]
    for o in failed:
        log = f" (log: `{o.row['log']}`)" if o.row.get("log") else ""
        lines.append(f"- `{o.run.name}`: {o.status} after {o.seconds:.1f} s — {o.error}{log}")
    return lines


READING = """\
**How to read it.** *images/s* is global: every GPU's images per second, summed, timed on the GPU's clock after
the warm-up steps. *speedup* is images/s over single_gpu's with the same `--amp`; *scaling efficiency* is speedup
divided by the GPUs used — 100 % means each added GPU brought a whole GPU's worth of throughput. *MFU* (model FLOPs
utilisation) is the model's FLOPs per second over the GPU's dense peak for the dtype in use: how much of the chip
the training actually uses. *GPU util* is NVML's "a kernel was running" share of time: a GPU running one small
kernel at a time, or waiting inside an all-reduce, reads 99 % while doing little, so high utilisation is not
efficiency — MFU and images/s are. *peak mem* lists each GPU in order: DataParallel's first GPU holds more (it
gathers the outputs and computes the loss). *data wait* is the share of a step spent waiting for the next batch.
Every row trains the same model with the same seed; with `--batch_size` the global batch is the same in every row
(each GPU's share shrinks as GPUs are added), with `--batch_per_gpu` each GPU keeps its batch."""


def modelled_backend(run: Run) -> bool:
    """Whether a dist_parallel run's backend is the one the projection models: on GPUs NCCL only, as Gloo stages
    every bucket through host memory (even in one process); without GPUs Gloo, the only backend there."""
    return run.unit != "gpu" or run.backend == "nccl"


def projection_inputs(outcomes: list[Outcome], grads: list[int], bucket_cap_mb: float) -> dict | None:
    """What the projection starts from: the mean single_gpu step (the first --amp's), the mean one-process DDP step
    of the modelled backend (None when not measured), the gradients' bytes and the bucket size. None without a
    successful single_gpu run."""
    single = [o.row for o in outcomes if o.status == "ok" and o.run.mode == "single_gpu"]
    if not single:
        return None
    amp = single[0]["amp"]
    ddp1 = [o.row["batch_time_p50_s"] for o in outcomes if o.status == "ok" and o.run.mode == "dist_parallel"
            and o.run.gpus == 1 and o.row["amp"] == amp and not o.run.sync_bn and modelled_backend(o.run)]
    return {"amp": amp, "batch": single[0]["per_gpu_batch"], "grads": grads, "bucket_cap_mb": bucket_cap_mb,
            "step_s": statistics.fmean(r["batch_time_p50_s"] for r in single if r["amp"] == amp),
            "ddp1_step_s": statistics.fmean(ddp1) if ddp1 else None}


def fabric_of_runs(outcomes: list[Outcome], topology: str | None) -> str | None:
    """The fabric under the measured DDP runs: of the GPUs the runs with the most GPUs used (the first N visible),
    not of every GPU in the node. None when unknown (see environment.fabric)."""
    counts = [o.run.gpus for o in outcomes if o.status == "ok" and o.run.mode == "dist_parallel"
              and o.run.unit == "gpu" and modelled_backend(o.run)]
    return machine.fabric(topology, max(counts)) if counts else None


def projection_section(outcomes: list[Outcome], inputs: dict | None, cuda: bool, fabric_name: str | None) -> list[str]:
    if inputs is None:
        return ["No single_gpu run succeeded, so there is no step time to project from."]
    amp, batch, grads, bucket_cap_mb = inputs["amp"], inputs["batch"], inputs["grads"], inputs["bucket_cap_mb"]
    step, ddp1 = inputs["step_s"], inputs["ddp1_step_s"]
    ddp_step = ddp1 or step
    gradient_mb = sum(grads) / 1e6
    lines = [
        "**A projection, not a measurement.** DDP's scaling efficiency past this machine, from the measured "
        f"single_gpu step ({step * 1000:.1f} ms for {batch} images, `--amp {amp}`), the model's {gradient_mb:.1f} MB "
        f"of gradients in DDP's buckets (1 MiB, then {bucket_cap_mb:g} MiB) and a ring all-reduce cost model that "
        "lets each bucket's all-reduce overlap the rest of backward. Each GPU keeps the single-GPU batch (weak "
        "scaling). "
        + ("DDP's own overhead comes from the measured one-process dist_parallel step "
           f"({ddp_step * 1000:.1f} ms). " if ddp1 else
           "DDP's own one-process overhead was not measured (add `--gpu_counts 1 ...`"
           + (" with the nccl backend" if cuda else "") + " to include it). ")
        + f"An allowance of {SYNC_ALLOWANCE:.1%} of the step for keeping ranks in lock-step is fitted to "
        "PyTorch's published DDP benchmark; the model is checked against its ResNet-50 result on 8 V100s "
        "(93 %, NVLink). The model is in `comparison/projection.py`.",
        "",
    ]
    if not cuda:
        lines += ["Measured on the CPU: a GPU's step is far shorter, so communication weighs far more there. This "
                  "table shows the method; run compare.py on GPUs for figures that mean something.", ""]
    lines += ["| fabric | assumed bus bandwidth | " + " | ".join(f"{n} GPUs" for n in PROJECTED_GPU_COUNTS) + " |",
              "|---|---|" + "---|" * len(PROJECTED_GPU_COUNTS)]
    for fabric in FABRICS:
        cells = [f"{projected_efficiency(step, ddp_step, grads, n, fabric, bucket_cap_mb):.0%}"
                 if n in fabric.gpu_counts else "—" for n in PROJECTED_GPU_COUNTS]
        lines.append(f"| {fabric.name}: {fabric.setup} | {fabric.bus_bandwidth_gbs:g} GB/s | "
                     + " | ".join(cells) + " |")
    lines += ["", "Bus bandwidths assumed (nccl-tests' `busbw` of an all-reduce, large messages):"]
    lines += [f"- {fabric.name}: {fabric.source}" for fabric in FABRICS]
    measured = [o for o in outcomes if o.status == "ok" and o.run.mode == "dist_parallel" and o.run.gpus > 1
                and o.row["amp"] == amp and o.row["scaling_efficiency"] is not None and modelled_backend(o.run)]
    if measured and cuda:
        fabric = next(f for f in FABRICS if f.name == (fabric_name or "PCIe"))
        known = (f"its fabric ({fabric.name})" if fabric_name else "PCIe, as `nvidia-smi topo -m` could not be "
                 "matched to the GPUs used, so their fabric is not known")
        lines += ["", f"The NCCL runs measured on this machine beside the projection for {known}:", "",
                  "| run | GPUs | per-GPU batch | measured efficiency | projected |", "|---|---|---|---|---|"]
        for o in measured:
            projected = projected_efficiency(step, ddp_step, grads, o.run.gpus, fabric, bucket_cap_mb)
            lines.append(f"| {o.run.name} | {o.run.gpus} | {o.row['per_gpu_batch']} | "
                         f"{o.row['scaling_efficiency']:.0%} | {projected:.0%} |")
        if any(o.row["per_gpu_batch"] != batch for o in measured):
            lines += ["", f"The projection keeps {batch} images per GPU; runs whose per-GPU batch is smaller do "
                          "less work per step for the same communication, so they fall below it. Compare like with "
                          "like with `--batch_per_gpu`."]
    return lines


def environment_section(env: dict, topology: str | None) -> list[str]:
    lines = [f"- GPUs: {gpu_summary(env) or 'none'}",
             f"- driver {env.get('driver') or '—'}, CUDA {env.get('cuda') or '—'}, "
             f"cuDNN {env.get('cudnn') or '—'}, NCCL {env.get('nccl') or '—'}, torch {env.get('torch')}, "
             f"Python {env.get('python')}",
             f"- CPU: {env.get('cpu')}, {env.get('cpu_count')} cores; host {env.get('hostname')}", ""]
    if topology:
        lines += ["`nvidia-smi topo -m` (NV# = # bonded NVLinks; PIX/PXB/PHB/NODE/SYS = PCIe paths, slowest last):",
                  "", "```", topology.rstrip(), "```"]
    else:
        lines.append("`nvidia-smi topo -m`: not available on this machine (no NVIDIA driver).")
    return lines


def fmt_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f} s"


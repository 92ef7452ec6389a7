"""From the runs' results.json files to the comparison: one CSV row per run, and report.md with one table row per
configuration (mean ± std over repeats), the failed runs, the projections (scaling, memory) and the environment."""
from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from common.logger import write_atomically
from comparison import environment as machine
from comparison.environment import gpu_summary
from comparison.matrix import GROUP_MODES, PlannedRun
from comparison.projection import (AUTOCAST, FABRICS, MEMORY_GPU_COUNTS, PROJECTED_GPU_COUNTS, SYNC_ALLOWANCE,
                                   bytes_sent_per_gpu, fsdp_projected_efficiency, memory_per_gpu,
                                   projected_efficiency)

CIFAR10_TRAIN_IMAGES = 50_000


@dataclass
class Outcome:
    run: PlannedRun
    status: str                    # ok, failed, interrupted (compare.py stopped), not run
    seconds: float = 0.0
    error: str | None = None
    results: dict | None = None
    log: Path | None = None
    row: dict = field(default_factory=dict)


COLUMNS = ("run", "mode", "gpus", "backend", "amp", "sync_bn", "reshard_after_forward", "repeat", "status", "error",
           "global_batch", "per_gpu_batch", "batch_time_p50_s", "batch_time_p90_s", "epoch_time_50k_s",
           "images_per_sec", "images_per_sec_per_gpu", "speedup", "scaling_efficiency", "data_wait_frac",
           "gpu_util_mean", "peak_mem_gb_per_gpu", "mfu", "test_acc", "train_loss", "wall_time_s", "log")


def fill_rows(outcomes: list[Outcome], out: Path) -> None:
    """Each outcome's CSV row: the results.json figures as they are, plus what is derived from them."""
    for o in outcomes:
        r, res = o.run, o.results or {}
        summary, config = res.get("summary", {}), res.get("config", {})
        ips = summary.get("images_per_sec")
        memory = res.get("peak_mem_gb_per_gpu") or {}
        o.row = {
            "run": r.name, "mode": r.mode, "gpus": r.gpus, "backend": r.backend or "", "amp": config.get("amp", r.amp),
            "sync_bn": r.sync_bn, "reshard_after_forward": r.reshard_after_forward, "repeat": r.repeat,
            "status": o.status, "error": o.error or "",
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
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    for o in outcomes:
        writer.writerow({k: "" if o.row[k] is None else o.row[k] for k in COLUMNS})
    write_file(path, text.getvalue().encode())


def write_file(path: Path, data: bytes) -> None:
    """`data` into `path`, whole or not at all (common.logger.write_atomically): an earlier file stays as it was
    whatever stops the write (a full disk, a signal, a crash), and an OSError names the file."""
    write_atomically(path, lambda f: f.write(data))


# The pictures compare.py may draw (comparison/plots.py draws those it has figures for)
PICTURES = ("images_per_sec.png", "scaling_efficiency.png", "step_time.png", "memory_per_gpu.png")


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


# what each --amp runs as: every mode casts under torch.autocast (fsdp too, not FSDP's MixedPrecisionPolicy)
AMP_CELLS = {"bf16": "bf16 autocast", "fp16": "fp16 autocast + GradScaler", "off": "off"}
RESHARD_CELLS = {True: ", reshard", False: ", no reshard", None: ""}  # fsdp's --reshard_after_forward


def table_row(group: list[Outcome]) -> str:
    run, ok = group[0].run, [o.row for o in group if o.status == "ok"]
    col = lambda key: [r[key] for r in ok]  # noqa: E731
    memory = ok[0]["peak_mem_gb_per_gpu"] if ok else None
    memory = " / ".join(f"{float(v):.2f}" for v in memory.split()) if memory else "—"
    backend = (run.backend or "") + (" + SyncBN" if run.sync_bn else "") + RESHARD_CELLS[run.reshard_after_forward]
    amp = (ok[0]["amp"] if ok else group[0].row["amp"]) or "default"
    amp = AMP_CELLS.get(amp, amp)
    untimed = [row for row in ok if row["images_per_sec"] is None]
    runs = f"{len(ok)} ok" + (", no timed steps" if untimed and len(untimed) == len(ok) else
                              f", {len(untimed)} without timed steps" if untimed else "")
    for status in ("failed", "interrupted", "not run"):
        count = sum(o.status == status for o in group)
        runs += f", **{count} {status}**" if count else ""
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
        after = f" after {o.seconds:.1f} s" if o.status != "not run" else ""
        lines.append(f"- `{o.run.name}`: {o.status}{after} — {o.error}{log}")
    return lines


def untimed_note(outcomes: list[Outcome], warmup_steps: int) -> list[str]:
    """What a row of runs without timed steps means and what to do about it; nothing when every run
    timed steps."""
    if not any(o.status == "ok" and o.row["images_per_sec"] is None for o in outcomes):
        return []
    return [f"*no timed steps*: the run succeeded but ended within its {warmup_steps} warm-up "
            f"steps (`--warmup_steps`), which are not timed, so it measured no speed. Give it more "
            f"steps (more `--epochs`, a larger `--synthetic_size`) or fewer `--warmup_steps`.", ""]


READING = """\
**How to read it.** *images/s* is global: every GPU's images per second, summed, timed on the GPU's clock after
the warm-up steps. *speedup* is images/s over single_gpu's with the same `--amp`; *scaling efficiency* is speedup
divided by the GPUs used — 100 % means each added GPU brought a whole GPU's worth of throughput. *MFU* (model FLOPs
utilisation) is the model's FLOPs per second over the GPU's dense peak for the dtype in use: how much of the chip
the training actually uses. *GPU util* is NVML's "a kernel was running" share of time: a GPU running one small
kernel at a time, or waiting inside an all-reduce, reads 99 % while doing little, so high utilisation is not
efficiency — MFU and images/s are. *peak mem* lists each GPU in order: DataParallel's first GPU holds more (it
gathers the outputs and computes the loss); fsdp's GPUs each hold a slice of the weights, gradients and momentum.
*amp* says how the run computed: every mode casts under torch.autocast (fsdp too, so it gathers and reduces fp32),
`off` is fp32. An fsdp row's *backend* says whether it reshards after forward (frees each block's gathered
parameters and gathers them again in backward, ZeRO-3-like) or not (keeps them to backward, ZeRO-2-like).
*data wait* is the share of a step spent waiting for the next batch.
Every row trains the same model with the same seed; with `--batch_size` the global batch is the same in every row
(each GPU's share shrinks as GPUs are added), with `--batch_per_gpu` each GPU keeps its batch."""


def modelled_backend(run: PlannedRun) -> bool:
    """Whether a dist_parallel or fsdp run's backend is the one the projection models: on GPUs NCCL only, as Gloo
    stages every collective through host memory (even in one process); without GPUs Gloo, the only backend there."""
    return run.unit != "gpu" or run.backend == "nccl"


def projection_inputs(outcomes: list[Outcome], grads: list[int], bucket_cap_mb: float, units=None) -> dict | None:
    """What the projection starts from: the mean single_gpu step (the first --amp's), the mean one-process DDP step
    of the modelled backend (None when not measured), the gradients' bytes and the bucket size; FSDP's units
    (projection.fsdp_units; None: no FSDP projection) and the mean one-process fsdp step of the modelled backend by
    --reshard_after_forward (those measured). None without a successful single_gpu run."""
    timed = [o for o in outcomes if o.status == "ok" and o.row["batch_time_p50_s"] is not None]
    single = [o.row for o in timed if o.run.mode == "single_gpu"]
    if not single:
        return None
    amp = single[0]["amp"]
    one = lambda mode: [o for o in timed if o.run.mode == mode  # noqa: E731
                        and o.run.gpus == 1 and o.row["amp"] == amp and not o.run.sync_bn and modelled_backend(o.run)]
    ddp1 = [o.row["batch_time_p50_s"] for o in one("dist_parallel")]
    fsdp1 = {reshard: statistics.fmean(steps) for reshard in (True, False)
             if (steps := [o.row["batch_time_p50_s"] for o in one("fsdp") if o.run.reshard_after_forward == reshard])}
    return {"amp": amp, "batch": single[0]["per_gpu_batch"], "grads": grads, "bucket_cap_mb": bucket_cap_mb,
            "step_s": statistics.fmean(r["batch_time_p50_s"] for r in single if r["amp"] == amp),
            "ddp1_step_s": statistics.fmean(ddp1) if ddp1 else None, "units": units, "fsdp1_step_s": fsdp1}


def fabric_of_runs(outcomes: list[Outcome], topology: str | None) -> str | None:
    """The fabric under the measured DDP and FSDP runs: of the GPUs the runs with the most GPUs used (the first N
    visible), not of every GPU in the node. None when unknown (see environment.fabric)."""
    counts = [o.run.gpus for o in outcomes if o.status == "ok" and o.run.mode in GROUP_MODES
              and o.run.unit == "gpu" and modelled_backend(o.run)]
    return machine.fabric(topology, max(counts)) if counts else None


def projection_section(outcomes: list[Outcome], inputs: dict | None, cuda: bool, fabric_name: str | None) -> list[str]:
    if inputs is None:
        return ["No single_gpu run timed a step, so there is no step time to project from."]
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
    if inputs.get("units"):
        lines += ["", *fsdp_projection(inputs, cuda)]
    measured = [o for o in outcomes if o.status == "ok" and o.run.mode in GROUP_MODES
                and o.run.gpus > 1 and o.row["amp"] == amp and o.row["scaling_efficiency"] is not None
                and modelled_backend(o.run) and (o.run.mode == "dist_parallel" or inputs.get("units"))]
    if measured and cuda:
        fabric = next(f for f in FABRICS if f.name == (fabric_name or "PCIe"))
        known = (f"its fabric ({fabric.name})" if fabric_name else "PCIe, as `nvidia-smi topo -m` could not be "
                 "matched to the GPUs used, so their fabric is not known")
        lines += ["", f"The NCCL runs measured on this machine beside the projection for {known}:", "",
                  "| run | GPUs | per-GPU batch | measured efficiency | projected |", "|---|---|---|---|---|"]
        for o in measured:
            if o.run.mode == "fsdp":
                reshard = o.run.reshard_after_forward
                projected = fsdp_projected_efficiency(step, inputs["fsdp1_step_s"].get(reshard, step),
                                                      inputs["units"], o.run.gpus, fabric, reshard)
            else:
                projected = projected_efficiency(step, ddp_step, grads, o.run.gpus, fabric, bucket_cap_mb)
            lines.append(f"| {o.run.name} | {o.run.gpus} | {o.row['per_gpu_batch']} | "
                         f"{o.row['scaling_efficiency']:.0%} | {projected:.0%} |")
        if any(o.row["per_gpu_batch"] != batch for o in measured):
            lines += ["", f"The projection keeps {batch} images per GPU; runs whose per-GPU batch is smaller do "
                          "less work per step for the same communication, so they fall below it. Compare like with "
                          "like with `--batch_per_gpu`."]
    return lines


FSDP_SETTINGS = (("reshard", True), ("no reshard", False))  # --reshard_after_forward on, off


def fsdp_projection(inputs: dict, cuda: bool) -> list[str]:
    """FSDP's traffic beside DDP's, and FSDP's projected scaling efficiency (projection.fsdp_exposed's model)."""
    units, step, fsdp1 = inputs["units"], inputs["step_s"], inputs["fsdp1_step_s"]
    param_bytes, grad_bytes = sum(u.param_bytes for u in units), sum(inputs["grads"])
    measured = ", ".join(f"{fsdp1[r] * 1000:.1f} ms {name}" for name, r in FSDP_SETTINGS if r in fsdp1)
    lines = [
        "**FSDP, projected the same way.** FSDP's units (the model's "
        f"{len(units) - 1} residual blocks and the root: stem, final BatchNorm, classifier) all-gather their "
        "parameters before their forward, one unit ahead of the compute, again before their backward when they "
        "reshard after forward, and reduce-scatter their gradients as their backward ends, all in fp32 (the runs "
        "use autocast, not FSDP's MixedPrecisionPolicy); each unit computes its share of the model's FLOPs, and "
        "only what the compute does not hide adds to the step. A ring's latency grows with N and is paid per "
        "collective: FSDP issues two or three per unit where DDP issues one per bucket. "
        + (f"FSDP's own overhead comes from the measured one-process fsdp step ({measured}); a setting not "
           "measured takes the single_gpu step. " if measured else
           "FSDP's own one-process overhead was not measured (add fsdp to `--modes` with `--gpu_counts 1 ...`"
           + (" and the nccl backend" if cuda else "") + " to include it). ")
        + f"The lock-step allowance is DDP's {SYNC_ALLOWANCE:.1%}, fitted to DDP, not to FSDP.",
        "",
        f"What each GPU sends per step, in MB (P: the parameters' {param_bytes / 1e6:.1f} MB; G: the gradients', "
        "as many):",
        "",
        "| collectives (ring) | " + " | ".join(f"{n} GPUs" for n in PROJECTED_GPU_COUNTS) + " |",
        "|---|" + "---|" * len(PROJECTED_GPU_COUNTS),
    ]
    traffic = [("DDP: all-reduce of the gradients, 2(N−1)/N × G", "dist_parallel", True),
               ("FSDP, reshard: all-gather in forward and in backward, reduce-scatter, (N−1)/N × (2P + G)", "fsdp",
                True),
               ("FSDP, no reshard: all-gather in forward, reduce-scatter, (N−1)/N × (P + G)", "fsdp", False)]
    for name, mode, reshard in traffic:
        cells = [f"{bytes_sent_per_gpu(param_bytes, grad_bytes, n, mode, reshard) / 1e6:,.1f}"
                 for n in PROJECTED_GPU_COUNTS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "FSDP's projected scaling efficiency:", "",
              "| fabric | FSDP | " + " | ".join(f"{n} GPUs" for n in PROJECTED_GPU_COUNTS) + " |",
              "|---|---|" + "---|" * len(PROJECTED_GPU_COUNTS)]
    for fabric in FABRICS:
        for name, reshard in FSDP_SETTINGS:
            cells = [f"{fsdp_projected_efficiency(step, fsdp1.get(reshard, step), units, n, fabric, reshard):.0%}"
                     if n in fabric.gpu_counts else "—" for n in PROJECTED_GPU_COUNTS]
            lines.append(f"| {fabric.name} | {name} | " + " | ".join(cells) + " |")
    return lines


GIB = 1024**3
MEMORY_SETTINGS = (("DDP", "dist_parallel", True), ("FSDP, reshard", "fsdp", True), ("FSDP, no reshard", "fsdp", False))


def fmt_bytes(nbytes: float) -> str:
    """Bytes in GiB, MiB or KiB, three figures or so."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= size or unit == "KiB":
            value = nbytes / size
            return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def memory_section(memory: dict, outcomes: list[Outcome], gpu: str | None) -> list[str]:
    """The memory projection (projection.memory_projection) as a table per model and setting by GPU count, where
    FSDP lets a model fit that DDP cannot, and the activations the table leaves out as far as a run measured them.
    `gpu`: the GPUs' name, None without GPUs (the capacity is then assumed)."""
    capacity, amp, momentum = memory["gpu_bytes"], memory["amp"], memory["momentum"]
    total = lambda size, n, mode, reshard: sum(  # noqa: E731
        memory_per_gpu(size, n, mode, reshard, amp, momentum).values())
    against = (f"{fmt_bytes(capacity)} ({gpu})" if not memory["assumed"] else
               f"{fmt_bytes(capacity)}, an H100 80GB's, assumed: no GPU here")
    half = amp in AUTOCAST
    lines = [
        "### Memory per GPU: what fits",
        "",
        "**A projection, not a measurement: arithmetic on parameter counts** (the runs' depth and block at their α "
        "and wider, each built on the meta device). Per GPU: the fp32 parameters, gradients and "
        + ("SGD momentum" if momentum else "no momentum (`--momentum 0`)") + ", replicated by DDP, a 1/N shard "
        "each under FSDP, which also holds what it gathers: the root's parameters (stem, final BatchNorm, "
        "classifier) and, resharding after forward, two blocks' (the one computing, the next prefetched) and the "
        "computing block's gradients before their reduce-scatter; without, every parameter from forward to "
        "backward. "
        + (f"Under {amp} autocast every mode also keeps a 2-byte copy of every convolution and classifier weight "
           "from forward to backward (autograd saves the casts; FSDP frees its gathered fp32 parameters, not "
           "these), unsharded. " if half else "")
        + "**Activations are left out**: they do not shard under FSDP, grow with the per-GPU batch, and are "
        "usually most of a CNN's memory, so a model state that fits is necessary, not sufficient. "
        f"✗: more than the GPU's memory, here {against}. The model is in `comparison/projection.py`.",
        "",
        "| model | parameters | per GPU | " + " | ".join(f"{n} GPU{'s' * (n > 1)}" for n in MEMORY_GPU_COUNTS)
        + " |",
        "|---|---|---|" + "---|" * len(MEMORY_GPU_COUNTS),
    ]
    for size in memory["models"]:
        factor = size.alpha / memory["models"][0].alpha
        for first, (name, mode, reshard) in enumerate(MEMORY_SETTINGS):
            label = f"α={size.alpha:g} " + ("(the runs')" if factor == 1 else f"(×{factor:g})") if first == 0 else ""
            cells = [fmt_bytes(b) + (" ✗" if b > capacity else "")
                     for b in (total(size, n, mode, reshard) for n in MEMORY_GPU_COUNTS)]
            lines.append(f"| {label} | {f'{size.parameters:,}' if first == 0 else ''} | {name} | "
                         + " | ".join(cells) + " |")
    lines += ["", *fit_lines(memory, total, half), "", activation_line(memory, outcomes, total)]
    return lines


def fit_lines(memory: dict, total, half: bool) -> list[str]:
    """Where FSDP lets a model fit that DDP cannot, and how wide a model FSDP holds on the most GPUs projected."""
    crossover, runs_alpha, most = memory["crossover"], memory["models"][0].alpha, MEMORY_GPU_COUNTS[-1]
    if crossover is None:
        return ["No width of this model up to α=2²⁴ outgrows one GPU under DDP."]

    def on(reshard: bool) -> str:
        n, how = memory["fsdp_gpus"][reshard], "resharding" if reshard else "without resharding"
        return (f"on {n} GPUs {how} ({fmt_bytes(total(crossover, n, 'fsdp', reshard))} each)" if n else
                f"on none of up to {most} GPUs {how}")

    runs = f", the runs' α={runs_alpha:g} among them" if crossover.alpha <= runs_alpha else ""
    text = (f"**Where FSDP lets a model fit that DDP cannot:** from α={crossover.alpha:g} ({crossover.parameters:,} "
            f"parameters{runs}) DDP's model state outgrows one GPU's {fmt_bytes(memory['gpu_bytes'])}; FSDP holds "
            f"that model {on(True)}, and {on(False)}.")
    limits = [f"α={size.alpha:g} ({size.parameters:,} parameters) {name}"
              for name, size in (("resharding", memory["fsdp_limit"][True]),
                                 ("without resharding", memory["fsdp_limit"][False])) if size]
    if limits:
        unsharded = "the gathered parameters" + (" and autocast's 2-byte copies" if half else "")
        text += (f" On {most} GPUs FSDP holds models up to " + ", and ".join(limits)
                 + f": beyond, what it does not shard ({unsharded}) alone outgrows the GPU.")
    return [text]


def activation_line(memory: dict, outcomes: list[Outcome], total) -> str:
    """The activations the table leaves out, as single_gpu's measured peak memory shows them (GPUs only)."""
    peaks = [(float(o.row["peak_mem_gb_per_gpu"].split()[0]) * GIB, o.row["per_gpu_batch"]) for o in outcomes
             if o.status == "ok" and o.run.mode == "single_gpu" and o.row.get("peak_mem_gb_per_gpu")
             and o.row["amp"] == memory["amp"]]
    if not peaks:
        return ("The activations the table leaves out would be estimated from single_gpu's measured peak memory, "
                "which only a run on a GPU has: not here.")
    peak, batch = statistics.fmean(p for p, _ in peaks), peaks[0][1]
    state = total(memory["models"][0], 1, "dist_parallel", True)
    return (f"single_gpu's measured peak, {fmt_bytes(peak)} at {batch} images per GPU, is {fmt_bytes(peak - state)} "
            f"above its model state ({fmt_bytes(state)}): activations and workspace, which the table leaves out. "
            "They are the same under DDP and FSDP at the same per-GPU batch, and grow about as the widths (α) for a "
            "wider model.")


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


"""projection.md's "Scaling past this machine": what the projection starts from
(`projection_inputs`: the measured steps, the gradients, FSDP's units), DDP's and FSDP's projected
scaling efficiency by fabric and GPU count, the NCCL runs measured here beside their projection,
and without GPUs why there is none. The cost model itself is comparison/projection.py."""
from __future__ import annotations

import statistics

from comparison import environment as machine
from comparison.matrix import PlannedRun
from comparison.train_files import DATA_GROUP_MODES
from comparison.projection import (FABRICS, PROJECTED_GPU_COUNTS, SYNC_ALLOWANCE,
                                   bytes_sent_per_gpu, fsdp_projected_efficiency,
                                   projected_efficiency)
from comparison.report.formatting import byte_unit, fmt_bytes
from comparison.report.outcome import Outcome


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
    counts = [o.run.gpus for o in outcomes if o.status == "ok" and o.run.mode in DATA_GROUP_MODES
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
    measured = [o for o in outcomes if o.status == "ok" and o.run.mode in DATA_GROUP_MODES
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

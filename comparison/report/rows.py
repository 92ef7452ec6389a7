"""Each run's row: results.csv's columns (`COLUMNS`), filled from its run folder (`fill_rows`:
results.json's figures as they are, plus the mean step, the epoch, the speedup over single_gpu's
images/s (`baseline`) and the step's split from its ranks' traces, averaged over the ranks,
`split_row`), and results.csv written from them. The table, the sentences and the pictures all
read these rows."""
from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

from comparison.breakdown import run_breakdown
from comparison.report.files import write_file
from comparison.report.model import model_title, train_images
from comparison.report.outcome import Outcome


# the parts a step splits into (comparison/breakdown.py's): they add up to the profiled step
SPLIT_PARTS = ("compute_ms", "comm_exposed_ms", "bubble_ms", "data_ms", "optimizer_ms",
               "other_ms")
SPLIT_KEYS = ("step_ms", *SPLIT_PARTS, "comm_ms")
SPLIT_COLUMNS = ("ranks", *(f"split_{key}" for key in SPLIT_KEYS), "split_comm_hidden_ms",
                 "split_work_ms_per_rank", "split_slowest_rank", "split_bubble_share")
COLUMNS = ("run", "mode", "gpus", "backend", "amp", "sync_bn", "reshard_after_forward", "repeat",
           "status", "error", "global_batch", "per_gpu_batch", "step_time_mean_s",
           "batch_time_p50_s", "batch_time_p90_s", "train_images", "epoch_time_s",
           "images_per_sec",
           "images_per_sec_per_gpu", "speedup", "scaling_efficiency", "data_wait_frac",
           "gpu_util_mean", "peak_mem_gb_per_gpu", "peak_mem_reserved_gb_per_gpu", "mfu",
           "test_acc", "train_loss", "model", "parameters", "flops_per_image", "wall_time_s",
           "run_time_s", "profiled_steps", "stages", "microbatches", "schedule",
           "bubble_share_theory", *SPLIT_COLUMNS, "log")


def fill_rows(outcomes: list[Outcome], out: Path) -> None:
    """Each outcome's CSV row: the results.json figures as they are, plus what is derived from
    them: the mean step (global batch ÷ images/s, which is the mean of the timed steps), the epoch
    of the run's own training set at that step, speedup (over single_gpu's images/s: baseline)
    and scaling efficiency (speedup ÷ GPUs, one GPU's too), the run's time start to end as
    compare.py timed it, and the step's split from the traces in its run folder, averaged over the
    ranks (split_row). Peak memory: results.json's {GPU or rank: [allocated, reserved]} in GB."""
    for o in outcomes:
        if o.split is None and o.status == "ok":
            o.split = run_breakdown(o.run_dir)
        r, res = o.run, o.results or {}
        summary, config = res.get("summary", {}), res.get("config", {})
        ips = summary.get("images_per_sec")
        batch = config.get("batch_size")
        images = train_images(config) if config else None
        peaks = res.get("peak_mem_gb_per_gpu") or {}
        memory = {gpu: pair[0] for gpu, pair in peaks.items()}
        reserved = {gpu: pair[1] for gpu, pair in peaks.items()}
        o.row = {
            "run": r.name, "mode": r.mode, "gpus": r.gpus, "backend": r.backend or "",
            "amp": config.get("amp", r.amp), "sync_bn": r.sync_bn,
            "reshard_after_forward": r.reshard_after_forward, "repeat": r.repeat,
            "status": o.status, "error": o.error or "", "global_batch": config.get("batch_size"),
            # a pipeline's stages each take every image of their replica's share
            "per_gpu_batch": config["batch_size"] // (res.get("replicas") or r.gpus)
                             if config else None,
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
            "profiled_steps": config.get("profile_steps"),
            # pipeline_parallel's: its stages, micro-batches, schedule, (S-1)/(M+S-1)
            "stages": len(res["stages"]) if isinstance(res.get("stages"), list) else None,
            "microbatches": config.get("microbatches"), "schedule": config.get("schedule"),
            "bubble_share_theory": res.get("bubble_fraction"),
            **split_row(o.split),
            "log": str(o.log.relative_to(out)) if o.log else "",
        }
    for o in outcomes:  # speedup against single_gpu with the same --amp
        base = baseline(outcomes, o.row["amp"])
        if base and o.row["images_per_sec"]:
            o.row["speedup"] = o.row["images_per_sec"] / base
            # on one GPU too: data_parallel at 1.36× one GPU's speed is 136 % efficient
            o.row["scaling_efficiency"] = o.row["speedup"] / o.run.gpus


def split_row(breakdown: dict | None) -> dict:
    """A run's step split for its CSV row (SPLIT_COLUMNS), from its ranks' splits
    ({rank: {step_ms, compute_ms, ...}}, breakdown.run_breakdown): each part averaged over the
    ranks, the communication hidden behind compute (comm_ms less comm_exposed_ms), each rank's work
    (its step less its exposed communication and bubble: the time it was not waiting for the
    others) and the slowest rank, the one with the most work; and the bubble's share of the
    schedule (the step less its data wait and optimizer, which no schedule overlaps) on the rank
    where it is least: a pipeline's busiest stage, whose share (S-1)/(M+S-1) predicts (a lighter
    stage also waits for it). All None where the run left no trace (profiling off), or a split
    that lacks a part."""
    ranks = sorted(breakdown, key=int) if isinstance(breakdown, dict) else []
    whole = lambda split: isinstance(split, dict) and all(  # noqa: E731
        isinstance(split.get(key), (int, float)) for key in SPLIT_KEYS)
    if not ranks or not all(whole(breakdown[r]) for r in ranks):
        return dict.fromkeys(SPLIT_COLUMNS)
    mean = {key: statistics.fmean(breakdown[r][key] for r in ranks) for key in SPLIT_KEYS}
    work = {r: breakdown[r]["step_ms"] - breakdown[r]["comm_exposed_ms"]
            - breakdown[r]["bubble_ms"] for r in ranks}
    schedule = {r: breakdown[r]["step_ms"] - breakdown[r]["data_ms"] - breakdown[r]["optimizer_ms"]
                for r in ranks}
    return {"ranks": len(ranks), **{f"split_{key}": mean[key] for key in SPLIT_KEYS},
            "split_comm_hidden_ms": mean["comm_ms"] - mean["comm_exposed_ms"],
            "split_work_ms_per_rank": " ".join(f"{work[r]:.3f}" for r in ranks),
            "split_slowest_rank": int(max(ranks, key=lambda r: work[r])),
            "split_bubble_share": min(breakdown[r]["bubble_ms"] / schedule[r] if schedule[r] > 0
                                      else 0.0 for r in ranks)}


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

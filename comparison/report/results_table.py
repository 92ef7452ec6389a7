"""report.md's results table: its note (`TABLE_NOTE`), its header, each column's statistic named,
and one row per configuration (`table_row`): its speed from its Measured, the other columns each
run's own figure averaged, peak memory per GPU allocated (reserved)."""
from __future__ import annotations

import statistics

from comparison.report.formatting import spread
from comparison.report.measured import measured
from comparison.report.outcome import Outcome


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

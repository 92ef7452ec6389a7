"""projection.md's "Memory per GPU: what fits": the memory projection
(projection.memory_projection) as a table per model and setting by GPU count, where FSDP lets a
model fit that DDP cannot, the models too small to matter, and the activations the projection
leaves out as far as a run measured them. `STATE_PARTS` names the model state alike here and in
report.md's recommendation."""
from __future__ import annotations

import statistics

from comparison.projection import AUTOCAST, MEMORY_GPU_COUNTS, memory_per_gpu
from comparison.report.formatting import fmt_bytes, fmt_count
from comparison.report.outcome import Outcome


GIB = 1024**3
MEMORY_SETTINGS = (("DDP", "dist_parallel", True), ("FSDP, reshard", "fsdp", True),
                   ("FSDP, no reshard", "fsdp", False))

# a model whose state takes less of the GPU than this in every setting says nothing: left out
TRIVIAL_SHARE = 0.01
# past this, a model of the family is no model anyone trains: no crossover is stated
REALISTIC_PARAMETERS = 100e9

# what projection.md counts as the model state, named alike there and here
STATE_PARTS = "weights, gradients and optimizer state"


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

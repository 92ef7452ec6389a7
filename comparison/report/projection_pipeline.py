"""projection.md's "Pipeline: more stages and micro-batches": the pipeline model
(projection.pipeline_projection) as a table by stages and micro-batches, its bubble, its step
against one GPU's and the memory per GPU of its largest stage, beside the measured pipeline runs:
their busiest stage's bubble (results.csv's split_bubble_share) against the same formula."""
from __future__ import annotations

from comparison.projection import PipelinePoint
from comparison.report.formatting import fmt_bytes
from comparison.report.outcome import Outcome
from comparison.report.projection_memory import TRIVIAL_SHARE


def pipeline_section(points: list[PipelinePoint], whole_state: float, capacity: float,
                     outcomes: list[Outcome]) -> list[str]:
    """The table of `points` (each measured (S, M) marked), the model state DDP keeps on every GPU
    (`whole_state`) to hold the stages' against, and the measured runs' bubbles. A model state
    that takes under TRIVIAL_SHARE of a GPU of `capacity` bytes gets no column: it says nothing."""
    if not points:
        return ["No pipeline projection: the pipeline cuts PyramidNet into its stem, blocks and "
                "head (or a Sequential of yours, in pipeline_parallel/train.py), and this model "
                "is neither."]
    runs = [o for o in outcomes if o.status == "ok" and o.run.mode == "pipeline_parallel"
            and o.row and o.row.get("stages")]
    measured = {(int(o.row["stages"]), int(o.row["microbatches"])): o for o in runs}
    state = whole_state >= TRIVIAL_SHARE * capacity  # a column of its own, or a sliver of a GPU
    memory = (f"The model state per GPU is the stage with the most parameters' (weights, "
              f"gradients and momentum), against {fmt_bytes(whole_state)} for the whole model on "
              "every GPU under DDP: a cut by FLOPs gives PyramidNet's last stage its widest "
              "blocks." if state else "The model state is a sliver of one GPU in every setting "
              "(above), so the table has no column for it.")
    lines = [
        "The model cut by FLOPs into S stages, a GPU each, each step's batch in M micro-batches "
        "(`pipeline_parallel/train.py`): each stage idles (S − 1)/(M + S − 1) of the step while "
        "the pipeline fills and drains, and the costliest stage sets the pace. The step against "
        "one GPU's is that stage's share of the FLOPs × (M + S − 1)/M; the transfers between "
        "stages and each micro-batch's smaller kernels are left out: a bound a measured pipeline "
        f"falls short of. {memory} Activations: GPipe holds all M micro-batches' from forward to "
        "backward, 1F1B at most S on its first stage.",
        "",
        "| stages S | micro-batches M | bubble (S−1)/(M+S−1) | costliest stage, share of the "
        "FLOPs | step ÷ one GPU's (projected) |" + " model state per GPU, largest stage |" * state
        + " micro-batches of activations held, GPipe / 1F1B | measured here |",
        "|---|---|---|---|---|" + "---|" * state + "---|---|",
    ]
    for point in points:
        run = measured.get((point.stages, point.microbatches))
        cells = [str(point.stages), str(point.microbatches), f"{100 * point.bubble:.1f} %",
                 f"{100 * point.costliest_share:.1f} %", f"{point.step_vs_one_gpu:.2f}×",
                 *([fmt_bytes(point.state_bytes)] if state else []),
                 f"{point.held_microbatches['gpipe']} / {point.held_microbatches['1f1b']}",
                 measured_cell(run) if run else ""]
        lines.append("| " + " | ".join(cells) + " |")
    shown = {(p.stages, p.microbatches) for p in points}
    lines += [f"- {o.run.name} ran {o.row['stages']} stages and {o.row['microbatches']} "
              "micro-batches, outside the table." for (s, m), o in measured.items()
              if (s, m) not in shown]
    return lines


def measured_cell(run: Outcome) -> str:
    """A measured pipeline run beside its (S, M): its busiest stage's bubble, and its step against
    single_gpu's (1 ÷ its speedup), where the comparison has them."""
    said = [run.run.name]
    if run.row.get("split_bubble_share") is not None:
        said.append(f"busiest stage's bubble {100 * run.row['split_bubble_share']:.1f} %")
    if run.row.get("speedup"):
        said.append(f"step ÷ single_gpu's {1 / run.row['speedup']:.2f}×")
    return ", ".join(said)

"""A roofline of one training step of the model, from its layer shapes: what the GPU could do at best.

Every operator of the forward pass, the loss and the backward pass is recorded once on the meta device (shapes
only: no memory, no compute) with its FLOPs (torch.utils.flop_counter's formulas: convolutions and matrix
products) and the fewest bytes it must move: each input read once and each output written once, at the dtype the
step computes in. Its time is bounded by the GPU's peak FLOP/s or its memory bandwidth, whichever takes longer;
then the SGD update (parameter, gradient and momentum in fp32). Two bounds follow:

- operator by operator: every operator's bound added up, as an eager step runs them (one kernel each);
- ideal fusion: only the convolutions, the classifier and the update, as if every BatchNorm, ReLU, addition and
  shortcut ran inside the convolutions' prologues and epilogues, moving no bytes of their own.

A measured step is then "x % of the roofline": the bound's time over the measured time.
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from common.performance import by_gpu_name

# Memory bandwidth in TB/s, from each GPU's datasheet, matched by name as GPU_PEAK_TFLOPS is (whole words).
GPU_BANDWIDTH_TBS = {
    "H100 PCIe": 2.0, "H100 NVL": 3.9, "H100": 3.35,  # SXM5 80 GB HBM3
    "H200 NVL": 4.8, "H200": 4.8, "GH200": 4.0,  # GH200 480GB: 96 GB HBM3
    "A100": 2.039,  # SXM4 80 GB (the 40 GB parts: 1.555)
    "L40S": 0.864, "RTX 4090": 1.008, "RTX 3090": 0.936,
}
CATEGORIES = {  # by operator name, first match
    "convolution": re.compile(r"convolution"),
    "batchnorm": re.compile(r"batch_norm"),
    "classifier": re.compile(r"\b(addmm|mm)\b"),
    "elementwise": re.compile(r"relu|threshold|add|mul|pad|avg_pool|mean|sum|div|copy|fill|where|sub|clone"),
}
FUSED = ("convolution", "classifier", "update")  # what an ideal fusion still runs on its own


@dataclasses.dataclass
class Op:
    name: str
    category: str
    flops: int
    bytes: int


class _Recorder(TorchDispatchMode):
    """Every operator dispatched while active, with its FLOPs and the bytes of its inputs and outputs. Views move
    nothing; an in-place operator writes the tensor it read, counted once as written."""

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # a view
        packet = func.overloadpacket
        flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
        read = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        written = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        in_place = {id(t) for t in written}
        moved = sum(t.numel() * t.element_size() for t in read if id(t) not in in_place)
        moved += sum(t.numel() * t.element_size() for t in written)
        name = packet.__name__
        category = next((kind for kind, pattern in CATEGORIES.items() if pattern.search(name)), "other")
        self.ops.append(Op(name, category, int(flops), int(moved)))
        return out


def step_ops(model: torch.nn.Module, batch: int, image_shape: tuple[int, int, int], classes: int,
             dtype: torch.dtype = torch.bfloat16) -> list[Op]:
    """The operators of one training step of `model` (built on the meta device) at `batch` images in `dtype`,
    then the SGD update of its parameters in fp32 (read parameter, gradient and momentum; write parameter and
    momentum: nesterov's extra read of the momentum stays in cache)."""
    model = model.to(device="meta", dtype=dtype)
    images = torch.empty(batch, *image_shape, device="meta", dtype=dtype)
    labels = torch.zeros(batch, dtype=torch.int64, device="meta")
    recorder = _Recorder()
    with recorder:
        F.cross_entropy(model(images), labels).backward()
    parameters = sum(p.numel() for p in model.parameters())
    return [*recorder.ops, Op("sgd", "update", 2 * parameters, 5 * 4 * parameters)]


def roofline(ops: list[Op], batch: int, peak_tflops: float, bandwidth_tbs: float) -> dict:
    """The two bounds of a step of `ops` on a GPU of `peak_tflops` and `bandwidth_tbs`, as seconds per step and
    images/s, with each category's bound and FLOPs and bytes."""
    def seconds(op: Op) -> float:
        return max(op.flops / (peak_tflops * 1e12), op.bytes / (bandwidth_tbs * 1e12))

    categories = {}
    for op in ops:
        entry = categories.setdefault(op.category, {"seconds": 0.0, "flops": 0, "bytes": 0})
        entry["seconds"] += seconds(op)
        entry["flops"] += op.flops
        entry["bytes"] += op.bytes
    eager = sum(seconds(op) for op in ops)
    fused = sum(seconds(op) for op in ops if op.category in FUSED)
    return {"batch": batch, "peak_tflops": peak_tflops, "bandwidth_tbs": bandwidth_tbs,
            "flops": sum(op.flops for op in ops), "bytes": sum(op.bytes for op in ops),
            "op_by_op_s": eager, "op_by_op_images_per_sec": batch / eager,
            "fused_s": fused, "fused_images_per_sec": batch / fused, "categories": categories}


def bandwidth_tbs(name: str) -> float | None:
    """The memory bandwidth of the GPU called `name`, or None when it is not in the table."""
    return by_gpu_name(GPU_BANDWIDTH_TBS, name)


def share_of_roofline(measured_images_per_sec: float, bound: dict) -> dict:
    """The measured rate as a share of each bound: 'x % of the roofline'."""
    return {"op_by_op": measured_images_per_sec / bound["op_by_op_images_per_sec"],
            "fused": measured_images_per_sec / bound["fused_images_per_sec"]}

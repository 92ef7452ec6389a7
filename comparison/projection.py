"""Projections past the GPUs at hand: DDP's and FSDP's scaling (ring collectives overlapping the
compute), and the memory each needs per GPU for the runs' model (PyramidNet: and wider ones).

They are models, not measurements, and the report labels them so. What the DDP model assumes:

- Weak scaling: every GPU keeps the measured single-GPU batch, so the compute of a
  step stays the measured single-GPU step time. Efficiency at N GPUs = single-GPU step
  time / projected step time at N.
- DDP's own bookkeeping (hooks, bucket views) is in the measured one-process DDP step when
  the comparison has one (`dist_parallel` on 1 GPU); otherwise the single-GPU step stands
  in for it and the report says so.
- Backward is two thirds of a step's compute (a backward pass costs about twice the forward's FLOPs)
  and gradients become ready at an even rate over it, in the reverse of the parameters' registration
  order: the order DDP builds its buckets in (a first bucket of 1 MiB, then --bucket_cap_mb).
- Each bucket is all-reduced by NCCL's ring as soon as it is full, one bucket after another on one
  stream, while backward goes on. A ring all-reduce of m bytes over N GPUs takes
      latency + m * 2(N-1)/N / bus_bandwidth,   latency = 8.4 us + 2(N-1) * hop latency
  (nccl-tests' definition of bus bandwidth; NCCL's own ring/Simple latency model,
  src/graph/tuning.cc).
  Only the communication still running when backward ends adds to the step.
- What the bandwidth model leaves out (ranks waiting for the slowest one every step, NCCL
  kernels competing with backward for the GPU) is one allowance, SYNC_ALLOWANCE of the
  single-GPU step, charged from two GPUs on. It is fitted, not derived: the gap between the
  bandwidth model and PyTorch's published DDP benchmark
  (https://github.com/pytorch/pytorch/tree/main/benchmarks/distributed/ddp, 8 V100s on NVLink,
  DGX-1) for ResNet-101, ResNeXt-50 and ResNeXt-101. ResNet-50 is left out of the fit and is
  the check: the tests re-derive the allowance from those figures and compare the model with
  the measured ResNet-50 efficiency.

What the FSDP model (fsdp/train.py: FSDP2's fully_shard on every repeated block, the rule
comparison/model_shapes.py's repeated_blocks follows, PyramidNet's and ResNet's residual blocks or
ViT's encoder blocks, and on the root for the rest: stem, final norm, classifier) assumes, beside
the above (weak scaling, the same fabrics, backward two thirds of the compute, the same lock-step
allowance):

- Traffic per GPU per step, nccl-tests' bus-bandwidth definitions, P the parameters' bytes and G the
  gradients' (both fp32, the same size: the runs use autocast, not FSDP's MixedPrecisionPolicy, so
  FSDP gathers and reduces fp32): DDP's all-reduce sends 2(N-1)/N x G. FSDP all-gathers each unit's
  parameters before its forward, (N-1)/N x P, again before its backward when it reshards after
  forward (ZeRO-3-like; not with --no-reshard_after_forward, ZeRO-2-like), and reduce-scatters its
  gradients, (N-1)/N x G: 3(N-1)/N x P in all, 1.5x DDP's bytes, or 2(N-1)/N x P without resharding,
  DDP's. An all-gather or a reduce-scatter of m bytes over a ring of N GPUs takes latency + m *
  (N-1)/N / bus_bandwidth, latency = 8.4 us + (N-1) * hop latency (N-1 ring steps where the
  all-reduce takes 2(N-1)); the bus bandwidth is the fabric's all-reduce figure, taken for all three
  (nccl-tests defines bus bandwidth so that a ring's link speed reads the same in each collective).
- A unit's compute is its share of the model's FLOPs (counted per unit on the meta
  device; forward and backward in the same shares), not of its parameters: the early
  blocks are narrow but see large images.
- Forward: a unit's all-gather is issued as the unit before it starts computing (FSDP2 prefetches
  one unit ahead), and a unit computes once its parameters are gathered. Backward, in reverse unit
  order: with resharding, a unit's all-gather is issued as the unit after it starts its backward
  (FSDP2's backward prefetch), the first one as forward ends; each unit's reduce-scatter is issued
  as its backward ends. The collectives share the links and run one after another in the order
  issued. Only the communication the compute does not hide adds to the step. The root unit (a few
  kB) is taken as the first unit of forward and the last of backward, whereas FSDP2 gathers it first
  in backward; the padding of each parameter to a multiple of N is left out.
- FSDP's own work (copying into and out of the gathered buffers, its hooks) is in the
  measured one-process fsdp step when the comparison has one; otherwise the single-GPU step
  stands in for it and the report says so.
- The lock-step allowance is DDP's, fitted to DDP: no published FSDP figure for a model
  like this one was found to fit it to. FSDP's ranks meet at every unit's collectives
  rather than at the end of backward.

What the memory projection assumes (bytes per GPU of the model state, not a measurement either):

- Parameters, gradients and SGD's momentum buffer, 4 bytes each per parameter (fp32: autocast keeps
  fp32 weights, and FSDP here shards fp32). DDP replicates all three (its gradients are its buckets:
  gradient_as_bucket_view); FSDP keeps a 1/N shard of each, plus what it has gathered at its peak:
  the root's parameters throughout (its forward and its backward enclose the blocks'), and in
  backward the root's unsharded gradients; with resharding, two blocks' parameters (the one
  computing and the next, prefetched) and, in backward, the computing block's unsharded gradients
  before their reduce-scatter; without, every block's parameters from its forward to the end of its
  backward, and the computing block's gradients.
- Under autocast (bf16 or fp16) every mode also keeps, from forward to backward, a 2-byte copy of
  the weights of every convolution, linear layer and attention input projection: autograd saves
  the cast copies for backward, and FSDP's resharding frees its gathered fp32 parameters but not
  these copies. They are not sharded.
- Activations are left out: they do not shard under FSDP, they grow with the per-GPU batch,
  and for a CNN of this size they are usually most of a GPU's memory. A model state that
  fits is necessary, not sufficient.
- Wider models: PyramidNet's width (alpha) is swept, each width's model built on the meta
  device. Any other model has no such knob here: its own state is projected, for DDP and FSDP on
  1 to 64 GPUs, and nothing wider.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from collections.abc import Callable

import torch
from torch import nn

from comparison.model_shapes import repeated_blocks

FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
BACKWARD_SHARE = 2 / 3            # backward ~ 2x forward FLOPs
RING_BASE_LATENCY_US = 8.4        # NCCL src/graph/tuning.cc, baseLat, Ring/Simple
SYNC_ALLOWANCE = 0.056            # fitted, see above; re-derived by tests/test_compare.py
PROJECTED_GPU_COUNTS = (2, 4, 8, 16, 32, 64)
MEMORY_GPU_COUNTS = (1, *PROJECTED_GPU_COUNTS)
WIDER = (1, 2, 4, 8, 16)  # the memory projection's models: the runs' alpha times each
# without a GPU here, the memory projection weighs the models against an H100's
ASSUMED_GPU_BYTES = 80 * 1024**3
AUTOCAST = ("bf16", "fp16")  # --amp values that compute in 2-byte floats under torch.autocast


@dataclass(frozen=True)
class Fabric:
    name: str
    setup: str
    bus_bandwidth_gbs: float  # nccl-tests all_reduce "busbw" for large messages
    hop_latency_us: float     # NCCL's ring/Simple per-step hardware latency
    gpu_counts: tuple[int, ...]
    source: str


FABRICS = (
    Fabric("NVLink", "8 GPUs in one node on NVLink 4 + NVSwitch (H100/H200 SXM)", 370.0, 5.7,
           (2, 4, 8), "NCCL's ring reaches ~370 GB/s bus bandwidth on H100 NVLink (450 GB/s line "
                      "rate less ~20 % protocol overhead): S. Jeaugey, NVIDIA, "
                      "https://github.com/NVIDIA/nccl-tests/issues/212"),
    Fabric("PCIe", "8 GPUs in one node on PCIe Gen5 x16, no NVLink", 28.0, 5.7, (2, 4, 8),
           "8x RTX 5090 on PCIe Gen5: all_reduce bus bandwidth 28 GB/s (35 GB/s on 4), "
           "https://github.com/NVIDIA/nccl/issues/1639"),
    Fabric("InfiniBand", "8-GPU NVLink nodes, 4x HDR 200 Gb/s InfiniBand per node", 85.0, 6.6,
           (16, 32, 64), "8x A100 SXM + 4x HDR per node, 3 nodes: all_reduce bus bandwidth 84.8 "
                         "GB/s on average (96 peak; ~24 GB/s per HDR NIC), "
                         "https://github.com/NVIDIA/nccl-tests/issues/119"),
)


def ring_allreduce_seconds(nbytes: float, gpus: int, bus_bandwidth_gbs: float,
                           hop_latency_us: float, passes: int = 2) -> float:
    """NCCL ring all-reduce of `nbytes` over `gpus` ranks: latency plus the bytes each rank sends
    at bus speed. `passes` 1: an all-gather or a reduce-scatter, whose `nbytes` is the whole
    (gathered, or reduced) buffer."""
    if gpus < 2:
        return 0.0
    steps = passes * (gpus - 1)
    latency = (RING_BASE_LATENCY_US + steps * hop_latency_us) * 1e-6
    return latency + nbytes * steps / gpus / (bus_bandwidth_gbs * 1e9)


def ring_gather_seconds(nbytes: float, gpus: int, fabric: Fabric) -> float:
    """NCCL ring all-gather (or reduce-scatter) of a buffer of `nbytes` over `gpus` ranks."""
    return ring_allreduce_seconds(nbytes, gpus, fabric.bus_bandwidth_gbs, fabric.hop_latency_us,
                                  passes=1)


def bytes_sent_per_gpu(param_bytes: float, grad_bytes: float, gpus: int, mode: str,
                       reshard: bool = True) -> float:
    """Bytes each GPU sends per step: DDP's all-reduce of the gradients (`mode` dist_parallel),
    or FSDP's all-gathers of the parameters (twice when it reshards after forward) and
    reduce-scatter of the gradients."""
    share = (gpus - 1) / gpus
    if mode == "dist_parallel":
        return 2 * share * grad_bytes
    return share * ((2 if reshard else 1) * param_bytes + grad_bytes)


def ddp_buckets(gradient_bytes: list[int], bucket_cap_mb: float = 25.0) -> list[int]:
    """Bucket sizes in the order DDP all-reduces them: parameters in reverse
    registration order, a first bucket of 1 MiB, then `bucket_cap_mb` MiB each (a bucket
    closes once it reaches its cap)."""
    caps, buckets, current = [FIRST_BUCKET_BYTES, int(bucket_cap_mb * 1024 * 1024)], [], 0
    for nbytes in reversed(gradient_bytes):
        current += nbytes
        if current >= caps[min(len(buckets), 1)]:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    return buckets


def exposed_communication(step_s: float, buckets: list[int], gpus: int, fabric: Fabric) -> float:
    """Seconds of all-reduce left after backward ends, buckets sent in order
    as they fill during backward."""
    backward_s = step_s * BACKWARD_SHARE
    backward_end = step_s * (1 - BACKWARD_SHARE) + backward_s  # forward, then backward
    total, ready, comm_end = sum(buckets), step_s * (1 - BACKWARD_SHARE), 0.0
    for nbytes in buckets:
        ready += backward_s * nbytes / total
        comm_end = max(ready, comm_end) + ring_allreduce_seconds(nbytes, gpus,
                                                                 fabric.bus_bandwidth_gbs,
                                                                 fabric.hop_latency_us)
    return max(0.0, comm_end - backward_end)


def projected_efficiency(single_step_s: float, ddp_step_s: float, gradient_bytes: list[int],
                         gpus: int, fabric: Fabric, bucket_cap_mb: float = 25.0) -> float:
    """Per-GPU throughput at `gpus` GPUs over single-GPU throughput, each GPU
    keeping the single-GPU batch."""
    exposed = exposed_communication(single_step_s, ddp_buckets(gradient_bytes, bucket_cap_mb), gpus,
                                    fabric)
    lockstep = SYNC_ALLOWANCE * single_step_s if gpus > 1 else 0.0
    return single_step_s / (ddp_step_s + exposed + lockstep)


def gradient_bytes(model: torch.nn.Module) -> list[int]:
    """Bytes of each trainable parameter's gradient, in registration order (fp32 gradients, also
    under autocast, whose master weights stay fp32)."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


# --- FSDP
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """One FSDP unit of fsdp/train.py: a residual block, or the root (what no block holds)."""
    name: str
    param_bytes: int  # fp32 parameters; their gradients take as many
    flops: int        # forward FLOPs of one image in the unit


def unit_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks FSDP shards one at a time, each a unit of its own, in forward order, with
    their names: the blocks of model_shapes.repeated_blocks, the rule fsdp/train.py follows
    (PyramidNet's and ResNet's residual blocks, ViT's encoder blocks; none for a model with
    nothing repeated, which is then one unit, the root)."""
    blocks = {id(block) for block in repeated_blocks(model)}
    return [(name, module) for name, module in model.named_modules() if id(module) in blocks]


def fsdp_units(model: nn.Module, channels: int, size: int) -> list[Unit]:
    """FSDP's units in forward order, the root first: each unit's parameter bytes and forward FLOPs
    per image, counted by torch.utils.flop_counter on `model` as it is (build it on the meta
    device: nothing is computed). Two images go through it, as a training batch of one would leave
    BatchNorm a single value per channel."""
    from torch.utils.flop_counter import FlopCounterMode

    blocks = unit_modules(model)
    images = torch.empty(2, channels, size, size, device=next(model.parameters()).device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(images)
    counts = {name: sum(ops.values()) // 2 for name, ops in counter.get_flop_counts().items()}
    prefix = type(model).__name__
    units = [Unit(name, sum(p.numel() * p.element_size() for p in block.parameters()),
                  counts.get(f"{prefix}.{name}", 0)) for name, block in blocks]
    root_bytes = (sum(p.numel() * p.element_size() for p in model.parameters())
                  - sum(u.param_bytes for u in units))
    root_flops = counts.get("Global", 0) - sum(u.flops for u in units)
    return [Unit("root", root_bytes, root_flops), *units]


def fsdp_exposed(step_s: float, units: list[Unit], gpus: int, fabric: Fabric,
                 reshard: bool = True) -> float:
    """Seconds of FSDP's all-gathers and reduce-scatters that the compute of a `step_s` step does
    not hide: the timeline of the module docstring, one communication stream beside the compute."""
    if gpus < 2:
        return 0.0
    flops = sum(u.flops for u in units)
    forward = [step_s * (1 - BACKWARD_SHARE) * u.flops / flops for u in units]
    backward = [step_s * BACKWARD_SHARE * u.flops / flops for u in units]
    # a reduce-scatter takes as long
    gather = [ring_gather_seconds(u.param_bytes, gpus, fabric) for u in units]
    stream = clock = issued = 0.0  # when the communication stream is free; the compute's clock
    # forward: each all-gather issued as the unit before starts computing
    for i in range(len(units)):
        stream = max(stream, issued) + gather[i]
        issued = max(clock, stream)
        clock = issued + forward[i]
    order = list(reversed(range(len(units))))
    ready = clock  # when the next unit to run backward has its parameters
    if reshard:
        stream = max(stream, clock) + gather[order[0]]
        ready = stream
    for k, i in enumerate(order):
        start = max(clock, ready)
        # the next unit's all-gather, issued as this unit's backward starts
        if reshard and k + 1 < len(order):
            stream = max(stream, start) + gather[order[k + 1]]
            ready = stream
        clock = start + backward[i]
        # its gradients reduce-scattered once its backward ends
        stream = max(stream, clock) + gather[i]
    return max(0.0, max(clock, stream) - step_s)


def fsdp_projected_efficiency(single_step_s: float, fsdp_step_s: float, units: list[Unit],
                              gpus: int, fabric: Fabric, reshard: bool = True) -> float:
    """Per-GPU throughput of FSDP at `gpus` GPUs over single-GPU throughput, each GPU keeping the
    single-GPU batch; `fsdp_step_s` is the one-process fsdp step (FSDP's own work), or the
    single-GPU step where none was measured."""
    exposed = fsdp_exposed(single_step_s, units, gpus, fabric, reshard)
    lockstep = SYNC_ALLOWANCE * single_step_s if gpus > 1 else 0.0
    return single_step_s / (fsdp_step_s + exposed + lockstep)


# --- memory
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSize:
    """What the memory projection needs of a model: the parameters of its FSDP units in forward
    order, the root's first, and the parameters autocast computes with in 2-byte copies (the weights
    and biases of convolutions, linear layers and attention's input projection; normalisation layers
    stay fp32). `alpha`: PyramidNet's width, None for any other model."""
    alpha: float | None
    units: tuple[int, ...]
    autocast_cast: int

    @property
    def parameters(self) -> int:
        return sum(self.units)


# their own parameters
CAST_BY_AUTOCAST = (nn.modules.conv._ConvNd, nn.Linear, nn.MultiheadAttention)


def model_size(model: nn.Module, alpha: float | None = None) -> ModelSize:
    """`model`'s ModelSize (built on the meta device, it costs no memory)."""
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    blocks = [count(block) for _, block in unit_modules(model)]
    cast = {id(p): p.numel() for m in model.modules() if isinstance(m, CAST_BY_AUTOCAST)
            for p in m.parameters(recurse=False)}
    return ModelSize(alpha, (count(model) - sum(blocks), *blocks), sum(cast.values()))


def gathered_at_peak(units: tuple[int, ...], reshard: bool) -> int:
    """Parameters and gradients (elements) FSDP holds unsharded at its peak, as the module docstring
    has it: `units` the root's and then each block's parameters, in forward order."""
    root, blocks = units[0], units[1:] or (0,)
    if reshard:
        # forward: computing, and the next prefetched; backward: computing with its gradients,
        # the next
        forward = max(a + b for a, b in zip(blocks, (*blocks[1:], 0)))
        backward = max(2 * b + a for a, b in zip((0, *blocks), blocks))
        return max(root + forward, 2 * root + backward)
    # blocks not yet through backward
    gathered = [sum(blocks[:i + 1]) + blocks[i] for i in range(len(blocks))]
    return 2 * root + max(gathered)


def memory_per_gpu(size: ModelSize, gpus: int, mode: str, reshard: bool = True, amp: str = "off",
                   momentum: bool = True) -> dict[str, float]:
    """Bytes per GPU of the model state, by part, as the module docstring models it: `mode`
    dist_parallel (DDP, replicated) or fsdp (sharded over `gpus`); `momentum` False: SGD
    without momentum keeps no buffer."""
    shard = 1 if mode == "dist_parallel" else gpus
    fp32 = 4 * size.parameters
    parts = {"parameters": fp32 / shard, "gradients": fp32 / shard,
             "momentum": fp32 / shard if momentum else 0.0}
    if mode == "fsdp":
        parts["gathered"] = 4 * gathered_at_peak(size.units, reshard)
    parts["autocast copies"] = 2 * size.autocast_cast if amp in AUTOCAST else 0.0
    return parts


def memory_projection(build: Callable[[float | None], nn.Module], alpha: float | None, amp: str,
                      momentum: bool, gpu_bytes: int | None) -> dict:
    """The memory projection of the model `build(alpha)` returns (on the meta device) against a GPU
    of `gpu_bytes` (None: ASSUMED_GPU_BYTES, an H100's): its ModelSize, and the fewest GPUs on which
    FSDP holds its model state (`runs_fsdp_gpus`, with and without resharding; None: not on 64).
    With PyramidNet's `alpha`, wider models too (WIDER times alpha), and where FSDP lets a model fit
    that DDP cannot: the smallest whole alpha whose DDP model state outgrows the GPU, the fewest
    GPUs on which FSDP holds it, and the widest model FSDP holds on 64 GPUs, each alpha found by
    bisection, a model built for each probe. `alpha` None: a model without a width to sweep (any
    model but PyramidNet): the runs' model alone (`sweep` False)."""
    capacity = gpu_bytes or ASSUMED_GPU_BYTES
    size_of = functools.cache(lambda a: model_size(build(a), a))
    total = lambda size, gpus, mode, reshard=True: sum(  # noqa: E731
        memory_per_gpu(size, gpus, mode, reshard, amp, momentum).values())
    fewest = lambda size, reshard: next(  # noqa: E731
        (n for n in MEMORY_GPU_COUNTS if total(size, n, "fsdp", reshard) <= capacity), None)
    found = {"gpu_bytes": capacity, "assumed": gpu_bytes is None, "amp": amp, "momentum": momentum,
             "sweep": alpha is not None,
             "runs_fsdp_gpus": {reshard: fewest(size_of(alpha), reshard)
                                for reshard in (True, False)}}
    if alpha is None:
        return {**found, "models": [size_of(None)], "crossover": None,
                "fsdp_gpus": {True: None, False: None}, "fsdp_limit": {True: None, False: None}}

    def first_alpha(outgrows: Callable[[ModelSize], bool]) -> int | None:
        """The smallest whole alpha whose model `outgrows` holds for (monotone
        in alpha); None past 2**24."""
        low, high = 0, max(1, round(alpha))
        while not outgrows(size_of(high)):
            low, high = high, high * 2
            if high > 2**24:
                return None
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if outgrows(size_of(middle)) else (middle, high)
        return high

    crossover = first_alpha(lambda size: total(size, 1, "dist_parallel") > capacity)
    fsdp_gpus, fsdp_limit = {}, {}
    for reshard in (True, False):
        fsdp_gpus[reshard] = crossover and fewest(size_of(crossover), reshard)

        def outgrows_the_most_gpus(size, reshard=reshard):
            return total(size, MEMORY_GPU_COUNTS[-1], "fsdp", reshard) > capacity
        beyond = first_alpha(outgrows_the_most_gpus)
        fsdp_limit[reshard] = size_of(beyond - 1) if beyond and beyond > 1 else None
    return {**found, "models": [size_of(alpha * k) for k in WIDER],
            "crossover": size_of(crossover) if crossover else None, "fsdp_gpus": fsdp_gpus,
            "fsdp_limit": fsdp_limit}


# --- pipeline parallelism
# --------------------------------------------------------------------------------------------------
# What the pipeline model (pipeline_parallel/train.py: the model cut into S contiguous stages, a GPU
# each, each step's batch in M micro-batches) assumes:
#
# - The cut is by FLOPs, as the train file cuts: the pieces (PyramidNet's stem, each residual
#   block, its head) in S contiguous runs whose costliest costs the least. A step takes M + S - 1
#   micro-batch slots of the costliest stage (the pipeline fills and drains: GPipe's bubble,
#   (S-1)/(M+S-1) of the step idle, 1F1B's alike), each slot that stage's share of one
#   micro-batch's compute. Step against one GPU's: costliest share x (M + S - 1) / M.
# - Left out: the transfers between stages (a micro-batch's activations forward, their gradients
#   backward: small next to the compute on one node's links), each micro-batch's kernels being
#   smaller than the batch's (on a GPU, fewer images a kernel run less efficiently), and the
#   schedules' own overhead.
# - Memory per GPU, of the model state: the stage with the most parameters keeps its fp32 weights,
#   gradients and SGD's momentum (12 bytes a parameter; and autocast's 2-byte copies of its
#   convolutions' and linear layers' weights). Activations are counted as micro-batches held: GPipe
#   keeps all M micro-batches' from forward to backward, 1F1B on its first stage S of them at most.

PIPELINE_STAGES = (2, 4, 8)  # the stage counts projected, as many as the model has pieces


@dataclass(frozen=True)
class Piece:
    """One piece of the model a pipeline stage holds whole: PyramidNet's stem, a block, its head."""
    name: str
    parameters: int     # elements, fp32
    autocast_cast: int  # of those, the weights autocast casts to 2 bytes (convolutions, linear)
    flops: int          # forward FLOPs of one image


def pipeline_pieces(model: nn.Module, channels: int, size: int) -> list[Piece] | None:
    """PyramidNet's pieces as pipeline_parallel/train.py cuts it, in forward order (the stem, its
    conv1 and bn1; each residual block of layer1 to layer3; the head, bn_final and fc), with their
    forward FLOPs per image counted on `model` as it is (the meta device: nothing computed). None
    for a model without those parts (the pipeline cuts PyramidNet, or a user's Sequential)."""
    from torch.utils.flop_counter import FlopCounterMode

    parts = ("conv1", "bn1", "layer1", "layer2", "layer3", "bn_final", "fc")
    if not all(hasattr(model, part) for part in parts):
        return None
    pieces = [("stem", [model.conv1, model.bn1])]
    pieces += [(f"{layer}.{i}", [block]) for layer in parts[2:5]
               for i, block in enumerate(getattr(model, layer))]
    pieces.append(("head", [model.bn_final, model.fc]))
    names = {id(module): name for name, module in model.named_modules()}
    images = torch.empty(2, channels, size, size, device=next(model.parameters()).device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(images)
    counts = {name: sum(ops.values()) // 2 for name, ops in counter.get_flop_counts().items()}
    prefix = type(model).__name__
    count = lambda modules: sum(p.numel() for m in modules for p in m.parameters())  # noqa: E731
    cast = lambda modules: sum(p.numel() for m in modules for sub in m.modules()  # noqa: E731
                               if isinstance(sub, CAST_BY_AUTOCAST)
                               for p in sub.parameters(recurse=False))
    return [Piece(name, count(modules), cast(modules),
                  sum(counts.get(f"{prefix}.{names[id(m)]}", 0) for m in modules))
            for name, modules in pieces]


def costliest_cut(costs: list[int], stages: int) -> list[int]:
    """Where to cut pieces of these costs into `stages` contiguous runs so that the costliest run
    costs the least (the rule pipeline_parallel/train.py cuts by): each run's first piece, and
    len(costs) last. The least costliest run found by bisection on it, each run filled greedily."""
    def runs_within(limit: int) -> list[int] | None:
        starts, total = [0], 0
        for index, cost in enumerate(costs):
            if cost > limit:
                return None
            if total + cost > limit:
                starts.append(index)
                total = 0
            total += cost
        return starts if len(starts) <= stages else None

    low, high = max(costs), sum(costs)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if runs_within(middle) else (middle + 1, high)
    starts = runs_within(low)
    while len(starts) < stages:  # fewer runs did: cut one more, which costs no run more
        index = next(i for i in range(1, len(costs)) if i not in starts)
        starts = sorted({*starts, index})
    return [*starts, len(costs)]


@dataclass(frozen=True)
class PipelinePoint:
    """One (stages, micro-batches) of the pipeline projection."""
    stages: int
    microbatches: int
    bubble: float            # (S-1)/(M+S-1): the share of the step each stage idles
    costliest_share: float   # the costliest stage's share of the model's FLOPs (1/S: balanced)
    step_vs_one_gpu: float   # costliest share x (M+S-1)/M
    state_bytes: float       # the model state of the stage with the most parameters
    held_microbatches: dict  # schedule -> micro-batches whose activations the first stage holds


def pipeline_point(pieces: list[Piece], stages: int, microbatches: int, amp: str = "off",
                   momentum: bool = True) -> PipelinePoint:
    """The pipeline model (above) at S `stages` and M `microbatches`."""
    cuts = costliest_cut([piece.flops for piece in pieces], stages)
    runs = [pieces[start:end] for start, end in zip(cuts, cuts[1:])]
    share = max(sum(p.flops for p in run) for run in runs) / sum(p.flops for p in pieces)
    per_parameter = 4 * (3 if momentum else 2)
    state = max(sum(per_parameter * p.parameters
                    + (2 * p.autocast_cast if amp in AUTOCAST else 0) for p in run)
                for run in runs)
    return PipelinePoint(stages, microbatches, (stages - 1) / (microbatches + stages - 1), share,
                         share * (microbatches + stages - 1) / microbatches, state,
                         {"gpipe": microbatches, "1f1b": min(stages, microbatches)})


def pipeline_projection(pieces: list[Piece], batch: int, amp: str = "off",
                        momentum: bool = True) -> list[PipelinePoint]:
    """The pipeline model for each stage count of PIPELINE_STAGES the pieces allow (a piece a
    stage at least), each with M = S, 2S, 4S and 8S micro-batches that split `batch` evenly."""
    return [pipeline_point(pieces, stages, m, amp, momentum) for stages in PIPELINE_STAGES
            if stages <= len(pieces)
            for m in (stages, 2 * stages, 4 * stages, 8 * stages) if m <= batch and not batch % m]

"""The check that every rank of a process group holds the same weights, made at the
end of a run (and every epoch with --verify_sync): hashes of every parameter,
gathered from every rank and compared."""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from common.errors import plural
from common.state import is_sharded, whole


def _digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def check_sync(raw_model: torch.nn.Module) -> dict:
    """Every rank hashes each parameter and buffer; the hashes (and the small BatchNorm buffers)
    are gathered. Parameters must be bit-identical on every rank; running statistics may differ
    without SyncBatchNorm. Every rank computes the same verdict, so every rank can act on it. A
    model sharded by FSDP keeps each slice on one rank only, so there are no copies to drift
    apart: each rank gathers every parameter whole and hashes that, which checks that the ranks
    assemble the same weights (those a checkpoint saves); the buffers, which FSDP does not
    shard, are compared as under DDP."""
    params = {name: _digest(whole(p)) for name, p in raw_model.named_parameters()}
    buffers = {name: b.detach().cpu() for name, b in raw_model.named_buffers()
               if b.is_floating_point()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (params, buffers))
    reference_params, reference_buffers = gathered[0]
    mismatched = sorted({name for rank_params, _ in gathered[1:]
                         for name, digest in rank_params.items()
                         if reference_params.get(name) != digest})
    worst_name, worst = None, 0.0
    for _, rank_buffers in gathered[1:]:
        for name, value in rank_buffers.items():
            diff = ((value.double() - reference_buffers[name].double()).abs().max().item()
                    if value.numel() else 0.0)
            if diff > worst:
                worst_name, worst = name, diff
    return {"params_in_sync": not mismatched, "mismatched": mismatched,
            "buffers_max_abs_diff": worst, "worst_buffer": worst_name, "ranks": len(gathered),
            "params": len(reference_params), "sharded": is_sharded(raw_model)}


def describe_sync(report: dict, sync_bn: bool) -> str:
    whole = ", each gathered whole from its slices," if report.get("sharded") else ""
    params = (f"all {report['params']} parameter tensors{whole} identical on "
              f"{plural(report['ranks'], 'rank')}"
              if report["params_in_sync"] else
              f"parameters differ between ranks: {', '.join(report['mismatched'][:5])}"
              f"{' ...' if len(report['mismatched']) > 5 else ''}")
    if report["buffers_max_abs_diff"] == 0:
        buffers = "buffers identical"
    else:
        why = ("" if sync_bn else " (expected without SyncBatchNorm: each rank's BatchNorm "
                                  "sees only its own share)")
        buffers = ("BatchNorm running statistics differ by up to "
                   f"{report['buffers_max_abs_diff']:.3g} ({report['worst_buffer']}){why}")
    return f"sync check: {params}; {buffers}"


def verify_sync(raw_model: torch.nn.Module, sync_bn: bool, is_main: bool) -> dict:
    """check_sync, reported by rank 0; parameters that differ end the run on
    every rank with a non-zero exit."""
    report = check_sync(raw_model)
    if is_main:
        print(describe_sync(report, sync_bn), flush=True)
    if not report["params_in_sync"]:
        raise SystemExit("error: the ranks hold different parameters (named above): "
                         "their training diverged"
                         if is_main else 1)
    return report

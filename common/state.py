"""A model's and its optimizer's whole state as plain tensors, the one form checkpoints
and model.pt files take, whether the model is whole (single_gpu, data_parallel,
dist_parallel) or sharded by FSDP2 (fsdp).

Under FSDP2 every parameter is a DTensor of which each rank holds one slice, and so are the
gradients and the momentum buffers. `torch.distributed.checkpoint.state_dict` names the slices,
`DTensor.full_tensor` gathers each into a whole tensor kept on rank 0's CPU (one tensor at a time,
so no GPU ever holds the whole model for it) and, on loading, torch.distributed.checkpoint cuts
whole tensors into each rank's slice. The checkpoint is then the same file every mode writes: a
dist_parallel checkpoint resumes in fsdp, and back. The optimizer's state comes from
torch.distributed.checkpoint keyed by parameter name; it is stored as `optimizer.state_dict()`
stores it, keyed by the parameter's position in the optimizer, and turned back on loading.

A model whose channels are stored aligned (models/aligned.py) holds some tensors padded: every
tensor leaves here in the paper's shape and comes back padded, so that checkpoints are those of the
paper's model whatever the alignment (`to_paper`, `to_stored`).
"""
from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist

from models.aligned import to_paper, to_stored


def _is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a DTensor. Nothing can be one before torch.distributed.tensor is
    imported (fully_shard imports it), and importing it only to ask would add most of a
    second to every single-GPU start."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether the model's parameters are DTensor slices (FSDP2's
    fully_shard), not whole tensors."""
    return any(_is_dtensor(param) for param in model.parameters())


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: its slice of a DTensor, or the tensor itself."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor's slices gathered from every rank (a
    collective: every rank calls it)."""
    if not _is_dtensor(tensor):
        return tensor
    group = tensor.device_mesh.get_group()
    if tensor.device.type != "cpu" and dist.get_backend(group) == "gloo":
        return _whole_through_the_cpu(tensor, group)
    return tensor.full_tensor()


def _whole_through_the_cpu(tensor: torch.Tensor, group) -> torch.Tensor:
    """`tensor.full_tensor()` for GPU slices over gloo (two ranks sharing one GPU):
    gloo's all-gather of CUDA tensors crashes the process (pytorch/pytorch#152645), so
    the slices cross on the CPU, as the same DTensor on a CPU mesh of the same group, and
    the whole tensor goes back to the GPU."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    mesh = DeviceMesh.from_group(group, "cpu")
    on_cpu = DTensor.from_local(tensor.to_local().cpu(), mesh, tensor.placements,
                                shape=tensor.shape, stride=tensor.stride())
    return on_cpu.full_tensor().to(tensor.device)


def _whole_on_rank_0(values: dict) -> dict:
    """Each DTensor of `values` (a state_dict or one parameter's optimizer state) gathered by
    `whole`, one at a time, and kept on rank 0's CPU; the other ranks get an empty dict (every rank
    calls it, in the same order)."""
    rank_0 = dist.get_rank() == 0
    gathered = {}
    for key, value in values.items():
        value = whole(value) if isinstance(value, torch.Tensor) else value
        if rank_0:
            gathered[key] = value.cpu() if isinstance(value, torch.Tensor) else value
    return gathered


def _options(full: bool):
    """torch.distributed.checkpoint's options: whole tensors (`full`) or each rank's slices."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full)


def load_file(path) -> object:
    """What a checkpoint or model.pt file holds: `torch.load(weights_only=True)` onto the CPU, so
    that a file cannot run code. A file that torch.save did not write but `pickle` did makes torch
    warn of its pickle protocol (not torch's 2) before it refuses the file; the caller refuses it in
    one line that says what to give, so that warning is silenced, for this load only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        return torch.load(path, map_location="cpu", weights_only=True)


def model_state(model: torch.nn.Module) -> dict:
    """The model's state_dict with whole tensors of the paper's shapes. Sharded,
    torch.distributed.checkpoint names the slices and each is gathered onto rank 0's CPU, one tensor
    at a time, so no GPU ever holds the whole model for it; the other ranks get an empty dict (they
    write nothing), and every rank must call it."""
    if not is_sharded(model):
        return model.state_dict()  # the aligned layers' state_dict hooks cut their padding
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    gathered = _whole_on_rank_0(get_model_state_dict(model, options=_options(full=False)))
    return {key: to_paper(model, key, value) for key, value in gathered.items()}


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` with whole tensors of the paper's shapes, keyed by position
    as torch keys it. Sharded: gathered onto rank 0's CPU (the other ranks get an empty
    dict), every rank calling it."""
    names = parameter_names(model, optimizer)
    if not is_sharded(model):
        saved = optimizer.state_dict()
        return {**saved, "state": {index: _in_paper_shapes(model, names[index], values)
                                   for index, values in saved["state"].items()}}
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options(full=False))
    state = {name: _whole_on_rank_0(values) for name, values in by_name["state"].items()}
    if dist.get_rank() != 0:
        return {}
    position = {name: index for index, name in enumerate(names)}
    return {"state": {position[name]: _in_paper_shapes(model, name, values)
                      for name, values in state.items()},
            "param_groups": [{**group, "params": [position[name] for name in group["params"]]}
                             for group in by_name["param_groups"]]}


def load_model_state(model: torch.nn.Module, state: dict) -> None:
    """`model.load_state_dict(state)`; sharded, each rank keeps its slice of the whole tensors
    (every rank holds `state`, and every rank calls it)."""
    if not is_sharded(model):
        model.load_state_dict(state)  # the aligned layers' load hooks pad the paper's shapes
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    kept = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    # padded first: torch cuts the stored shapes into slices
    stored = {key: (to_stored(model, key, value, _zeros_or_itself(kept[key])) if key in kept
                    else value)
              for key, value in state.items()}
    set_model_state_dict(model, stored, options=_options(full=True))


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         saved: dict) -> None:
    """`optimizer.load_state_dict(saved)` of a state keyed by position;
    sharded, each rank keeps its slices."""
    names = parameter_names(model, optimizer)
    params = dict(model.named_parameters())
    state = {index: _in_stored_shapes(model, names[index], values, params[names[index]])
             for index, values in saved["state"].items()}
    if not is_sharded(model):
        optimizer.load_state_dict({**saved, "state": state})
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    by_name = {"state": {names[index]: values for index, values in state.items()},
               "param_groups": [{**group, "params": [names[index] for index in group["params"]]}
                                for group in saved["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=_options(full=True))


def _in_paper_shapes(model: torch.nn.Module, name: str, values: dict) -> dict:
    """One parameter's optimizer state (its momentum) in the paper's shape."""
    return {key: to_paper(model, name, value) if isinstance(value, torch.Tensor) else value
            for key, value in values.items()}


def _in_stored_shapes(model: torch.nn.Module, name: str, values: dict, param: torch.Tensor) -> dict:
    """One parameter's optimizer state of the paper's shape, padded with
    zeros as the parameter is stored."""
    if not isinstance(values, dict):
        return values
    return {key: to_stored(model, name, value, _zeros_or_itself(param, zeros=True))
            if isinstance(value, torch.Tensor) else value for key, value in values.items()}


def _zeros_or_itself(tensor: torch.Tensor, zeros: bool = False) -> torch.Tensor:
    """What a padded copy of `tensor` takes its padding from: zeros of its whole shape
    on the CPU for a DTensor (or when `zeros`), else the tensor itself (a running
    variance pads with its ones)."""
    if _is_dtensor(tensor):
        return torch.zeros(tensor.shape, dtype=tensor.dtype)
    return torch.zeros_like(tensor) if zeros else tensor.detach()


def parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in the optimizer's order
    (its state_dict's positions)."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [names[id(param)] for group in optimizer.param_groups for param in group["params"]]


def all_finite(model: torch.nn.Module) -> bool:
    """Whether every weight and buffer is finite, the same verdict on every rank (a sharded
    model's slices differ between ranks, so each rank's verdict is combined: every rank
    calls it in a process group)."""
    finite = all(bool(torch.isfinite(local(tensor)).all())
                 for tensor in model.state_dict().values())
    if not (dist.is_available() and dist.is_initialized()):
        return finite
    verdict = torch.tensor([float(finite)], device=_group_device())
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    return bool(verdict.item())


def _group_device() -> torch.device:
    """Where the default group's collectives take their tensors: this process's
    GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

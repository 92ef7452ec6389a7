"""SGD and the learning-rate schedule, identical in every mode.

--lr is per 128 images of GLOBAL batch and scales linearly with --batch_size (Goyal et al.,
2017), so every mode trains with the same rate for the same global batch. At every batch size the
rate ramps up linearly over a short warm-up (--lr_warmup_epochs, at most a tenth of the run; an
image folder's at least 50 steps and at most a third: `warmup_steps`): at the full rate from the
first step, a ResNet's first epoch on a small image folder ended at a test loss of 8e4
(BENCHMARKS.md); then the paper's step schedule divides it by 10 at 50 % and at 75 % of the
epochs.
"""
from __future__ import annotations

import torch

from common.config import BASE_BATCH, Config
from common.state import is_sharded
from models.aligned import mask_padded_gradients


def build_optimizer(model: torch.nn.Module, cfg: Config,
                    device: torch.device) -> torch.optim.Optimizer:
    """SGD; on a GPU its fused form, one kernel for every parameter's update, which also takes fp16
    loss scaling without a host sync. On the CPU the default (for-each) form.

    The momentum buffers start at zero, which is what SGD's first step makes of them anyway (0.9 x
    0 + grad is grad, exactly). Left to the first step, fused SGD creates them with
    torch.empty_like and lets its kernel fill them; when the GradScaler skips that step (an fp16
    overflow, common at the first step's 65536 loss scale) the kernel does nothing, and every later
    step would build on uninitialised memory.

    A model sharded by FSDP2 takes the for-each form on GPUs too: its parameters are DTensors, and
    torch has no sharding rule for fused SGD's kernel (it has for fused Adam's). The GradScaler
    works with either: over DTensor gradients its overflow check is reduced across the ranks, so
    every rank skips the same steps.

    Under --deterministic every mode takes the for-each form on GPUs, fsdp's: the two forms round
    differently. Fused SGD's kernel (aten/src/ATen/native/cuda/FusedSgdKernel.cu) computes the
    momentum update, Nesterov's step and lr x step in double and rounds once, where the for-each
    form rounds to fp32 after every op, so fsdp would part from the other modes from the second
    step, and `compare.py --verify --deterministic` would fail with nothing wrong. On the CPU
    every mode takes the default form (a loop over the parameters, the same arithmetic as the
    for-each form), as without --deterministic.

    With channels stored aligned (models/aligned.py), a hook before every step zeroes the
    gradients of BatchNorm beta's padded parts, the only padded parts that receive any:
    one multi-tensor op per step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.effective_lr(), momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay, nesterov=cfg.nesterov,
                                **sgd_form(model, cfg, device))
    if cfg.momentum:
        for param in model.parameters():
            # in the parameter's layout
            optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
    mask_padded_gradients(model, optimizer)  # channels stored aligned: their padding never moves
    return optimizer


def sgd_form(model: torch.nn.Module, cfg: Config, device: torch.device) -> dict:
    """SGD's `fused` and `foreach` for this model on this device (build_optimizer says why):
    fused on a GPU, for-each for a sharded model or under --deterministic, torch's default (a loop
    over the parameters) on the CPU."""
    if device.type != "cuda":
        return dict(fused=None, foreach=None)
    if cfg.deterministic or is_sharded(model):
        return dict(fused=False, foreach=True)
    return dict(fused=True, foreach=None)


# An image folder's warm-up lasts at least this many steps, and at most this share of the run
FOLDER_WARMUP_STEPS = 50
FOLDER_WARMUP_SHARE = 3


def warmup_steps(cfg: Config, steps_per_epoch: int) -> int:
    """The steps of the rate's linear warm-up: --lr_warmup_epochs' worth, at most a tenth of the
    run. An image folder's (data of any size, often small) at least FOLDER_WARMUP_STEPS, and at
    most a third of the run: what the rate needs is steps, not epochs. On 1,438 8x8 digits at the
    default batch (11 steps an epoch), a ResNet-18 run of 15 epochs warmed up over a tenth of it, 16
    steps, and its training loss leapt from 2.0 to 5.3 in the second epoch (steps up to 12.1); over
    33 from 0.76 to 2.27 in the fifth; over 55 it did not leap (BENCHMARKS.md). It costs the
    smallest model of a short run: PyramidNet-8 in 12 epochs reached 89 % where it had 94 %."""
    steps = round(cfg.lr_warmup_epochs * steps_per_epoch)
    run = cfg.epochs * steps_per_epoch
    if cfg.dataset != "imagefolder" or not steps:
        return min(steps, run // 10)
    return min(max(steps, FOLDER_WARMUP_STEPS), run // FOLDER_WARMUP_SHARE)


def lr_factor(step: int, cfg: Config, steps_per_epoch: int) -> float:
    """The multiplier of the effective rate for optimizer step `step` (0-based)."""
    ramp = warmup_steps(cfg, steps_per_epoch)
    warm = (step + 1) / ramp if step < ramp else 1.0
    epoch = step // max(steps_per_epoch, 1)
    return warm * 0.1 ** ((epoch >= 0.5 * cfg.epochs) + (epoch >= 0.75 * cfg.epochs))


def lr_schedule(optimizer: torch.optim.Optimizer, cfg: Config, steps_per_epoch: int):
    """Stepped once per optimizer step. A LambdaLR keeps its position in its
    state_dict, so it can be resumed."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer,
                                             lambda step: lr_factor(step, cfg, steps_per_epoch))


def describe_lr(cfg: Config, steps_per_epoch: int) -> str:
    ramp = warmup_steps(cfg, steps_per_epoch)
    warm = f", linear warm-up over {ramp} steps" if ramp else ""
    return (f"lr {cfg.effective_lr():g} (= {cfg.lr:g} per {BASE_BATCH} images x global batch "
            f"{cfg.batch_size}{warm}; x0.1 after epochs {-(-cfg.epochs // 2)} and "
            f"{-(-3 * cfg.epochs // 4)})")

"""Where a training step's time goes: torch.profiler over a few single_gpu steps, grouped into convolutions,
BatchNorm, element-wise work and the rest, plus the top operators.

    python benchmarks/profile_step.py --batch_size 256                       # the default model, the fast path
    python benchmarks/profile_step.py --batch_size 256 --width_multiple 8    # widths rounded for tensor cores
    python benchmarks/profile_step.py --depth 8 --alpha 12 --batch_size 32 --steps 3 --out profile.json  # CPU

It takes every train.py flag (model, --amp, --channels_last, --compile, ...) and builds the model and optimizer
with single_gpu/train.py's own functions; the batches are synthetic and stay on the device. Times are the
operators' self time on the device (on the CPU without one), so nested operators are not counted twice; on a GPU the
top CUDA kernels are listed as well.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from common.config import Config, flag, parse_config, user_errors
from common.data import DATASET_INFO
from common.devices import seed_everything
from common.performance import autocast, memory_format, resolve_fast_path
from single_gpu.train import get_model, get_optimizer, setup

# Operator name fragments of each category, checked in this order (backward operators carry the same fragments).
CATEGORIES = {
    "convolution": ("conv", "cudnn", "mm", "linear"),
    "batchnorm": ("batch_norm",),
    "elementwise": ("add", "mul", "relu", "threshold", "copy", "fill", "zero", "pad", "cat", "div", "sub", "where",
                    "clamp", "sqrt", "foreach", "sgd", "pool", "mean", "sum", "softmax", "nll", "cross_entropy"),
}


@dataclass(frozen=True)
class ProfileConfig(Config):
    steps: int = flag(5, "profiled steps, after --warmup_steps unprofiled ones")
    top: int = flag(15, "operators listed by self time")
    out: str | None = flag(None, "also write the breakdown as JSON to this file")


def category(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, fragments in CATEGORIES.items() if any(f in lowered for f in fragments)), "other")


def profile_steps(cfg: ProfileConfig) -> dict:
    device, _ = setup(cfg)
    cfg = resolve_fast_path(cfg, device)
    seed_everything(cfg.seed)
    model, raw_model = get_model(cfg, device)
    optimizer, _, scaler = get_optimizer(cfg, raw_model, device, steps_per_epoch=1)
    data = DATASET_INFO[cfg.dataset]  # random images of the shape the model was built for
    images = torch.randn(cfg.batch_size, data.channels, data.size, data.size, device=device)
    images = images.contiguous(memory_format=memory_format(cfg))
    labels = torch.randint(0, data.classes, (cfg.batch_size,), device=device)

    def step():
        with autocast(cfg, device):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    model.train()
    for _ in range(max(cfg.warmup_steps, 1)):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(cfg.steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    self_time = "self_device_time_total" if cuda else "self_cpu_time_total"  # microseconds over every step
    operators = per_step([(e.key, getattr(e, self_time)) for e in events if e.device_type == DeviceType.CPU],
                         cfg.steps)
    kernels = per_step([(e.key, e.self_device_time_total) for e in events if e.device_type == DeviceType.CUDA],
                       cfg.steps)
    total = sum(seconds for _, seconds in operators)
    shares = {kind: 0.0 for kind in [*CATEGORIES, "other"]}
    for name, seconds in operators:
        shares[category(name)] += seconds / total
    return {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
            "config": {"depth": cfg.depth, "alpha": cfg.alpha, "block": cfg.block, "batch_size": cfg.batch_size,
                       "width_multiple": cfg.width_multiple, "amp": cfg.amp, "channels_last": cfg.channels_last,
                       "compile": cfg.compile},
            "step_seconds": total, "shares": shares,
            "top": [{"op": name, "ms_per_step": 1e3 * s, "share": s / total, "category": category(name)}
                    for name, s in operators[:cfg.top]],
            "top_kernels": [{"kernel": name, "ms_per_step": 1e3 * s, "share": s / total}
                            for name, s in kernels[:cfg.top]]}


def per_step(times: list[tuple[str, float]], steps: int) -> list[tuple[str, float]]:
    """(name, total microseconds) -> (name, seconds per step), largest first, zeros dropped."""
    return sorted(((name, us / 1e6 / steps) for name, us in times if us > 0), key=lambda item: -item[1])


def main(argv=None) -> None:
    cfg = parse_config(ProfileConfig, argv, description=__doc__)
    report = profile_steps(cfg)
    print(f"{report['device']}, batch {cfg.batch_size}: {1e3 * report['step_seconds']:.2f} ms of operator self "
          f"time per step")
    print("  " + ", ".join(f"{kind} {100 * share:.1f}%" for kind, share in report["shares"].items()))
    for row in report["top"]:
        print(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {row['category']:<11} {row['op']}")
    if report["top_kernels"]:
        print("top kernels:")
    for row in report["top_kernels"]:
        print(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {row['kernel'][:110]}")
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    with user_errors():
        main()

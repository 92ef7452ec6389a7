"""The suite's own overhead: `single_gpu/train.py --benchmark` against the plainest loop over
the same model, batches and optimizer (no timer, no meter, no logging; one host sync at the
end), alternately, best of N each.

    python benchmarks/overhead.py   # PyramidNet-8 alpha=12, batch 32, on this machine's CPU
    python benchmarks/overhead.py --depth 110 --alpha 270 --batch_size 256 --repeat 3   # on a GPU

It takes every train.py flag. The ratio of images/s (train.py's over the bare loop's) is
printed: 1.0 means the suite's measurement costs nothing. A benchmark, not a test: it is
timed, and the figure goes to BENCHMARKS.md. train.py's runs are kept as run folders in
--log_dir, named --run_name (default overhead-<time>) plus -suite<N>, so that the folders
their lines name are there to read afterwards.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from common.command_line import config_argv
from common.config import Config, UsageError, flag, parse_config
from common.domains import CHECKS
from common.errors import user_errors
from common.data import dataset_info, load_datasets
from common.devices import seed_everything
from common.loaders import make_loader
from common.optim import build_optimizer
from common.performance import autocast, memory_format, resolve_fast_path
from common.samplers import ShuffleSampler
from models import build_model

DEFAULTS = ["--dataset", "synthetic", "--synthetic_size", "512", "--depth", "8", "--alpha", "12",
            "--batch_size", "32", "--warmup_steps", "3", "--benchmark_steps", "24",
            "--log_interval", "9", "--no_progress"]


@dataclass(frozen=True)
class OverheadConfig(Config):
    repeat: int = flag(2, "runs of each loop, alternately; the best of each is compared",
                       at_least=1)

    def __post_init__(self):
        super().__post_init__()
        if self.run_name is not None:  # the last run's folder name must be one too
            wrong = CHECKS["name"](suite_run_name(self.run_name, self.repeat - 1))
            if wrong:
                raise UsageError(f"--run_name {self.run_name!r} leaves no room for "
                                 f"-suite{self.repeat - 1}: give a shorter one")


def suite_run_name(base: str, attempt: int) -> str:
    """The run folder of train.py's `attempt`-th run."""
    return f"{base}-suite{attempt}"


def bare_images_per_sec(cfg: Config, device: torch.device) -> float:
    """--benchmark's model, batches and optimizer in the plainest loop."""
    seed_everything(cfg.seed)
    train_set, _ = load_datasets("synthetic", "", cfg.synthetic_size, cfg.seed)
    loader = make_loader(cfg.loader or ("gpu" if device.type == "cuda" else "torchvision"),
                         train_set, ShuffleSampler(len(train_set), True, cfg.seed), cfg.batch_size,
                         device, train=True, augment=True, num_workers=cfg.num_workers,
                         # the loader --benchmark builds, workers included
                         seed=cfg.seed, memory_format=memory_format(cfg))
    model = build_model(cfg, dataset_info(cfg)).to(device, memory_format=memory_format(cfg)).train()
    optimizer = build_optimizer(model, cfg, device)
    steps = cfg.warmup_steps + cfg.benchmark_steps
    done = 0
    epoch = 0
    while done < steps:
        loader.sampler.set_epoch(epoch)
        loader.start_epoch(epoch)
        for images, labels in loader:
            if done == cfg.warmup_steps:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            with autocast(cfg, device):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return cfg.batch_size * cfg.benchmark_steps / (time.perf_counter() - start)


def main(argv=None) -> None:
    import single_gpu.train as single

    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_config(OverheadConfig, [*DEFAULTS, *argv], description=__doc__)
    # train.py's flags from the parsed values, whichever way they were spelt (--repeat=1, --rep 1)
    values = {field.name: getattr(cfg, field.name) for field in dataclasses.fields(Config)}
    train_flags = config_argv(Config, values)
    base = cfg.run_name or f"overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    resolved = resolve_fast_path(cfg, device)
    suite, bare = [], []
    for attempt in range(cfg.repeat):
        name = suite_run_name(base, attempt)
        single.main([*train_flags, "--benchmark", "--run_name", name])
        results = json.loads(Path(cfg.log_dir, name, "results.json").read_text())
        suite.append(results["summary"]["images_per_sec"])
        bare.append(bare_images_per_sec(resolved, device))
    runs = Path(cfg.log_dir, f"{base}-suite{{0..{cfg.repeat - 1}}}" if cfg.repeat > 1 else name)
    print(f"--benchmark / bare loop images/s on {device}: {max(suite) / max(bare):.3f} "
          f"({max(suite):.0f} vs {max(bare):.0f}, best of {cfg.repeat} each); "
          f"train.py's runs: {runs}")


if __name__ == "__main__":
    with user_errors():
        main()

"""The suite's own overhead: `single_gpu/train.py --benchmark` against the plainest loop over
the same model, batches and optimizer (no timer, no meter, no logging; one host sync at the
end), alternately, best of N each.

    python benchmarks/overhead.py   # PyramidNet-8 alpha=12, batch 32, on this machine's CPU
    python benchmarks/overhead.py --depth 110 --alpha 270 --batch_size 256 --repeat 3   # on a GPU

It takes every single_gpu/train.py flag, and builds the bare loop's model, loader and optimizer
with that file's own functions. The ratio of images/s (train.py's over the bare loop's) is
printed: 1.0 means the suite's measurement costs nothing. A benchmark, not a test: it is
timed, and the figure goes to BENCHMARKS.md. train.py's runs are kept as run folders in
--log_dir, named --run_name (default overhead-<time>) plus -suite<N>, so that the folders
their lines name are there to read afterwards.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path += [str(path) for path in (REPO, REPO / "models") if str(path) not in sys.path]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import runkit  # noqa: E402
from benchmarks.fast import train_file  # noqa: E402

DEFAULTS = ["--dataset", "synthetic", "--synthetic_size", "512", "--depth", "8", "--alpha", "12",
            "--batch_size", "32", "--warmup_steps", "3", "--benchmark_steps", "24",
            "--log_interval", "9"]


def bare_images_per_sec(single, argv: list[str]) -> float:
    """--benchmark's model, batches and optimizer (single_gpu/train.py's functions) in the
    plainest loop."""
    args = single.get_args([*argv, "--benchmark"])
    device = single.setup(args)
    train_set, test_set, classes = single.get_datasets(args)
    single.data_defaults(args, len(train_set))
    loader, _ = single.get_loaders(args, train_set, test_set, device)
    torch.manual_seed(args.seed)
    model, raw_model, _ = single.get_model(args, classes, device)
    optimizer, _, _ = single.get_optimizer(args, raw_model, device, len(loader))
    steps, done, epoch, start = args.warmup_steps + args.benchmark_steps, 0, 0, None
    model.train()
    while done < steps:
        for images, labels in single.epoch_batches(loader, epoch, {"batch": 0}):
            if done == args.warmup_steps:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            images = images.to(device, non_blocking=True, memory_format=single.memory_format(args))
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, single.AMP[args.amp], enabled=args.amp != "off"):
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
    return args.batch_size * args.benchmark_steps / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = runkit.ArgumentParser(description=__doc__, prog="overhead.py")
    parser.add_argument("--repeat", type=runkit.count(1), default=2,
                        help="runs of each loop, alternately; the best of each is compared")
    options, flags = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    single = train_file("single_gpu")
    argv = [*DEFAULTS, *flags]
    args = single.get_args(argv)  # train.py's refusals, before anything runs
    base = args.run_name or f"overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    suite, bare = [], []
    for attempt in range(options.repeat):
        name = f"{base}-suite{attempt}"
        single.main([*argv, "--benchmark", "--run_name", name])
        results = json.loads(Path(args.log_dir, name, "results.json").read_text())
        suite.append(results["summary"]["images_per_sec"])
        bare.append(bare_images_per_sec(single, argv))
    runs = Path(args.log_dir, f"{base}-suite{{0..{options.repeat - 1}}}" if options.repeat > 1
                else name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"--benchmark / bare loop images/s on {device}: {max(suite) / max(bare):.3f} "
          f"({max(suite):.0f} vs {max(bare):.0f}, best of {options.repeat} each); "
          f"train.py's runs: {runs}")


if __name__ == "__main__":
    with runkit.one_line_errors():
        main()

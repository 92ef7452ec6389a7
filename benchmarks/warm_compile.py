"""The warm compile on this machine: `benchmarks/fast.py single_gpu --compile` run cold, then warm,
each in a fresh process, on a compile cache made empty for the pair, and what AOTAutograd's cache
did read from the runs' own logs.

    python benchmarks/warm_compile.py                  # PyramidNet-8 alpha=12 on the CPU, 3 pairs
    python benchmarks/warm_compile.py --pairs 1 --depth 20 --alpha 48    # any train.py flag too
    python benchmarks/warm_compile.py --same_numbers   # the compiled sum against ShortcutSum's

Each run is `benchmarks/fast.py single_gpu --benchmark --compile --compile_cache CACHE` (2 untimed
and 2 timed steps of synthetic images) with TORCH_LOGS naming the logger of AOTAutograd's cache,
whose lines say what each compile did with it: "Bypassing autograd cache" (the cache refused the
graph, so a warm run traces it again), "AOTAutograd cache hit", "AOTAutograd cache miss". Its
compile time is the run's first step (results.json's `first_step_s`: the compile, and the first
step's own work, a fraction of a second here). It prints a line a pair, then the medians, and exits
1 unless every warm run logged no bypass and its first step was at least --at_least (default 3)
times quicker than its cold run's. A benchmark, not a test: it times, and its figures go to
BENCHMARKS.md. Other work on the machine slows the runs as it comes and goes: run several pairs,
and say what else ran.

--same_numbers instead trains the fast path's PyramidNet-8 (benchmarks/aligned.py) three SGD steps,
in this process, eager (the blocks' in-place ShortcutSum), compiled as the model compiles (the
padded sum) and compiled with the blocks made to apply ShortcutSum, in fp32 and in bf16 autocast,
with channels stored as the paper's and aligned to 8, and prints how far apart the three are
(||a - b|| / ||b|| of the outputs, and of the weights after the steps; "bit for bit" where they are
equal): what the plain sum changes in the compiled model's numbers; and first the kernels inductor
makes of the sum itself.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = ["--dataset", "synthetic", "--synthetic_size", "64", "--batch_size", "16", "--depth", "8",
       "--alpha", "12", "--benchmark", "--warmup_steps", "2", "--benchmark_steps", "2",
       "--num_workers", "0"]
CACHE_LOGGER = "torch._functorch._aot_autograd.autograd_cache"  # TORCH_LOGS takes a module's name
SAID = {"bypass": "Bypassing autograd cache", "hit": "AOTAutograd cache hit",
        "miss": "AOTAutograd cache miss"}
PLURAL = {"bypass": "bypasses", "hit": "hits", "miss": "misses"}


def compile_run(name: str, cache: Path, out: Path, flags: list[str]) -> tuple[float, dict]:
    """One train.py run compiled on `cache`: its compile time and what AOTAutograd's cache said."""
    log = out / f"{name}.log"
    env = {**os.environ, "TORCH_LOGS": CACHE_LOGGER}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # --compile_cache is the cache
    command = [sys.executable, str(REPO / "benchmarks" / "fast.py"), "single_gpu", *RUN, *flags,
               "--compile", "--compile_cache", str(cache), "--log_dir", str(out), "--run_name",
               name]
    with log.open("w") as output:
        code = subprocess.run(command, cwd=REPO, env=env, stdout=output,
                              stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"error: {name} failed (exit {code}); its output: {log}")
    text = log.read_text()
    summary = json.loads((out / name / "results.json").read_text())["summary"]
    return summary["first_step_s"], {key: text.count(line) for key, line in SAID.items()}


def padded_sum_kernels() -> list[str]:
    """The kernels inductor makes of the blocks' compiled sum, a 24-channel residual plus a
    20-channel shortcut padded to it: one, the pad fused into the addition, is no copy."""
    import re

    import torch
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    def padded_sum(residual: torch.Tensor, shortcut: torch.Tensor) -> torch.Tensor:
        return residual + F.pad(shortcut, (0, 0, 0, 0, 0, residual.shape[1] - shortcut.shape[1]))

    _, code = run_and_get_code(torch.compile(padded_sum), torch.randn(4, 24, 8, 8),
                               torch.randn(4, 20, 8, 8))
    return sorted(set(re.findall(r"(\w*fused\w*) = async_compile", "\n".join(code))))


def same_numbers() -> None:
    """The compiled padded sum against the compiled ShortcutSum and eager (the docstring)."""
    import copy
    import functools

    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO))
    from benchmarks.aligned import BasicBlock, ShortcutSum, fast_pyramidnet

    def apply_shortcut_sum(block, x):  # the block as eager runs it, under compile too
        residual = block.conv1(block.bn1(x))
        residual = block.bn3(block.conv2(F.relu(block.bn2(residual), inplace=True)))
        if block.stride != 1:
            x = F.avg_pool2d(x, kernel_size=2, stride=2, ceil_mode=True)
        return ShortcutSum.apply(residual, x)

    def train(model, how: str, amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model = copy.deepcopy(model)
        if how == "compiled ShortcutSum":
            for block in model.modules():
                if isinstance(block, BasicBlock):
                    block.forward = functools.partial(apply_shortcut_sum, block)
        torch._dynamo.reset()
        run = model if how == "eager" else torch.compile(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                    weight_decay=5e-4)
        draws, outputs = torch.Generator().manual_seed(0), []
        for _ in range(3):
            images = torch.randn(8, 3, 32, 32, generator=draws)
            labels = torch.randint(0, 10, (8,), generator=draws)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = run(images)
                loss = F.cross_entropy(out, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            outputs.append(out.detach().float().flatten())
            optimizer.step()
        return torch.cat(outputs), torch.cat([p.detach().flatten() for p in model.parameters()])

    def apart(a: torch.Tensor, b: torch.Tensor) -> str:
        return "bit for bit" if torch.equal(a, b) else f"{((a - b).norm() / b.norm()).item():.1e}"

    kernels = padded_sum_kernels()
    print(f"the padded sum of a 4x24x8x8 residual and a 4x20x8x8 shortcut, compiled: "
          f"{len(kernels)} kernel{'' if len(kernels) == 1 else 's'} ({', '.join(kernels)})")
    hows = ("eager", "compiled padded sum", "compiled ShortcutSum")
    for amp in (False, True):
        for align in (0, 8):
            torch.manual_seed(0)
            model = fast_pyramidnet(depth=8, alpha=12, align=align)
            done = {how: train(model, how, amp) for how in hows}
            for first, second in ((hows[1], hows[2]), (hows[1], hows[0]), (hows[2], hows[0])):
                (out_a, weights_a), (out_b, weights_b) = done[first], done[second]
                print(f"{'bf16' if amp else 'fp32'}, align {align}: {first} against {second}: "
                      f"outputs {apart(out_a, out_b)}, weights {apart(weights_a, weights_b)}",
                      flush=True)


def said(counts: dict) -> str:
    return ", ".join(f"{counts[key]} {key if counts[key] == 1 else PLURAL[key]}" for key in SAID)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="cold-then-warm pairs (default 3)")
    parser.add_argument("--at_least", type=float, default=3.0,
                        help="the least cold / warm ratio each pair must reach (default 3)")
    parser.add_argument("--same_numbers", action="store_true",
                        help="compare the compiled sum's numbers with ShortcutSum's instead")
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the runs' folders and logs here (default: a temporary folder, "
                             "removed at the end)")
    args, flags = parser.parse_known_args()  # the rest goes to train.py
    if args.pairs < 1:
        parser.error("--pairs must be 1 or more")
    if args.same_numbers:
        same_numbers()
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="warm_compile-"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    machine = platform.processor() or platform.machine()
    print(f"benchmarks/fast.py single_gpu {' '.join(RUN + flags)} --compile, cold then warm in "
          f"fresh processes; torch {torch.__version__}, {machine}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    pairs, met = [], True
    try:
        for pair in range(1, args.pairs + 1):
            cache = out / f"cache{pair}"
            shutil.rmtree(cache, ignore_errors=True)  # empty: the first run of the pair is cold
            cold, cold_said = compile_run(f"cold{pair}", cache, out, flags)
            warm, warm_said = compile_run(f"warm{pair}", cache, out, flags)
            ratio = cold / warm
            short = [why for why, failed in (("the warm run bypassed the cache",
                                              warm_said["bypass"] > 0),
                                             (f"under {args.at_least:g}x", ratio < args.at_least))
                     if failed]
            met &= not short
            pairs.append((cold, warm, ratio))
            print(f"pair {pair}: cold {cold:.1f} s ({said(cold_said)}), warm {warm:.1f} s "
                  f"({said(warm_said)}): {ratio:.1f}x{''.join(f'; {why}' for why in short)}",
                  flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    cold, warm, ratio = (statistics.median(column) for column in zip(*pairs))
    print(f"median of {len(pairs)}: cold {cold:.1f} s, warm {warm:.1f} s, {ratio:.1f}x")
    print(f"target (every warm run: no bypass, at least {args.at_least:g}x faster than its cold "
          f"run): {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

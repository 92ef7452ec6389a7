"""compare.py with fsdp: its runs in the matrix and their command lines, its rows in the report, and
the projections of its traffic, its scaling and its memory beside DDP's. Everything here is
in-process and takes seconds: the flags are resolved, the runs planned and the report rendered from
outcomes built here (as fill_rows makes them of the runs' results.json); no train.py is started.
That fsdp/train.py runs, on the CPU over gloo, is tested with it."""
from __future__ import annotations

import sys

import pytest
import torch
import torchvision
from torch import nn

import compare
from comparison.matrix import PlannedRun, check_runs, command, plan, run_flags
from comparison.model_shapes import PyramidNetShape
from comparison.projection import (ASSUMED_GPU_BYTES, FABRICS, Fabric, ModelSize, Unit,
                                   bytes_sent_per_gpu, fsdp_exposed, fsdp_projected_efficiency,
                                   fsdp_units, gradient_bytes, memory_per_gpu, memory_projection,
                                   model_size, ring_gather_seconds)
from comparison.report.measured import groups
from comparison.report.outcome import Outcome
from comparison.report.projection_memory import memory_section
from comparison.report.projection_scaling import projection_inputs, projection_section
from comparison.report.results_table import table_row
from comparison.report.rows import fill_rows
from conftest import REPO


def pyramidnet(depth: int, alpha: float, block: str) -> nn.Module:
    """PyramidNet's shapes for CIFAR-10 (the layers models/pyramidnet.py builds), on the meta device
    where it is built."""
    return PyramidNetShape(depth, alpha, block, 10, 3)

FOUR = ("single_gpu", "data_parallel", "dist_parallel", "fsdp")


@pytest.fixture
def gpus(monkeypatch):
    """have(count): this process believes it has `count` CUDA GPUs (0: none), so compare.configure
    resolves for them."""
    def have(count: int):
        monkeypatch.setattr(compare.torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(compare.torch.cuda, "device_count", lambda: count)
    return have


# --- the matrix
# ------------------------------------------------------------------------------------------------

PIPE = ("pipeline_parallel",)  # on two GPUs or more, or two CPU processes


@pytest.mark.parametrize("count, modes", [(0, FOUR[:3] + PIPE), (1, FOUR[:3]), (2, FOUR + PIPE),
                                          (8, FOUR + PIPE)])
def test_fsdp_is_a_default_mode_from_two_gpus_on(gpus, count, modes):
    gpus(count)
    assert compare.configure([])[0].modes == modes


def test_fsdp_is_planned_like_dist_parallel_for_each_count_backend_and_reshard_setting():
    runs = plan(FOUR, (1, 2), ("nccl", "gloo"), (None,), (False,), 1, cuda=True, batch_size=64,
                batch_per_gpu=None, reshards=(True, False))
    assert [r.name for r in runs] == [
        "01-single_gpu-1gpu-r1", "02-data_parallel-1gpu-r1", "03-dist_parallel-1gpu-nccl-r1",
        "04-dist_parallel-1gpu-gloo-r1", "05-fsdp-1gpu-nccl-r1", "06-fsdp-1gpu-nccl-zero2-r1",
        "07-fsdp-1gpu-gloo-r1", "08-fsdp-1gpu-gloo-zero2-r1", "09-data_parallel-2gpu-r1",
        "10-dist_parallel-2gpu-nccl-r1", "11-dist_parallel-2gpu-gloo-r1", "12-fsdp-2gpu-nccl-r1",
        "13-fsdp-2gpu-nccl-zero2-r1", "14-fsdp-2gpu-gloo-r1", "15-fsdp-2gpu-gloo-zero2-r1"]
    assert {r.reshard_after_forward for r in runs if r.mode != "fsdp"} == {None}
    assert len({r.setting for r in runs}) == len(runs)  # reshard on and off are two configurations
    assert runs[5].describe() == "fsdp on 1 GPU (nccl, no reshard after forward (ZeRO-2))"
    assert runs[11].describe() == "fsdp on 2 GPUs (nccl, reshard after forward (ZeRO-3))"
    # SyncBatchNorm is dist_parallel's: asking for it adds dist_parallel runs only
    sync = plan(("fsdp", "dist_parallel"), (2,), ("nccl",), (None,), (False, True), 1, True, 64,
                None)
    assert [r.name for r in sync] == ["01-dist_parallel-2gpu-nccl-r1",
                                      "02-dist_parallel-2gpu-nccl-syncbn-r1",
                                      "03-fsdp-2gpu-nccl-r1"]


def test_fsdp_on_the_cpu_when_asked_for(gpus):
    gpus(0)
    cc, train, group_flags, cuda = compare.configure(["--modes", "fsdp", "--reshard_after_forward",
                                                      "off"])
    runs = plan(cc.modes, cc.gpu_counts, cc.backends, cc.amp, [False], 1, cuda, 32, None,
                [s == "on" for s in cc.reshard_after_forward])
    assert [r.name for r in runs] == ["01-fsdp-2cpu-gloo-zero2-r1"]


def test_an_fsdp_run_is_launched_under_torchrun_with_its_own_flags(gpus, tmp_path):
    """--dist_timeout goes to dist_parallel, fsdp and pipeline_parallel, --bucket_cap_mb to
    dist_parallel only (FSDP has no buckets); fsdp's flags are read by fsdp/train.py's own parser
    before anything starts."""
    gpus(4)
    cc, train, group_flags, cuda = compare.configure(["--modes", "dist_parallel", "fsdp",
                                                      "--gpu_counts", "4", "--backends", "nccl",
                                                      "--reshard_after_forward", "on", "off",
                                                      "--bucket_cap_mb", "50", "--dist_timeout",
                                                      "30"])
    assert group_flags == {"dist_parallel": ["--bucket_cap_mb", "50", "--dist_timeout", "30"],
                           "fsdp": ["--dist_timeout", "30"],
                           "pipeline_parallel": ["--dist_timeout", "30"]}
    runs = plan(cc.modes, cc.gpu_counts, cc.backends, cc.amp, [False], 1, cuda, 64, None,
                [True, False])
    check_runs(runs, ["--benchmark"], group_flags, tmp_path, cuda)
    ddp, zero3, zero2 = (command(r, run_flags(r, ["--benchmark"], group_flags, tmp_path, cuda))
                         for r in runs)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                "4"]
    assert zero2 == [*torchrun, str(REPO / "fsdp" / "train.py"), "--benchmark", "--batch_size",
                     "64", "--log_dir", str(tmp_path), "--run_name", "03-fsdp-4gpu-nccl-zero2-r1",
                     "--dist_timeout", "30", "--backend", "nccl", "--no-reshard_after_forward"]
    assert (zero3[-4:] == ["--dist_timeout", "30", "--backend", "nccl"]
            and "--bucket_cap_mb" in ddp)
    self_launch = command(runs[2], run_flags(runs[2], [], group_flags, tmp_path, cuda),
                          self_launch=True)
    assert self_launch[:2] == [sys.executable, str(REPO / "fsdp" / "train.py")]
    assert self_launch[-3:] == ["--no-reshard_after_forward", "--nproc_per_node", "4"]
    with pytest.raises(compare.UsageError, match="fsdp/train.py refuses the flags of fsdp on 4 "
                                                 "GPUs .*unrecognized arguments: --bucket_cap_mb"):
        # fsdp/train.py has no buckets
        check_runs(runs[1:], [], {"fsdp": ["--bucket_cap_mb", "50"]}, tmp_path, cuda)


# --- traffic and the FSDP step
# ------------------------------------------------------------------------------------

def test_fsdp_moves_one_and_a_half_times_ddps_bytes_resharding_and_as_many_without():
    P = G = 100e6
    assert bytes_sent_per_gpu(P, G, 8, "dist_parallel") == pytest.approx(2 * 7 / 8 * G)
    assert bytes_sent_per_gpu(P, G, 8, "fsdp", reshard=True) == pytest.approx(3 * 7 / 8 * P)
    for n in (2, 4, 8, 64):
        ddp = bytes_sent_per_gpu(P, G, n, "dist_parallel")
        assert bytes_sent_per_gpu(P, G, n, "fsdp", True) == pytest.approx(1.5 * ddp)
        assert bytes_sent_per_gpu(P, G, n, "fsdp", False) == pytest.approx(ddp)
    assert bytes_sent_per_gpu(P, G, 1, "fsdp") == 0.0
    # an all-gather (or reduce-scatter) of 1 GB over 8 ranks: each sends 7/8
    # GB at 100 GB/s, in 7 ring steps
    fabric = Fabric("test", "", 100.0, 2.0, (8,), "")
    assert ring_gather_seconds(1e9, 8, fabric) == \
        pytest.approx(7 / 8 * 0.01 + (8.4 + 7 * 2.0) * 1e-6)
    assert ring_gather_seconds(1e9, 1, fabric) == 0.0


# equal shares of bytes and FLOPs
TWO_UNITS = [Unit("root", 4_000_000, 10), Unit("layer1.0", 4_000_000, 10)]


def test_the_fsdp_timeline_hides_what_the_compute_covers():
    """A 0.3 s step over two equal units: 0.05 s of forward and 0.1 s of backward each.
    Every collective takes c. On a fast link only the first forward all-gather, the
    first backward all-gather (resharding) and the last reduce-scatter are exposed; on a
    slow one the six collectives run back to back and only the second unit's forward
    compute is not under one of them."""
    fast = Fabric("fast", "", 1000.0, 0.0, (8,), "")
    c = ring_gather_seconds(4_000_000, 8, fast)
    assert fsdp_exposed(0.3, TWO_UNITS, 8, fast, reshard=True) == pytest.approx(3 * c)
    assert fsdp_exposed(0.3, TWO_UNITS, 8, fast, reshard=False) == pytest.approx(2 * c)
    slow = Fabric("slow", "", 0.01, 0.0, (8,), "")
    c = ring_gather_seconds(4_000_000, 8, slow)
    assert c > 0.3
    assert fsdp_exposed(0.3, TWO_UNITS, 8, slow, reshard=True) == pytest.approx(6 * c + 0.05 - 0.3)
    assert fsdp_exposed(0.3, TWO_UNITS, 1, slow) == 0.0
    # one process: FSDP's own overhead is all there is; more GPUs and slower links only cost
    assert fsdp_projected_efficiency(0.1, 0.104, TWO_UNITS, 1, slow) == pytest.approx(0.1 / 0.104)


def test_fsdp_units_are_the_residual_blocks_and_the_root_with_their_flops():
    """PyramidNet-8 α=12: one basic block per stage, widths 20, 24, 28. Block 1 sees 32x32 images:
    two 3x3 convolutions, 16 -> 20 and 20 -> 20 channels, 2 FLOPs a multiply-add; the root is the
    stem (3 -> 16) and the classifier (28 -> 10)."""
    with torch.device("meta"):
        model = pyramidnet(8, 12, "basic")
    units = fsdp_units(model, 3, 32)
    assert [u.name for u in units] == ["root", "layer1.0", "layer2.0", "layer3.0"]
    assert units[1].flops == 2 * 9 * 32 * 32 * (16 * 20 + 20 * 20)
    assert units[0].flops == 2 * 9 * 32 * 32 * 3 * 16 + 2 * 28 * 10
    assert sum(u.param_bytes for u in units) == sum(gradient_bytes(model))
    assert units[1].param_bytes == 4 * sum(p.numel() for p in model.layer1.parameters())
    with torch.device("meta"):
        units = fsdp_units(pyramidnet(56, 84, "basic"), 3, 32)
    step = 0.005  # a fast GPU's step: communication matters
    for fabric in FABRICS:
        n = fabric.gpu_counts[-1]
        zero3, zero2 = (fsdp_projected_efficiency(step, step, units, n, fabric, r)
                        for r in (True, False))
        assert zero3 <= zero2 < 1  # fewer collectives on the same stream never cost more
    nvlink, pcie, _ = FABRICS
    assert fsdp_projected_efficiency(step, step, units, 8, pcie) < \
        fsdp_projected_efficiency(step, step, units, 8, nvlink)


# --- memory
# --------------------------------------------------------------------------------------------------

# a root and 8 blocks
SIZE = ModelSize(alpha=1, units=(40_000, *[120_000] * 8), autocast_cast=900_000)


def test_the_model_state_per_gpu_is_replicated_by_ddp_and_sharded_by_fsdp():
    total = lambda *args, **kwargs: sum(memory_per_gpu(SIZE, *args, **kwargs).values())  # noqa: E731
    assert SIZE.parameters == 1_000_000
    assert total(8, "dist_parallel") == 12_000_000  # parameters, gradients, momentum: 4 bytes each
    assert total(8, "dist_parallel", momentum=False) == 8_000_000
    # autocast's 2-byte weight copies
    assert total(8, "dist_parallel", amp="bf16") == 12_000_000 + 1_800_000
    # a quarter each, plus, gathered at the peak (in backward): the root's parameters and
    # gradients, the computing block's parameters and gradients and the next block's
    # parameters, 4 bytes each: 4 x (80k + 360k)
    assert memory_per_gpu(SIZE, 4, "fsdp") == {"parameters": 1e6, "gradients": 1e6, "momentum": 1e6,
                                               "gathered": 1.76e6, "autocast copies": 0.0}
    # without resharding, the last block's backward: every parameter, the
    # root's and that block's gradients
    assert total(4, "fsdp", reshard=False) == 3e6 + 4 * (1_000_000 + 40_000 + 120_000)
    assert total(4, "fsdp", amp="fp16") == 3e6 + 1.76e6 + 1.8e6  # the copies are not sharded
    assert total(1, "fsdp") > total(1, "dist_parallel")  # on one GPU FSDP only adds


def linears(alpha: float) -> nn.Module:
    """A stand-in model whose sizes are known: eight units (layer1.0 to layer1.7),
    each an alpha x alpha matrix."""
    width = int(alpha)
    model = nn.Module()
    model.layer1 = nn.Sequential(*[nn.Linear(width, width, bias=False, device="meta")
                                   for _ in range(8)])
    return model


def test_where_fsdp_lets_a_model_fit_that_ddp_cannot():
    """Eight a x a blocks (no root), fp32, momentum, no autocast, against 96 MB: DDP needs 96
    a^2 bytes, so it fits up to a = 1000 exactly. FSDP on N GPUs: 96 a^2 / N plus 12 a^2
    gathered (two blocks and one block's gradients), or 36 a^2 without resharding (every
    parameter and one block's gradients). On 64 GPUs that is 13.5 a^2 (a up to 2666) and 37.5
    a^2 (a up to 1600, exactly 96 MB)."""
    projection = memory_projection(linears, 1000, "off", True, 96_000_000)
    assert model_size(linears(1000), 1000) == ModelSize(1000, (0, *[1_000_000] * 8), 8_000_000)
    assert (projection["crossover"].alpha == 1001
            and projection["crossover"].parameters == 8 * 1001**2)
    assert projection["fsdp_gpus"] == {True: 2, False: 2}
    assert (projection["fsdp_limit"][True].alpha == 2666
            and projection["fsdp_limit"][False].alpha == 1600)
    assert [size.alpha for size in projection["models"]] == [1000, 2000, 4000, 8000, 16000]
    assert projection["gpu_bytes"] == 96_000_000 and not projection["assumed"]
    assumed = memory_projection(linears, 1000, "off", True, None)
    assert assumed["assumed"] and assumed["gpu_bytes"] == ASSUMED_GPU_BYTES == 80 * 2**30


# --- the report
# --------------------------------------------------------------------------------------------------

def outcomes() -> list[Outcome]:
    """A GPU comparison's outcomes: single_gpu at 100 ms (peak 3 GiB), DDP on 2 GPUs, fsdp on 1 and
    on 2 GPUs resharding, on 2 without; bf16, 64 images per GPU."""
    settings = [("single_gpu", 1, None, None, 0.100), ("dist_parallel", 2, "nccl", None, 0.110),
                ("fsdp", 1, "nccl", True, 0.104), ("fsdp", 2, "nccl", True, 0.120),
                ("fsdp", 2, "nccl", False, 0.112)]
    made = []
    for index, (mode, gpus, backend, reshard, step_s) in enumerate(settings, 1):
        run = PlannedRun(mode, gpus, backend, None, False, 64 * gpus, 1, index, "gpu",
                         reshard_after_forward=reshard)
        results = {"summary": {"images_per_sec": 64 * gpus / step_s, "batch_time_p50": step_s},
                   "config": {"batch_size": 64 * gpus, "amp": "bf16"},
                   "peak_mem_gb_per_gpu": {"0": [3.0, 3.2]} if mode == "single_gpu" else None}
        made.append(Outcome(run, "ok", results=results))
    fill_rows(made, REPO)
    return made


def test_the_report_has_fsdp_rows_with_their_reshard_setting_and_autocast():
    made = outcomes()
    rows = [table_row(group, made) for group in groups(made)]
    assert [row.split(" | ")[:4] for row in rows] == [
        ["| single_gpu", "1", "—", "bf16 autocast"],
        ["| dist_parallel", "2", "nccl", "bf16 autocast"],
        ["| fsdp", "1", "nccl, reshard", "bf16 autocast"],
        ["| fsdp", "2", "nccl, reshard", "bf16 autocast"],
        ["| fsdp", "2", "nccl, no reshard", "bf16 autocast"]]
    # 128 images / 120 ms against single_gpu's 640 images/s
    assert "| 1,067 | 1.67× | 83 % |" in rows[3]
    assert [o.row["reshard_after_forward"] for o in outcomes()] == [None, None, True, True, False]


def test_the_projection_section_projects_fsdp_from_its_one_process_step():
    made = outcomes()
    with torch.device("meta"):
        model = pyramidnet(20, 24, "basic")
    units, grads = fsdp_units(model, 3, 32), gradient_bytes(model)
    inputs = projection_inputs(made, grads, 25.0, units)
    assert inputs["fsdp1_step_s"] == {True: pytest.approx(0.104)} and inputs["ddp1_step_s"] is None
    report = "\n".join(projection_section(made, inputs, True, "NVLink"))
    assert "one-process fsdp step (104.0 ms reshard)" in report
    megabytes = sum(grads) / 1e6
    assert "| FSDP, reshard: all-gather in forward and in backward, reduce-scatter, " \
           f"(N−1)/N × (2P + G) | {1.5 * megabytes:,.1f} |" in report
    nvlink = FABRICS[0]
    projected = {r: fsdp_projected_efficiency(0.100, 0.104 if r else 0.100, units, 2, nvlink, r)
                 for r in (True, False)}
    assert f"| NVLink | reshard | {projected[True]:.0%} |" in report
    assert f"| NVLink | no reshard | {projected[False]:.0%} |" in report
    measured = {line.split(" | ")[0]: line for line in report.splitlines() if "fsdp-2gpu" in line}
    # 1.67x on 2 GPUs
    assert measured["| 04-fsdp-2gpu-nccl-r1"].endswith(f"| 83% | {projected[True]:.0%} |")
    assert measured["| 05-fsdp-2gpu-nccl-zero2-r1"].endswith(f"| {projected[False]:.0%} |")


def test_the_memory_section_labels_the_projection_and_estimates_the_activations():
    memory = memory_projection(linears, 1000, "off", True, 96_000_000)
    made = [o for o in outcomes() if o.run.mode == "single_gpu"]
    made[0].row["amp"] = "off"
    lines = memory_section(memory, made, "1× Test GPU")
    text = "\n".join(lines)
    assert "**A projection, not a measurement" in text and "**Activations are left out**" in text
    assert "here 91.6 MiB (1× Test GPU)" in text  # 96 MB in MiB
    row = next(line for line in lines if line.startswith("| α=1000 (the runs') | 8.00M | DDP |"))
    assert row.count("91.6 MiB |") == 7  # 96 a^2 bytes replicated: just fits, on every count
    zero3 = lines[lines.index(row) + 1]
    # 96/N + 12 MB
    assert zero3.startswith("|  |  | FSDP, reshard | 103 MiB ✗ | 57.2 MiB | 34.3 MiB |")
    assert "| α=2000 (×2) | 32.0M | DDP | 366 MiB ✗ |" in text
    assert ("from α=1001 (8.02M parameters) DDP's model state outgrows one GPU's 91.6 "
            "MiB; FSDP holds that model on 2 GPUs resharding (57.3 MiB each), and on 2 "
            "GPUs without resharding") in text
    assert ("up to α=2666 (56.9M parameters, 2.7× the runs' α) resharding, and α=1600 "
            "(20.5M parameters) without") in text
    # single_gpu's 3 GiB peak less its 96 MB model state
    assert ("single_gpu's measured peak, 3.0 GiB at 64 images per GPU, is 2.9 "
            "GiB above its model state" in text)
    assert "not here" in "\n".join(memory_section(memory, [], None))


def test_the_memory_section_leaves_out_what_says_nothing():
    """Against 2 TB: the models to 8x wide take under 1 % of it in every setting, and are one
    sentence; DDP would outgrow it only past 100B parameters, a model of the family nobody trains,
    so no crossover width is stated."""
    lines = memory_section(memory_projection(linears, 1000, "off", True, 2 * 10**12), [],
                           "1× Huge GPU")
    text = "\n".join(lines)
    assert ("The runs' model, α=1000 (8.00M parameters), needs 91.6 MiB per GPU under DDP "
            "(weights, gradients and optimizer state): the figure report.md's recommendation "
            "weighs.") in text
    assert ("The models from α=1000 (8.00M parameters, the runs') to α=8000 (512M parameters, ×8) "
            "need at most 7.9 GiB per GPU in any setting, DDP or FSDP on 1 to 64 GPUs (α=8000 "
            "under FSDP without resharding on 1 GPU, which holds what it gathers beside its "
            "shard)") in text and "the table leaves them out" in text
    assert [line.split(" | ")[0] for line in lines if line.startswith("| α=")] == \
        ["| α=16000 (×16)"]
    assert ("DDP's model state fits one GPU's 1.8 TiB for any model of this "
            "family up to 100B parameters" in text)
    assert "Where FSDP lets a model fit" not in text


# --- any model: torchvision's
# --------------------------------------------------------------------------------------

def test_any_models_fsdp_units_are_its_repeated_blocks_and_its_memory_projected_without_a_sweep():
    """ResNet-18: eight BasicBlocks and the root (stem, classifier), FLOPs counted at 32x32 (a batch
    of two, so that BatchNorm on the last 1x1 maps has two values a channel). ViT-B/16: twelve
    encoder blocks, its classifier with the root (a Linear as its MLPs' layers are, but those inside
    the blocks do not count: fsdp/train.py's rule); autocast's copies count the attention's input
    projections beside the linear layers and the patch convolution. ResNet-18's memory: the runs'
    model only, no width to sweep. Against a 100 MB GPU DDP's 134 MiB do not fit; FSDP's shards do
    from 4 GPUs resharding (layer4's two blocks, 3.7M and 4.7M parameters, gathered with one's
    gradients, take about 50 MiB), from 8 without."""
    with torch.device("meta"):
        resnet = torchvision.models.resnet18()
        vit = torchvision.models.vit_b_16(image_size=32)
    units = fsdp_units(resnet, 3, 32)
    assert [u.name for u in units] == \
        ["root", *[f"layer{s}.{i}" for s in (1, 2, 3, 4) for i in (0, 1)]]
    assert (sum(u.param_bytes for u in units) == sum(gradient_bytes(resnet))
            and all(u.flops > 0 for u in units))
    assert [u.name for u in fsdp_units(vit, 3, 32)] == \
        ["root", *[f"encoder.layers.encoder_layer_{i}" for i in range(12)]]
    cast = sum(p.numel() for m in vit.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear, nn.MultiheadAttention))
               for p in m.parameters(recurse=False))
    linear = sum(p.numel() for m in vit.modules() if isinstance(m, nn.Linear)
                 for p in m.parameters(recurse=False))
    assert model_size(vit).autocast_cast == cast > linear
    memory = {**memory_projection(lambda alpha: resnet, None, "off", True, 100_000_000),
              "name": "resnet18"}
    assert not memory["sweep"] and [size.alpha for size in memory["models"]] == [None]
    assert memory["runs_fsdp_gpus"] == {True: 4, False: 8} and memory["crossover"] is None
    text = "\n".join(memory_section(memory, [], "1× Test GPU"))
    assert ("(the runs' model, resnet18, built on the meta device; no wider models: only "
            "PyramidNet has a width" in text)
    assert "| resnet18 (the runs') | 11.7M | DDP | 134 MiB ✗ |" in text and "α=" not in text
    assert ("**Where FSDP lets a model fit that DDP cannot:** DDP's model state of "
            "resnet18 (11.7M parameters) takes 134 MiB per GPU, more than one GPU's 95.4 "
            "MiB; FSDP holds it on 4 GPUs resharding (87.5 MiB each) and on 8 GPUs without "
            "resharding (81.3 MiB each).") in text

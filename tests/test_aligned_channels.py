"""--align_channels: every activation stored at a channel count rounded up to a multiple of N,
the extra channels exactly zero, while the model stays the paper's: the same parameters,
state_dict, FLOPs and checkpoints, and on the CPU in fp32 the same training, bit for bit, in one
process and under FSDP2's sharding."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from common.config import Config, UsageError, parse_config
from common.performance import flops_per_image, resolve_fast_path
from common.state import whole
from comparison.matrix import PlannedRun, check_runs, config_class
from conftest import TINY
from models import pyramidnet
from common.state import load_model_state, load_optimizer_state, model_state, optimizer_state
from models.aligned import (AlignedBatchNorm2d, AlignedConv2d, mask_padded_gradients, paper_shapes,
                            to_paper, weights_nhwc)
from models.pyramidnet import stored

CPU = torch.device("cpu")


def build(align: int, block: str = "basic", depth: int = 8, alpha: float = 12) -> torch.nn.Module:
    torch.manual_seed(0)
    return pyramidnet(depth, alpha, block, align_channels=align)


def sgd(model):
    """SGD as build_optimizer makes it: momentum, Nesterov, weight decay,
    beta's padded gradients masked."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                weight_decay=1e-4)
    mask_padded_gradients(model, optimizer)
    return optimizer


def padded_outputs(model) -> list[torch.Tensor]:
    """Forward hooks on every block and BatchNorm: their outputs' padded
    channels, collected as they run."""
    padded = []

    def keep(module, _inputs, output):
        real = module.num_features if isinstance(module, AlignedBatchNorm2d) else module.bn_real
        padded.append(output[:, real:].detach())

    for module in model.modules():
        if isinstance(module, AlignedBatchNorm2d):
            module.register_forward_hook(keep)
        elif hasattr(module, "residual"):  # a block: its last BatchNorm says its real width
            module.bn_real = list(module.children())[-1].num_features
            module.register_forward_hook(keep)
    return padded


@pytest.mark.parametrize("block, depth, align",
                         [("basic", 8, 8), ("basic", 14, 16), ("bottleneck", 11, 32)])
def test_aligned_training_is_the_unaligned_training_bit_for_bit(block, depth, align):
    """Five fp32 SGD steps (momentum, Nesterov, weight decay) of the aligned and the unaligned model
    from the same weights: every parameter and BatchNorm statistic equal after every step, every
    padded channel exactly zero, and the evaluation's logits equal."""
    plain, aligned = build(0, block, depth), build(align, block, depth)
    assert any(m.stored > m.num_features for m in aligned.modules()
               if isinstance(m, AlignedBatchNorm2d))
    padded = padded_outputs(aligned)
    optimizers = [sgd(plain), sgd(aligned)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        images = torch.randn(16, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (16,), generator=generator)
        for model, optimizer in zip((plain, aligned), optimizers):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
        assert padded and all(not p.any() for p in padded) and any(p.numel() for p in padded)
        padded.clear()
        ours, theirs = aligned.state_dict(), plain.state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    plain.eval()
    aligned.eval()
    images = torch.randn(8, 3, 32, 32, generator=generator)
    assert torch.equal(aligned(images), plain(images))


def test_the_same_model_parameters_state_dict_and_flops():
    """The paper's parameter names, counts and state_dict shapes, whatever is stored padded."""
    plain, aligned = build(0, depth=20, alpha=48), build(8, depth=20, alpha=48)
    assert [name for name, _ in plain.named_parameters()] == \
        [name for name, _ in aligned.named_parameters()]
    shapes = paper_shapes(aligned)
    assert {k: v.shape for k, v in plain.state_dict().items()} == \
        {k: v.shape for k, v in aligned.state_dict().items()}
    assert shapes == {k: v.shape for k, v in plain.state_dict().items()}
    assert sum(p.numel() for p in plain.parameters()) == \
        sum(shapes[n].numel() for n, _ in aligned.named_parameters())
    widths = [m.num_features for m in aligned.modules() if isinstance(m, AlignedBatchNorm2d)]
    assert any(w % 8 for w in widths)  # the paper's widths are mostly not multiples of 8...
    # ...and gamma, beta and the statistics are stored at the padded length
    for m in aligned.modules():
        if isinstance(m, AlignedBatchNorm2d):
            assert m.weight.numel() == \
                m.bias.numel() == m.running_mean.numel() == stored(m.num_features, 8)
            assert not m.weight[m.num_features:].any() and not m.bias[m.num_features:].any()
    convs = [m for m in aligned.modules() if isinstance(m, AlignedConv2d)]
    assert convs and all(m.weight.shape[:2] == (m.out_stored, m.in_stored) for m in convs)
    assert any(m.out_stored > m.out_channels for m in convs)
    cfg = parse_config(Config, [*TINY])
    assert flops_per_image(cfg) == \
        flops_per_image(parse_config(Config, [*TINY, "--align_channels", "8"]))


def test_checkpoints_are_interchangeable_both_ways():
    """A state (weights, running statistics, momentum) saved by either model through
    common/state.py, as a checkpoint holds it, and loaded into the other trains on exactly as the
    model that saved it; the saved tensors have the paper's shapes whichever saved them, with
    channels_last weights and with (out, kh, kw, in) ones."""
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 3, 32, 32, generator=generator),
                torch.randint(0, 10, (16,), generator=generator))
               for _ in range(4)]
    paper = {key: value.shape for key, value in build(0).state_dict().items()}

    def train(model, optimizer, steps, layout):
        for images, labels in steps:
            optimizer.zero_grad(set_to_none=True)
            images = images if layout == "plain" else images.to(memory_format=torch.channels_last)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()

    def built(align, layout):
        model = build(align)
        if layout == "channels_last":
            model = model.to(memory_format=torch.channels_last)
        elif layout == "nhwc":
            weights_nhwc(model)
        return model

    # the weights' layouts within a pair compute alike: an (out, kh, kw, in)
    # weight's view has channels_last strides
    for (first, first_layout), (second, second_layout) in (((8, "plain"), (0, "plain")),
                                                          ((0, "plain"), (8, "plain")),
                                                          ((8, "channels_last"), (8, "nhwc")),
                                                          ((8, "nhwc"), (8, "channels_last"))):
        saver = built(first, first_layout)
        saver_optimizer = sgd(saver)
        train(saver, saver_optimizer, batches[:2], first_layout)
        model, momentum = copy.deepcopy((model_state(saver),
                                         optimizer_state(saver, saver_optimizer)))
        assert {key: value.shape for key, value in model.items()} == paper
        loader = built(second, second_layout)
        loader_optimizer = sgd(loader)
        load_model_state(loader, model)
        load_optimizer_state(loader, loader_optimizer, momentum)
        loaded = copy.deepcopy((model_state(loader), optimizer_state(loader, loader_optimizer)))
        assert all(torch.equal(loaded[0][key], model[key]) for key in model)
        assert all(torch.equal(loaded[1]["state"][i]["momentum_buffer"], buffers["momentum_buffer"])
                   for i, buffers in momentum["state"].items())
        train(saver, saver_optimizer, batches[2:], first_layout)
        train(loader, loader_optimizer, batches[2:], second_layout)
        ours, theirs = loader.state_dict(), saver.state_dict()
        assert all(torch.equal(ours[key], theirs[key]) for key in ours), \
            (first_layout, second_layout, [k for k in ours if not torch.equal(ours[k], theirs[k])])


def test_the_forward_runs_the_unaligned_models_operators():
    """Stored padded, the aligned model pads nothing on the way: its forward's aten operators,
    counted on the CPU, are within 2 % of the unaligned model's (the classifier's slice of the
    real channels is the one extra)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    for align in (0, 8):
        model = build(align, depth=110, alpha=270)
        with torch.no_grad(), Count():
            Count.calls = 0
            model(torch.randn(1, 3, 32, 32))
        counts[align] = Count.calls
    assert counts[8] <= counts[0] * 1.02, counts


def test_the_default_is_8_on_cuda_and_off_on_the_cpu():
    assert resolve_fast_path(parse_config(Config, TINY), CPU).align_channels == 0
    cfg = parse_config(Config, [*TINY, "--align_channels", "16"])
    assert resolve_fast_path(cfg, CPU).align_channels == 16


def test_sync_bn_takes_the_papers_widths_only():
    """SyncBatchNorm replaces the aligned BatchNorm with one of the paper's width: the two are
    refused together in one line, by a train.py and by compare.py before its matrix starts (on a
    GPU, where --align_channels defaults to 8, --sync_bn alone turns it off)."""
    dist_config = config_class("dist_parallel")
    with pytest.raises(UsageError, match="give --align_channels 0"):
        resolve_fast_path(parse_config(dist_config, [*TINY, "--sync_bn", "--align_channels", "8"]),
                          CPU)
    cfg = parse_config(dist_config, [*TINY, "--sync_bn"])
    assert resolve_fast_path(cfg, CPU).align_channels == 0
    # compare.py's matrix
    sync_bn_run = PlannedRun("dist_parallel", 2, "nccl", None, True, 64, 1, unit="gpu")
    with pytest.raises(UsageError, match="give --align_channels 0"):
        check_runs([sync_bn_run], ["--align_channels", "8"], {})


def _two_ranks(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of the process-group test: DDP over the unaligned model and FSDP2 over the
    aligned one, from the same weights, three SGD steps on this rank's share of the same
    batches; rank 0 compares the weights."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        plain, aligned = build(0), build(8)
        replicated = DDP(plain)
        for block in (*aligned.layer1, *aligned.layer2, *aligned.layer3):
            fully_shard(block)
        fully_shard(aligned)
        optimizers = [sgd(plain), sgd(aligned)]
        generator = torch.Generator().manual_seed(3)
        for _ in range(3):
            # this rank's share
            images = torch.randn(2 * 8, 3, 32, 32, generator=generator)[rank::2]
            labels = torch.randint(0, 10, (2 * 8,), generator=generator)[rank::2]
            for model, optimizer in zip((replicated, aligned), optimizers):
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
        theirs = dict(plain.named_parameters())
        same = {name: torch.equal(to_paper(aligned, name, whole(param).detach()),
                                  theirs[name].detach())
                for name, param in aligned.named_parameters()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(same))
    finally:
        dist.destroy_process_group()


def test_fsdp_aligned_trains_ddps_unaligned_weights(tmp_path):
    """On a real 2-process gloo group, FSDP2 over the aligned model ends three steps with
    DDP-over-the-unaligned- model's weights, bit for bit: FSDP2 shards, gathers and
    reduce-scatters the same real-shaped parameters and gradients (the modes' own files train
    alike on the CPU: compare.py --verify)."""
    torch.multiprocessing.spawn(_two_ranks, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)),
                                nprocs=2)
    for rank in range(2):
        same = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert same and all(same.values()), \
            (rank, [name for name, equal in same.items() if not equal])

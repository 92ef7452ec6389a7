"""--align_channels: every activation stored at a channel count rounded up to a multiple of N, the extra channels
exactly zero, while the model stays the paper's: the same parameters, state_dict, FLOPs and checkpoints, and on
the CPU in fp32 the same training, bit for bit, in one process and under FSDP2's sharding."""
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
from models.pyramidnet import AlignedBatchNorm2d, stored

CPU = torch.device("cpu")


def build(align: int, block: str = "basic", depth: int = 8, alpha: float = 12) -> torch.nn.Module:
    torch.manual_seed(0)
    return pyramidnet(depth, alpha, block, align_channels=align)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)


def padded_outputs(model) -> list[torch.Tensor]:
    """Forward hooks on every block and BatchNorm: their outputs' padded channels, collected as they run."""
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


@pytest.mark.parametrize("block, depth, align", [("basic", 8, 8), ("basic", 14, 16), ("bottleneck", 11, 32)])
def test_aligned_training_is_the_unaligned_training_bit_for_bit(block, depth, align):
    """Five fp32 SGD steps (momentum, Nesterov, weight decay) of the aligned and the unaligned model from the same
    weights: every parameter and BatchNorm statistic equal after every step, every padded channel exactly zero,
    and the evaluation's logits equal."""
    plain, aligned = build(0, block, depth), build(align, block, depth)
    assert any(m.stored > m.num_features for m in aligned.modules() if isinstance(m, AlignedBatchNorm2d))
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
    plain, aligned = build(0, depth=20, alpha=48), build(8, depth=20, alpha=48)
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [(n, p.shape) for n, p in aligned.named_parameters()]
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in aligned.state_dict().items()}
    widths = [m.num_features for m in aligned.modules() if isinstance(m, AlignedBatchNorm2d)]
    assert any(w % 8 for w in widths)  # the paper's widths are mostly not multiples of 8...
    assert all(m.running_mean.numel() == stored(m.num_features, 8) for m in aligned.modules()
               if isinstance(m, AlignedBatchNorm2d))  # ...and the statistics are kept at the stored length
    cfg = parse_config(Config, [*TINY])
    assert flops_per_image(cfg) == flops_per_image(parse_config(Config, [*TINY, "--align_channels", "8"]))


def test_checkpoints_are_interchangeable_both_ways():
    """A state (weights, running statistics, momentum) saved by either model and loaded into the other trains on
    exactly as the model that saved it."""
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 3, 32, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator))
               for _ in range(4)]

    def train(model, optimizer, steps):
        for images, labels in steps:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()

    for first, second in ((8, 0), (0, 8)):
        saver = build(first)
        saver_optimizer = sgd(saver)
        train(saver, saver_optimizer, batches[:2])
        loader = build(second)
        loader.load_state_dict(copy.deepcopy(saver.state_dict()))  # as a checkpoint file holds them
        loader_optimizer = sgd(loader)
        loader_optimizer.load_state_dict(copy.deepcopy(saver_optimizer.state_dict()))
        train(saver, saver_optimizer, batches[2:])
        train(loader, loader_optimizer, batches[2:])
        ours, theirs = loader.state_dict(), saver.state_dict()
        assert all(torch.equal(ours[key], theirs[key]) for key in ours), (first, second)


def test_the_default_is_8_on_cuda_and_off_on_the_cpu():
    assert resolve_fast_path(parse_config(Config, TINY), CPU).align_channels == 0
    assert resolve_fast_path(parse_config(Config, [*TINY, "--align_channels", "16"]), CPU).align_channels == 16


def test_sync_bn_takes_the_papers_widths_only():
    """SyncBatchNorm replaces the aligned BatchNorm with one of the paper's width: the two are refused together
    in one line, by a train.py and by compare.py before its matrix starts (on a GPU, where --align_channels
    defaults to 8, --sync_bn alone turns it off)."""
    dist_config = config_class("dist_parallel")
    with pytest.raises(UsageError, match="give --align_channels 0"):
        resolve_fast_path(parse_config(dist_config, [*TINY, "--sync_bn", "--align_channels", "8"]), CPU)
    assert resolve_fast_path(parse_config(dist_config, [*TINY, "--sync_bn"]), CPU).align_channels == 0
    sync_bn_run = PlannedRun("dist_parallel", 2, "nccl", None, True, 64, 1, unit="gpu")  # compare.py's matrix
    with pytest.raises(UsageError, match="give --align_channels 0"):
        check_runs([sync_bn_run], ["--align_channels", "8"], {})


def _two_ranks(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of the process-group test: DDP over the unaligned model and FSDP2 over the aligned one, from the
    same weights, three SGD steps on this rank's share of the same batches; rank 0 compares the weights."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        plain, aligned = build(0), build(8)
        replicated = DDP(plain)
        for block in (*aligned.layer1, *aligned.layer2, *aligned.layer3):
            fully_shard(block)
        fully_shard(aligned)
        optimizers = [sgd(plain), sgd(aligned)]
        generator = torch.Generator().manual_seed(3)
        for _ in range(3):
            images = torch.randn(2 * 8, 3, 32, 32, generator=generator)[rank::2]  # this rank's share
            labels = torch.randint(0, 10, (2 * 8,), generator=generator)[rank::2]
            for model, optimizer in zip((replicated, aligned), optimizers):
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
        theirs = dict(plain.named_parameters())
        same = {name: torch.equal(whole(param).detach(), theirs[name].detach())
                for name, param in aligned.named_parameters()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(same))
    finally:
        dist.destroy_process_group()


def test_fsdp_aligned_trains_ddps_unaligned_weights(tmp_path):
    """On a real 2-process gloo group, FSDP2 over the aligned model ends three steps with DDP-over-the-unaligned-
    model's weights, bit for bit: FSDP2 shards, gathers and reduce-scatters the same real-shaped parameters and
    gradients (the modes' own files train alike on the CPU: compare.py --verify)."""
    torch.multiprocessing.spawn(_two_ranks, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        same = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert same and all(same.values()), (rank, [name for name, equal in same.items() if not equal])

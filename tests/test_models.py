"""--model: PyramidNet or any torchvision classifier through one factory (models/factory.py), and
fsdp/train.py building it as FSDP2 teaches (on the meta device, sharded, each rank's slices filled
from rank 0's weights): on two gloo processes fsdp ends a ResNet's and a ViT's training bit for
bit where dist_parallel ends it."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

from common.config import Config, UsageError, parse_config
from common.data import dataset_info
from conftest import read_results, run_script
from models import model_refusal, on_meta, pyramidnet, repeated_blocks

SMALL = ["--dataset", "synthetic", "--synthetic_size", "64", "--image_size", "32"]


def tiny_vit() -> torch.nn.Module:
    """A ViT of torchvision's own class, small enough for a CPU test:
    two encoder layers of width 32."""
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=32, mlp_dim=64,
                                                num_classes=10)


def test_the_repeated_blocks_are_the_units_fsdp_shards():
    """One small rule finds PyramidNet's and ResNet's residual blocks and ViT's encoder
    layers; a model of plain layers in Sequentials has its layers as units
    (tests/test_blocks.py has the rule's own cases)."""
    kinds = lambda model: Counter(type(block).__name__ for block in repeated_blocks(model))  # noqa: E731
    assert kinds(on_meta(lambda: pyramidnet(20, 48))) == {"BasicBlock": 9}
    assert kinds(on_meta(lambda: pyramidnet(11, 48, "bottleneck"))) == {"Bottleneck": 3}
    assert kinds(on_meta(lambda: torchvision.models.resnet18(num_classes=10))) == {"BasicBlock": 8}
    assert kinds(on_meta(lambda: torchvision.models.resnet50(num_classes=10))) == {"Bottleneck": 16}
    assert kinds(on_meta(lambda: torchvision.models.vit_b_16(num_classes=10))) == \
        {"EncoderBlock": 12}
    assert kinds(on_meta(lambda: torchvision.models.vgg11(num_classes=10))) == \
        {"Conv2d": 8, "Linear": 3}


def test_a_constructor_that_computes_on_tensors_is_built_on_the_meta_device_too():
    """RegNet's constructor calls .tolist() on tensors, which the meta device cannot
    answer: it is built on the CPU with each tensor moved to the meta device as it
    is registered (no memory kept)."""
    model = on_meta(lambda: torchvision.models.regnet_x_400mf(num_classes=10))
    assert all(param.device.type == "meta" for param in model.parameters())


@pytest.mark.parametrize("argv, message", [
    (["--model", "resnt18"], "--model must be pyramidnet or a classification model torchvision "
                             "lists (the closest: resnet18"),
    (["--model", "resnet18", "--align_channels", "8"], "--align_channels 8 stores "
                                                       "PyramidNet's channels padded"),
])
def test_a_bad_model_is_one_line(argv, message):
    from common.performance import resolve_fast_path

    with pytest.raises(UsageError) as refused:
        resolve_fast_path(parse_config(Config, [*SMALL, *argv]), torch.device("cpu"))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "mnist", "--model", "resnet18"], "--model resnet18 takes 3-channel images "
                                                    "and --dataset mnist has 1"),
    ([*SMALL, "--model", "alexnet"], "--model alexnet cannot take 32x32 images (Given input size"),
    ([*SMALL[:-1], "40", "--model", "vit_b_16"], "--model vit_b_16 cannot take 40x40 images"),
])
def test_a_model_that_cannot_take_the_images_says_what_to_give(argv, message):
    cfg = parse_config(Config, argv)
    refusal = model_refusal(cfg, dataset_info(cfg))
    assert refusal.startswith(message) and ("--image_size" in refusal
                                            or "--model pyramidnet" in refusal)


def test_a_torchvision_model_trains_and_reports_its_size(tmp_path):
    """single_gpu trains resnet18 on 32x32 synthetic images; results.json has
    its parameter count and FLOPs."""
    done = run_script("single_gpu/train.py", *SMALL, "--model", "resnet18", "--batch_size", "16",
                      "--max_steps", "2", "--log_dir", tmp_path, "--run_name", "r", "--no_progress")
    assert done.returncode == 0, done.stderr
    summary = read_results(tmp_path / "r")["summary"]
    assert summary["parameters"] == \
        sum(p.numel() for p in torchvision.models.resnet18(num_classes=10).parameters())
    # resnet18 at 32 px: 0.56 GMAC forward, x3 with backward
    assert 0.1e9 < summary["flops_per_image"] < 1e9


def _two_ranks(rank: int, init_file: str, out_dir: str, model_name: str) -> None:
    """One rank: dist_parallel's get_model and fsdp's (each file's own), the same config,
    three SGD steps on this rank's share of the same batches; rank 0 writes whether FSDP's
    gathered weights equal DDP's."""
    import dist_parallel.train as ddp_train
    import fsdp.train as fsdp_train
    from common.optim import build_optimizer
    from common.state import model_state

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # a ViT small enough for the CPU, built by each file's build_model call
        if model_name == "tiny_vit":
            for module in (ddp_train, fsdp_train):
                module.build_model = lambda cfg, data: tiny_vit()
        argv = [*SMALL, "--model", "vit_b_16" if model_name == "tiny_vit" else model_name]
        built = []  # (the model to call, the unwrapped one, its optimizer), DDP's then FSDP's
        for module, config in ((ddp_train, ddp_train.DistConfig),
                               (fsdp_train, fsdp_train.FsdpConfig)):
            torch.manual_seed(0)  # as train.py seeds before the model
            cfg = parse_config(config, argv)
            model, raw_model = module.get_model(cfg, torch.device("cpu"))
            built.append((model, raw_model, build_optimizer(raw_model, cfg, torch.device("cpu"))))
        generator = torch.Generator().manual_seed(3)
        for _ in range(3):
            images = torch.randn(8, 3, 32, 32, generator=generator)[rank::2]  # this rank's share
            labels = torch.randint(0, 10, (8,), generator=generator)[rank::2]
            for model, _, optimizer in built:
                model.train()
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
        theirs, ours = built[0][1].state_dict(), model_state(built[1][1])
        if rank == 0:
            same = {key: torch.equal(ours[key], theirs[key]) for key in theirs}
            Path(out_dir, f"{model_name}.json").write_text(json.dumps(same))
    finally:
        dist.destroy_process_group()


# ViT in the fast tier; the ResNet, the longer launch, in the second
@pytest.mark.parametrize("model_name", [pytest.param("resnet18", marks=pytest.mark.second_tier),
                                        "tiny_vit"])
def test_fsdp_built_on_meta_ends_where_ddp_ends(model_name, tmp_path):
    """On a real 2-process gloo group, fsdp/train.py's model (built on the meta device, its repeated
    blocks sharded, each rank's slices filled from rank 0's whole model) and
    dist_parallel/train.py's (DDP over a whole model on every rank) end three SGD steps on the same
    batches with the same weights, bit for bit."""
    torch.multiprocessing.spawn(_two_ranks,
                                args=(str(tmp_path / "rendezvous"), str(tmp_path), model_name),
                                nprocs=2)
    same = json.loads((tmp_path / f"{model_name}.json").read_text())
    assert same and all(same.values()), [key for key, equal in same.items() if not equal]

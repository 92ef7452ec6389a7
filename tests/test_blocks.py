"""fsdp/train.py's repeated_blocks: the blocks FSDP shards one at a time, found by one rule for
any model: a child of a Sequential or ModuleList that holds weights, inside no other block, whose
class another block shares. Every model here is built on the meta device: the rule reads the
structure only."""
from __future__ import annotations

import torch
import torchvision
from torch import nn

from benchmarks.aligned import fast_pyramidnet
from benchmarks.fast import train_file
from pyramidnet import PyramidNet

repeated_blocks = train_file("fsdp").repeated_blocks
def block_names(model: nn.Module) -> list[str]:
    blocks = {id(block) for block in repeated_blocks(model)}
    return [name for name, module in model.named_modules() if id(module) in blocks]


def test_pyramidnets_blocks_are_its_residual_blocks_one_per_stage_or_many():
    with torch.device("meta"):
        tiny, full = PyramidNet(8, 12, "basic"), fast_pyramidnet(110, 270, "basic", align=8)
    # one per stage: repeated across the stages
    assert block_names(tiny) == ["layer1.0", "layer2.0", "layer3.0"]
    assert block_names(full) == [f"layer{stage}.{i}" for stage in (1, 2, 3) for i in range(18)]
    # fsdp/train.py's units, in order
    assert repeated_blocks(full) == [*full.layer1, *full.layer2, *full.layer3]


def test_resnets_blocks_are_its_basic_blocks_with_their_downsample_inside():
    with torch.device("meta"):
        model = torchvision.models.resnet18()
    assert block_names(model) == [f"layer{stage}.{i}" for stage in (1, 2, 3, 4) for i in (0, 1)]
    assert {type(block).__name__ for block in repeated_blocks(model)} == {"BasicBlock"}


def test_vits_blocks_are_its_encoder_blocks_and_its_classifier_is_the_roots():
    """Linear layers repeat inside every EncoderBlock's MLP, and once in the heads: inside blocks
    they do not count, so the head, alone outside them, stays with the root (with the patch
    embedding and the class token)."""
    with torch.device("meta"):
        model = torchvision.models.vit_b_16()
    assert block_names(model) == [f"encoder.layers.encoder_layer_{i}" for i in range(12)]


def test_a_model_with_nothing_repeated_has_no_blocks():
    """FSDP then shards it as one unit, the root; a repeated class without
    parameters (ReLU) is no block."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.ReLU(), nn.Flatten(), nn.Linear(8, 10))
    assert repeated_blocks(model) == []

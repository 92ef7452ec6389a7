"""models/pyramidnet.py, the file a train.py imports beside it: shapes, the paper's parameter
counts, the block structure, the shortcut and the init."""
from __future__ import annotations

import functools
import importlib.util
import math

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from conftest import REPO

# models/pyramidnet.py as a train.py imports it: by itself, beside the file (no `models` package)
_spec = importlib.util.spec_from_file_location("pyramidnet", REPO / "models" / "pyramidnet.py")
PYRAMIDNET = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(PYRAMIDNET)
BasicBlock, Bottleneck = PYRAMIDNET.BasicBlock, PYRAMIDNET.Bottleneck
PyramidNet = PYRAMIDNET.PyramidNet


def pyramidnet(depth=110, alpha=270, block="basic", num_classes=10, in_channels=3) -> PyramidNet:
    return PyramidNet(depth, alpha, block, num_classes, in_channels)


def residual_of(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The block's residual branch alone: its output with the shortcut left out."""
    shortcut_added = PYRAMIDNET.shortcut_added
    PYRAMIDNET.shortcut_added = lambda residual, x, stride: residual
    try:
        return block(x)
    finally:
        PYRAMIDNET.shortcut_added = shortcut_added

TINY_BASIC = dict(depth=8, alpha=12, block="basic")  # one basic block per stage
TINY_BOTTLENECK = dict(depth=11, alpha=12, block="bottleneck")  # one bottleneck block per stage


def trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@functools.lru_cache(maxsize=1)
def default_model() -> PyramidNet:
    """PyramidNet-110 alpha=270 (the default), built once for the tests that read it."""
    torch.manual_seed(0)
    return pyramidnet()


# ----------------------------------------------------------------------------------- forward shapes

@pytest.mark.parametrize("arch", [TINY_BASIC, TINY_BOTTLENECK,
                                  dict(depth=14, alpha=24, block="basic"),
                                  dict(depth=20, alpha=18, block="bottleneck")])
# 30: odd 15x15 at the last stride
@pytest.mark.parametrize("in_channels, size", [(3, 32), (1, 28), (3, 30)])
@pytest.mark.parametrize("num_classes", [10, 7])
def test_forward_shape(arch, in_channels, size, num_classes):
    torch.manual_seed(0)
    model = pyramidnet(**arch, num_classes=num_classes, in_channels=in_channels)
    x = torch.randn(2, in_channels, size, size)
    for train in (True, False):
        model.train(train)
        out = model(x)
        assert out.shape == (2, num_classes)
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert model.fc.out_features == num_classes and model.conv1.in_channels == in_channels


def test_wrong_number_of_input_channels_is_refused():
    model = pyramidnet(**TINY_BASIC, in_channels=1)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 3, 32, 32))


# --------------------------------------------------------------------------------- parameter counts

# (depth, alpha, block, the paper's CIFAR-10 table in millions, the
# exact count of this implementation)
PAPER = [
    (110, 48, "basic", 1.7, 1_772_706),
    (110, 84, "basic", 3.8, 3_904_446),
    (110, 270, "basic", 28.3, 28_485_477),
    (164, 270, "bottleneck", 27.0, 27_216_021),
    (200, 240, "bottleneck", 26.6, 26_752_702),
    (272, 200, "bottleneck", 26.0, 26_210_842),
]


def analytic_count(blocks_per_stage: int, step: float, bottleneck: bool,
                   num_classes: int = 10) -> int:
    """Trainable parameters of a PyramidNet counted by hand (convs without bias, BN weight+bias,
    fc), independent of the model code: stem conv3x3 3->16 + BN, then 3 stages of blocks, widths
    round(16 + k*step), final BN, fc."""
    total = 3 * 16 * 9 + 2 * 16
    width, channels = 16.0, 16
    for _ in range(3):
        for _ in range(blocks_per_stage):
            width += step
            w = int(round(width))
            if bottleneck:
                total += (2 * channels + channels * w + 2 * w + w * w * 9 + 2 * w + w * 4 * w
                          + 2 * 4 * w)
                channels = 4 * w
            else:
                total += 2 * channels + channels * w * 9 + 2 * w + w * w * 9 + 2 * w
                channels = w
    return total + 2 * channels + channels * num_classes + num_classes


@pytest.mark.parametrize("depth, alpha, block, paper_millions, exact", PAPER,
                         ids=[f"{d}-{a}-{b}" for d, a, b, _, _ in PAPER])
def test_parameter_count_matches_the_paper(depth, alpha, block, paper_millions, exact):
    model = (default_model() if (depth, alpha, block) == (110, 270, "basic")
             else pyramidnet(depth, alpha, block))
    count = trainable(model)
    assert count == sum(p.numel() for p in model.parameters())  # nothing frozen
    # Regression: the faithful structure (official PyramidNet-PyTorch: widths rounded, BN affine
    # parameters counted) gives exactly this number.
    assert count == exact
    per_stage = (depth - 2) // (6 if block == "basic" else 9)
    assert count == analytic_count(per_stage, alpha / (3 * per_stage), block == "bottleneck")
    # The paper's table (Han, Kim & Kim, CVPR 2017, Table 4) is rounded to 0.1M and runs
    # slightly low (by up to ~0.2M, presumably BN parameters or rounding of the widths left
    # out), so it is only a tolerance check.
    assert abs(count - paper_millions * 1e6) <= 0.25e6


def test_seventeen_blocks_per_stage_would_be_caught():
    """A classic off-by-one, 17 blocks per stage for depth 110 (the width step still alpha/54),
    gives ~24.3M: both the pinned count and the paper's 28.3M +- 0.25M reject it."""
    buggy = analytic_count(17, 270 / 54, bottleneck=False)
    assert abs(buggy - 24.3e6) < 0.1e6
    assert abs(buggy - 28.3e6) > 0.25e6
    assert trainable(default_model()) != buggy
    assert len(default_model().layer1) == 18


def test_num_classes_changes_only_the_classifier():
    base = trainable(pyramidnet(**TINY_BASIC))
    features = pyramidnet(**TINY_BASIC).fc.in_features
    assert trainable(pyramidnet(**TINY_BASIC, num_classes=100)) - base == 90 * (features + 1)
    assert trainable(pyramidnet(**TINY_BASIC, in_channels=1)) == base - 2 * 16 * 9


# ---------------------------------------------------------------------------------------- structure

def test_default_model_structure():
    model = default_model()
    stages = [model.layer1, model.layer2, model.layer3]
    assert [len(stage) for stage in stages] == [18, 18, 18]
    assert (model.fc.in_features == 286 and model.fc.in_features == 286
            and model.bn_final.num_features == 286)
    blocks = [block for stage in stages for block in stage]
    assert all(isinstance(block, BasicBlock) for block in blocks)
    widths = [block.bn3.num_features for block in blocks]
    assert widths == sorted(widths) and widths[0] == 21 and widths[-1] == 286
    assert all(b - a == 5 for a, b in zip(widths, widths[1:]))  # alpha/N = 270/54 = 5 exactly
    inputs = [16] + widths[:-1]
    assert [block.bn1.num_features for block in blocks] == inputs
    assert [block.conv1.in_channels for block in blocks] == inputs
    strides = [[block.stride for block in stage] for stage in stages]
    assert strides == [[1] * 18, [2] + [1] * 17, [2] + [1] * 17]
    conv_strides = [[(block.conv1.stride, block.conv2.stride) for block in stage]
                    for stage in stages]
    assert conv_strides[0] == [((1, 1), (1, 1))] * 18
    for stage in conv_strides[1:]:
        assert stage == [((2, 2), (1, 1))] + [((1, 1), (1, 1))] * 17


def test_nondecreasing_widths_for_fractional_steps():
    model = pyramidnet(110, 48, "basic")  # step 48/54, not an integer: some blocks keep their width
    widths = [block.bn3.num_features for stage in (model.layer1, model.layer2, model.layer3)
              for block in stage]
    assert widths == sorted(widths) and widths[-1] == 64 == model.fc.in_features
    assert all(b - a in (0, 1) for a, b in zip(widths, widths[1:]))
    bottleneck = pyramidnet(164, 270, "bottleneck")
    assert bottleneck.bn_final.num_features == 4 * 286 == bottleneck.fc.in_features
    assert [len(s) for s in (bottleneck.layer1, bottleneck.layer2, bottleneck.layer3)] == \
        [18, 18, 18]


def call_order(module: nn.Module, forward, x):
    """The ops of `forward(x)`, traced with torch.fx: call_module targets and
    call_function names in order."""
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x):
            return forward(self.inner, x)

    graph = torch.fx.symbolic_trace(Wrapper()).graph
    return [node.target.removeprefix("inner.") if node.op == "call_module" else node.target.__name__
            for node in graph.nodes if node.op in ("call_module", "call_function")]


def test_basic_block_is_bn_conv_bn_relu_conv_bn():
    block = BasicBlock(16, 20, 1)
    assert [name for name, _ in block.named_children()] == ["bn1", "conv1", "bn2", "conv2", "bn3"]
    assert call_order(block, residual_of, torch.randn(2, 16, 8, 8)) == \
        ["bn1", "conv1", "bn2", "relu", "conv2", "bn3"]
    assert block.conv1.kernel_size == block.conv2.kernel_size == (3, 3)
    assert block.conv1.bias is None and block.conv2.bias is None
    # the only ReLU is the functional one
    assert not any(isinstance(m, nn.ReLU) for m in block.modules())


def test_bottleneck_block_order():
    block = Bottleneck(16, 8, 2)
    assert [name for name, _ in block.named_children()] == \
        ["bn1", "conv1", "bn2", "conv2", "bn3", "conv3", "bn4"]
    assert call_order(block, residual_of, torch.randn(2, 16, 8, 8)) == \
        ["bn1", "conv1", "bn2", "relu", "conv2", "bn3", "relu", "conv3", "bn4"]
    assert [c.kernel_size for c in (block.conv1, block.conv2, block.conv3)] == \
        [(1, 1), (3, 3), (1, 1)]
    assert block.conv2.stride == (2, 2) and block.conv1.stride == block.conv3.stride == (1, 1)
    assert block.bn4.num_features == 32


def randomise_batchnorm(module: nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=generator))
                m.running_mean.copy_(torch.randn(m.num_features, generator=generator))
                m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)


@pytest.mark.parametrize("block_class, in_channels, width, stride", [
    (BasicBlock, 16, 21, 1), (BasicBlock, 16, 21, 2), (BasicBlock, 20, 20, 1),
    (Bottleneck, 16, 8, 1), (Bottleneck, 24, 8, 2)])
def test_block_is_residual_plus_zero_padded_identity(block_class, in_channels, width, stride):
    torch.manual_seed(0)
    block = block_class(in_channels, width, stride)
    randomise_batchnorm(block)
    block.eval()
    # odd size: the shortcut's pooling must round up like the conv
    x = torch.randn(3, in_channels, 9, 9)
    with torch.no_grad():
        out = block(x)
        residual = residual_of(block, x)
    out_channels = width * block_class.expansion
    size = 9 if stride == 1 else 5
    assert out.shape == residual.shape == (3, out_channels, size, size)
    identity = x if stride == 1 else F.avg_pool2d(x, 2, 2, ceil_mode=True)
    # the identity goes into the first channels; the new channels are the
    # residual alone; no ReLU after the sum
    torch.testing.assert_close(out[:, :in_channels], residual[:, :in_channels] + identity)
    torch.testing.assert_close(out[:, in_channels:], residual[:, in_channels:])
    assert (out < 0).any()
    torch.testing.assert_close(out, residual + padded_shortcut(x, out_channels, stride))


def padded_shortcut(x: torch.Tensor, out_channels: int, stride: int) -> torch.Tensor:
    """The paper's identity shortcut: 2x2 average pooling where the block downsamples, zero
    channels appended to the block's width (what the blocks added until they added it in place)."""
    if stride != 1:
        x = F.avg_pool2d(x, kernel_size=2, stride=2, ceil_mode=True)
    return F.pad(x, (0, 0, 0, 0, 0, out_channels - x.shape[1]))


def test_the_shortcut_is_added_into_the_first_channels():
    """shortcut_added on a zero residual is the padded identity: the input in the first channels,
    pooled 2x2 (ceil_mode: a 5x5 map pools to 3x3, its border averaged) where the block
    downsamples, the rest zero."""
    add = PYRAMIDNET.shortcut_added
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2, 3, 4, 4)
    assert torch.equal(add(torch.zeros(2, 3, 4, 4), x, 1), x)
    same = add(torch.zeros(2, 5, 4, 4), x, 1)
    assert torch.equal(same[:, :3], x) and torch.equal(same[:, 3:], torch.zeros(2, 2, 4, 4))
    down = add(torch.zeros(2, 6, 2, 2), x, 2)
    expected = x.view(2, 3, 2, 2, 2, 2).mean(dim=(3, 5))  # 2x2 average pooling
    assert torch.equal(down[:, :3], expected) and torch.equal(down[:, 3:], torch.zeros(2, 3, 2, 2))
    assert down[0, 0, 0, 0] == (0 + 1 + 4 + 5) / 4
    odd = add(torch.zeros(1, 2, 3, 3), torch.ones(1, 2, 5, 5), 2)
    assert torch.equal(odd, torch.ones(1, 2, 3, 3))


def test_shortcut_has_no_parameters():
    block = BasicBlock(16, 32, 2)
    names = {name.split(".")[0] for name, _ in block.named_parameters()}
    assert names == {"bn1", "conv1", "bn2", "conv2", "bn3"}


def test_stem_has_no_relu_and_head_has_one():
    torch.manual_seed(0)
    model = pyramidnet(**TINY_BASIC)
    randomise_batchnorm(model)
    model.eval()
    seen = {}
    model.layer1.register_forward_pre_hook(
        lambda m, args: seen.__setitem__("layer1", args[0].clone()))
    model.fc.register_forward_pre_hook(lambda m, args: seen.__setitem__("fc", args[0].clone()))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        model(x)
        stem = model.bn1(model.conv1(x))
    torch.testing.assert_close(seen["layer1"], stem)
    assert (seen["layer1"] < 0).any()  # the stem is conv + BN only
    # BN + ReLU + global average pooling before fc
    assert (seen["fc"] >= 0).all() and (seen["fc"] > 0).any()
    assert [name for name, _ in model.named_children()] == ["conv1", "bn1", "layer1", "layer2",
                                                            "layer3", "bn_final", "fc"]


# ----------------------------------------------------------------------------------- initialisation

def test_he_fan_out_init_of_big_convs():
    model = default_model()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.weight.numel() >= 100_000]
    assert len(convs) > 20
    for conv in convs:
        fan_out = conv.out_channels * conv.kernel_size[0] * conv.kernel_size[1]
        weight = conv.weight.detach()
        assert weight.std().item() == pytest.approx(math.sqrt(2.0 / fan_out), rel=0.03)
        assert abs(weight.mean().item()) < 0.1 * math.sqrt(2.0 / fan_out)


def test_init_uses_fan_out_not_fan_in():
    torch.manual_seed(0)
    # conv3 of a bottleneck: 1x1, out = 4x in, so the two differ by 2x
    model = pyramidnet(20, 48, "bottleneck")
    conv = model.layer3[-1].conv3
    assert conv.out_channels == 4 * conv.in_channels
    std = conv.weight.detach().std().item()
    assert std == pytest.approx(math.sqrt(2.0 / conv.out_channels), rel=0.1)
    assert std < 0.75 * math.sqrt(2.0 / conv.in_channels)
    stem = model.conv1  # 3 -> 16, 3x3: fan_out 144, fan_in 27
    assert stem.weight.detach().std().item() == pytest.approx(math.sqrt(2.0 / 144), rel=0.2)


def test_batchnorm_and_classifier_init():
    torch.manual_seed(0)
    model = pyramidnet(**TINY_BASIC)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(norms) == 1 + 3 * 3 + 1
    for bn in norms:
        assert bn.affine and torch.equal(bn.weight, torch.ones_like(bn.weight))
        assert torch.equal(bn.bias, torch.zeros_like(bn.bias))
    assert torch.equal(model.fc.bias, torch.zeros(10))
    assert model.fc.weight.abs().sum() > 0


def test_same_seed_same_weights():
    torch.manual_seed(3)
    a = pyramidnet(**TINY_BASIC).state_dict()
    torch.manual_seed(3)
    b = pyramidnet(**TINY_BASIC).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -------------------------------------------------------------------------------- invalid arguments

@pytest.mark.parametrize("depth, block, form", [
    (109, "basic", "6n+2"), (2, "basic", "6n+2"), (0, "basic", "6n+2"), (-4, "basic", "6n+2"),
    (111, "basic", "6n+2"), (165, "basic", "6n+2"), (111, "bottleneck", "9n+2"),
    (2, "bottleneck", "9n+2"), (12, "bottleneck", "9n+2"), (165, "bottleneck", "9n+2")])
def test_invalid_depth(depth, block, form):
    with pytest.raises(ValueError, match=r"depth .*" + form.replace("+", r"\+")) as error:
        pyramidnet(depth, 48, block)
    assert str(depth) in str(error.value)


def test_depth_110_is_also_a_valid_bottleneck_depth():
    # 110 = 9 * 12 + 2: twelve bottleneck blocks per stage (so it is not
    # an example of an invalid depth)
    model = pyramidnet(110, 12, "bottleneck")
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3)] == [12, 12, 12]


@pytest.mark.parametrize("alpha", [0, -1, -270.0, float("nan")])
def test_invalid_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        pyramidnet(8, alpha, "basic")


@pytest.mark.parametrize("block", ["Basic", "resnet", "", "bottle"])
def test_unknown_block(block):
    with pytest.raises(ValueError, match="basic.*bottleneck"):
        pyramidnet(8, 12, block)

"""The fast path's PyramidNet (benchmarks/aligned.py): models/pyramidnet.py's model, its shortcut
added in place and its channels stored aligned, the same model: the same weights from the same
seed, the same parameters and state_dict, checkpoints interchangeable with the plain model both
ways, and on the CPU in fp32 the same training, bit for bit. The fast path end to end, a
checkpoint the plain train.py resumes among it, is tests/test_fast_path.py's."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.aligned import (AlignedBatchNorm2d, AlignedConv2d, BasicBlock, Bottleneck,
                                align_channels, fast_pyramidnet, mask_padded_gradients,
                                paper_optimizer_state, paper_shapes, stored, sum_in_place,
                                wider_pyramidnet)
from pyramidnet import PyramidNet

TINY_BASIC = dict(depth=8, alpha=12, block="basic")  # one basic block per stage
TINY_BOTTLENECK = dict(depth=11, alpha=12, block="bottleneck")


def plain(arch: dict) -> PyramidNet:
    torch.manual_seed(0)
    return PyramidNet(**arch)


def fast(arch: dict, align: int) -> PyramidNet:
    torch.manual_seed(0)
    return fast_pyramidnet(**arch, align=align)


def sgd(model: nn.Module) -> torch.optim.SGD:
    """SGD as the train files make it (momentum, Nesterov, weight decay), and as fast.py adds to
    it for an aligned model: beta's padded gradients masked, its state in the paper's shapes."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                weight_decay=1e-4)
    if paper_shapes(model):
        mask_padded_gradients(model, optimizer)
        paper_optimizer_state(model, optimizer)
    return optimizer


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bits, as integers: equal bits, not equal values (-0.0 is not +0.0)."""
    size = tensor.element_size()
    return tensor.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


@pytest.mark.parametrize("align", [0, 8])
@pytest.mark.parametrize("arch", [TINY_BASIC, TINY_BOTTLENECK])
def test_the_fast_model_is_the_plain_model(arch, align):
    """The same draws in the same order: every tensor of the state_dict equal, under the same
    names; the same parameters, counted in the paper's shapes."""
    ours, theirs = fast(arch, align).state_dict(), plain(arch).state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    model = fast(arch, align)
    shapes = {**{key: value.shape for key, value in theirs.items()}, **paper_shapes(model)}
    assert shapes == {key: value.shape for key, value in theirs.items()}
    assert [name for name, _ in model.named_parameters()] == \
        [name for name, _ in plain(arch).named_parameters()]


def steps(model: nn.Module, amp: bool, count: int = 3) -> list[torch.Tensor]:
    """`count` SGD steps on fixed batches, fp32 or bf16 autocast: each step's output and the
    paper's part of every gradient, then the state_dict."""
    optimizer, draws, seen = sgd(model), torch.Generator().manual_seed(0), []
    for _ in range(count):
        images = torch.randn(8, 3, 32, 32, generator=draws)
        labels = torch.randint(0, 10, (8,), generator=draws)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(images)
            loss = F.cross_entropy(out, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # a real backward: autograd refuses a sum into a tensor something saved
        seen += [out.detach(), *(param.grad.clone() for param in model.parameters())]
        optimizer.step()
    return seen + list(model.state_dict().values())


@pytest.mark.parametrize("align", [0, 8])
@pytest.mark.parametrize("arch", [TINY_BASIC, TINY_BOTTLENECK])
def test_the_in_place_shortcut_trains_the_padded_sums_bits(arch, align):
    """Blocks that add the shortcut into the residual in place compute, bit for bit, what
    `residual + the padded shortcut` (models/pyramidnet.py's) computes: each step's output and
    every gradient, and the weights after three SGD steps, in fp32 and in bf16 autocast, with
    channels stored as the paper's or aligned to 8 (the padded storage's zero channels added to)."""
    for amp in (False, True):
        padded = plain(arch)
        padded = align_channels(padded, align) if align else padded
        in_place = sum_in_place(copy.deepcopy(padded))
        assert type(in_place.layer1[0]) is not type(padded.layer1[0])
        ours, theirs = steps(in_place, amp), steps(padded, amp)
        assert len(ours) == len(theirs)
        for now, before in zip(ours, theirs):
            assert now.dtype == before.dtype and torch.equal(bits(now), bits(before)), amp


def padded_outputs(model: nn.Module) -> list[torch.Tensor]:
    """Forward hooks on every block and BatchNorm: their outputs' padded channels, as they run."""
    padded = []

    def keep(module, _inputs, output):
        norm = module if isinstance(module, AlignedBatchNorm2d) else list(module.children())[-1]
        padded.append(output[:, norm.num_features:].detach())

    for module in model.modules():
        if isinstance(module, (AlignedBatchNorm2d, BasicBlock, Bottleneck)):
            module.register_forward_hook(keep)
    return padded


@pytest.mark.parametrize("block, depth, align",
                         [("basic", 8, 8), ("basic", 14, 16), ("bottleneck", 11, 32)])
def test_aligned_training_is_the_unaligned_training_bit_for_bit(block, depth, align):
    """Five fp32 SGD steps (momentum, Nesterov, weight decay) of the aligned and the unaligned model
    from the same weights: every parameter and BatchNorm statistic equal after every step, every
    padded channel exactly zero, the momentum saved in the paper's shapes and equal, and the
    evaluation's logits equal. (Bit for bit only where the convolutions add up their input
    channels in the same order: it holds for these narrow models, not in general: docs/speed.md.)"""
    arch = dict(depth=depth, alpha=12, block=block)
    unaligned, aligned = fast(arch, 0), fast(arch, align)
    assert any(module.bias.shape[0] > module.num_features for module in aligned.modules()
               if isinstance(module, AlignedBatchNorm2d))
    padded = padded_outputs(aligned)
    optimizers = [sgd(unaligned), sgd(aligned)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        images = torch.randn(16, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (16,), generator=generator)
        for model, optimizer in zip((unaligned, aligned), optimizers):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
        assert padded and all(not p.any() for p in padded) and any(p.numel() for p in padded)
        padded.clear()
        ours, theirs = aligned.state_dict(), unaligned.state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    momentum = [optimizer.state_dict()["state"] for optimizer in optimizers]
    assert all(torch.equal(momentum[1][i]["momentum_buffer"], entry["momentum_buffer"])
               for i, entry in momentum[0].items())
    unaligned.eval()
    aligned.eval()
    images = torch.randn(8, 3, 32, 32, generator=generator)
    assert torch.equal(aligned(images), unaligned(images))


def test_every_tensor_is_stored_aligned_and_its_padding_zero():
    model = fast(dict(depth=20, alpha=48, block="basic"), 8)
    norms = [m for m in model.modules() if isinstance(m, AlignedBatchNorm2d)]
    assert any(norm.num_features % 8 for norm in norms)  # the paper's widths mostly are not...
    for norm in norms:  # ...and gamma, beta and the statistics are stored at the padded length
        width = stored(norm.num_features, 8)
        assert all(tensor.shape == (width,) for tensor in (norm.weight, norm.bias,
                                                           norm.running_mean, norm.running_var))
        assert not norm.weight[norm.num_features:].any()
        assert not norm.bias[norm.num_features:].any()
    convs = [m for m in model.modules() if isinstance(m, AlignedConv2d)]
    assert convs[0] is model.conv1 and model.conv1.weight.shape[1] == 3  # the images: as they are
    assert all(conv.weight.shape[:2] == (stored(conv.out_channels, 8),
                                         stored(conv.in_channels, 8)) for conv in convs[1:])
    assert any(conv.weight.shape[0] > conv.out_channels for conv in convs)


def test_checkpoints_are_interchangeable_both_ways():
    """A model's and its optimizer's state (weights, running statistics, momentum) saved by either
    model, as a checkpoint holds them, and loaded into the other, trains on exactly as the model
    that saved it; the saved tensors have the paper's shapes whichever saved them, and with
    channels_last weights."""
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 3, 32, 32, generator=generator),
                torch.randint(0, 10, (16,), generator=generator)) for _ in range(4)]
    paper = {key: value.shape for key, value in plain(TINY_BASIC).state_dict().items()}

    def train(model, optimizer, some, channels_last):
        for images, labels in some:
            images = images.to(memory_format=torch.channels_last) if channels_last else images
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()

    def built(align, channels_last):
        model = fast(TINY_BASIC, align)
        return model.to(memory_format=torch.channels_last) if channels_last else model

    # the layouts within a pair compute alike (channels_last convolutions over more input channels
    # add them up in another order, as convolutions over 8 more channels may in general)
    for first, second, channels_last in ((8, 0, False), (0, 8, False), (8, 8, True)):
        saver = built(first, channels_last)
        saver_optimizer = sgd(saver)
        train(saver, saver_optimizer, batches[:2], channels_last)
        weights, momentum = copy.deepcopy((saver.state_dict(), saver_optimizer.state_dict()))
        assert {key: value.shape for key, value in weights.items()} == paper
        assert {i: entry["momentum_buffer"].shape for i, entry in momentum["state"].items()} == \
            {i: param.shape for i, param in enumerate(plain(TINY_BASIC).parameters())}
        loader = built(second, channels_last)
        loader_optimizer = sgd(loader)
        loader.load_state_dict(weights)
        loader_optimizer.load_state_dict(momentum)
        train(saver, saver_optimizer, batches[2:], channels_last)
        train(loader, loader_optimizer, batches[2:], channels_last)
        ours, theirs = loader.state_dict(), saver.state_dict()
        assert all(torch.equal(ours[key], theirs[key]) for key in ours), (first, second)


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
        model = fast(dict(depth=110, alpha=270, block="basic"), align)
        with torch.no_grad(), Count():
            Count.calls = 0
            model(torch.randn(1, 3, 32, 32))
        counts[align] = Count.calls
    assert counts[8] <= counts[0] * 1.02, counts


def test_a_compiled_model_holds_no_custom_autograd_function_and_computes_the_same():
    """Under torch.compile the blocks add the padded shortcut as a plain sum (inductor fuses the
    pad into it): ShortcutSum, a custom autograd Function, reaches AOTAutograd as
    autograd_function_apply, which its cache refuses (torch/_functorch/_aot_autograd/
    autograd_cache.py, check_node_safe: "Bypassing autograd cache"), so that every warm compile
    traced the model again. The graphs TorchDynamo hands its backend hold no such call, and the
    compiled model, channels stored aligned, gives eager's in-place output and gradients
    (TorchDynamo's graphs run as traced: no kernel of inductor's here). What the warm compile
    gains is measured by benchmarks/warm_compile.py (BENCHMARKS.md), not here."""
    graphs = []

    def keep(graph_module: torch.fx.GraphModule, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    model = fast(TINY_BASIC, 8)
    eager = copy.deepcopy(model)
    images = torch.randn(4, 3, 32, 32)
    torch._dynamo.reset()
    out = torch.compile(model, backend=keep)(images)
    out.sum().backward()
    expected = eager(images)
    expected.sum().backward()
    calls = [str(node.target) for graph in graphs for node in graph.graph.nodes
             if node.op == "call_function"]
    assert calls and not [call for call in calls if "autograd_function_apply" in call]
    assert torch.equal(out, expected)
    for compiled, ours in zip(model.parameters(), eager.parameters()):
        assert torch.equal(compiled.grad, ours.grad)


def test_the_wider_model_rounds_every_blocks_width_up():
    """--width_multiple 8: another model, wider (every block's width a multiple of 8), built and
    initialised as PyramidNet is."""
    torch.manual_seed(0)
    wider = wider_pyramidnet(20, 48, "basic", 10, 3, 8)
    blocks = [*wider.layer1, *wider.layer2, *wider.layer3]
    widths = [block.conv1.out_channels for block in blocks]
    paper = [block.conv1.out_channels for block in (*plain(dict(depth=20, alpha=48)).layer1,
                                                    *plain(dict(depth=20, alpha=48)).layer2,
                                                    *plain(dict(depth=20, alpha=48)).layer3)]
    assert all(width % 8 == 0 for width in widths) and any(width % 8 for width in paper)
    assert all(width >= ours for width, ours in zip(widths, paper))
    assert all(block.conv1.in_channels == earlier.conv2.out_channels
               for earlier, block in zip(blocks, blocks[1:]))
    assert wider.fc.in_features == widths[-1] and wider(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert all(not block.bn3.bias.any() and torch.equal(block.bn3.weight,
                                                        torch.ones_like(block.bn3.weight))
               for block in blocks)

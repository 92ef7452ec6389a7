"""--model: PyramidNet or any torchvision classifier, built by each train file's get_model (a
user's own model goes there too), and the units fsdp/train.py shards: a bad name is one line, a
torchvision model trains and reports its own size, and a model that cannot take the images says so.
(fsdp against dist_parallel on two processes, bit for bit: tests/test_parallel.py.)"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import torchvision

import runkit
from conftest import MODES, read_results
from processes import in_process, train_file

SMALL = ["--dataset", "synthetic", "--synthetic_size", "64", "--image_size", "32",
         "--num_workers", "0", "--warmup_steps", "1"]


def on_meta(build) -> torch.nn.Module:
    with torch.device("meta"):
        return build()


def test_the_repeated_blocks_are_the_units_fsdp_shards():
    """One small rule finds PyramidNet's and ResNet's residual blocks and ViT's encoder layers; a
    model of plain layers in Sequentials has its layers as units."""
    fsdp = train_file("fsdp")

    def kinds(model):
        return Counter(type(block).__name__ for block in fsdp.repeated_blocks(model))

    assert kinds(on_meta(lambda: fsdp.PyramidNet(20, 48))) == {"BasicBlock": 9}
    assert kinds(on_meta(lambda: fsdp.PyramidNet(11, 48, "bottleneck"))) == {"Bottleneck": 3}
    assert kinds(on_meta(lambda: torchvision.models.resnet18(num_classes=10))) == {"BasicBlock": 8}
    assert kinds(on_meta(lambda: torchvision.models.resnet50(num_classes=10))) == {"Bottleneck": 16}
    # ViT: its encoder layers (and its head, a Linear as its MLPs' are, a unit of its own)
    vit = on_meta(lambda: torchvision.models.vit_b_16(num_classes=10))
    assert kinds(vit)["EncoderBlock"] == 12
    assert kinds(on_meta(lambda: torchvision.models.vgg11(num_classes=10))) == \
        {"Conv2d": 8, "Linear": 3}


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_model_name_is_one_line(mode):
    with pytest.raises(runkit.UsageError) as refused:
        train_file(mode).get_args([*SMALL, "--model", "resnt18"])
    assert str(refused.value) == "--model resnt18 is no torchvision classifier"


def test_a_torchvision_model_trains_and_reports_its_own_size(tmp_path):
    """single_gpu trains resnet18 on 32x32 synthetic images; results.json has its parameter count
    and the FLOPs counted on it."""
    done = in_process("single_gpu", *SMALL, "--model", "resnet18", "--batch_size", "16",
                      "--max_steps", "2", "--log_dir", tmp_path, "--run_name", "r")
    assert done.returncode == 0, done.stderr
    assert ": resnet18 (11,181,642 parameters) at 32 px" in done.stdout.splitlines()[0]
    summary = read_results(tmp_path / "r")["summary"]
    model = torchvision.models.resnet18(num_classes=10)
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())
    assert summary["flops_per_image"] == runkit.flops_per_image(model, torch.zeros(2, 3, 32, 32))


@pytest.mark.parametrize("argv, named", [
    ([*SMALL, "--image_size", "16", "--model", "vgg11"], "--model vgg11"),
    ([*SMALL, "--model", "alexnet"], "--model alexnet"),
])
def test_a_model_that_cannot_take_the_images_says_what_to_give(tmp_path, argv, named):
    done = in_process("single_gpu", *argv, "--batch_size", "16", "--max_steps", "1", "--log_dir",
                      tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr
    assert named in errors[0]
    assert "--image_size" in errors[0] or "--model pyramidnet" in errors[0]

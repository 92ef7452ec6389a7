"""What the runs trained, as the report names it: a results.json config with every field
(`run_config`), the model's title ('PyramidNet-110 α=270 (basic)'), report.md's first-screen
`Model: ... Data: ...` line, and the images of one epoch of the training set (the table's epoch
column)."""
from __future__ import annotations

import dataclasses
import types

from common.config import Config
from common.data import dataset_info
from common.errors import UsageError
from common.folders import image_folder
from comparison.report.formatting import fmt_count, fmt_flops
from comparison.report.outcome import Outcome
from models import PYRAMIDNET


def run_config(config: dict) -> types.SimpleNamespace:
    """A results.json config with every field: one it lacks (written before the
    field existed) takes its default."""
    return types.SimpleNamespace(**{**{f.name: f.default for f in dataclasses.fields(Config)},
                                    **config})


def model_title(config: dict) -> str:
    """The model a run trained (its results.json config), as the report names it: 'PyramidNet-110
    α=270 (basic)', or torchvision's name, 'resnet50'."""
    cfg = run_config(config)
    if cfg.model == PYRAMIDNET:
        return f"PyramidNet-{cfg.depth} α={cfg.alpha:g} ({cfg.block})"
    return cfg.model


def model_line(config: dict, outcomes: list[Outcome], parameters: int) -> str:
    """What the runs trained, for the report's first screen: the model, its parameters and FLOPs
    per image (a successful run's results.json summary; without one, `parameters` as counted
    here and no FLOPs) and the data."""
    cfg, data = run_config(config), dataset_info(run_config(config))
    summary = next((o.results["summary"] for o in outcomes if o.status == "ok"), {})
    parameters = summary.get("parameters") or parameters
    flops = summary.get("flops_per_image")
    origin = "" if cfg.model == PYRAMIDNET else ", torchvision's, without pretrained weights"
    figures = f"{fmt_count(parameters)} parameters" + (f", {fmt_flops(flops)} per image "
                                                       "(forward and backward)"
                                                      if flops else "")
    return (f"Model: {model_title(config)}{origin}: {figures}. Data: {data_source(cfg)}, "
            f"{data.size}×{data.size} images, {data.channels} channel{'s' * (data.channels > 1)}, "
            f"{data.classes} classes.")


def data_source(cfg) -> str:
    """The data the runs read, as the Data line names it: the dataset, or an image folder with its
    path and images (what --benchmark runs read too)."""
    if cfg.dataset != "imagefolder":
        return cfg.dataset
    try:
        images = image_folder(cfg.data_dir).images
    except UsageError:  # gone since the runs read it: named alone
        return f"the image folder {cfg.data_dir}"
    return (f"the image folder {cfg.data_dir} ({images['train']:,} training and "
            f"{images['val']:,} validation images)")


# the training sets' images (torchvision's CIFAR10 and MNIST, train=True): one epoch of each
TRAIN_IMAGES = {"cifar10": 50_000, "mnist": 60_000}


def train_images(config: dict) -> int | None:
    """The images of the training set a run's results.json config names, one epoch of which the
    table's epoch column times: --synthetic_size for the synthetic set, CIFAR-10's and MNIST's
    own, an image folder's train/ images (None where it can no longer be listed)."""
    cfg = run_config(config)
    if cfg.dataset == "synthetic":
        return cfg.synthetic_size
    if cfg.dataset == "imagefolder":
        try:
            return image_folder(cfg.data_dir).images["train"]
        except UsageError:
            return None
    return TRAIN_IMAGES.get(cfg.dataset)

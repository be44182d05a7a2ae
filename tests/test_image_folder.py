"""The image-folder importer (``fedpers data import-folder``): layout, labels, domains, resizing, the
channel statistics the CIFAR-100 build checks, and its refusals as one line."""

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fedpers.core.data import load_dataset
from fedpers.core.errors import DataError
from fedpers.core.image_folder import channel_statistics, import_image_folder


def _image(path, value, size=(4, 4), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixel = (value, value // 2, 255 - value) if mode == "RGB" else value
    Image.new(mode, size, pixel).save(path)


def _tree(root, classes=("cat", "apple"), per_class=2, domains=None, size=(4, 4)):
    for split, n in (("train", per_class), ("test", 1)):
        for d in domains or [None]:
            for c, cls in enumerate(classes):
                for i in range(n):
                    base = root / split / d if d else root / split
                    _image(base / cls / f"{i:02d}.png", 10 * c + i + (100 if d == "sketch" else 0), size)
    return root


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fedpers", *args], capture_output=True, text=True, timeout=120)


def test_classes_are_sorted_folder_names_and_pixels_exact(tmp_path):
    arrays = import_image_folder(_tree(tmp_path))
    assert list(arrays["class_names"]) == ["apple", "cat"]  # sorted: apple = 0
    np.testing.assert_array_equal(arrays["y_train"], [0, 0, 1, 1])
    np.testing.assert_array_equal(arrays["y_test"], [0, 1])
    assert arrays["x_train"].shape == (4, 4, 4, 3) and arrays["x_train"].dtype == np.uint8
    # apple was written with class index 1 of ("cat", "apple"): values 10, 11; cat 0, 1
    np.testing.assert_array_equal(arrays["x_train"][:, 0, 0, 0], [10, 11, 0, 1])
    np.testing.assert_array_equal(arrays["x_train"][0, 0, 0], [10, 5, 245])
    assert "d_train" not in arrays


def test_domain_level_gives_domain_ids(tmp_path):
    arrays = import_image_folder(_tree(tmp_path, domains=["sketch", "photo"]), domains=True)
    assert list(arrays["domain_names"]) == ["photo", "sketch"]
    np.testing.assert_array_equal(arrays["d_train"], [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(arrays["y_train"], [0, 0, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(arrays["d_test"], [0, 0, 1, 1])
    assert arrays["x_train"][4, 0, 0, 0] == 110  # sketch's apple 0


def test_size_resizes_and_mixed_sizes_need_it(tmp_path):
    root = _tree(tmp_path)
    _image(root / "train" / "cat" / "99.png", 3, size=(6, 5))
    with pytest.raises(DataError, match="99.png: 6x5 where the first image is 4x4: pass a size"):
        import_image_folder(root)
    arrays = import_image_folder(root, size=3)
    assert arrays["x_train"].shape == (5, 3, 3, 3) and arrays["x_test"].shape == (2, 3, 3, 3)
    assert arrays["x_train"][0, 1, 1, 0] == 10  # a flat image stays flat


def test_refusals_name_the_folder(tmp_path):
    with pytest.raises(DataError, match="has no 'train' folder"):
        import_image_folder(tmp_path)
    root = _tree(tmp_path / "a")
    _image(root / "test" / "dog" / "0.png", 1)
    with pytest.raises(DataError, match="classes differ .* dog"):
        import_image_folder(root)
    root = _tree(tmp_path / "b")
    (root / "train" / "cat" / "bad.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match="bad.png: not a readable image"):
        import_image_folder(root)


def test_channel_statistics_exact():
    x = np.zeros((2, 1, 1, 3), dtype=np.uint8)
    x[1] = 255
    mean, std = channel_statistics(x)
    np.testing.assert_allclose(mean, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(std, [0.5, 0.5, 0.5])


def test_cli_writes_a_dataset_the_loader_reads_and_never_overwrites(tmp_path):
    root = _tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "mine.npz"
    done = run_cli("data", "import-folder", str(root), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "6 train / 2 test images of 4x4x3, 2 classes" in done.stdout
    ds = load_dataset(str(out))
    assert ds.num_classes == 2 and ds.input_shape == (3, 4, 4)
    np.testing.assert_array_equal(ds.y_train, [0, 0, 0, 1, 1, 1])
    again = run_cli("data", "import-folder", str(root), "--out", str(out))
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"fedpers: error: --out {out}: exists; a dataset file is never overwritten (remove it first)"]
    missing = run_cli("data", "import-folder", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.npz"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "nowhere: not a folder" in missing.stderr
    assert not (tmp_path / "x.npz").exists()

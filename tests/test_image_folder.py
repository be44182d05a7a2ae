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


def test_domain_order_sets_the_domain_ids(tmp_path):
    root = _tree(tmp_path, domains=["sketch", "photo", "art"])
    arrays = import_image_folder(root, domains=True, domain_order=["photo", "art", "sketch"])
    assert list(arrays["domain_names"]) == ["photo", "art", "sketch"]
    # images are read in id order: photo (0), art (1), sketch (2); classes sorted within each
    np.testing.assert_array_equal(arrays["d_train"], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(arrays["d_test"], [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(arrays["y_train"], [0, 0, 1, 1] * 3)
    assert arrays["x_train"][8, 0, 0, 0] == 110  # sketch's apple 0, now domain 2
    default = import_image_folder(root, domains=True)  # sorted: art, photo, sketch
    assert list(default["domain_names"]) == ["art", "photo", "sketch"]
    by_name = {n: default["x_train"][default["d_train"] == d] for d, n in enumerate(default["domain_names"])}
    for d, name in enumerate(arrays["domain_names"]):  # the same images per domain, only the ids move
        np.testing.assert_array_equal(arrays["x_train"][arrays["d_train"] == d], by_name[name])


def test_domain_order_must_name_every_domain_once(tmp_path):
    root = _tree(tmp_path, domains=["sketch", "photo"])
    with pytest.raises(DataError, match="not named: sketch"):
        import_image_folder(root, domains=True, domain_order=["photo"])
    with pytest.raises(DataError, match="no folder: cartoon"):
        import_image_folder(root, domains=True, domain_order=["photo", "sketch", "cartoon"])
    with pytest.raises(DataError, match="names photo more than once"):
        import_image_folder(root, domains=True, domain_order=["photo", "photo", "sketch"])
    with pytest.raises(DataError, match="needs a tree with a domain level"):
        import_image_folder(root, domain_order=["photo", "sketch"])


def test_cli_domain_order(tmp_path):
    root = _tree(tmp_path / "tree", domains=["sketch", "photo"])
    out = tmp_path / "d.npz"
    done = run_cli("data", "import-folder", str(root), "--out", str(out), "--domains",
                   "--domain-order", "sketch, photo")
    assert done.returncode == 0, done.stderr
    assert "2 domains" in done.stdout
    with np.load(out) as f:
        assert list(f["domain_names"]) == ["sketch", "photo"]
        np.testing.assert_array_equal(f["d_test"], [0, 0, 1, 1])
    bad = run_cli("data", "import-folder", str(root), "--out", str(tmp_path / "e.npz"), "--domain-order", "photo")
    assert bad.returncode == 2 and "--domain-order needs --domains" in bad.stderr
    assert not (tmp_path / "e.npz").exists()


def test_resample_names_pillows_filter(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "tree"
    for split in ("train", "test"):
        path = root / split / "cat" / "0.png"
        path.parent.mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (9, 9, 3), dtype=np.uint8)).save(path)
    with Image.open(root / "train" / "cat" / "0.png") as img:
        want = {name: np.asarray(img.convert("RGB").resize((4, 4), getattr(Image.Resampling, name.upper()),
                                                           reducing_gap=None)) for name in ("bilinear", "bicubic")}
    assert not np.array_equal(want["bilinear"], want["bicubic"])
    np.testing.assert_array_equal(import_image_folder(root, size=4)["x_train"][0], want["bilinear"])  # the default
    np.testing.assert_array_equal(import_image_folder(root, size=4, resample="bicubic")["x_train"][0], want["bicubic"])
    with pytest.raises(DataError, match="resample must be one of bilinear, bicubic, lanczos, got 'area'"):
        import_image_folder(root, size=4, resample="area")
    out = tmp_path / "b.npz"
    done = run_cli("data", "import-folder", str(root), "--out", str(out), "--size", "4", "--resample", "bicubic")
    assert done.returncode == 0, done.stderr
    with np.load(out) as f:
        np.testing.assert_array_equal(f["x_train"][0], want["bicubic"])

"""SSD builder and weight files, with weight files of the right shapes made here; ChainerCV's
cache is a temporary dataset root and every server a closed port, so nothing touches the network."""
import hashlib
import os
import time
import re
import shutil
import socket
from dataclasses import replace

import chainer
import numpy as np
import pytest
from chainercv.links import SSD300, SSD512

from medaidet.errors import WeightsError
from medaidet.ssd import weights
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import compare_weights, load_weights, materialize, save_weights

CHAINERCV = {"ssd300": SSD300, "ssd512": SSD512}
VGG16_KEYS = re.compile(r"extractor/conv([1-5]_[1-3]|6|7)/[Wb]$")  # the ImageNet file's


def params_of(model):
    return {name.lstrip("/"): param.array for name, param in model.namedparams()}


def arrays_of(cls, n_fg_class, seed):
    np.random.seed(seed)
    return {k: v.copy() for k, v in params_of(materialize(cls(n_fg_class=n_fg_class))).items()}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Every source's server is a closed port on 127.0.0.1 (a served one: test_imagenet.py)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    for key, chain in weights.SOURCES.items():
        monkeypatch.setitem(weights.SOURCES, key, tuple(
            replace(source, url=f"{closed}/{source.file_name}") for source in chain))


@pytest.fixture
def dataset_root(tmp_path):
    """A fresh ChainerCV cache: models go to <root>/pfnet/chainercv/models/."""
    old = chainer.dataset.get_dataset_root()
    chainer.dataset.set_dataset_root(str(tmp_path / "dataset"))
    yield tmp_path / "dataset"
    chainer.dataset.set_dataset_root(old)


@pytest.fixture(scope="module")
def voc_arrays():
    """What ChainerCV's SSD300 VOC file holds: every parameter, with 20 classes."""
    return arrays_of(SSD300, 20, seed=123)


@pytest.fixture(scope="module")
def bccd_file(tmp_path_factory):
    """A model-only weight file of a 3-class SSD300, with its sidecar."""
    path = tmp_path_factory.mktemp("weights") / "bccd_ssd300.npz"
    np.random.seed(7)
    save_weights(build_ssd("ssd300"), path)
    return path


def put_in_cache(name, pretrained, arrays):
    path = weights.cache_dir() / weights.SOURCES[name, pretrained][0].file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


@pytest.mark.slow(seconds=8)
def test_voc0712_loads_everything_but_the_class_heads(dataset_root, voc_arrays):
    path = put_in_cache("ssd300", "voc0712", voc_arrays)
    url = SSD300._models["voc0712"]["url"]
    assert path == dataset_root / "pfnet" / "chainercv" / "models" / url.rsplit("/", 1)[1]

    np.random.seed(0)
    fresh = params_of(materialize(build_ssd("ssd300")))
    np.random.seed(0)
    model = build_ssd("ssd300", "voc0712")
    assert model.weights_report.origin.endswith(", cache")
    assert isinstance(model, SSD300) and model.n_fg_class == 3

    params = params_of(model)
    assert set(params) == set(voc_arrays)
    heads = sorted(k for k in params if k.startswith("multibox/conf/"))
    assert len(heads) == 12
    for key, array in params.items():
        if key in heads:
            np.testing.assert_array_equal(array, fresh[key])
            assert array.shape[0] == voc_arrays[key].shape[0] // 21 * 4
        else:
            np.testing.assert_array_equal(array, voc_arrays[key])

    report = model.weights_report
    assert report.source == str(path)
    assert report.loaded == tuple(sorted(set(params) - set(heads))) and len(report.loaded) == 59
    assert report.skipped == tuple(heads) and report.initialized == tuple(heads)


@pytest.mark.parametrize("damage", ["reshape", "drop"])
def test_voc_mismatch_outside_the_class_heads_is_named(dataset_root, voc_arrays, damage):
    arrays = dict(voc_arrays)
    if damage == "reshape":
        arrays["multibox/loc/0/W"] = np.zeros((8, 512, 3, 3), dtype=np.float32)
    else:
        del arrays["extractor/conv1_1/b"]
    put_in_cache("ssd300", "voc0712", arrays)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", "voc0712")
    err = info.value
    if damage == "reshape":
        assert (err.parameter, err.expected, err.found) == \
            ("multibox/loc/0/W", (16, 512, 3, 3), (8, 512, 3, 3))
    else:       # (the shape is not known before the model's first forward pass)
        assert (err.parameter, err.found) == ("extractor/conv1_1/b", None)


def test_imagenet_is_chainercvs_own_file(dataset_root, voc_arrays):
    vgg = {k: v for k, v in voc_arrays.items() if VGG16_KEYS.match(k)}
    assert len(vgg) == 30  # conv1_1 ... conv5_3, conv6, conv7: W and b
    path = put_in_cache("ssd300", "imagenet", vgg)
    assert weights.SOURCES["ssd512", "imagenet"][0].file_name == path.name
    np.random.seed(0)
    model = build_ssd("ssd300", "imagenet")
    assert model.weights_report.origin == "ChainerCV's model server, cache"
    params = params_of(model)
    for key in vgg:
        np.testing.assert_array_equal(params[key], vgg[key])
    for key in ("extractor/conv8_1/W", "multibox/loc/0/W"):  # random, not from the file
        assert params[key].shape == voc_arrays[key].shape
        assert not np.array_equal(params[key], voc_arrays[key])
    assert params["multibox/conf/0/W"].shape == (16, 512, 3, 3)
    report = model.weights_report
    assert report.loaded == tuple(sorted(vgg)) and report.skipped == ()
    assert set(report.initialized) == set(params) - set(vgg)


def test_imagenet_file_that_does_not_fit_is_named(dataset_root, voc_arrays):
    vgg = {k: v for k, v in voc_arrays.items() if VGG16_KEYS.match(k)}
    vgg["extractor/conv1_2/W"] = np.zeros((64, 32, 3, 3), dtype=np.float32)
    path = put_in_cache("ssd300", "imagenet", vgg)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", "imagenet")
    e = info.value
    assert (e.kind, e.path, e.parameter, e.expected, e.found) == (
        "mismatch", path, "extractor/conv1_2/W", (64, 64, 3, 3), (64, 32, 3, 3))


@pytest.mark.parametrize("name", ["ssd300", "ssd512"])
def test_offline_says_which_file_to_place_where(dataset_root, name):
    url = CHAINERCV[name]._models["voc0712"]["url"]
    folder = dataset_root / "pfnet" / "chainercv" / "models"
    with pytest.raises(WeightsError) as info:
        build_ssd(name, "voc0712")
    err = info.value
    assert (err.kind, err.path) == ("missing", folder)
    assert str(folder / url.rsplit("/", 1)[1]) in str(err)
    assert err.__cause__ is None and err.__context__ is None  # no URLError traceback
    assert not any(folder.iterdir())


@pytest.mark.slow(seconds=13)
def test_local_npz_round_trip_with_sha256(tmp_path):
    np.random.seed(1)
    model = build_ssd("ssd300")
    assert model.weights_report is None
    path = tmp_path / "out" / "bccd_ssd300.npz"
    digest = save_weights(model, path)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (tmp_path / "out" / "bccd_ssd300.npz.sha256").read_text() == \
        f"{digest}  bccd_ssd300.npz\n"
    assert sorted(os.listdir(path.parent)) == ["bccd_ssd300.npz", "bccd_ssd300.npz.sha256"]
    saved = params_of(model)

    np.random.seed(2)
    loaded = build_ssd("ssd300", pretrained=path)
    assert isinstance(loaded, SSD300)
    for key, array in params_of(loaded).items():
        np.testing.assert_array_equal(array, saved[key])
    report = loaded.weights_report
    assert report.loaded == tuple(sorted(saved)) and len(report.loaded) == 71
    assert report.skipped == () and report.initialized == ()

    # the same weights saved again (later, elsewhere) are the same bytes: no clock inside
    time.sleep(2.1)                              # zip dates have 2-second resolution
    assert save_weights(loaded, tmp_path / "again.npz") == digest


def test_checksum_mismatch_is_named(tmp_path, bccd_file):
    path = tmp_path / bccd_file.name
    shutil.copy(bccd_file, path)
    shutil.copy(str(bccd_file) + ".sha256", str(path) + ".sha256")
    expected = (tmp_path / (bccd_file.name + ".sha256")).read_text().split()[0]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside an array
    path.write_bytes(bytes(data))
    with pytest.raises(WeightsError) as info:
        load_weights(build_ssd("ssd300"), path)
    err = info.value
    found = hashlib.sha256(bytes(data)).hexdigest()
    assert (err.kind, err.path, err.expected, err.found) == ("checksum", path, expected, found)


def test_other_class_count_names_parameter_shapes_and_cause(bccd_file):
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", bccd_file, n_fg_class=5)
    err = info.value
    assert (err.parameter, err.expected, err.found) == \
        ("multibox/conf/0/W", (24, 512, 3, 3), (16, 512, 3, 3))
    assert (err.kind, err.path) == ("mismatch", bccd_file)


@pytest.mark.slow(seconds=8)
def test_ssd512_file_into_ssd300_says_so(tmp_path):
    path = tmp_path / "ssd512.npz"
    np.savez(path, **arrays_of(SSD512, 3, seed=5))
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", path)
    assert info.value.parameter == "extractor/conv12_1/W"  # SSD512's extra layer
    assert "build_ssd('ssd512', ...)" in str(info.value)


def test_trainer_snapshot_is_recognized(tmp_path, bccd_file):
    with np.load(bccd_file) as npz:
        snapshot = {f"updater/model:main/model/{k}": npz[k] for k in npz.files}
    snapshot["updater/iteration"] = np.array(100)
    path = tmp_path / "snapshot_iter_100"
    with open(path, "wb") as f:
        np.savez(f, **snapshot)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", path)
    assert info.value.kind == "mismatch" and "trainer snapshot" in str(info.value)
    assert info.value.parameter == "extractor/conv10_1/W"  # the first one missing


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'ssd600'"):
        build_ssd("ssd600")
    with pytest.raises(ValueError, match="n_fg_class"):
        build_ssd("ssd300", n_fg_class=0)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", tmp_path / "nothing.npz")
    assert (info.value.kind, info.value.path) == ("missing", tmp_path / "nothing.npz")


def test_compare_weights(tmp_path):
    a = {"x/W": np.ones((2, 3), np.float32), "x/b": np.zeros(2, np.float32)}
    np.savez(tmp_path / "a.npz", **a)
    same = compare_weights(tmp_path / "a.npz", dict(a))
    assert same.identical and same.n_arrays == 2 and "bit for bit" in same.summary()
    b = dict(a, **{"x/W": a["x/W"] + np.float32(0.5)})
    other = compare_weights(a, b)
    assert not other.identical and other.n_different == 1
    assert (other.max_abs_diff, other.max_rel_diff) == (pytest.approx(0.5), pytest.approx(1 / 3))
    assert compare_weights(a, {"x/W": a["x/W"]}).only_in_one == ("x/b",)
    # the largest difference is printed as a plain number
    a = {"bn/avg_var": np.array([1.0, 2.0], np.float32), "W": np.zeros(2, np.float32)}
    b = {"bn/avg_var": np.array([1.0, 1042.0], np.float32), "W": np.zeros(2, np.float32)}
    comparison = compare_weights(a, b)
    assert (comparison.n_different, comparison.max_abs_diff) == (1, 1040.0)
    assert "largest difference 1,040;" in comparison.summary()


def assert_no_chained_error(err):
    """No raw zipfile/NumPy error shown under the named one."""
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__


def _with_non_finite(bccd_file, path, key, value):
    with np.load(bccd_file) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays[key] = arrays[key].copy()
    arrays[key].flat[[3, 5]] = value
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_weights_are_refused_naming_file_and_array(tmp_path, bccd_file, value):
    path = _with_non_finite(bccd_file, tmp_path / "diverged.npz", "multibox/loc/2/b", value)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", path)
    err = info.value
    assert (err.kind, err.path, err.parameter, err.count) == \
        ("not_finite", path, "multibox/loc/2/b", 1)


def test_evaluate_load_model_refuses_nan_weights(tmp_path, bccd_file):
    from medaidet.evaluation.evaluate import load_model
    path = _with_non_finite(bccd_file, tmp_path / "model.npz", "extractor/conv1_1/W", np.nan)
    with pytest.raises(WeightsError) as info:
        load_model(path)
    assert (info.value.kind, info.value.parameter) == ("not_finite", "extractor/conv1_1/W")


def test_non_finite_voc_cache_says_download_again(dataset_root, voc_arrays):
    arrays = dict(voc_arrays)
    arrays["extractor/conv4_3/b"] = np.full_like(arrays["extractor/conv4_3/b"], np.nan)
    put_in_cache("ssd300", "voc0712", arrays)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", "voc0712")
    assert (info.value.kind, info.value.parameter) == ("not_finite", "extractor/conv4_3/b")
    assert "downloaded again" in str(info.value)


def _tar(path):
    import tarfile
    inner = path.with_suffix(".txt")
    inner.write_text("x\n")
    with tarfile.open(path, "w") as tar:
        tar.add(inner, arcname="x.txt")


def _zip_of_other_files(path):
    import zipfile
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")


@pytest.mark.parametrize("make, what", [
    (lambda p: np.save(p.open("wb"), np.zeros(3, np.float32)), "is a single NumPy array (.npy"),
    (lambda p: p.write_text("extractor/conv1_1/W 0.1 0.2\n"),
     "is a text file (it begins 'extractor/conv1_1/W 0.1 0.2')"),
    (_tar, "is a tar archive"),
    (lambda p: p.write_bytes(b"\x80\x04\x95\x05\x00."), "is a Python pickle"),
    (lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100)), "is an HDF5 file"),
    (_zip_of_other_files, "is a zip archive but not an .npz of arrays"),
])
def test_a_file_of_another_kind_says_what_it_is(tmp_path, make, what):
    path = tmp_path / "weights.bin"
    make(path)
    with pytest.raises(WeightsError) as info:
        build_ssd("ssd300", path)
    assert (info.value.kind, info.value.path) == ("file", path) and what in str(info.value)
    assert_no_chained_error(info.value)


@pytest.mark.parametrize("cut", [0, 1, 30, 4096, -22, -1])
def test_truncated_or_empty_npz_is_named(tmp_path, bccd_file, cut):
    data = bccd_file.read_bytes()
    path = tmp_path / "model.npz"
    path.write_bytes(data[:cut] if cut >= 0 else data[:len(data) + cut])
    with pytest.raises(WeightsError) as info:
        load_weights(build_ssd("ssd300"), path)
    assert (info.value.kind, info.value.path) == ("file", path)
    assert ("is empty (0 bytes)" if cut == 0 else "is a truncated .npz") in str(info.value)
    assert_no_chained_error(info.value)


def test_damaged_entry_is_named(tmp_path, bccd_file):
    path = tmp_path / "model.npz"
    data = bytearray(bccd_file.read_bytes())
    data[len(data) // 2] ^= 0xFF        # inside an array: the zip's CRC no longer matches
    path.write_bytes(bytes(data))       # (no sidecar: the checksum file would say it first)
    with pytest.raises(WeightsError) as info:
        load_weights(build_ssd("ssd300"), path)
    assert (info.value.kind, info.value.path) == ("file", path)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_saved_weights_get_the_umask_mode_not_0600(tmp_path, umask_022):
    model = chainer.links.Linear(2, 3)   # every parameter shaped: saved without a forward pass
    path = tmp_path / "model.npz"
    save_weights(model, path)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert oct((tmp_path / "model.npz.sha256").stat().st_mode & 0o777) == oct(0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz", "model.npz.sha256"]
    os.umask(0o077)
    save_weights(model, tmp_path / "private.npz")
    assert oct((tmp_path / "private.npz").stat().st_mode & 0o777) == oct(0o600)


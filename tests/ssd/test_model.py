"""SSD builder and weight files, with weight files of the right shapes made here; ChainerCV's
cache is a temporary dataset root and every server a closed port, so nothing touches the network."""
import hashlib
import io
import os
import re
import shutil
import socket
import tarfile
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import chainer
import numpy as np
import pytest
from chainercv.links import SSD300, SSD512

from medaidet.errors import WeightsError
from medaidet.ssd import weights
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import compare_weights, load_weights, materialize, save_weights

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


def voc_cache(change):
    """ChainerCV's VOC file in the cache, changed by ``change(arrays)``; loading it."""
    def make(get, tmp):
        arrays = dict(get("voc_arrays"))
        change(arrays)
        path = put_in_cache("ssd300", "voc0712", arrays)
        return lambda: build_ssd("ssd300", "voc0712"), dict(path=path)
    return make


def imagenet_cache(get, tmp):
    vgg = {k: v for k, v in get("voc_arrays").items() if VGG16_KEYS.match(k)}
    vgg["extractor/conv1_2/W"] = np.zeros((64, 32, 3, 3), dtype=np.float32)
    path = put_in_cache("ssd300", "imagenet", vgg)
    return lambda: build_ssd("ssd300", "imagenet"), dict(path=path)


def uncached(name):
    return lambda get, tmp: (lambda: build_ssd(name, "voc0712"), dict(path=weights.cache_dir()))


def weights_copy(damage, sidecar=False):
    """The BCCD weight file, its bytes changed by ``damage(bytearray)``."""
    def make(get, tmp):
        path, source = tmp / "model.npz", get("bccd_file")
        data = bytearray(source.read_bytes())
        damaged = damage(data)
        path.write_bytes(bytes(data if damaged is None else damaged))
        fields = dict(path=path)
        if sidecar:
            shutil.copy(str(source) + ".sha256", str(path) + ".sha256")
            fields.update(expected=Path(str(source) + ".sha256").read_text().split()[0],
                          found=hashlib.sha256(path.read_bytes()).hexdigest())
        return lambda: load_weights(build_ssd("ssd300"), path), fields
    return make


def flip_a_byte(data):
    data[len(data) // 2] ^= 0xFF        # inside an array: the zip's CRC no longer matches


def with_non_finite(key, value, load=lambda path: build_ssd("ssd300", path)):
    def make(get, tmp):
        with np.load(get("bccd_file")) as npz:
            arrays = {k: npz[k] for k in npz.files}
        arrays[key] = arrays[key].copy()
        arrays[key].flat[[3, 5]] = value
        path = tmp / "model.npz"
        np.savez(path, **arrays)
        return lambda: load(path), dict(path=path)
    return make


def written(write=None):
    """A file ``write(binary file, fixture getter)`` wrote (None: no file); loading it."""
    def make(get, tmp):
        path = tmp / "weights.bin"
        if write:
            with path.open("wb") as f:
                write(f, get)
        return lambda: build_ssd("ssd300", path), dict(path=path)
    return make


def snapshot(f, get):
    with np.load(get("bccd_file")) as npz:
        arrays = {f"updater/model:main/model/{k}": npz[k] for k in npz.files}
    np.savez(f, **arrays, **{"updater/iteration": np.array(100)})


def tar_file(f, get):
    with tarfile.open(fileobj=f, mode="w") as tar:
        info = tarfile.TarInfo("x.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"x\n"))


def zip_of_other_files(f, get):
    with zipfile.ZipFile(f, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")


def error(make, kind, slow=None, **fields):
    marks = [pytest.mark.slow(seconds=slow)] if slow else []
    return pytest.param(make, kind, fields, marks=marks)


def evaluate_load_model(path):
    from medaidet.evaluation.evaluate import load_model
    return load_model(path)


WEIGHTS_ERRORS = {
    # id: (make(fixture getter, tmp_path) -> (call, fields known then), kind, fields)
    "voc-other-shape": error(voc_cache(lambda a: a.update({"multibox/loc/0/W": np.zeros(
        (8, 512, 3, 3), np.float32)})), "mismatch", parameter="multibox/loc/0/W",
        expected=(16, 512, 3, 3), found=(8, 512, 3, 3)),
    # (the shape is not known before the model's first forward pass)
    "voc-missing-array": error(voc_cache(lambda a: a.pop("extractor/conv1_1/b")), "mismatch",
                               parameter="extractor/conv1_1/b", found=None),
    "voc-not-finite": error(voc_cache(lambda a: a.update({"extractor/conv4_3/b": np.full_like(
        a["extractor/conv4_3/b"], np.nan)})), "not_finite", parameter="extractor/conv4_3/b"),
    "imagenet-other-shape": error(imagenet_cache, "mismatch", parameter="extractor/conv1_2/W",
                                  expected=(64, 64, 3, 3), found=(64, 32, 3, 3)),
    "offline-ssd300": error(uncached("ssd300"), "missing"),
    "offline-ssd512": error(uncached("ssd512"), "missing"),
    "no-file": error(written(), "missing"),
    "checksum": error(weights_copy(flip_a_byte, sidecar=True), "checksum"),
    "damaged-entry": error(weights_copy(flip_a_byte), "file"),     # no sidecar to say it first
    **{f"cut-{cut}": error(weights_copy(lambda data, cut=cut: data[:cut] if cut >= 0 else
                                     data[:len(data) + cut]), "file")
       for cut in (0, 1, 30, 4096, -22, -1)},
    "other-class-count": error(
        lambda get, tmp: (lambda: build_ssd("ssd300", get("bccd_file"), n_fg_class=5),
                          dict(path=get("bccd_file"))),
        "mismatch", parameter="multibox/conf/0/W", expected=(24, 512, 3, 3),
        found=(16, 512, 3, 3)),
    "ssd512-file": error(written(lambda f, get: np.savez(f, **arrays_of(SSD512, 3, seed=5))),
                         "mismatch", slow=8,
                         parameter="extractor/conv12_1/W"),           # SSD512's extra layer
    "trainer-snapshot": error(written(snapshot), "mismatch",
                              parameter="extractor/conv10_1/W"),   # the first one missing
    **{f"not-finite-{value}": error(with_non_finite("multibox/loc/2/b", value), "not_finite",
                                    parameter="multibox/loc/2/b", count=1)
       for value in (np.nan, np.inf)},
    "not-finite-evaluate": error(with_non_finite("extractor/conv1_1/W", np.nan,
                                                 evaluate_load_model),
                                 "not_finite", parameter="extractor/conv1_1/W"),
    "npy": error(written(lambda f, get: np.save(f, np.zeros(3, np.float32))), "file"),
    **{name: error(written(lambda f, get, data=data: f.write(data)), "file") for name, data in (
        ("text", b"extractor/conv1_1/W 0.1 0.2\n"), ("pickle", b"\x80\x04\x95\x05\x00."),
        ("hdf5", b"\x89HDF\r\n\x1a\n" + bytes(100)))},
    "tar": error(written(tar_file), "file"),
    "zip-not-npz": error(written(zip_of_other_files), "file"),
}


@pytest.mark.parametrize("make, kind, fields", WEIGHTS_ERRORS.values(),
                         ids=list(WEIGHTS_ERRORS))
def test_weights_errors_are_named(request, dataset_root, tmp_path, make, kind, fields):
    call, known = make(request.getfixturevalue, tmp_path)
    cached = sorted(p for p in dataset_root.rglob("*") if p.is_file())
    with pytest.raises(WeightsError) as info:
        call()
    err = info.value
    assert {name: getattr(err, name) for name in ("kind", *known, *fields)} == \
        dict(kind=kind, **known, **fields)
    assert err.__cause__ is None            # no raw zipfile, NumPy or URLError traceback
    assert err.__context__ is None or err.__suppress_context__
    assert sorted(p for p in dataset_root.rglob("*") if p.is_file()) == cached   # as it was


@pytest.mark.parametrize("arguments", [("ssd600",), ("ssd300", None, 0)])
def test_bad_arguments(arguments):
    with pytest.raises(ValueError):
        build_ssd(*arguments)


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


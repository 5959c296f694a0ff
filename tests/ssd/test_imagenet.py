"""SSD's ImageNet VGG-16 sources, against a real HTTP server on 127.0.0.1 serving random
weights in each publisher's layout; the sources' sha256 pins are those files'."""
import functools
import hashlib
import http.server
import logging
import socket
import threading
from dataclasses import replace

import chainer
import numpy as np
import pytest
from vgg_files import timm_layout, torchvision_vgg16, write_vgg_file

from medaidet.ssd import weights
from medaidet.ssd.model import build_ssd
from medaidet.ssd.weights import SOURCES, VGG16_SHAPES, convert_vgg16, pretrained_file
from medaidet.errors import WeightsError


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def state():
    return torchvision_vgg16(seed=1)


@pytest.fixture(scope="module")
def served(state, tmp_path_factory):
    """A folder served on 127.0.0.1 holding each publisher's file (and ChainerCV's layout)."""
    root = tmp_path_factory.mktemp("www")
    write_vgg_file(state, root / "model.safetensors")
    converted = convert_vgg16(timm_layout(state))
    np.savez(root / "ssd_vgg16_imagenet_converted_2017_06_09.npz",
             **{k: v for k, v in converted.items() if k in VGG16_SHAPES})
    np.savez(root / "not_vgg.npz", **{"extractor/conv1_1/W": np.zeros((8, 3, 3, 3))})
    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def closed_port_url(name):
    with socket.socket() as s:          # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def sources(served, chainercv="closed", timm="good"):
    """The two sources with local URLs; each 'good', 'closed', '404', 'wrong-sha' or 'not-vgg'."""
    root, base = served
    files = {"chainercv": "ssd_vgg16_imagenet_converted_2017_06_09.npz",
             "timm": "model.safetensors"}
    out = []
    for source, how in zip(SOURCES["ssd300", "imagenet"], (chainercv, timm), strict=True):
        name = files[source.name]
        url = {"closed": closed_port_url(name), "404": f"{base}/missing/{name}",
               "not-vgg": f"{base}/not_vgg.npz"}.get(how, f"{base}/{name}")
        digest = sha256(root / name)
        if how == "wrong-sha":
            digest = hashlib.sha256(b"another file").hexdigest()
        if source.sha256:
            source = replace(source, sha256=digest)
        out.append(replace(source, url=url))
    return tuple(out)


@pytest.fixture
def cache(tmp_path):
    old = chainer.dataset.get_dataset_root()
    chainer.dataset.set_dataset_root(str(tmp_path / "dataset"))
    yield tmp_path / "dataset" / "pfnet" / "chainercv" / "models"
    chainer.dataset.set_dataset_root(old)


def params(model):
    return {name.lstrip("/"): p.array for name, p in model.namedparams()}


def fetch(chain):
    """SSD300's ImageNet file from the ``chain`` of sources: (path, source, how)."""
    return pretrained_file("ssd300", "imagenet", progress=False, sources=chain)


@pytest.mark.slow(seconds=19)
def test_chainercv_unreachable_builds_from_timms_file(served, state, cache, monkeypatch,
                                                      caplog):
    chain = sources(served, chainercv="closed")
    monkeypatch.setitem(weights.SOURCES, ("ssd300", "imagenet"), chain)
    caplog.set_level(logging.INFO, logger="medaidet")
    model = build_ssd("ssd300", pretrained="imagenet")
    report = model.weights_report
    assert report.origin == "timm's vgg16.tv_in1k (converted), download"
    assert "ssd_vgg16_imagenet_from_timm.npz" in report.source
    assert "Connection refused" in caplog.text        # ChainerCV's server was tried first
    want = convert_vgg16(timm_layout(state))
    got = params(model)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert len(report.loaded) == 31 and "extractor/conv8_1/W" in report.initialized
    # kept: the converted file and its sidecar; not the 500 MB download
    assert sorted(p.name for p in cache.iterdir()) == [
        "ssd_vgg16_imagenet_from_timm.npz", "ssd_vgg16_imagenet_from_timm.npz.sha256"]
    monkeypatch.setitem(weights.SOURCES, ("ssd512", "imagenet"),
                        sources(served, "closed", "closed"))
    again = build_ssd("ssd512", pretrained="imagenet")
    assert again.weights_report.origin.endswith(", cache")
    np.testing.assert_array_equal(params(again)["extractor/conv6/W"],
                                  want["extractor/conv6/W"])


@pytest.mark.slow(seconds=6)
def test_404_then_timm(served, cache, caplog):
    caplog.set_level(logging.INFO, logger="medaidet")
    path, source, how = fetch(sources(served, chainercv="404", timm="good"))
    assert (source.name, how) == ("timm", "download")
    assert path == cache / "ssd_vgg16_imagenet_from_timm.npz"
    assert "HTTP 404" in caplog.text


PLACED = "vgg16.tv_in1k.safetensors"        # timm's file, placed by hand
CONVERTED = "ssd_vgg16_imagenet_from_timm.npz"
SIDECAR = CONVERTED + ".sha256"
CHAINERCVS = "ssd_vgg16_imagenet_converted_2017_06_09.npz"


def prepare(cache, served, step):
    """Before the fetch: timm's file placed by hand ('placed', 'placed-wrong'), or its converted
    file fetched, then changed ('appended', 'truncated')."""
    if step in ("placed", "placed-wrong"):
        cache.mkdir(parents=True)
        (cache / PLACED).write_bytes((served[0] / "model.safetensors").read_bytes()
                                     if step == "placed" else b"{}" * 10)
    elif step:
        path, _, _ = fetch(sources(served, chainercv="closed", timm="good"))
        if step == "appended":
            path.write_bytes(path.read_bytes() + b"changed")
        else:       # with a sidecar for the damaged file: it proves nothing, the build reads it
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            path.with_name(SIDECAR).write_text(f"{sha256(path)}  {path.name}\n")


@pytest.mark.parametrize("chainercv, timm, step, expected, cached", [
    ("good", "good", None, ("chainercv", "download", CHAINERCVS), {CHAINERCVS}),
    ("not-vgg", "good", None, ("timm", "download", CONVERTED), {CONVERTED, SIDECAR}),  # deleted
    ("closed", "closed", "placed", ("timm", "cache", CONVERTED), {PLACED, CONVERTED, SIDECAR}),
], ids=["chainercvs-own-file", "not-vgg-then-timm", "timm-placed-by-hand"])
def test_a_source_gives_the_file(served, cache, chainercv, timm, step, expected, cached):
    prepare(cache, served, step)
    path, source, how = fetch(sources(served, chainercv, timm))
    assert (source.name, how, path) == expected[:2] + (cache / expected[2],)
    assert {p.name for p in cache.iterdir()} == cached
    if source.name == "chainercv":
        assert sha256(path) == sha256(served[0] / path.name)      # no conversion


@pytest.mark.parametrize("chainercv, timm, step, kind, name", [
    ("404", "wrong-sha", None, "missing", None),        # the download is deleted
    ("closed", "404", None, "missing", None),           # every source failed
    ("closed", "closed", "placed-wrong", "checksum", PLACED),
    ("closed", "good", "appended", "checksum", CONVERTED),
    ("closed", "good", "truncated", "file", CONVERTED),
], ids=["download-of-another-checksum", "offline", "placed-wrong", "converted-changed",
        "converted-truncated"])
def test_a_source_that_fails_is_named(served, cache, chainercv, timm, step, kind, name):
    prepare(cache, served, step)
    with pytest.raises(WeightsError) as info:
        fetch(sources(served, chainercv, timm))
    assert (info.value.kind, info.value.path) == (kind, cache / name if name else cache)
    if name is None:
        assert not cache.exists() or not any(cache.iterdir())

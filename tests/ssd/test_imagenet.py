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


def test_a_download_with_another_checksum_is_deleted_and_named(served, cache):
    with pytest.raises(WeightsError) as info:
        fetch(sources(served, chainercv="404", timm="wrong-sha"))
    assert info.value.kind == "missing"
    assert not cache.exists() or not any(cache.iterdir())


def test_chainercvs_own_file_is_used_as_it_is(served, cache):
    path, source, how = fetch(sources(served, "good"))
    assert (source.name, how) == ("chainercv", "download")
    assert path == cache / "ssd_vgg16_imagenet_converted_2017_06_09.npz"
    assert sha256(path) == sha256(served[0] / path.name)      # no conversion


def test_a_server_file_that_is_not_vgg16_is_deleted(served, cache, caplog):
    caplog.set_level(logging.INFO, logger="medaidet")
    _, source, _ = fetch(sources(served, chainercv="not-vgg", timm="good"))
    assert source.name == "timm"
    assert "is not ChainerCV's ImageNet VGG-16" in caplog.text
    assert not (cache / "ssd_vgg16_imagenet_converted_2017_06_09.npz").exists()


def test_offline_one_error_lists_every_source(served, cache):
    chain = sources(served, "closed", "404")
    with pytest.raises(WeightsError) as info:
        fetch(chain)
    for source in chain:
        assert source.url in str(info.value) and str(cache / source.file_name) in str(info.value)
    assert (info.value.kind, info.value.path) == ("missing", cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_a_file_placed_by_hand_is_checked_and_converted(served, cache):
    cache.mkdir(parents=True)
    placed = cache / "vgg16.tv_in1k.safetensors"
    placed.write_bytes((served[0] / "model.safetensors").read_bytes())
    path, source, how = fetch(sources(served, "closed", "closed"))
    assert (source.name, how, path.name) == ("timm", "cache", "ssd_vgg16_imagenet_from_timm.npz")
    assert placed.exists()


def test_a_wrong_file_placed_by_hand_is_named(served, cache):
    cache.mkdir(parents=True)
    wrong = cache / "vgg16.tv_in1k.safetensors"
    wrong.write_bytes(b"{}" * 10)
    with pytest.raises(WeightsError) as info:
        fetch(sources(served, "closed", "closed"))
    assert (info.value.kind, info.value.path) == ("checksum", wrong)


def test_a_converted_file_changed_since_is_named(served, cache):
    chain = sources(served, chainercv="closed", timm="good")
    path, _, _ = fetch(chain)
    with open(path, "ab") as f:
        f.write(b"changed")
    with pytest.raises(WeightsError) as info:
        fetch(chain)
    assert (info.value.kind, info.value.path) == ("checksum", path)


def test_a_truncated_converted_file_with_a_matching_sidecar_is_damaged_not_cached(served, cache):
    """A sidecar written for the damaged file proves nothing: the build reads the file."""
    chain = sources(served, chainercv="closed", timm="good")
    path, _, _ = fetch(chain)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    path.with_name(path.name + ".sha256").write_text(f"{sha256(path)}  {path.name}\n")
    with pytest.raises(WeightsError) as info:
        fetch(chain)
    assert info.value.path == path

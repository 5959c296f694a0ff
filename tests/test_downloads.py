"""medaidet.downloads vs a local server that lies about sizes or trickles: a DataError, never a
full disk or an endless wait."""
import http.server
import io
import threading
import time

import pytest

from medaidet.downloads import stream_url
from medaidet.errors import DataError, WeightsError


class _Liar(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        if self.path == "/huge":                     # announces 10 TB, sends a little
            self.send_header("Content-Length", str(10 * 10**12))
            self.end_headers()
            self.wfile.write(b"x" * 1000)
        elif self.path == "/trickle":                # one byte every 0.2 s, for a minute
            self.send_header("Content-Length", "300")
            self.end_headers()
            for _ in range(300):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.2)
        else:                                        # no length, more than allowed
            self.end_headers()
            self.wfile.write(b"y" * 5000)


@pytest.fixture(scope="module")
def liar():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Liar)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _get(url, **kwargs):
    out = io.BytesIO()
    stream_url(url, out, timeout=5, user_agent="test", desc="test", progress=False, **kwargs)
    return out


def test_an_announced_size_above_the_cap_is_refused_before_reading(liar):
    with pytest.raises(DataError) as info:
        _get(f"{liar}/huge", max_bytes=10**6)
    assert info.value.kind == "download" and not info.value.offline
    assert "10000000000000" in str(info.value) and "1000000" in str(info.value)   # both sizes


def test_more_bytes_than_the_cap_without_a_length(liar):
    with pytest.raises(DataError) as info:
        _get(f"{liar}/plain", max_bytes=4096)
    assert info.value.kind == "download" and not info.value.offline


def test_a_trickling_server_meets_the_deadline(liar):
    began = time.monotonic()
    with pytest.raises(DataError) as info:
        _get(f"{liar}/trickle", deadline_s=1)
    assert info.value.kind == "download" and info.value.offline
    assert time.monotonic() - began < 10   # each byte arrives within the socket timeout


def test_weight_downloads_are_capped_at_about_twice_the_largest_file(liar, tmp_path):
    from dataclasses import replace

    import chainer

    from medaidet.ssd import weights
    source = replace(weights.SOURCES["ssd300", "imagenet"][1], url=f"{liar}/huge")
    assert 1e9 < weights.MAX_DOWNLOAD_BYTES < 1.2e9
    old = chainer.dataset.get_dataset_root()
    chainer.dataset.set_dataset_root(str(tmp_path))
    try:
        with pytest.raises(WeightsError, match="announces 10000000000000 bytes") as info:
            weights._download(source, progress=False, timeout=5)
    finally:
        chainer.dataset.set_dataset_root(old)
    assert info.value.kind == "source"
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []   # nothing left behind

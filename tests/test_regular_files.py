"""Every file we read is checked to be regular first: a FIFO blocks its reader for ever, a link
to ``/dev/zero`` reads until memory runs out. Calls run with a deadline, so nothing hangs."""
import os
import threading

import pytest

from medaidet.data.bccd import parse_annotation, parse_yolo_labels
from medaidet.data.image import decode_image, read_image_size
from medaidet.errors import DataError, WeightsError
from medaidet.files import not_a_regular_file
from medaidet.ssd.weights import read_arrays


def raised_within(call, seconds=10):
    """The exception ``call()`` raised, failing the test if it has not returned in time."""
    outcome = {}

    def run():
        try:
            call()
        except BaseException as exc:        # noqa: BLE001 (the outcome is the exception)
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s: it blocked or never ends"
    return outcome.get("error")


@pytest.fixture(params=["fifo", "dev_zero", "folder"])
def not_a_file(request, tmp_path):
    path = tmp_path / f"input.{request.param}"
    if request.param == "fifo":
        os.mkfifo(path)
    elif request.param == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    yield path
    if request.param == "fifo":     # free a reader a regression left waiting
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


@pytest.mark.parametrize("read, error, kind", [
    (decode_image, DataError, "image"),
    (read_image_size, DataError, "image"),
    (lambda p: parse_yolo_labels(p, (480, 640)), DataError, "yolo"),
    (parse_annotation, DataError, "xml"),
    (read_arrays, WeightsError, "file"),
], ids=["decode_image", "read_image_size", "yolo labels", "voc annotation", "weights"])
def test_each_reader_refuses_what_is_not_a_regular_file(read, error, kind, not_a_file):
    raised = raised_within(lambda: read(not_a_file))
    assert isinstance(raised, error) and raised.kind == kind, raised
    assert str(not_a_file) in str(raised)


def test_what_is_not_a_regular_file_is_named(tmp_path):
    regular = tmp_path / "a.jpg"
    regular.write_bytes(b"x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.jpg"
    link.symlink_to(regular)
    assert not_a_regular_file(regular) is None and not_a_regular_file(link) is None
    assert not_a_regular_file(tmp_path / "missing") is None   # the reader says "missing"
    assert "FIFO" in not_a_regular_file(fifo) and "folder" in not_a_regular_file(tmp_path)
    assert "device" in not_a_regular_file("/dev/zero")


@pytest.mark.slow(seconds=5)
def test_count_image_on_a_fifo_is_one_named_line(tmp_path, capsys):
    from medaidet import cli

    pytest.importorskip("onnxruntime")
    fifo = tmp_path / "smear.jpg"
    os.mkfifo(fifo)
    model = tmp_path / "model.onnx"
    os.mkfifo(model)
    status = {}
    error = raised_within(lambda: status.setdefault(
        "rc", cli.main(["count-image", "--model", str(model), str(fifo)])))
    assert error is None and status["rc"] != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(model) in err and "FIFO" in err

"""A weight file is untrusted: a small .npz declaring or inflating to gigabytes must end in a
named WeightsError having taken almost no memory (tracemalloc sees NumPy's allocations)."""
import io
import tracemalloc
import zipfile

import numpy as np
import pytest

from medaidet import cli
from medaidet.errors import WeightsError
from medaidet.ssd import weights
from medaidet.ssd.weights import read_arrays

PEAK = 64 * 2**20      # what reading a refused file may take, at most


def npy_header(shape, dtype="<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


@pytest.fixture
def lying_header(tmp_path):
    """An .npz whose member declares 2**30 float32 (4 GiB) and holds 16 bytes."""
    path = tmp_path / "lying.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("extractor/conv1_1/W.npy", npy_header((2**30,)) + bytes(16))
    return path


@pytest.fixture
def inflating(tmp_path):
    """An .npz of a few hundred KB whose one member inflates to 300 MiB of zeros."""
    path = tmp_path / "inflating.npz"
    n = 300 * 2**20 // 4
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("extractor/conv1_1/W.npy", "w", force_zip64=True) as member:
            member.write(npy_header((n,)))
            chunk = bytes(2**20)
            for _ in range(300):
                member.write(chunk)
    return path


def refused(read, path):
    """The WeightsError ``read(path)`` raises, and the peak memory it took."""
    tracemalloc.start()
    try:
        with pytest.raises(WeightsError) as info:
            read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return info.value, peak


def test_a_header_declaring_gigabytes_is_refused_before_allocating(lying_header):
    error, peak = refused(read_arrays, lying_header)
    assert error.kind == "file" and error.parameter == "extractor/conv1_1/W.npy"
    assert error.path == lying_header and peak < PEAK


def test_a_member_inflating_past_the_limit_is_refused_unread(inflating):
    assert inflating.stat().st_size < 2 * 2**20
    error, peak = refused(read_arrays, inflating)
    assert error.kind == "too_large" and error.parameter == "extractor/conv1_1/W.npy"
    assert peak < PEAK


def test_members_over_the_total_limit_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "two.npz"
    np.savez(path, a=np.zeros(2**18, np.float32), b=np.zeros(2**18, np.float32))  # 1 MiB each
    assert set(read_arrays(path)) == {"a", "b"}                   # under the limits: read
    monkeypatch.setattr(weights, "MAX_TOTAL_BYTES", 3 * 2**19)  # 1.5 MiB in all
    error, _ = refused(read_arrays, path)
    assert error.kind == "too_large" and error.parameter == "b.npy"


def test_a_snapshot_to_resume_is_held_to_the_same_limits(inflating):
    from medaidet.training.train import load_snapshot

    error, peak = refused(lambda p: load_snapshot(None, p, train_size=4, batch_size=2),
                          inflating)
    assert error.kind == "too_large" and peak < PEAK


@pytest.mark.slow(seconds=10)
@pytest.mark.parametrize("command", [["export", "{path}", "--out", "{out}"],
                                     ["evaluate", "{path}"], ["count", "{path}"]])
def test_the_commands_refuse_it_in_one_named_line(command, lying_header, tmp_path, capsys):
    argv = [a.format(path=lying_header, out=tmp_path / "x.onnx") for a in command]
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status != 0 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("medaidet") and str(lying_header) in err
    assert not (tmp_path / "x.onnx").exists()

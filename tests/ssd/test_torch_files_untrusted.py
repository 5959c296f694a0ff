"""A ``.pth`` file is untrusted data: no pickle in it runs code, and no size it declares is
believed before it is checked against the bytes really there. Each hostile file below is
made from the real PyTorch-saved fixtures (data/) or written opcode by opcode."""
import io
import os
import pickle
import pickletools
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from medaidet.ssd import torch_files
from medaidet.ssd.torch_files import read_state_dict
from medaidet.errors import WeightsError
from vgg_files import write_pth

DATA = Path(__file__).parent / "data"
#: the five pickles of a legacy file, in order (then the storages' bytes)
POSITIONS = ("magic number", "protocol version", "system info", "state dict", "storage keys")


class _MakesFolder:
    """Unpickled, it would create a folder: the marker of code run by a pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _legacy_pickles(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each of the five pickles, found by parsing (nothing is run)."""
    f, spans = io.BytesIO(data), []
    for _ in POSITIONS:
        start = f.tell()
        for _op in pickletools.genops(f):
            pass
        spans.append((start, f.tell()))
    return spans


@pytest.mark.parametrize("position", range(len(POSITIONS)), ids=POSITIONS)
def test_no_pickle_of_a_legacy_file_runs_code(position, tmp_path):
    data = (DATA / "torch_state_legacy.pth").read_bytes()
    start, end = _legacy_pickles(data)[position]
    marker = tmp_path / "the-pickle-ran"
    evil = pickle.dumps(_MakesFolder(marker), protocol=2)
    path = tmp_path / "evil.pth"
    path.write_bytes(data[:start] + evil + data[end:])
    with pytest.raises(WeightsError, match=r"evil\.pth.*(posix|os)\.mkdir"):
        read_state_dict(path)
    assert not marker.exists()
    # the file it was made from still reads
    assert read_state_dict(DATA / "torch_state_legacy.pth")


def _pth_with(tmp_path, old: bytes, new: bytes) -> Path:
    """A zip-format file of one 2x3 float32 tensor whose pickle has ``old`` replaced by ``new``."""
    path = tmp_path / "w.pth"
    write_pth({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, path)
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    assert entries["archive/data.pkl"].count(old) == 1
    entries["archive/data.pkl"] = entries["archive/data.pkl"].replace(old, new)
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return path


def _int(n):
    return b"J" + struct.pack("<i", n)


def test_negative_strides_and_offsets_are_refused_not_read_outside_the_storage(tmp_path):
    strides = b"(" + _int(3) + _int(1) + b"t"
    path = _pth_with(tmp_path, strides, b"(" + _int(-3) + _int(1) + b"t")
    with pytest.raises(WeightsError, match=r"strides \(-3, 1\).*negative"):
        read_state_dict(path)
    offset = b"Q" + _int(0)             # the storage, then the tensor's offset in it
    path = _pth_with(tmp_path, offset, b"Q" + _int(-4))
    with pytest.raises(WeightsError, match="offset -4"):
        read_state_dict(path)


def test_a_shape_larger_than_its_storage_is_refused_before_allocating(tmp_path):
    shape = b"(" + _int(2) + _int(3) + b"t"
    huge = b"(" + _int(2**30) + _int(2**30) + b"t"
    path = _pth_with(tmp_path, shape + b"(" + _int(3) + _int(1) + b"t",
                     huge + b"(" + _int(0) + _int(0) + b"t")       # stride 0: no bounds hit
    with pytest.raises(WeightsError, match="more elements than its storage of 6"):
        read_state_dict(path)


def test_a_declared_storage_size_is_checked_before_it_is_read(tmp_path):
    # numel 2**40 elements (LONG1): refused as it is declared
    numel = _int(6) + b"t" + b"Q"
    path = _pth_with(tmp_path, numel, b"\x8a\x06" + (2**40).to_bytes(6, "little") + b"tQ")
    with pytest.raises(WeightsError, match="1099511627776 elements"):
        read_state_dict(path)
    # a storage entry of 256 MB of zeros (a 250 kB deflated bomb) for a header saying 6 floats
    path = tmp_path / "bomb.pth"
    write_pth({"w": np.zeros(6, np.float32)}, path)
    with zipfile.ZipFile(path) as archive:
        pkl = archive.read("archive/data.pkl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pkl)
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/data/0", bytes(256 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(WeightsError, match=r"storage 0 is 268435456 bytes in the archive, "
                                                 r"its header says 6 x 4"):
            read_state_dict(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20       # refused before the 256 MB were inflated


def test_a_legacy_storage_longer_than_the_file_is_refused(tmp_path):
    data = (DATA / "torch_state_legacy.pth").read_bytes()
    end = _legacy_pickles(data)[-1][1]
    (count,) = struct.unpack("<q", data[end:end + 8])
    path = tmp_path / "cut.pth"
    path.write_bytes(data[:end] + struct.pack("<q", 2**40) + data[end + 8:])
    with pytest.raises(WeightsError, match="bytes are left in the file"):
        read_state_dict(path)
    assert count > 0


def test_deep_nesting_and_huge_declared_bytes_are_named_errors(tmp_path):
    deep = b"\x80\x02" + b"}X\x01\x00\x00\x00k" * 200_000 + b"}" + b"s" * 200_000 + b"."
    path = tmp_path / "deep.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", deep)
    with pytest.raises(WeightsError, match="nested too deeply or declares more data"):
        read_state_dict(path)
    # BINBYTES8 declaring 2**62 bytes: the pickle's own allocation
    huge = b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"."
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", huge)
    with pytest.raises(WeightsError, match=r"deep\.pth cannot be read"):
        read_state_dict(path)


def test_a_pickle_entry_above_the_cap_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(torch_files, "MAX_PICKLE_BYTES", 100)
    path = tmp_path / "w.pth"
    write_pth({"w": np.zeros((4, 4), np.float32)}, path)
    with pytest.raises(WeightsError, match="data.pkl declares more than 100 bytes"):
        read_state_dict(path)

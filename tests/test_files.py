"""medaidet.files: a full disk leaves no half-written file, and its error names the file."""
import errno
import os

import pytest

from conftest import run_python
from medaidet.files import atomic_file, write_files

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"),
                                    reason="needs Linux's /dev/full (every write: ENOSPC)")


def _to_dev_full(f) -> None:
    """From now on the writes to ``f`` go to /dev/full: a real "No space left on device"."""
    f.flush()
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, f.fileno())
    os.close(full)


@needs_dev_full
@pytest.mark.parametrize("mode", ["w", "wb"])
def test_a_full_disk_keeps_the_old_file_and_the_error_names_it(tmp_path, mode):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with pytest.raises(OSError) as info:
        with atomic_file(target, mode) as f:
            _to_dev_full(f)
            f.write("new" * 10_000 if mode == "w" else b"new" * 10_000)
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(target)  # the write itself names no file
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["summary.json"]  # no .part left


def test_other_errors_are_left_as_they_are(tmp_path):
    target = tmp_path / "weights.npz"
    with pytest.raises(ConnectionResetError) as info:
        with atomic_file(target):
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    assert info.value.filename is None  # not a write that found no room: no file to blame
    assert os.listdir(tmp_path) == []


def test_write_files_writes_text_and_bytes(tmp_path):
    write_files({tmp_path / "evaluation.json": "{\"map\": \"µ\"}\n",
                 tmp_path / "pr_curves.png": b"\x89PNG"})
    assert (tmp_path / "evaluation.json").read_text(encoding="utf-8") == "{\"map\": \"µ\"}\n"
    assert (tmp_path / "pr_curves.png").read_bytes() == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["evaluation.json", "pr_curves.png"]


def test_write_files_changes_none_when_one_finds_no_room(tmp_path):
    """When its figure does not fit (a real EFBIG), a result keeps its old content too."""
    (tmp_path / "evaluation.json").write_text("old result")
    (tmp_path / "pr_curves.png").write_bytes(b"old figure")
    done = run_python(f"""
import resource, signal
from pathlib import Path
from medaidet.files import write_files
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
folder = Path({str(tmp_path)!r})
try:
    write_files({{folder / "evaluation.json": "new result", folder / "pr_curves.png": b"x" * 5000}})
except OSError as exc:
    print(exc.errno, exc.filename)
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(errno.EFBIG), str(tmp_path / "pr_curves.png")]
    assert (tmp_path / "evaluation.json").read_text() == "old result"
    assert (tmp_path / "pr_curves.png").read_bytes() == b"old figure"
    assert sorted(os.listdir(tmp_path)) == ["evaluation.json", "pr_curves.png"]


def test_an_output_never_replaces_a_device_a_fifo_a_folder_or_an_input(tmp_path):
    from medaidet.files import check_output
    from medaidet.errors import ConfigError
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nothing")
    for target, what in ((fifo, "a device, FIFO or socket"), (tmp_path, "a folder"),
                         (link, "a link to nothing")):
        with pytest.raises(ConfigError) as info:
            with atomic_file(target) as f:
                f.write(b"x")
        assert (info.value.kind, info.value.path) == ("not_a_file", target)
        assert what in str(info.value)                     # it says what is there
    if os.path.exists("/dev/null"):    # as root (Colab) a rename would make it a plain file
        with pytest.raises(ConfigError) as info:
            write_files({tmp_path / "ok.json": "{}", "/dev/null": b"x"})
        assert (info.value.kind, str(info.value.path)) == ("not_a_file", "/dev/null")
        assert not (tmp_path / "ok.json").exists()           # checked before any write
        assert not os.path.isfile("/dev/null")
    source = tmp_path / "in.npz"
    source.write_bytes(b"weights")
    alias = tmp_path / "alias.npz"
    alias.symlink_to(source)
    for target in (source, alias):
        with pytest.raises(ConfigError) as info:
            with atomic_file(target, inputs=[source]) as f:
                f.write(b"drawing")
        assert (info.value.kind, info.value.path) == ("input", target)
    assert source.read_bytes() == b"weights" and fifo.exists() and not fifo.is_file()
    # a regular file or a link to one, not an input: replaced as before
    (tmp_path / "old.txt").write_text("old")
    assert check_output(tmp_path / "old.txt", inputs=[source]) == tmp_path / "old.txt"
    with atomic_file(tmp_path / "old.txt", "w", inputs=[source]) as f:
        f.write("new")
    assert (tmp_path / "old.txt").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []

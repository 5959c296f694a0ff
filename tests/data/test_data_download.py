"""``medaidet data download``, from archives rebuilt from the real BCCD served on 127.0.0.1."""
import collections
import gzip
import http.server
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from medaidet.data import download as dl
from medaidet.data.download import download_bccd, resolve_root, verify_dataset
from medaidet.errors import DataError

REPO = Path(__file__).resolve().parents[2]

TOP = f"BCCD_Dataset-{dl.BCCD.commit}"
CORRUPTED = "JPEGImages/BloodImage_00042.jpg"


def upstream_name(rel: str) -> str:
    """Manifest path -> member name in GitHub's archive of the commit."""
    return f"{TOP}/{rel}" if "/" not in rel else f"{TOP}/BCCD/{rel}"


def _member(name, kind=tarfile.DIRTYPE, target=""):
    """A member without data: a folder (0755), or with ``kind`` a link, device or FIFO."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    return info


def make_tar_gz(entries) -> bytes:
    """``entries``: ``(name, bytes)`` or a ``TarInfo``; written like ``git archive`` (pax)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1, format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": dl.BCCD.commit}) as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])     # mode 0644
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return buf.getvalue()


def upstream_entries(files: dict, replace=None):
    """The whole upstream archive: directories, the manifest files, and extras we ignore."""
    return [_member(f"{TOP}/"), ("%s/README.md" % TOP, b"# BCCD Dataset\n"),
            (f"{TOP}/example.jpg", b"\xff\xd8not used\xff\xd9"),
            _member(f"{TOP}/scripts/"), (f"{TOP}/scripts/split.py", b"print('split')\n"),
            _member(f"{TOP}/BCCD/"), _member(f"{TOP}/BCCD/ImageSets/"),
            _member(f"{TOP}/BCCD/ImageSets/Main/"), _member(f"{TOP}/BCCD/Annotations/"),
            _member(f"{TOP}/BCCD/JPEGImages/")] + [
        (upstream_name(rel), (replace or {}).get(rel, data)) for rel, data in files.items()]


@pytest.fixture(scope="module")
def good_files(bccd_root):
    return {rel: (bccd_root / rel).read_bytes() for rel in dl.load_manifest()}


class Server:
    """Serves ``routes[path] = (body, content_length)`` on 127.0.0.1 and counts hits; a path in
    ``stalls`` sends half its body, then waits."""

    def __init__(self):
        self.routes, self.stalls, self.hits = {}, set(), collections.Counter()
        self.release, self.lock = threading.Event(), threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with server.lock:
                    server.hits[self.path] += 1
                if self.path not in server.routes:
                    return self.send_error(404, "Not Found")
                body, length = server.routes[self.path]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-gzip")
                if length is not None:
                    self.send_header("Content-Length", str(len(body) if length is True else length))
                self.end_headers()
                stall = self.path in server.stalls
                try:
                    self.wfile.write(body[: len(body) // 2] if stall else body)
                    if stall:
                        self.wfile.flush()
                        server.release.wait(60)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def add(self, path, body, content_length=True) -> str:
        self.routes[path] = (body, content_length)
        return self.url(path)

    def url(self, path) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(good_files):
    srv = Server()
    good = make_tar_gz(upstream_entries(good_files))
    corrupt = bytearray(good_files[CORRUPTED])
    corrupt[len(corrupt) // 2] ^= 0xFF
    srv.add("/good.tar.gz", good)
    srv.add("/nolength.tar.gz", good, content_length=None)
    srv.add("/cli.tar.gz", good)
    srv.add("/corrupt.tar.gz",
            make_tar_gz(upstream_entries(good_files, {CORRUPTED: bytes(corrupt)})))
    srv.add("/truncated.tar.gz", good[: len(good) // 2])
    srv.add("/dropped.tar.gz", good[: len(good) // 2], content_length=len(good))
    yield srv
    srv.close()


TXL_TOP = f"TXL-PBC_Dataset-{dl.TXL_PBC.commit}"
TXL_CHANGED = "TXL_PBC/labels/test/01e4af27-0d62-557e-b967-cd665b590d45.txt"


@pytest.fixture(scope="module")
def txl_server(txl_root):
    """TXL-PBC's upstream archive (code and png not kept): good, and one label changed."""
    files = {rel: (txl_root / rel).read_bytes() for rel in dl.load_manifest(dl.TXL_PBC)}
    extras = [(f"{TXL_TOP}/example.png", b"\x89PNG not kept"),
              (f"{TXL_TOP}/TXL_PBC/train.py", b"print('not kept')\n")]

    def archive(changed=None):
        entries = [_member(f"{TXL_TOP}/")] + extras + [
            (f"{TXL_TOP}/{rel}", (changed or {}).get(rel, data)) for rel, data in files.items()]
        return make_tar_gz(entries)

    good = archive()
    srv = Server()
    srv.add("/txl.tar.gz", good)
    changed = files[TXL_CHANGED].replace(b"1 ", b"2 ", 1)
    srv.add("/txl-changed.tar.gz", archive({TXL_CHANGED: changed}))
    yield srv
    srv.close()


# per source: its server fixture, the good archive's path, one with a file changed, that file
ARCHIVES = {dl.BCCD: ("server", "/good.tar.gz", "/corrupt.tar.gz", CORRUPTED),
            dl.TXL_PBC: ("txl_server", "/txl.tar.gz", "/txl-changed.tar.gz", TXL_CHANGED)}


@pytest.fixture(autouse=True)
def _no_proxy_for_localhost(monkeypatch):
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    monkeypatch.delenv(dl.BCCD.url_env, raising=False)


def leftovers(folder: Path):
    """Everything in ``folder`` (temp files, partial folders...)."""
    return sorted(p.name for p in folder.iterdir())


def data_error(call, *args, **kwargs) -> DataError:
    """The DataError that ``call(*args, **kwargs)`` raises."""
    with pytest.raises(DataError) as info:
        call(*args, **kwargs)
    return info.value


def fetch(server, root, path, **kwargs) -> Path:
    """``download_bccd`` into ``root`` from ``server``'s ``path``, without a progress bar."""
    return download_bccd(root=root, url=server.url(path), progress=False, **kwargs)


def assert_complete(root: Path, extra=(), source=dl.BCCD):
    """Every manifest file verified and marked (for ``source`` only); besides them only the
    user's files ``extra``."""
    assert verify_dataset(root, source) == []
    assert [s for s in dl.SOURCES.values() if dl.is_verified(root, s)] == [source]
    marker = (root / dl.MARKER_NAME).read_text().splitlines()[0]
    assert marker == dl.manifest_sha256(source)
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert files == set(dl.load_manifest(source)) | {dl.MARKER_NAME} | set(extra)  # no code...


def test_manifests_list_every_file_without_the_upstream_level_as_the_shared_copies_do(
        bccd_root):
    manifest = dl.load_manifest()
    assert collections.Counter(p.split("/")[0] for p in manifest) == {     # 734 files
        "Annotations": 364, "JPEGImages": 364, "ImageSets": 4, "LICENSE": 1, "test.csv": 1}
    assert {p for p in manifest if p.startswith("ImageSets/")} == {
        f"ImageSets/Main/{s}.txt" for s in ("train", "val", "trainval", "test")}
    assert len(dl.load_manifest(dl.TXL_PBC)) == 2888
    shared = bccd_root / "SHA256SUMS"
    if shared.is_file():                # a copy made by hand may lack it
        assert dl._manifest_bytes() == shared.read_bytes()


def place_by_hand(dest: Path, files: dict) -> Path:
    """Write ``files`` (manifest path -> bytes) under ``dest``, as a user copying them would."""
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return dest


def test_verify_dataset_names_missing_and_changed_files(tmp_path, good_files):
    place_by_hand(tmp_path, good_files)
    (tmp_path / "Annotations/BloodImage_00001.xml").unlink()
    (tmp_path / "test.csv").write_bytes(b"filename\n")
    problems = verify_dataset(tmp_path)
    assert [(p.path, p.kind) for p in problems] == [
        ("Annotations/BloodImage_00001.xml", "missing"), ("test.csv", "mismatch")]
    path, kind, expected, actual = problems[1]
    assert expected == dl.load_manifest()["test.csv"] and actual != expected
    assert problems[0].actual is None


GOOD_INSTALLS = ("http", "no-length-with-progress", "file-url", "empty-folder", "default-root")


@pytest.mark.parametrize("source, case", [
    *(pytest.param(dl.BCCD, case, id=case) for case in GOOD_INSTALLS),
    pytest.param(dl.TXL_PBC, "http", marks=pytest.mark.slow(seconds=6), id="TXL-PBC")])
def test_a_good_archive_installs_every_file_then_is_used_without_the_network(
        tmp_path, monkeypatch, clean_env, request, source, case):
    """Into the cache by default, where resolve_root looks; --force: the tests below."""
    fixture, good, _, _ = ARCHIVES[source]
    srv = request.getfixturevalue(fixture)
    url = srv.url("/nolength.tar.gz" if case == "no-length-with-progress" else good)
    monkeypatch.setenv("MEDAIDET_CACHE", str(tmp_path / "cache"))
    dest = tmp_path / "cache" / source.cache_name
    if case == "file-url":                  # an archive fetched elsewhere
        archive = tmp_path / "archive.tar.gz"
        archive.write_bytes(srv.routes[good][0])
        url = archive.as_uri()
    if case == "empty-folder":
        dest.mkdir(parents=True)
    hits = sum(srv.hits.values()) + (case != "file-url")
    root = dl.download(source, None if case == "default-root" else dest, url,
                       progress=case == "no-length-with-progress")
    assert root == dest.resolve() == resolve_root(source=source)
    assert_complete(root, source=source)
    assert leftovers(dest.parent) == [source.cache_name]
    assert sum(srv.hits.values()) == hits
    # verified: no network at all, even with an unreachable URL
    assert dl.download(source, dest, "http://127.0.0.1:9/nothing", progress=False) == root
    assert sum(srv.hits.values()) == hits


@pytest.mark.parametrize("source", [  # TXL-PBC's 2,888 files take seconds
    dl.BCCD, pytest.param(dl.TXL_PBC, marks=pytest.mark.slow(seconds=2))], ids=lambda s: s.name)
def test_a_changed_file_is_named_and_nothing_is_installed(tmp_path, request, source):
    fixture, _, changed, rel = ARCHIVES[source]
    dest = tmp_path / source.cache_name
    err = data_error(dl.download, source, dest, request.getfixturevalue(fixture).url(changed),
                     progress=False)
    assert err.kind == "checksum" and [(p.path, p.kind) for p in err.problems] == [
        (rel, "mismatch")]
    assert leftovers(tmp_path) == []


def _zip_of(files: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


# What the server sends instead of the .tar.gz (besides a 404 and a connection dropped).
NOT_A_TAR_GZ = {
    "zip": lambda good, files: _zip_of({upstream_name(rel): files[rel]
                                        for rel in sorted(files)[:20]}),
    "html": lambda good, files: (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>"
                                 b"<body>Please log in</body></html>"),
    "empty": lambda good, files: b"",
    "truncated": lambda good, files: good[: len(good) // 2],
    "gzip-not-tar": lambda good, files: gzip.compress(b"filename,cell\n" * 100),
    "plain-text": lambda good, files: b"BloodImage_00000.jpg,RBC\n",
}


@pytest.mark.parametrize("case", ["http-404", "dropped", *sorted(NOT_A_TAR_GZ)])
def test_a_failed_download_or_not_a_tar_gz_is_named_and_nothing_is_written(
        tmp_path, server, good_files, case):
    path = {"http-404": "/missing.tar.gz", "dropped": "/dropped.tar.gz"}.get(case,
                                                                             f"/not-tar-{case}")
    if case in NOT_A_TAR_GZ:
        server.add(path, NOT_A_TAR_GZ[case](server.routes["/good.tar.gz"][0], good_files))
    kind = "archive" if case in NOT_A_TAR_GZ else "download"
    assert data_error(fetch, server, tmp_path / "bccd", path).kind == kind
    assert leftovers(tmp_path) == []


UNSAFE = {   # members tarfile's data filter refuses
    "parent": ("../evil.txt", b"evil"),
    "symlink": _member(f"{TOP}/BCCD/JPEGImages/BloodImage_00000.jpg", tarfile.SYMTYPE,
                       "/etc/passwd"),
    "symlink-dir": _member(f"{TOP}/BCCD/Annotations", tarfile.SYMTYPE, "/tmp"),
    "symlink-out": _member(f"{TOP}/BCCD/out", tarfile.SYMTYPE, "../../../../evil.txt"),
    "hardlink": _member(f"{TOP}/test.csv", tarfile.LNKTYPE, "/etc/passwd"),
    "device": _member(f"{TOP}/LICENSE", tarfile.CHRTYPE),
    "fifo": _member(f"{TOP}/scripts/pipe", tarfile.FIFOTYPE),
    # the filter lets a link inside the folder through; where the dataset has a file, refused
    "symlink-inside": _member(f"{TOP}/BCCD/JPEGImages/BloodImage_00001.jpg", tarfile.SYMTYPE,
                              "BloodImage_00000.jpg"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_member_is_refused_and_nothing_is_written(tmp_path, server, good_files, case):
    work = tmp_path / "work"
    work.mkdir()
    entry = UNSAFE[case]
    member = entry.name if isinstance(entry, tarfile.TarInfo) else entry[0]
    # a few good files first, so the refusal happens mid-extraction
    first = [(upstream_name(rel), good_files[rel]) for rel in sorted(good_files)[:5]]
    url = server.add(f"/unsafe-{case}.tar.gz", make_tar_gz([_member(f"{TOP}/")] + first + [entry]))
    err = data_error(download_bccd, root=work / "bccd", url=url, progress=False)
    assert (err.kind, err.member) == ("unsafe_archive", member)
    assert leftovers(work) == []
    assert not list(tmp_path.rglob("evil.txt"))
    assert not (tmp_path.parent / "evil.txt").exists()


# members the filter makes safe ("/" stripped, ".." inside) and the manifest does not name
UNNAMED = {"absolute": lambda tmp: str(tmp / "evil.txt"),
           "deep-parent": lambda tmp: f"{TOP}/BCCD/../../evil.txt"}


@pytest.mark.parametrize("case", sorted(UNNAMED))
def test_a_member_the_manifest_does_not_name_is_never_written(tmp_path, server, good_files,
                                                              case):
    work = tmp_path / "work"
    work.mkdir()
    name = UNNAMED[case](tmp_path)
    entries = [_member(f"{TOP}/"), (name, b"evil")] + upstream_entries(good_files)[1:]
    url = server.add(f"/unnamed-{case}.tar.gz", make_tar_gz(entries))
    assert_complete(download_bccd(root=work / "bccd", url=url, progress=False))
    assert leftovers(work) == ["bccd"]
    assert not list(tmp_path.rglob("evil.txt"))
    assert not (tmp_path.parent / "evil.txt").exists()


@pytest.mark.parametrize("source", [dl.BCCD, dl.TXL_PBC], ids=lambda s: s.name)
def test_offline_exits_2_naming_where_to_place_the_data_by_hand(tmp_path, source):
    dest = tmp_path / "data"
    flag = [] if source is dl.BCCD else ["--dataset", "txl-pbc"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        result = _cli(["data", "download", *flag, "--root", str(dest)],
                      {source.url_env: f"http://127.0.0.1:{sock.getsockname()[1]}/x.tar.gz"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(dest) in result.stderr           # the folder to place the data in
    assert leftovers(tmp_path) == []


URLS_WITHOUT_AN_ACCEPTED_SCHEME = {     # None: the archive's local path
    "local-path": None, "relative-path": "bccd.tar.gz", "ftp": "ftp://ftp.example.org/BCCD.tar.gz",
    "windows-path": r"C:\\Users\\me\\BCCD.tar.gz",
    "host-without-scheme": "github.com/Shenggan/BCCD_Dataset/archive/x.tar.gz",
}


@pytest.mark.parametrize("case", sorted(URLS_WITHOUT_AN_ACCEPTED_SCHEME))
def test_url_without_an_accepted_scheme_is_a_named_error(tmp_path, server, case):
    archive = tmp_path / "BCCD.tar.gz"
    archive.write_bytes(server.routes["/good.tar.gz"][0])
    url = URLS_WITHOUT_AN_ACCEPTED_SCHEME[case] or str(archive)
    assert data_error(download_bccd, root=tmp_path / "out" / "bccd", url=url,
                      progress=False).kind == "url"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BCCD.tar.gz"]


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_copy_placed_by_hand_is_verified_in_place_without_network(tmp_path, good_files,
                                                                    read_only):
    """Writable: marked (extra files and another manifest's marker are fine); read-only, as a
    shared copy is: left unwritten, even by root (CI)."""
    dest = place_by_hand(tmp_path / "bccd", good_files)
    if read_only:
        dest.chmod(0o555)
    else:
        (dest / "SOURCE.txt").write_text("extra files are fine")
        (dest / dl.MARKER_NAME).write_text("0" * 64 + "\n")
    try:
        for _ in range(2):
            assert download_bccd(root=dest, url="http://127.0.0.1:9/unused",
                                 progress=False) == dest.resolve()
    finally:
        dest.chmod(0o755)
    assert dl.is_verified(dest) is not read_only
    assert (dest / dl.MARKER_NAME).exists() is not read_only


def test_other_content_is_never_replaced_silently(tmp_path, server):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("precious")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for root, force in ((dest, False), (dest, True), (afile, False)):
        assert data_error(fetch, server, root, "/good.tar.gz", force=force).kind == "destination"
    assert (dest / "notes.txt").read_text() == "precious" and afile.read_text() == "x"


USER_FILES = {
    "notes.txt": b"my notes",
    "Annotations/BloodImage_99999.xml": b"<annotation><filename>mine</filename></annotation>",
    "JPEGImages/BloodImage_99999.jpg": b"\xff\xd8 my own image \xff\xd9",
    "ImageSets/Main/my_split.txt": b"BloodImage_99999\n",
    "mine/deep/result.csv": b"a,b\n1,2\n",
}


def assert_forced_install_complete(root: Path):
    assert_complete(root, extra=USER_FILES)
    for rel, data in USER_FILES.items():
        assert (root / rel).read_bytes() == data, rel


def installed_with_user_files(server, root: Path, edited: str) -> Path:
    """A downloaded BCCD with the user's files added and ``edited`` changed."""
    fetch(server, root, "/good.tar.gz")
    (place_by_hand(root, USER_FILES) / edited).write_bytes(b"edited")
    return root.resolve()


def test_force_replaces_only_the_bccd_files_and_keeps_the_users(tmp_path, server):
    root = installed_with_user_files(server, tmp_path / "bccd", CORRUPTED)
    (root / "ImageSets" / "Main" / "train.txt").unlink()
    assert fetch(server, root, "/good.tar.gz", force=True) == root
    assert_forced_install_complete(root)
    assert leftovers(tmp_path) == ["bccd"]


def test_an_interrupted_forced_install_is_never_taken_for_verified(tmp_path, server,
                                                                   monkeypatch):
    changed = list(dl.load_manifest())[-1]                # installed last
    root = installed_with_user_files(server, tmp_path / "bccd", changed)
    real_replace, moved = os.replace, []

    def killed_after_ten_files(src, dst, **kwargs):
        if Path(dst).parent.is_relative_to(root) and Path(dst).name != dl.MARKER_NAME:
            if len(moved) == 10:
                raise KeyboardInterrupt
            moved.append(dst)
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", killed_after_ten_files)
    with pytest.raises(KeyboardInterrupt):
        fetch(server, root, "/good.tar.gz", force=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert len(moved) == 10
    assert not dl.is_verified(root)
    assert [(p.path, p.kind) for p in verify_dataset(root)] == [(changed, "mismatch")]
    assert all((root / rel).read_bytes() == data for rel, data in USER_FILES.items())
    assert leftovers(tmp_path) == ["bccd"]
    assert data_error(fetch, server, root, "/good.tar.gz").kind == "destination"
    fetch(server, root, "/good.tar.gz", force=True)
    assert_forced_install_complete(root)


def test_failed_forced_download_keeps_the_existing_dataset(tmp_path, server):
    root = fetch(server, tmp_path / "bccd", "/good.tar.gz")
    for path, kind in (("/corrupt.tar.gz", "checksum"), ("/truncated.tar.gz", "archive")):
        assert data_error(fetch, server, root, path, force=True).kind == kind
    assert_complete(root)
    assert leftovers(tmp_path) == ["bccd"]


def _kill_mid_download(dest: Path, url: str) -> list:
    """SIGKILL a real download while the server stalls half-way; return what is left beside."""
    code = ("from medaidet.data.download import download_bccd\n"
            f"download_bccd(root={str(dest)!r}, url={url!r}, progress=False)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), no_proxy="127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size for p in
                      dest.parent.glob(f".{dest.name}.*.partial/archive.download")):
            assert time.monotonic() < deadline, "the download never started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    return sorted(p.name for p in dest.parent.iterdir())


def test_a_killed_download_leaves_one_hidden_folder_and_the_next_one_deletes_nothing(
        tmp_path, server):
    """The dataset's folder gets the user's umask, not the temporary folder's 0700."""
    work = tmp_path / "data"
    work.mkdir()
    dest = work / "bccd"
    server.stalls.add("/stall.tar.gz")
    server.add("/stall.tar.gz", server.routes["/good.tar.gz"][0])
    killed = _kill_mid_download(dest, server.url("/stall.tar.gz"))
    assert len(killed) == 1 and killed[0].startswith(".bccd.") and \
        killed[0].endswith(".partial"), killed
    (work / "notes.txt").write_bytes(b"keep me")
    umask = os.umask(0o022)
    try:
        fetch(server, dest, "/good.tar.gz")
    finally:
        os.umask(umask)
    assert_complete(dest)
    assert leftovers(work) == sorted(["bccd", killed[0], "notes.txt"])
    assert (work / "notes.txt").read_bytes() == b"keep me"
    assert dest.stat().st_mode & 0o777 == 0o755


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in (dl.BCCD.data_env, dl.TXL_PBC.data_env, "MEDAIDET_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _dataset(path: Path) -> Path:
    (path / "Annotations").mkdir(parents=True)
    return path.resolve()


def test_default_root_follows_the_cache_settings(clean_env, monkeypatch, tmp_path):
    assert dl.default_root() == clean_env / ".cache" / "medaidet" / "bccd"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dl.default_root() == tmp_path / "xdg" / "medaidet" / "bccd"
    monkeypatch.setenv("MEDAIDET_CACHE", str(tmp_path / "cache"))
    assert dl.default_root() == tmp_path / "cache" / "bccd"


def test_resolve_root_order_explicit_then_env_then_cache(clean_env, monkeypatch, tmp_path):
    cached = _dataset(clean_env / ".cache" / "medaidet" / "bccd")
    assert resolve_root() == cached
    from_env = _dataset(tmp_path / "env")
    monkeypatch.setenv(dl.BCCD.data_env, str(from_env))
    assert resolve_root() == from_env
    explicit = _dataset(tmp_path / "explicit")
    assert resolve_root(explicit) == explicit
    assert resolve_root(str(explicit)) == explicit


def test_resolve_root_never_downloads_and_explains(clean_env, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    err = data_error(resolve_root, empty)
    assert err.kind == "not_found" and str(empty) in str(err)
    assert data_error(resolve_root).kind == "not_found"            # the default cache: empty too
    assert list(empty.iterdir()) == []


def _cli(args, env):
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "medaidet", *args], capture_output=True,
                          text=True, env=full_env, cwd=REPO, timeout=120)


def test_cli_download_prints_the_root(tmp_path, server):
    dest = tmp_path / "bccd"
    result = _cli(["data", "download", "--root", str(dest)],
                  {dl.BCCD.url_env: server.url("/cli.tar.gz"), "no_proxy": "127.0.0.1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(dest.resolve())
    assert_complete(dest)
    assert server.hits["/cli.tar.gz"] == 1


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("force", [False, True])
def test_a_root_holding_another_dataset_is_refused_even_with_force(tmp_path, server, txl_server,
                                                                  force):
    bccd = fetch(server, tmp_path / "bccd", "/good.tar.gz")
    marker = (bccd / dl.MARKER_NAME).read_text()
    assert data_error(dl.download_txl_pbc, root=bccd, url=txl_server.url("/txl.tar.gz"),
                      force=force, progress=False).kind == "destination"
    assert not (bccd / "TXL_PBC").exists()
    assert (bccd / dl.MARKER_NAME).read_text() == marker and dl.is_verified(bccd)
    txl = dl.download_txl_pbc(root=tmp_path / "txl", url=txl_server.url("/txl.tar.gz"),
                              progress=False)
    assert data_error(fetch, server, txl, "/good.tar.gz", force=force).kind == "destination"
    assert not (txl / "Annotations").exists()
    assert dl.is_verified(txl, dl.TXL_PBC)

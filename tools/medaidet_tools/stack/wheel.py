"""Writing a pure-Python wheel from a patched source tree.

The wheel format (a zip with a ``.dist-info`` folder) is small enough to write
directly, which keeps setuptools — whose changes broke these sdists in the
first place — out of the build. Timestamps are fixed, so a build is
byte-for-byte reproducible. :func:`verify_wheel` checks a wheel (a cached one,
before it is reused) against its own ``RECORD``.
"""
import base64
import csv
import hashlib
import io
import zipfile
import zlib
from pathlib import Path

from medaidet.files import atomic_file
from medaidet_tools.stack.errors import StackError

_EPOCH = (1980, 1, 1, 0, 0, 0)
_DATA_FILES = {"py.typed"}


def _package_files(root: Path, package: str, recursive: bool):
    base = root / package
    candidates = base.rglob("*") if recursive else base.glob("*")
    for path in sorted(candidates):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix in (".py", ".pyi") or path.name in _DATA_FILES:
            yield path.relative_to(root).as_posix()


class BrokenWheelError(StackError):
    """A wheel is not intact: not a readable zip, a member fails its CRC, or its files do not
    match its ``RECORD`` (missing, extra, another sha256 or size)."""


def _digest(data: bytes) -> str:
    """RECORD's hash: urlsafe base64 of the sha256, without padding (PEP 376/427)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record_line(name: str, data: bytes) -> str:
    return f"{name},{_digest(data)},{len(data)}"


def verify_wheel(path: Path) -> None:
    """Raise :class:`BrokenWheelError` unless the wheel at ``path`` is intact.

    Intact: a readable zip whose every member passes its CRC, with one
    ``*.dist-info/RECORD`` that lists every other member with the sha256 and size it has.
    Reads the whole wheel (a fraction of a second for chainer's 1 MB).
    """
    def broken(why):
        return BrokenWheelError(f"{path}: {why}")

    try:
        with zipfile.ZipFile(path) as zf:
            files = {}
            for name in zf.namelist():
                try:
                    files[name] = zf.read(name)   # checks the member's CRC
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                    raise broken(f"its member {name} cannot be read ({exc})") from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise broken(f"not a readable zip archive ({exc}); truncated?") from None
    records = [n for n in files if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1:
        raise broken("has no RECORD" if not records else f"has {len(records)} RECORD files")
    listed = {}
    for row in csv.reader(io.StringIO(files[records[0]].decode("utf-8", "replace"))):
        if row:
            listed[row[0]] = row[1:]
    for name, data in sorted(files.items()):
        if name == records[0]:
            continue
        if name not in listed:
            raise broken(f"{name} is not listed in its RECORD")
        digest, size = (listed.pop(name) + ["", ""])[:2]
        if digest != _digest(data) or size != str(len(data)):
            raise broken(f"{name} does not match its RECORD entry ({digest}, {size} bytes; "
                         f"found {_digest(data)}, {len(data)} bytes)")
    listed.pop(records[0], None)
    if listed:
        raise broken(f"{sorted(listed)[0]} is listed in its RECORD but missing")


def write_wheel(root: Path, *, name: str, version: str, summary: str, packages,
                requires, patch_notes, dest_dir: Path) -> Path:
    """Write ``{name}-{version}-py3-none-any.whl`` into ``dest_dir`` atomically.

    ``packages`` is a list of ``(package_dir, recursive)``; ``requires`` the
    Requires-Dist lines; ``patch_notes`` lines recorded in the dist-info.
    """
    dist_info = f"{name}-{version}.dist-info"
    files = {}
    for package, recursive in packages:
        for rel in _package_files(root, package, recursive):
            files[rel] = (root / rel).read_bytes()
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {summary}",
        "License: MIT",
        "Requires-Python: >=3.10",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    files[f"{dist_info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: medaidet.stack\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n").encode()
    top_level = sorted({package.split("/")[0] for package, _ in packages})
    files[f"{dist_info}/top_level.txt"] = ("\n".join(top_level) + "\n").encode()
    files[f"{dist_info}/MEDAIDET_PATCHES"] = ("\n".join(patch_notes) + "\n").encode()
    if (root / "LICENSE").exists():
        files[f"{dist_info}/LICENSE"] = (root / "LICENSE").read_bytes()
    record_name = f"{dist_info}/RECORD"
    record = [_record_line(n, d) for n, d in sorted(files.items())] + [f"{record_name},,"]
    files[record_name] = ("\n".join(record) + "\n").encode()

    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / f"{name}-{version}-py3-none-any.whl"
    with atomic_file(target) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
        for entry, data in sorted(files.items(), key=lambda kv: kv[0] == record_name):
            info = zipfile.ZipInfo(entry, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return target

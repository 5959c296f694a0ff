"""Writing a pure-Python wheel from a patched source tree.

The wheel format (a zip with a ``.dist-info`` folder) is small enough to write
directly, which keeps setuptools — whose changes broke these sdists in the
first place — out of the build. Timestamps are fixed, so a build is
byte-for-byte reproducible.
"""
import base64
import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

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


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


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
    fd, tmp = tempfile.mkstemp(suffix=".whl.part", dir=dest_dir)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for entry, data in sorted(files.items(), key=lambda kv: kv[0] == record_name):
                info = zipfile.ZipInfo(entry, date_time=_EPOCH)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target

"""Building the patched chainer and chainercv wheels (cached)."""
import shutil
import tarfile
import tempfile
from pathlib import Path

from medaidet.arguments import prepare_output_dir
from medaidet.compat import NUMPY_RANGE
from medaidet.files import default_cache_dir
from medaidet_tools.stack import patches, sources
from medaidet_tools.stack.wheel import BrokenWheelError, verify_wheel, write_wheel


# (sdist, packages as (dir, recursive), Requires-Dist, patches, summary)
_RECIPES = {
    "chainer": (
        [("chainer", True), ("chainermn", True), ("onnx_chainer", True),
         ("chainerx", False)],  # upstream ships only the top of chainerx without its C++ core
        [f"numpy{NUMPY_RANGE}", "filelock", "protobuf>=3.0.0", "six>=1.9.0",
         "typing_extensions", "packaging"],
        patches.CHAINER_PATCHES,
        "Chainer 7.8.1 patched by medaidet for Python 3.10-3.13, NumPy 1.26-2.5, CuPy 13/14",
    ),
    "chainercv": (
        [("chainercv", True)],
        ["chainer==7.8.1", "Pillow", f"numpy{NUMPY_RANGE}"],
        patches.CHAINERCV_PATCHES,
        "ChainerCV 0.13.1 patched by medaidet (pure Python; NumPy NMS post-processing)",
    ),
}


def wheel_path(sdist: sources.Sdist, cache_dir: Path) -> Path:
    return cache_dir / "wheels" / f"{sdist.name}-{sdist.wheel_version}-py3-none-any.whl"


def _extract(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python without extraction filters: refuse unsafe members ourselves
            for member in tar.getmembers():
                target = (dest / member.name).resolve()
                if not str(target).startswith(str(dest.resolve())) or member.issym() \
                        or member.islnk():
                    raise tarfile.TarError(f"unsafe member {member.name} in {archive}")
            tar.extractall(dest)
    return dest / archive.name[: -len(".tar.gz")]


def build_one(sdist: sources.Sdist, cache_dir: Path, log=print) -> Path:
    """Fetch, patch and package one sdist; return the wheel in the cache."""
    archive = sources.fetch(sdist, cache_dir, log=log)
    packages, requires, patch_list, summary = _RECIPES[sdist.name]
    log(f"building {sdist.name} {sdist.wheel_version} ...")
    with tempfile.TemporaryDirectory() as tmp:
        root = _extract(archive, Path(tmp))
        notes = patches.apply_all(root, patch_list)
        return write_wheel(root, name=sdist.name, version=sdist.wheel_version,
                           summary=summary, packages=packages, requires=requires,
                           patch_notes=notes, dest_dir=cache_dir / "wheels")


def build_wheels(cache_dir=None, out=None, force=False, log=print) -> list:
    """Build (or reuse from the cache) both wheels; return their paths.

    A cached wheel is reused only when intact (:func:`~medaidet_tools.stack.wheel.verify_wheel`:
    zip CRCs and every file's sha256 against its RECORD); a broken one, e.g. truncated by an
    interrupted copy or a full disk, is rebuilt, and ``log`` says so.

    With ``out``, the wheels are also copied there (e.g. to carry them to
    another machine); it is created, or refused (:class:`~medaidet.errors.ConfigError`
    naming ``--out``), before anything is built.
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    if out:
        out = prepare_output_dir(out, "--out", inputs=(cache_dir / "wheels",))
    built = []
    for sdist in sources.SDISTS:
        wheel = wheel_path(sdist, cache_dir)
        if force or not wheel.exists() or not _intact(wheel, log):
            wheel = build_one(sdist, cache_dir, log=log)
        built.append(wheel)
    if out:
        built = [Path(shutil.copy2(w, out / w.name)) for w in built]
    return built


def _intact(wheel: Path, log) -> bool:
    try:
        verify_wheel(wheel)
    except BrokenWheelError as exc:
        log(f"cached wheel {wheel} is broken ({str(exc).removeprefix(f'{wheel}: ')}); "
            "rebuilding it")
        return False
    return True

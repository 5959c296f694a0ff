"""The upstream sdists we build from, pinned by sha256, and fetching them.

The files are fetched with pip itself (``pip download``), so whatever index
the user's pip is configured for is used; no host is written here.
"""
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from medaidet.files import sha256_file
from medaidet_tools.stack.errors import StackError

# Bump when the patches or the overlay change: it becomes the local version
# label of the wheels (7.8.1+medaidet.N), so a changed build is reinstalled.
PATCHSET = 4
LOCAL_LABEL = f"medaidet.{PATCHSET}"

# pip runs the sdists' setup.py to read their metadata; chainer's setup.py
# imports pkg_resources, gone from setuptools >= 82.
BUILD_CONSTRAINT = "setuptools<82\n"


@dataclass(frozen=True)
class Sdist:
    """One pinned upstream source distribution."""

    name: str
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"

    @property
    def wheel_version(self) -> str:
        return f"{self.version}+{LOCAL_LABEL}"


CHAINER = Sdist("chainer", "7.8.1",
                "179f06176f8d7a42385bc7811956db04e68213cfe30f5081491b9e2b6ff70de8")
CHAINERCV = Sdist("chainercv", "0.13.1",
                  "84214bd2fc191dacd73a95342ac45ded36232fc588825458752ec57df5e97ded")
SDISTS = (CHAINER, CHAINERCV)


def verify(sdist: Sdist, path: Path) -> None:
    """Raise :class:`StackError` unless ``path`` has the pinned sha256."""
    actual = sha256_file(path)
    if actual != sdist.sha256:
        raise StackError(
            f"{path}: sha256 {actual} does not match the pinned {sdist.sha256} for "
            f"{sdist.name} {sdist.version}. The index served a different file; delete it "
            f"and retry, or check which index pip uses (pip config list).")


def fetch(sdist: Sdist, cache_dir: Path, log=print) -> Path:
    """Return the verified sdist from the cache, downloading it with pip if needed."""
    target = cache_dir / "sdists" / sdist.filename
    if target.exists():
        verify(sdist, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"fetching {sdist.name}=={sdist.version} (source) with pip ...")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        constraint = Path(tmp) / "build-constraint.txt"
        constraint.write_text(BUILD_CONSTRAINT)
        env = dict(os.environ)
        # pip < 25.3 reads PIP_CONSTRAINT in build environments, newer pip
        # reads PIP_BUILD_CONSTRAINT; set both.
        env["PIP_CONSTRAINT"] = str(constraint)
        env["PIP_BUILD_CONSTRAINT"] = str(constraint)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", tmp, f"{sdist.name}=={sdist.version}"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        downloaded = Path(tmp) / sdist.filename
        if done.returncode != 0 or not downloaded.exists():
            raise StackError(
                f"pip could not download {sdist.name}=={sdist.version} (source):\n"
                f"{(done.stdout + done.stderr).strip()[-2000:]}\n"
                f"Offline? Place {sdist.filename} (sha256 {sdist.sha256}) in {target.parent} "
                f"and run the command again.")
        verify(sdist, downloaded)
        os.replace(downloaded, target)
    return target

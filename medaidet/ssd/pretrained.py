"""Where a model's starting weights come from: ChainerCV's named pretrained weights (PASCAL
VOC), the trained weights that ship with medaidet, and ImageNet VGG-16 from several sources.

Named weights are ChainerCV's own files in its model cache (:func:`cache_dir`, under
``$CHAINER_DATASET_ROOT``, default ``~/.chainer/dataset``), downloaded by its
``download_model``; offline, a ``"missing"`` WeightsError says which file to place where.

**ImageNet VGG-16** (SSD300's and SSD512's starting point):
``build_ssd("ssd300", pretrained="imagenet")`` needs ImageNet VGG-16 weights in ChainerCV's
layout. ChainerCV publishes them on one server (since 2017, with no checksum); timm
publishes torchvision's weights of the same network as a safetensors file, which
:mod:`medaidet.ssd.vgg_weights` converts. :func:`imagenet_weights` takes the first of these
that works:

1. **the cache** (:func:`cache_dir`): ChainerCV's file; a file converted earlier (its
   ``.sha256`` sidecar and its layout verified); or timm's file placed there by hand
   (checked, then converted);
2. **ChainerCV's server** (:data:`SOURCES` in this order);
3. **timm's file**, ``vgg16.tv_in1k``'s ``model.safetensors``.

Every download is checked before use (timm's against the full sha256 its hub lists; ChainerCV
published none, so its file must hold exactly VGG-16's names and shapes, finite). A file that
fails is deleted and the next source tried; when none works, a ``"missing"`` WeightsError lists
every source's URL, why it failed, and where to place either file by hand.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from chainer.dataset import get_dataset_root
from chainercv.links import SSD300, SSD512
from chainercv.utils import download as _cv_download

from medaidet import __version__
from medaidet.checksums import sha256_file
from medaidet.downloads import stream_url
from medaidet.errors import DataError, WeightsError
from medaidet.files import atomic_file
from medaidet.ssd import MODEL_NAMES, PRETRAINED, WITH_PRETRAINED
from medaidet.ssd.vgg_weights import CHAINERCV_SHAPES, SSD_MEAN, convert_vgg16, read_vgg16
from medaidet.ssd.weight_files import SIDECAR_SUFFIX, check_cached_weights, write_arrays

__all__ = ["CACHE_SUBDIR", "SHIPPED_WEIGHTS", "cache_dir", "check_pretrained", "pretrained_url",
           "pretrained_cache_path", "pretrained_file", "shipped_weights",
           "ImagenetSource", "SOURCES", "imagenet_weights", "imagenet_status",
           "check_chainercv_file"]

logger = logging.getLogger(__name__)

#: ChainerCV's model cache, relative to the dataset root (see ``download_model``).
CACHE_SUBDIR = os.path.join("pfnet", "chainercv", "models")
#: Trained weights that ship with the package (model-only, float16, with ``.sha256`` and a
#: ``.json`` record of how they were made), by (model, labels): the small SSD trained on a CPU
#: on BCCD's boxes (notebooks 04, 05) and on TXL-PBC's re-annotation (notebook 10).
SHIPPED_WEIGHTS = {("ssd_small", "bccd"): Path(__file__).parent / "weights" / "ssd_small_bccd.npz",
                   ("ssd_small", "txl-pbc"):
                       Path(__file__).parent / "weights" / "ssd_small_txl-pbc.npz"}
#: The ChainerCV classes whose ``_models`` table holds the URLs (:data:`WITH_PRETRAINED`).
_CLASSES = {"ssd300": SSD300, "ssd512": SSD512}

def cache_dir() -> Path:
    """ChainerCV's model folder, where every named file and every ImageNet source's file is
    kept (nothing is created)."""
    return Path(get_dataset_root(), CACHE_SUBDIR)


def check_pretrained(name: str, pretrained) -> None:
    """a ``"missing"`` WeightsError when ``pretrained`` names weights (``'imagenet'``,
    ``'voc0712'``) that model ``name`` does not have."""
    if pretrained in PRETRAINED and str(name).lower() not in WITH_PRETRAINED:
        raise WeightsError(
            f"{name} has no {pretrained!r} weights (only {', '.join(WITH_PRETRAINED)} do): "
            f"train it from random weights (pretrained None, --pretrained none) or load a "
            f"model-only .npz of it", "missing", path=Path(str(pretrained)))


def pretrained_url(name: str = "ssd300", pretrained: str = "voc0712") -> str:
    """The URL ChainerCV downloads ``pretrained`` weights of model ``name`` from."""
    if str(name).lower() not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODEL_NAMES)}")
    check_pretrained(name, pretrained)
    if pretrained not in PRETRAINED:
        raise ValueError(f"unknown pretrained weights {pretrained!r}: use one of "
                         f"{', '.join(PRETRAINED)}, a file path, or None")
    return _CLASSES[str(name).lower()]._models[pretrained]["url"]


def pretrained_cache_path(name: str = "ssd300", pretrained: str = "voc0712") -> Path:
    """Where ChainerCV's ``download_model`` keeps (and looks for) that file: the URL's base
    name in :func:`cache_dir` (nothing is created)."""
    return cache_dir() / os.path.basename(pretrained_url(name, pretrained))


def shipped_weights(name: str = "ssd_small", labels: str = "bccd") -> Path:
    """The trained weights of ``name`` that ship with medaidet, trained on ``labels``
    (``'bccd'`` or ``'txl-pbc'``; :data:`SHIPPED_WEIGHTS`); their ``.json`` says the command
    and seed that reproduce them and how they score.

    Raises a ``"missing"`` WeightsError when medaidet ships none for ``name`` or the file
    is missing from this installation, a ``"checksum"`` one when it is not the file its
    record names (its sha256) or its ``.sha256`` sidecar is gone."""
    if (name, labels) not in SHIPPED_WEIGHTS:
        shipped = ", ".join(f"{n} ({l})" for n, l in SHIPPED_WEIGHTS)
        raise WeightsError(
            f"medaidet ships trained weights only for {shipped}, not {name!r} trained on "
            f"{labels!r} labels: train {name} (`medaidet train`) and use its model.npz",
            "missing", path=None)
    path = SHIPPED_WEIGHTS[name, labels]
    if not path.is_file():
        raise WeightsError(
            f"the shipped weights {path} are missing from this installation: reinstall "
            f"medaidet (pip install -e <checkout>), or train them: `medaidet train "
            f"--profile cpu`", "missing", path=path)
    expected = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))["sha256"]
    found, sidecar = sha256_file(path), path.with_name(path.name + SIDECAR_SUFFIX)
    if found != expected or not sidecar.is_file():
        why = (f"its sha256 is {found}, its record {path.with_suffix('.json').name} says "
               f"{expected}" if found != expected else f"its checksum file {sidecar} is missing")
        raise WeightsError(f"the shipped weights {path} are not the file medaidet shipped: "
                           f"{why}; reinstall medaidet (pip install -e <checkout>)",
                           "checksum", path=path, expected=expected, found=found)
    return path


def pretrained_file(name: str = "ssd300", pretrained: str = "voc0712") -> Path:
    """The cached weight file, downloaded by ChainerCV's ``download_model`` if missing.

    Raises:
        WeightsError: ``"missing"``: not cached and the download failed (offline, HTTP error).
            ``.path`` is where to place the file, ``.url`` where it comes from.
    """
    url = pretrained_url(name, pretrained)
    path = pretrained_cache_path(name, pretrained)
    if path.is_file():
        return path
    try:
        return Path(_cv_download.download_model(url))
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        reason = getattr(exc, "reason", None) or exc
        raise WeightsError(
            f"the {pretrained!r} weights for {name} are not in ChainerCV's cache and could "
            f"not be downloaded ({type(exc).__name__}: {reason}).\n"
            f"Place the file at:\n    {path}\n"
            f"It comes from:\n    {url}\n"
            f"(download it where there is network access and copy it there; the cache root "
            f"is $CHAINER_DATASET_ROOT, default ~/.chainer/dataset)",
            "missing", path=path, url=url) from None


# --------------------------------------------------------------------------- ImageNet VGG-16

TIMEOUT_S = 60.0
#: The most bytes a download may bring: about twice the largest real file (timm's
#: safetensors, 553 MB), checked against Content-Length first.
MAX_DOWNLOAD_BYTES = 1100 * 10**6


@dataclass(frozen=True)
class ImagenetSource:
    """One publisher's ImageNet VGG-16 file and how a download of it is checked."""

    name: str                        # 'chainercv', 'timm'
    url: str
    file_name: str                   # its name in the cache
    sha256: str | None = None        # the full digest its publisher lists
    converted: bool = True           # False: ChainerCV's own layout, used as it is

    @property
    def converted_name(self) -> str:
        return f"ssd_vgg16_imagenet_from_{self.name}.npz"

    def describe(self) -> str:
        return {"chainercv": "ChainerCV's model server",
                "timm": "timm's vgg16.tv_in1k (converted)"}.get(self.name, self.name)


#: The sources, in the order they are tried. Where each pin comes from:
#:
#: * ChainerCV's file: no checksum was ever published, and none could be confirmed from here
#:   (the server is not reachable from where this was written): names, shapes and finite
#:   values are checked instead (:func:`check_chainercv_file`).
#: * timm's file: the sha256 the model hub lists for ``timm/vgg16.tv_in1k``'s
#:   ``model.safetensors`` (its LFS object id). The hub was not reachable from where this
#:   was written; the value is the one two independent public projects pin for that file.
SOURCES = (
    ImagenetSource("chainercv", SSD300._models["imagenet"]["url"],
                   os.path.basename(SSD300._models["imagenet"]["url"]), converted=False),
    ImagenetSource("timm", "https://huggingface.co/timm/vgg16.tv_in1k/resolve/main/"
                   "model.safetensors", "vgg16.tv_in1k.safetensors",
                   sha256="57b026918159a6bf9faf8405c3a551903768e7138989d9c6224a14227203fad8"),
)


# --------------------------------------------------------------------------- checks

def check_chainercv_file(path: Path) -> None:
    """ChainerCV's ImageNet file must hold VGG-16's 30 parameters (conv1_1 … conv5_3, conv6,
    conv7) with their shapes and finite values: ChainerCV published no checksum for it.
    Raises a ``"file"`` WeightsError, a ``"mismatch"`` WeightsError or
    a ``"not_finite"`` WeightsError."""
    arrays = check_cached_weights(path)              # readable, finite
    for key, shape in CHAINERCV_SHAPES.items():
        found = tuple(arrays[key].shape) if key in arrays else None
        if found != shape:
            what = "is missing" if found is None else f"has shape {found}"
            raise WeightsError(
                f"{path} is not ChainerCV's ImageNet VGG-16: {key} {what}, expected "
                f"{shape}. Delete it; it is downloaded again.",
                "mismatch", path=path, parameter=key, expected=shape, found=found)


def _check_digest(source: ImagenetSource, digest: str) -> None:
    if source.sha256 and digest != source.sha256:
        raise WeightsError(f"its sha256 {digest} is not the {source.sha256} its publisher lists "
                           f"(a changed or damaged file); it was deleted", "source")


def _sidecar_ok(path: Path) -> bool:
    sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
    if not (path.is_file() and sidecar.is_file()):
        return False
    fields = sidecar.read_text().split()
    return bool(fields) and fields[0] == sha256_file(path)


# --------------------------------------------------------------------------- downloads

def _download(source: ImagenetSource, target: Path, progress: bool, timeout: float) -> None:
    """Stream ``source.url`` to ``target`` (atomically), checking its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(target) as out:
        try:
            _, digest = stream_url(source.url, out, timeout=timeout,
                                   user_agent=f"medaidet/{__version__}",
                                   desc=f"{source.name} VGG-16", progress=progress,
                                   max_bytes=MAX_DOWNLOAD_BYTES)
        except DataError as exc:         # stream_url's: a "download" error
            why = f"unreachable ({exc})" if exc.offline else str(exc)
            raise WeightsError(why, "source") from None
        _check_digest(source, digest)   # raised inside: nothing is kept


def _convert(source: ImagenetSource, raw: Path, mean) -> Path:
    out = cache_dir() / source.converted_name
    try:
        arrays, _ = convert_vgg16(read_vgg16(raw), mean=mean, path=raw)
    except WeightsError as exc:
        raise WeightsError(f"it cannot be converted: {exc}", "source") from None
    write_arrays(arrays, out)
    return out


def _from_cache(source: ImagenetSource, mean) -> Path | None:
    folder = cache_dir()
    if not source.converted:
        path = folder / source.file_name
        if path.is_file():
            check_chainercv_file(path)       # a damaged cached file is named, not skipped
            return path
        return None
    converted = folder / source.converted_name
    if _sidecar_ok(converted):
        check_chainercv_file(converted)      # a sidecar made for a damaged file proves nothing
        return converted
    if converted.is_file():
        raise WeightsError(
            f"{converted} does not match its {SIDECAR_SUFFIX} file (changed or damaged since "
            f"it was converted, or its {SIDECAR_SUFFIX} is missing): delete both; the weights "
            f"are converted again from {source.describe()}",
            "checksum", path=converted)
    raw = folder / source.file_name
    if raw.is_file():                        # placed by hand: checked like a download
        try:
            _check_digest(source, sha256_file(raw))
        except WeightsError as exc:      # of kind "source": _check_digest's only kind
            raise WeightsError(
                f"{raw} is not {source.describe()}'s published file: "
                f"{str(exc).replace('; it was deleted', '')}. Delete it, or replace it with "
                f"the file from {source.url}",
                "checksum", path=raw) from None
        return _convert(source, raw, mean)
    return None


def _from_server(source: ImagenetSource, mean, progress: bool, timeout: float) -> Path:
    folder = cache_dir()
    if not source.converted:
        path = folder / source.file_name
        _download(source, path, progress, timeout)
        try:
            check_chainercv_file(path)
        except WeightsError as exc:
            path.unlink()
            raise WeightsError(f"the file it sent is not VGG-16 ({exc}); it was deleted",
                               "source") from None
        return path
    raw = folder / f".{source.file_name}.{os.getpid()}.download"   # one per process
    _download(source, raw, progress, timeout)
    try:
        return _convert(source, raw, mean)
    finally:
        raw.unlink(missing_ok=True)          # only the converted file is kept


def imagenet_weights(progress: bool = True, timeout: float = TIMEOUT_S,
                     sources=None) -> tuple[Path, ImagenetSource, str]:
    """A ChainerCV-layout ImageNet VGG-16 ``.npz`` for SSD300/SSD512, from the first source
    that gives one (see the module docstring): ``(path, source, how)``, ``how`` being
    ``'cache'`` or ``'download'``.

    Raises:
        WeightsError: ``"missing"``: no source worked; the message lists each URL, why it failed
            and where to place any one of the files. ``.path`` is the cache folder.
        WeightsError: ``"checksum"``, ``"mismatch"``, ``"file"``, ``"not_finite"``: a file
            in the cache is damaged or is not what its name says (named; delete it).
    """
    sources = SOURCES if sources is None else tuple(sources)
    for source in sources:
        path = _from_cache(source, SSD_MEAN)
        if path is not None:
            return path, source, "cache"
    failures = []
    for source in sources:
        logger.info("ImageNet VGG-16: trying %s, %s", source.describe(), source.url)
        try:
            return _from_server(source, SSD_MEAN, progress, timeout), source, "download"
        except WeightsError as exc:
            if exc.kind != "source":
                raise
            logger.info("ImageNet VGG-16 from %s failed: %s", source.name, exc)
            failures.append((source, str(exc)))
    folder = cache_dir()
    lines = "\n".join(f"  {i}. {s.describe()}: {s.url}\n     {why}"
                      for i, (s, why) in enumerate(failures, 1))
    places = "\n".join(f"  {folder / s.file_name}" for s in sources)
    raise WeightsError(
        f"SSD's ImageNet VGG-16 weights are not in the cache and no source could give "
        f"them:\n{lines}\n"
        f"Download any one of these files where there is network access and place it at "
        f"its path (it is checked, and converted if needed, on first use):\n{places}\n"
        f"(the folder is ChainerCV's model cache: $CHAINER_DATASET_ROOT/{CACHE_SUBDIR}, "
        f"default ~/.chainer/dataset/{CACHE_SUBDIR}). Or train from random weights: "
        f"pretrained None (--pretrained none).", "missing",
        path=folder, url=sources[0].url if sources else None)


def imagenet_status(timeout: float = 3.0, sources=None) -> list[tuple[ImagenetSource, str]]:
    """For ``medaidet doctor``: each source's state, ``'cached (path)'``, ``'reachable'``
    (its server answers a HEAD request; all are asked at once, within ``timeout``) or
    ``'unreachable (why)'``. Nothing is downloaded or converted."""
    from concurrent.futures import ThreadPoolExecutor

    sources = SOURCES if sources is None else tuple(sources)
    folder = cache_dir()

    def state(source: ImagenetSource) -> str:
        converted = folder / source.converted_name if source.converted else None
        path = converted if converted and converted.is_file() else folder / source.file_name
        if path == converted and not _sidecar_ok(path):
            return f"damaged ({path} does not match its {SIDECAR_SUFFIX}: delete both)"
        if path.is_file():
            try:        # ChainerCV's layout (timm's file placed by hand: checked on first use)
                if path == converted or not source.converted:
                    check_chainercv_file(path)
            except WeightsError as exc:
                return f"damaged ({path}: {exc.kind}; delete it)"
            return f"cached ({path})"
        request = urllib.request.Request(source.url, method="HEAD",
                                         headers={"User-Agent": f"medaidet/{__version__}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                return "reachable"
        except urllib.error.HTTPError as exc:
            return f"unreachable (HTTP {exc.code} {exc.reason})"
        except urllib.error.URLError as exc:
            return f"unreachable ({exc.reason})"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return f"unreachable ({type(exc).__name__})"

    with ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
        return list(zip(sources, pool.map(state, sources)))

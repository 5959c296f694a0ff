"""Weights (notebooks 02, 03, 06): starting weights from ChainerCV's server or timm's VGG-16
(:data:`SOURCES`, cached in :func:`cache_dir`; timm's pinned by sha256 and converted), and weight
files saved, read as untrusted data (never unpickled, sizes checked before memory is taken,
``.sha256`` sidecars), checked and loaded. Names are ``save_npz``'s, e.g. ``multibox/conf/0/W``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import chainer
import numpy as np
from chainer.dataset import get_dataset_root
from chainercv.links import SSD300, SSD512

from medaidet import __version__
from medaidet.downloads import stream_url
from medaidet.errors import DataError, WeightsError
from medaidet.files import atomic_file, check_output, not_a_regular_file, sha256_file
from medaidet.ssd import PRETRAINED, WITH_PRETRAINED

__all__ = ["Source", "SOURCES", "SHIPPED_WEIGHTS", "CLASS_HEADS", "MAX_ARRAY_BYTES",
           "MAX_TOTAL_BYTES", "VGG16_SHAPES", "SSD_MEAN", "TORCHVISION_MEAN_255", "cache_dir",
           "check_pretrained", "pretrained_file", "shipped_weights", "convert_vgg16",
           "read_vgg16", "materialize", "save_weights", "what_file_is", "check_sizes",
           "read_arrays", "load_weights", "WeightsReport", "compare_weights",
           "WeightsComparison"]

TIMEOUT_S = 60.0
logger = logging.getLogger(__name__)
#: The most bytes a download may bring: about twice the largest file (timm's, 553 MB).
MAX_DOWNLOAD_BYTES = 1100 * 10**6
#: Per array and in all (SSD512: 18 MiB largest, ~110 MiB total; snapshots ~3x that).
MAX_ARRAY_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 1 * 2**30
#: Prefix of the class-score heads, whose shape depends on the number of classes.
CLASS_HEADS = "multibox/conf/"
#: Shipped trained weights (float16, ``.sha256``, ``.json`` record), notebooks 04, 05, 10.
SHIPPED_WEIGHTS = {(model, labels): Path(__file__).parent / "weights" / f"{model}_{labels}.npz"
                   for model, labels in (("ssd_small", "bccd"), ("ssd_small", "txl-pbc"))}


@dataclass(frozen=True)
class Source:
    """One publisher's file. ``layout``: ``'ssd'`` (ChainerCV's whole SSD), ``'vgg16'``
    (ChainerCV's ImageNet VGG-16) or ``'timm'`` (timm's VGG-16 safetensors, converted)."""

    name: str
    url: str
    file_name: str                   # its name in the cache
    layout: str = "ssd"
    sha256: str | None = None        # the digest its publisher lists

    def describe(self) -> str:
        return {"chainercv": "ChainerCV's model server",
                "timm": "timm's vgg16.tv_in1k (converted)"}.get(self.name, self.name)


def _chainercv(cls, key: str, layout: str) -> Source:
    url = cls._models[key]["url"]
    return Source("chainercv", url, os.path.basename(url), layout)


_IMAGENET = (_chainercv(SSD300, "imagenet", "vgg16"),
             Source("timm", "https://huggingface.co/timm/vgg16.tv_in1k/resolve/main/"
                    "model.safetensors", "vgg16.tv_in1k.safetensors", "timm",
                    "57b026918159a6bf9faf8405c3a551903768e7138989d9c6224a14227203fad8"))
#: (model, weights) -> the sources tried, in order.
SOURCES = {("ssd300", "voc0712"): (_chainercv(SSD300, "voc0712", "ssd"),),
           ("ssd512", "voc0712"): (_chainercv(SSD512, "voc0712", "ssd"),),
           ("ssd300", "imagenet"): _IMAGENET, ("ssd512", "imagenet"): _IMAGENET}
CONVERTED_NAME = "ssd_vgg16_imagenet_from_timm.npz"
_DAMAGED_CACHE = "the cached file is damaged; delete it and it is downloaded again"


def cache_dir() -> Path:
    """ChainerCV's model cache, ``$CHAINER_DATASET_ROOT/pfnet/chainercv/models``."""
    return Path(get_dataset_root(), "pfnet", "chainercv", "models")


def check_pretrained(name: str, pretrained) -> None:
    """A ``"missing"`` WeightsError when ``pretrained`` names weights model ``name`` lacks."""
    if pretrained in PRETRAINED and str(name).lower() not in WITH_PRETRAINED:
        raise WeightsError(
            f"{name} has no {pretrained!r} weights (only {', '.join(WITH_PRETRAINED)} do): train "
            f"it from random weights (--pretrained none) or load a .npz of it", "missing",
            path=Path(str(pretrained)))


def pretrained_file(name: str = "ssd300", pretrained: str = "voc0712", progress: bool = True,
                    timeout: float = TIMEOUT_S, sources=None) -> tuple[Path, Source, str]:
    """The weight file of ``pretrained`` for model ``name``: ``(path, source, how)``, ``how``
    ``'cache'`` or ``'download'``. A ``"missing"`` WeightsError when no source gives it (``.path``:
    the cache folder); another kind for a damaged cached file."""
    check_pretrained(name, pretrained)
    sources = SOURCES[str(name).lower(), pretrained] if sources is None else tuple(sources)
    for source in sources:
        if (path := _cached(source)) is not None:
            return path, source, "cache"
    failures = []
    for source in sources:
        try:
            return _download(source, progress, timeout), source, "download"
        except WeightsError as exc:
            if exc.kind != "source":
                raise
            logger.info("%s weights from %s failed: %s", pretrained, source.url, exc)
            failures.append(f"  {len(failures) + 1}. {source.describe()}: {source.url}\n"
                            f"     {exc}")
    folder = cache_dir()
    raise WeightsError(
        f"the {pretrained!r} weights for {name} are not in the cache and no source gave them:\n"
        + "\n".join(failures) + "\nPlace one of these files, downloaded elsewhere (it is checked "
        "on first use):\n" + "\n".join(f"  {folder / s.file_name}" for s in sources)
        + "\nor train from random weights (--pretrained none).", "missing", path=folder,
        url=sources[0].url)


def _cached(source: Source) -> Path | None:
    path = cache_dir() / source.file_name
    if source.layout == "vgg16" and path.is_file():     # an SSD file is checked as it loads
        _check_download(path, source, _DAMAGED_CACHE)
    if source.layout != "timm":
        return path if path.is_file() else None
    converted = cache_dir() / CONVERTED_NAME
    if converted.is_file():
        if _sidecar_digest(converted) != sha256_file(converted):
            raise WeightsError(f"{converted} does not match its .sha256 file (or that is "
                               "missing): delete both; the weights are converted again",
                               "checksum", path=converted)
        _check_download(converted, _IMAGENET[0], "delete it and its .sha256")
        return converted
    if not path.is_file():
        return None
    found = sha256_file(path)                     # placed by hand: checked like a download
    if found != source.sha256:
        raise WeightsError(f"{path} is not timm's published file (sha256 {found}, published "
                           f"{source.sha256}): delete it or replace it with {source.url}",
                           "checksum", path=path, expected=source.sha256, found=found)
    return _convert(path)


def _download(source: Source, progress: bool, timeout: float) -> Path:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    timm = source.layout == "timm"
    target = folder / (f".{source.file_name}.{os.getpid()}.download" if timm else source.file_name)
    try:
        with atomic_file(target) as out:
            try:
                _, digest = stream_url(source.url, out, timeout=timeout,
                                       user_agent=f"medaidet/{__version__}",
                                       desc=f"{source.name} weights", progress=progress,
                                       max_bytes=MAX_DOWNLOAD_BYTES)
            except DataError as exc:
                raise WeightsError(f"unreachable ({exc})" if exc.offline else str(exc),
                                   "source") from None
            if source.sha256 and digest != source.sha256:
                raise WeightsError(f"its sha256 {digest} is not the {source.sha256} its "
                                   "publisher lists; it was deleted", "source")
        if timm:
            return _convert(target)
        _check_download(target, source, "the server sent a damaged file")
        return target
    except WeightsError as exc:
        if exc.kind == "source":
            raise
        target.unlink(missing_ok=True)
        raise WeightsError(f"the file it sent is not usable ({exc}); it was deleted",
                           "source") from None
    finally:
        if timm:
            target.unlink(missing_ok=True)       # only the converted file is kept


def _check_download(path: Path, source: Source, cause: str) -> None:
    """Readable, finite and, for ChainerCV's VGG-16, VGG-16's names and shapes."""
    arrays = read_arrays(path)
    _check_finite(arrays, path, cause)
    if source.layout == "vgg16":
        _check_shapes(arrays, VGG16_SHAPES, path, "ChainerCV's ImageNet VGG-16",
                      ". Delete it; it is downloaded again.")


def _check_shapes(arrays: dict, shapes: dict, path: Path, what: str, advice: str) -> None:
    """A ``"mismatch"`` WeightsError for the first of ``shapes`` missing or misshapen."""
    for key, shape in shapes.items():
        found = tuple(np.shape(arrays[key])) if key in arrays else None
        if found != shape:
            raise WeightsError(
                f"{path} is not {what}: {key} "
                f"{'is missing' if found is None else f'has shape {found}'}, expected {shape}"
                f"{advice}", "mismatch", path=path, parameter=key, expected=shape, found=found)


def _sidecar_digest(path: Path) -> str:
    """Its .sha256 file's digest, or ""."""
    sidecar = path.with_name(path.name + ".sha256")
    return ((sidecar.read_text().split() if sidecar.is_file() else []) or [""])[0].lower()


def shipped_weights(name: str = "ssd_small", labels: str = "bccd") -> Path:
    """The shipped trained weights of ``name`` on ``labels`` (:data:`SHIPPED_WEIGHTS`); a
    ``"missing"`` WeightsError when none ship, ``"checksum"`` when not the file its record names."""
    path = SHIPPED_WEIGHTS.get((name, labels))
    if path is None or not path.is_file():
        raise WeightsError(
            f"no trained weights ship for {name!r} on {labels!r} (only for "
            f"{', '.join(f'{n} ({l})' for n, l in SHIPPED_WEIGHTS)}): train it (`medaidet "
            "train`) and use its model.npz, or reinstall medaidet", "missing", path=path)
    expected = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))["sha256"]
    found = sha256_file(path)
    if found != expected or _sidecar_digest(path) != found:
        raise WeightsError(f"the shipped weights {path} are not the file medaidet shipped (sha256 "
                           f"{found}, recorded {expected}, or no .sha256): reinstall medaidet",
                           "checksum", path=path, expected=expected, found=found)
    return path


#: VGG-16's 3x3 convolutions: ChainerCV's names, their indices in timm's ``features``.
_CONVS = ("conv1_1", "conv1_2", "conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv3_3",
          "conv4_1", "conv4_2", "conv4_3", "conv5_1", "conv5_2", "conv5_3")
_FEATURES = (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)
_WIDTHS = (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512)
SSD_MEAN = np.array([123.0, 117.0, 104.0])
TORCHVISION_MEAN_255 = np.array([0.485, 0.456, 0.406]) * 255
TORCHVISION_STD = np.array([0.229, 0.224, 0.225])
#: ChainerCV's ImageNet VGG-16: name -> shape (what its file holds).
VGG16_SHAPES = {f"extractor/{name}/{p}": (width, n_in, 3, 3) if p == "W" else (width,)
                for name, width, n_in in zip(_CONVS, _WIDTHS, (3, *_WIDTHS[:-1]))
                for p in "Wb"}
VGG16_SHAPES.update({"extractor/conv6/W": (1024, 512, 3, 3), "extractor/conv6/b": (1024,),
                     "extractor/conv7/W": (1024, 1024, 1, 1), "extractor/conv7/b": (1024,)})
#: ChainerCV's VGG-16 conv1_1 ... conv5_3 name -> timm's name.
_TIMM_NAMES = {f"extractor/{name}/{p}": f"features.{i}.{q}"
               for name, i in zip(_CONVS, _FEATURES) for p, q in (("W", "weight"), ("b", "bias"))}
_TIMM_SHAPES = {timm: VGG16_SHAPES[name] for name, timm in _TIMM_NAMES.items()}
_TIMM_SHAPES.update({"pre_logits.fc1.weight": (4096, 512, 7, 7), "pre_logits.fc1.bias": (4096,),
                     "pre_logits.fc2.weight": (4096, 4096, 1, 1), "pre_logits.fc2.bias": (4096,)})


def read_vgg16(path) -> dict[str, np.ndarray]:
    """The arrays of timm's VGG-16 safetensors file; a ``"file"`` WeightsError for anything
    else (a ``torch.save`` pickle is never read)."""
    path = Path(path)
    if (why := not_a_regular_file(path)) or not path.is_file():
        raise WeightsError(f"no VGG-16 weight file at {path} ({why or 'missing'})", "missing",
                           path=path)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(f"{path} is not a readable safetensors file ({exc}): download timm's "
                           "vgg16.tv_in1k model.safetensors again.", "file", path=path) from None


def convert_vgg16(state: dict, mean=SSD_MEAN, path="the weights") -> dict[str, np.ndarray]:
    """ChainerCV's VGG16 parameters (float32) from timm's ``vgg16.tv_in1k`` arrays.

    conv1_1 … conv5_3 are copied, conv1_1 rescaled: timm sees ``(pixel / 255 - MEAN) / STD``,
    ChainerCV ``pixel - mean``, so W is divided by ``255 STD`` and b gets ``W · (mean - 255 MEAN)
    / (255 STD)``. conv6/conv7 are fc6/fc7 subsampled as in the SSD paper; norm4's scale starts
    at 20. A ``"mismatch"`` or ``"not_finite"`` WeightsError names a bad entry."""
    path = Path(str(path))
    bn = any(k.endswith("running_mean") for k in state)
    _check_shapes(state, _TIMM_SHAPES, path, "timm's ImageNet VGG-16",
                  " (the file is VGG-16 with batch norm, vgg16_bn: use vgg16)." if bn else ".")
    _check_finite({k: state[k] for k in _TIMM_SHAPES}, path,
                  "the file was damaged or written by a diverged training; use the published file")
    out = {name: state[timm] for name, timm in _TIMM_NAMES.items()}
    weight = np.asarray(out["extractor/conv1_1/W"], dtype=np.float64)
    scale = 1.0 / (255.0 * TORCHVISION_STD)
    shift = (np.asarray(mean, dtype=np.float64).reshape(3) - TORCHVISION_MEAN_255) * scale
    out["extractor/conv1_1/W"] = weight * scale[None, :, None, None]
    out["extractor/conv1_1/b"] = out["extractor/conv1_1/b"] + np.einsum("ocij,c->o", weight, shift)
    out["extractor/conv6/W"] = state["pre_logits.fc1.weight"][::4, :, ::3, ::3]
    out["extractor/conv6/b"] = state["pre_logits.fc1.bias"][::4]
    out["extractor/conv7/W"] = state["pre_logits.fc2.weight"][::4, ::4]
    out["extractor/conv7/b"] = state["pre_logits.fc2.bias"][::4]
    out["extractor/norm4/scale"] = np.full(512, 20.0)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sorted(out.items())}


def _convert(raw: Path) -> Path:
    try:
        arrays = convert_vgg16(read_vgg16(raw), path=raw)
    except WeightsError as exc:
        raise WeightsError(f"it cannot be converted: {exc}", "source") from None
    save_weights(arrays, cache_dir() / CONVERTED_NAME)
    return cache_dir() / CONVERTED_NAME


def materialize(model):
    """Shape every lazily shaped parameter (one forward pass of a blank image; draws from NumPy's
    global RNG, so seeded runs stay reproducible). Returns ``model``."""
    if any(param.array is None for param in model.params()):
        x = model.xp.zeros((1, 3, model.insize, model.insize), dtype=np.float32)
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            model(x)
    return model


def save_weights(model, path, compression: bool = False, half: bool = False) -> str:
    """Save a model's parameters (or ``{name: array}``) in ``save_npz``'s format and a
    ``<sha256>  <name>`` sidecar, both atomically; returns the sha256. Reproducible byte for
    byte (fixed zip dates, name order); ``half``: float32 stored as float16."""
    arrays = model
    if not isinstance(model, dict):
        arrays = {}
        chainer.serializers.DictionarySerializer(arrays).save(materialize(model))
    path = Path(path)
    sidecar = path.with_name(path.name + ".sha256")
    path.parent.mkdir(parents=True, exist_ok=True)
    check_output(sidecar)
    method = zipfile.ZIP_DEFLATED if compression else zipfile.ZIP_STORED
    with atomic_file(path) as f, \
            zipfile.ZipFile(f, "w", compression=method, allowZip64=True) as archive:
        for name in sorted(arrays):
            array = chainer.backends.cuda.to_cpu(arrays[name])
            if half and array.dtype == np.float32:
                array = array.astype(np.float16)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            with archive.open(info, "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asanyarray(array), allow_pickle=False)
    digest = sha256_file(path)
    with atomic_file(sidecar, "w") as f:
        f.write(f"{digest}  {path.name}\n")
    return digest


_EXPECTED = "expected an .npz of arrays, as save_weights or chainer.serializers.save_npz write"
_MAGIC = ((b"\x93NUMPY", "a single NumPy array (.npy)"),
          (b"\x1f\x8b", "a gzip-compressed file (a .tar.gz?)"),
          (b"\x89HDF", "an HDF5 file (save_hdf5 or Keras weights?)"),
          (b"\x80", "a Python pickle (pickle.dump or an old torch.save?)"))


def what_file_is(path: Path) -> str | None:
    """What ``path`` holds, in words, when it is not a zip archive (``None`` when it is)."""
    if why := not_a_regular_file(path):
        return why
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "empty (0 bytes)"
    if any(magic.startswith(head[:4]) for magic in (b"PK\x03\x04", b"PK\x05\x06")):
        return None
    if head[257:262] == b"ustar":
        return "a tar archive"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    text = head.decode("utf-8", "replace")
    if "\x00" not in text and text.count("\ufffd") <= 1:
        return f"a text file (it begins {text.strip()[:40]!r})"
    return f"not an .npz (it begins with the bytes {head[:8].hex(' ')})"


def check_sizes(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse (``"too_large"``) members of ``archive`` past the byte limits and (``"file"``) a
    ``.npy`` header declaring another size than its member holds; reads headers only."""
    total = 0
    for info in archive.infolist():
        total += info.file_size
        if info.file_size > MAX_ARRAY_BYTES or total > MAX_TOTAL_BYTES:
            raise WeightsError(
                f"{path}: {info.filename} takes its entries to {total:,} bytes, more than any "
                f"model's weights (limits {MAX_ARRAY_BYTES:,} per array, {MAX_TOTAL_BYTES:,} in "
                f"all); not read. {_EXPECTED}.", "too_large", path=path, parameter=info.filename)
        if not info.filename.endswith(".npy"):
            continue
        with archive.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
                header = f.tell()
            except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                raise _damaged(path, info.filename, exc) from None
        declared = math.prod(shape) * dtype.itemsize
        if not dtype.hasobject and header + declared != info.file_size:
            raise WeightsError(f"{path}: {info.filename} declares shape {shape} ({declared:,} "
                               f"bytes) but holds {info.file_size - header:,}: damaged or made "
                               "to mislead; not read.", "file", path=path,
                               parameter=info.filename)


def read_arrays(path: Path) -> dict:
    """Every array of the ``.npz`` at ``path``, by name; a ``"file"`` or ``"too_large"``
    WeightsError saying what the file is instead and what was expected."""
    path = Path(path)
    what = what_file_is(path)
    if what is not None:
        raise WeightsError(f"{path} is {what}, not a weight file (an interrupted copy leaves an "
                           f"empty one: copy it again); {_EXPECTED}.", "file", path=path)
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        raise WeightsError(f"{path} is a truncated .npz ({path.stat().st_size} bytes; an "
                           "interrupted copy or save, or a full disk): copy or save it again.",
                           "file", path=path) from None
    with npz:
        check_sizes(path, npz.zip)
        other = [m for m in npz.zip.namelist() if not m.endswith(".npy")]
        if other or not npz.files:
            raise WeightsError(f"{path} is a zip archive but not an .npz of arrays (it holds "
                               f"{other[0] if other else 'nothing'!r}: a PyTorch checkpoint?); "
                               f"{_EXPECTED}.", "file", path=path)
        arrays = {}
        for key in npz.files:
            try:
                arrays[key] = npz[key]
            except ValueError as exc:
                if "allow_pickle" not in str(exc) and "Object arrays" not in str(exc):
                    raise _damaged(path, key, exc) from None
                raise WeightsError(f"{path}: {key} holds Python objects, not numbers (saved "
                                   "before the model's first forward pass?); save with "
                                   "save_weights.", "file", path=path, parameter=key) from None
            except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise _damaged(path, key, exc) from None
    return arrays


def _damaged(path: Path, key: str, exc: Exception) -> WeightsError:
    return WeightsError(f"{path} is damaged: its entry {key} cannot be read ({exc}); copy or "
                        "save it again.", "file", path=Path(path), parameter=key)


def _check_finite(arrays: dict, path: Path, cause: str) -> None:
    bad = [k for k in sorted(arrays) if np.asarray(arrays[k]).dtype.kind in "fc"
           and not np.isfinite(arrays[k]).all()]
    if bad:
        array = np.asarray(arrays[bad[0]])
        raise WeightsError(
            f"{path}: {bad[0]} holds {int(np.isnan(array).sum())} NaN and "
            f"{int(np.isinf(array).sum())} infinite of its {array.size} values ({len(bad)} of "
            f"{len(arrays)} arrays hold some); a model with them detects nothing. Likely cause: "
            f"{cause}.", "not_finite", path=path, parameter=bad[0], count=len(bad))


@dataclass(frozen=True)
class WeightsReport:
    """What a weight file gave a model (names are ``save_npz`` keys)."""

    source: str                    # the file read
    loaded: tuple[str, ...]        # model parameters set from the file
    skipped: tuple[str, ...]       # entries of the file not used
    initialized: tuple[str, ...]   # model parameters left at their random initialization
    note: str = ""                 # why entries were skipped
    origin: str = ""               # where the file came from, when it matters

    def summary(self) -> str:
        def groups(names):
            counts = Counter("/".join(n.split("/")[:2 if n.startswith("multibox") else 1])
                             for n in names)
            return " (" + ", ".join(f"{g} {c}" for g, c in sorted(counts.items())) + ")"
        origin = f" ({self.origin})" if self.origin else ""
        parts = [f"{Path(self.source).name}{origin}: loaded {len(self.loaded)} parameters"
                 f"{groups(self.loaded)}"]
        if self.skipped:
            parts.append(f"skipped {len(self.skipped)} from the file{groups(self.skipped)}"
                         + (f" ({self.note})" if self.note else ""))
        if self.initialized:
            parts.append(f"random init for {len(self.initialized)}{groups(self.initialized)}")
        return "; ".join(parts)

    __str__ = summary


def load_weights(model, path, *, skip: str | None = None, backbone: bool = False,
                 origin: str = "") -> WeightsReport:
    """Load the ``.npz`` at ``path`` into ``model`` after checking its sidecar, every name (before
    any forward pass), shape and finite values. ``skip``: a name prefix neither loaded nor
    required (:data:`CLASS_HEADS`); ``backbone``: the file holds part of the model, the rest stays
    random. A ``"mismatch"`` WeightsError names the parameter, both shapes and the likely cause."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"no weight file at {path}", "missing", path=path)
    if path.with_name(path.name + ".sha256").is_file():
        expected, found = _sidecar_digest(path), sha256_file(path)
        if found != expected:
            raise WeightsError(f"{path} does not match its .sha256 file (sha256 {found}, expected "
                               f"{expected}): changed after it was saved or copied partly; copy "
                               "it again.", "checksum", path=path, expected=expected, found=found)
    arrays = read_arrays(path)

    def used(key):
        return not (skip and key.startswith(skip))

    expected = _model_shapes(model)
    missing = [] if backbone else [k for k in sorted(expected) if used(k) and k not in arrays]
    extra = [] if skip else [k for k in sorted(arrays) if k not in expected]
    if missing or extra:
        raise _mismatch(model, path, arrays, expected, [], missing, extra)
    expected = _model_shapes(materialize(model))
    loaded = tuple(k for k in sorted(arrays) if k in expected and used(k))
    wrong = [k for k in loaded if tuple(arrays[k].shape) != expected[k]]
    if wrong:
        raise _mismatch(model, path, arrays, expected, wrong, [], [])
    _check_finite({k: arrays[k] for k in loaded}, path, _DAMAGED_CACHE if skip or backbone else
                  "the training diverged before these were saved; use an earlier snapshot")
    chainer.serializers.NpzDeserializer({k: arrays[k] for k in loaded}, strict=False).load(model)
    return WeightsReport(
        source=str(path), loaded=loaded, origin=origin,
        skipped=tuple(k for k in sorted(arrays) if k not in loaded),
        initialized=tuple(k for k in sorted(expected) if k not in loaded),
        note="VOC's 21-class score heads; these classes get new ones" if skip else "")


def _model_shapes(model) -> dict:
    """save_npz key -> shape of every parameter (None while lazy) and persistent value."""
    shapes = {name.lstrip("/"): None if param.array is None else tuple(param.shape)
              for name, param in model.namedparams()}
    for path, link in model.namedlinks():
        for name in link._persistent:
            shapes[f"{path}/{name}".lstrip("/")] = np.shape(getattr(link, name))
    return shapes


def _mismatch(model, path, arrays, expected, wrong, missing, extra) -> WeightsError:
    key = (wrong or missing or extra)[0]
    found = tuple(arrays[key].shape) if key in arrays else None
    want = expected.get(key)
    what = (f"parameter {key} has shape {found} in the file, the model expects {want}" if wrong
            else f"parameter {key} is not in the file" if missing
            else f"the file has {key} (shape {found}), which the model lacks")
    return WeightsError(
        f"{path} does not fit {type(model).__name__}(n_fg_class={model.n_fg_class}): {what} "
        f"({len(wrong)} of another shape, {len(missing)} missing, {len(extra)} extra). "
        f"Likely cause: {_likely_cause(model, arrays)}", "mismatch", path=path, parameter=key,
        expected=want, found=found)


def _likely_cause(model, arrays) -> str:
    if any(k.startswith("updater/") for k in arrays):
        return ("this is a trainer snapshot (keys start with 'updater/'): load it with "
                "chainer.serializers.load_npz(path, model, path='updater/model:main/model/'), "
                "then save_weights(model, ...).")
    is_512 = "extractor/conv12_1/W" in arrays
    if is_512 != isinstance(model, SSD512) and "extractor/conv1_1/W" in arrays:
        name = "SSD512" if is_512 else "SSD300"
        return f"the file was saved from {name}: build_ssd('{name.lower()}', ...)."
    loc, conf = arrays.get("multibox/loc/0/W"), arrays.get("multibox/conf/0/W")
    if loc is not None and conf is not None and loc.shape[0] % 4 == 0 and loc.shape[0]:
        n_fg = conf.shape[0] // (loc.shape[0] // 4) - 1
        if n_fg != model.n_fg_class:
            return (f"the file was saved from a model with n_fg_class={n_fg}: build it so, or "
                    "start from 'voc0712'/'imagenet' weights.")
    if not any(k.startswith(("extractor/", "multibox/")) for k in arrays):
        return "the file holds no SSD parameters; it is not an SSD weight file."
    return "the file was saved from a different architecture or a modified model."


@dataclass(frozen=True)
class WeightsComparison:
    """How two weight files differ (:func:`compare_weights`)."""

    n_arrays: int
    n_different: int
    max_abs_diff: float
    max_rel_diff: float        # per array max |a - b| / max(|a|, |b|); the largest
    only_in_one: tuple = ()

    @property
    def identical(self) -> bool:
        """Bit for bit: same names, every array equal."""
        return self.n_different == 0 and not self.only_in_one

    def summary(self) -> str:
        if self.identical:
            return f"identical ({self.n_arrays} arrays, bit for bit)"
        def plain(v):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        extra = f"; only in one file: {', '.join(self.only_in_one)}" if self.only_in_one else ""
        return (f"{self.n_different} of {self.n_arrays} arrays differ; largest difference "
                f"{plain(self.max_abs_diff)}; relative to its array's largest value, up to "
                f"{plain(self.max_rel_diff)}{extra}")


def compare_weights(a, b) -> WeightsComparison:
    """Compare two weight files (or ``{name: array}`` mappings) array by array."""
    a, b = (x if isinstance(x, dict) else read_arrays(x) for x in (a, b))
    common = sorted(set(a) & set(b))
    n_different, max_abs, max_rel = 0, 0.0, 0.0
    for name in common:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape:
            n_different, max_abs, max_rel = n_different + 1, math.inf, math.inf
        elif not np.array_equal(x, y):
            n_different += 1
            diff = float(np.max(np.abs(x.astype(np.float64) - y)))
            scale = max(float(np.max(np.abs(x))), float(np.max(np.abs(y)))) or 1.0
            max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / scale)
    return WeightsComparison(len(common), n_different, max_abs, max_rel,
                             tuple(sorted(set(a) ^ set(b))))

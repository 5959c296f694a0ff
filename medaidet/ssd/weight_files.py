"""Weight files: a model's parameters saved, loaded back with every name, shape and value
checked, and compared (a file that is not one is told apart by
:mod:`medaidet.ssd.npz_files`, which reads every file handed to it as untrusted data).

:func:`save_weights` writes a model-only ``.npz`` (the ``chainer.serializers.save_npz`` format,
reproducible byte for byte) and a ``.sha256`` sidecar; :func:`load_weights` verifies the
sidecar, then, before any array is copied, checks every shape against the model: a mismatch
raises a ``"mismatch"`` WeightsError naming the parameter, both shapes and the likely cause
(another ``n_fg_class``, SSD300 vs SSD512, a trainer snapshot instead of model weights). The
model is first *materialized* (:func:`materialize`: one forward pass on a blank image) so that
every expected shape is known exactly. What was loaded is described by a
:class:`WeightsReport`.

Parameter names are the keys of ``chainer.serializers.save_npz``, e.g.
``extractor/conv1_1/W``, ``multibox/loc/0/W``, ``multibox/conf/0/W``.
"""
from __future__ import annotations

import math
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import chainer
import numpy as np
from chainercv.links import SSD512

from medaidet.checksums import sha256_file
from medaidet.errors import WeightsError
from medaidet.files import atomic_file, check_output
from medaidet.ssd.npz_files import check_finite, read_arrays

__all__ = [
    "CLASS_HEADS", "SIDECAR_SUFFIX", "materialize", "save_weights", "write_arrays",
    "load_weights", "compare_weights", "check_cached_weights", "load_all_but_class_heads",
    "load_backbone", "WeightsReport", "WeightsComparison",
]

#: Prefix of the class-score heads: their shape depends on the number of classes.
CLASS_HEADS = "multibox/conf/"
SIDECAR_SUFFIX = ".sha256"


# --------------------------------------------------------------------------- report

@dataclass(frozen=True)
class WeightsReport:
    """What a weight file gave a model. Names are ``save_npz`` keys (``extractor/conv1_1/W``)."""

    source: str                    # the file read
    loaded: tuple[str, ...]        # model parameters set from the file
    skipped: tuple[str, ...]       # entries of the file that were not used
    initialized: tuple[str, ...]   # model parameters left at their random initialization
    note: str = ""                 # why entries were skipped, when they were
    origin: str = ""               # where the file came from, when it matters (ImageNet)

    def summary(self) -> str:
        origin = f" ({self.origin})" if self.origin else ""
        parts = [f"{Path(self.source).name}{origin}: loaded {len(self.loaded)} parameters"
                 f"{_groups(self.loaded)}"]
        if self.skipped:
            parts.append(f"skipped {len(self.skipped)} from the file{_groups(self.skipped)}"
                         + (f" ({self.note})" if self.note else ""))
        if self.initialized:
            parts.append(f"random init for {len(self.initialized)}{_groups(self.initialized)}")
        return "; ".join(parts)

    __str__ = summary


def _group(name: str) -> str:
    head = name.split("/")
    return "/".join(head[:2]) if head[0] == "multibox" else head[0]


def _groups(names) -> str:
    if not names:
        return ""
    counts = Counter(_group(n) for n in names)
    return " (" + ", ".join(f"{g} {c}" for g, c in sorted(counts.items())) + ")"


# --------------------------------------------------------------------------- shapes

def materialize(model):
    """Give every lazily shaped parameter its shape: one forward pass on a blank image.

    ChainerCV's convolutions learn their input channels on the first forward pass; until
    then their weights are uninitialized and cannot be checked, saved or copied. Draws the
    random initial values from NumPy's global RNG (seeded runs stay reproducible). Returns
    ``model``; does nothing when every parameter already has its array.
    """
    if all(param.array is not None for param in model.params()):
        return model
    x = model.xp.zeros((1, 3, model.insize, model.insize), dtype=np.float32)
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        model(x)
    return model


# --------------------------------------------------------------------------- weight files

def _write_npz(f, model, compression: bool, half: bool = False) -> None:
    """What ``chainer.serializers.save_npz`` writes, minus the clock: NumPy's ``savez``
    stamps every zip entry with the current time, so identical weights saved twice get
    different sha256s. Here every entry carries the same fixed date, in name order, and
    identical weights give an identical file. ``half``: float32 arrays are stored as
    float16 (loading casts them back)."""
    serializer = chainer.serializers.DictionarySerializer()
    serializer.save(model)
    _write_zip(f, serializer.target, compression, half)


def _write_zip(f, arrays: dict, compression: bool = False, half: bool = False) -> None:
    method = zipfile.ZIP_DEFLATED if compression else zipfile.ZIP_STORED
    with zipfile.ZipFile(f, mode="w", compression=method, allowZip64=True) as archive:
        for name in sorted(arrays):
            array = np.asanyarray(arrays[name])
            if half and array.dtype == np.float32:
                array = array.astype(np.float16)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            with archive.open(info, "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, array, allow_pickle=False)


def save_weights(model, path, compression: bool = False, half: bool = False) -> str:
    """Save the model's parameters only (the ``save_npz`` format) and a ``.sha256`` sidecar.

    The file is reproducible: the same weights give the same bytes and sha256 (see
    :func:`_write_npz`). ``half``: store float32 arrays as float16 (half the size, for
    weights that ship; :func:`load_weights` casts them back to the model's float32).

    The sidecar holds ``<sha256>  <file name>`` (``sha256sum -c`` reads it). Both files are
    written under temporary names and renamed, so a crash never leaves a half-written
    file under ``path``. Uncompressed by default: weights shrink by ~8% at several seconds'
    cost. Returns the sha256 hex digest.
    """
    path = Path(path)
    materialize(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        _write_npz(f, model, compression, half)
    return _write_sidecar(path)


def write_arrays(arrays: dict, path, inputs=()) -> str:
    """Save ``{name: array}`` as :func:`save_weights` saves a model (the same reproducible
    ``.npz`` and ``.sha256`` sidecar, written atomically; neither may be one of ``inputs``).
    Returns the sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_output(_sidecar(path), inputs)
    with atomic_file(path, inputs=inputs) as f:
        _write_zip(f, arrays)
    return _write_sidecar(path)


def _write_sidecar(path: Path) -> str:
    digest = sha256_file(path)
    with atomic_file(_sidecar(path), "w") as f:
        f.write(f"{digest}  {path.name}\n")
    return digest


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
        extra = f"; only in one file: {', '.join(self.only_in_one)}" if self.only_in_one else ""
        return (f"{self.n_different} of {self.n_arrays} arrays differ; largest difference "
                f"{_plain(self.max_abs_diff)}; relative to its array's largest value, up to "
                f"{_plain(self.max_rel_diff)}{extra}")


def _plain(value: float) -> str:
    """A number as a reader reads it: 1,040 rather than 1.04e+03, 3 significant digits."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def compare_weights(a, b) -> WeightsComparison:
    """Compare two model-only weight files (or ``{name: array}`` mappings) array by array."""
    def arrays(source):
        if isinstance(source, dict):
            return source
        return read_arrays(Path(source))

    a, b = arrays(a), arrays(b)
    common = sorted(set(a) & set(b))
    n_different, max_abs, max_rel = 0, 0.0, 0.0
    for name in common:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape:
            n_different += 1
            max_abs = max_rel = math.inf
            continue
        if np.array_equal(x, y):
            continue
        n_different += 1
        diff = float(np.max(np.abs(x.astype(np.float64) - y)))
        scale = max(float(np.max(np.abs(x))), float(np.max(np.abs(y)))) or 1.0
        max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / scale)
    return WeightsComparison(n_arrays=len(common), n_different=n_different,
                             max_abs_diff=max_abs, max_rel_diff=max_rel,
                             only_in_one=tuple(sorted(set(a) ^ set(b))))


def load_weights(model, path) -> WeightsReport:
    """Load a model-only weight file completely; verify its ``.sha256`` sidecar if present.

    Every parameter of the model must be in the file with the same shape and finite values,
    and the file must hold nothing else. Returns a :class:`WeightsReport`.

    Raises:
        WeightsError: of kind "missing", "checksum", "file" (not an ``.npz`` of arrays: says
        what the file is instead), "mismatch" or "not_finite".
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"no weight file at {path}", "missing", path=path)
    sidecar = _sidecar(path)
    if sidecar.is_file():
        fields = sidecar.read_text().split()
        expected = fields[0].lower() if fields else ""
        found = sha256_file(path)
        if found != expected:
            raise WeightsError(
                f"{path} does not match its checksum file {sidecar.name}: expected sha256 "
                f"{expected or '(empty sidecar)'}, found {found}. The file changed after it "
                f"was saved or was copied only partly; copy it again.",
                "checksum", path=path, expected=expected, found=found)
    return _load(model, path, skip=None, strict=True)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


_CAUSE_DIVERGED = ("the training diverged before these were saved; use an earlier snapshot "
                   "(or train again with a lower learning rate)")
_CAUSE_CACHED = ("the cached file is damaged; delete it and it is downloaded again")


def _model_shapes(model) -> dict:
    """save_npz key -> shape: every parameter (``None`` while lazily shaped) and every
    persistent value (batch normalisation's running mean and variance)."""
    shapes = {name.lstrip("/"): None if param.array is None else tuple(param.shape)
              for name, param in model.namedparams()}
    for path, link in model.namedlinks():
        for name in link._persistent:
            shapes[f"{path}/{name}".lstrip("/")] = np.shape(getattr(link, name))
    return shapes


def _load(model, path: Path, skip: str | None, strict: bool, note: str = "",
          non_finite_cause: str = _CAUSE_DIVERGED) -> WeightsReport:
    """Check every shape and that the values are finite, then copy. ``skip``: a key prefix
    neither loaded nor checked. ``strict``: the file may hold no entry the model lacks
    (otherwise such entries are reported as skipped). ``non_finite_cause``: the likely
    cause named when a value is NaN or inf."""
    arrays = read_arrays(path)

    def skipped(key):
        return skip is not None and key.startswith(skip)

    # Names first: they need no forward pass (a snapshot or an SSD512 file fails fast).
    expected = _model_shapes(model)
    missing = [k for k in sorted(expected) if not skipped(k) and k not in arrays]
    extra = [k for k in sorted(arrays) if k not in expected and not skipped(k)] \
        if strict else []
    if missing or extra:
        raise _mismatch(model, path, arrays, expected, [], missing, extra)
    materialize(model)
    expected = _model_shapes(model)
    wrong = [k for k in sorted(expected)
             if not skipped(k) and tuple(arrays[k].shape) != expected[k]]
    if wrong:
        raise _mismatch(model, path, arrays, expected, wrong, [], [])

    loaded = tuple(k for k in sorted(expected) if not skipped(k))
    check_finite({k: arrays[k] for k in loaded}, path, non_finite_cause)
    chainer.serializers.NpzDeserializer(
        {k: arrays[k] for k in loaded}, strict=True,
        ignore_names=lambda key: skipped(key)).load(model)
    return WeightsReport(
        source=str(path), loaded=loaded,
        skipped=tuple(k for k in sorted(arrays) if k not in loaded),
        initialized=tuple(k for k in sorted(expected) if skipped(k)),
        note=note if skip else "")


def load_backbone(model, path: Path, origin: str = "") -> WeightsReport:
    """Load an ImageNet VGG-16 file (ChainerCV's, or converted by
    :mod:`medaidet.ssd.vgg_weights`) into SSD300/SSD512: every entry must be a parameter of
    the model with its shape and finite values; the model's other parameters (the extra
    layers, the heads) keep their random initialization. ``origin``: where the file came
    from, for the report. What ChainerCV's own ``pretrained_model='imagenet'`` does, checked."""
    arrays = read_arrays(path)
    expected = _model_shapes(materialize(model))
    unknown = [k for k in sorted(arrays) if k not in expected]
    wrong = [k for k in sorted(arrays) if k in expected and tuple(arrays[k].shape) != expected[k]]
    if unknown or wrong:
        raise _mismatch(model, path, arrays, expected, wrong, [], unknown)
    check_finite(arrays, path, _CAUSE_CACHED)
    chainer.serializers.NpzDeserializer(arrays, strict=False).load(model)
    return WeightsReport(
        source=str(path), loaded=tuple(sorted(arrays)), skipped=(),
        initialized=tuple(k for k in sorted(expected) if k not in arrays), origin=origin)


def _mismatch(model, path, arrays, expected, wrong, missing, extra) -> WeightsError:
    if wrong:
        key = wrong[0]
        what = f"parameter {key} has shape {tuple(arrays[key].shape)} in the file, " \
               f"the model expects {expected[key]}"
        found, want = tuple(arrays[key].shape), expected[key]
    elif missing:
        key = missing[0]
        shape = "" if expected[key] is None else f" (shape {expected[key]})"
        what = f"parameter {key}{shape} is not in the file"
        found, want = None, expected[key]
    else:
        key = extra[0]
        what = f"the file has {key} (shape {tuple(arrays[key].shape)}), which the model lacks"
        found, want = tuple(arrays[key].shape), None
    counts = f"{len(wrong)} of another shape, {len(missing)} missing, {len(extra)} extra"
    message = (f"{path} does not fit {type(model).__name__}(n_fg_class={model.n_fg_class}): "
               f"{what} ({counts}). Likely cause: {_likely_cause(model, arrays)}")
    return WeightsError(message, "mismatch", path=path, parameter=key, expected=want, found=found)


def _likely_cause(model, arrays) -> str:
    keys = list(arrays)
    prefixes = sorted({k.split("/")[0] for k in keys if "/" in k})
    if any(k.startswith("updater/") for k in keys):
        return ("this is a trainer snapshot (keys start with 'updater/'), not model weights. "
                "Load it with chainer.serializers.load_npz(path, model, "
                "path='updater/model:main/model/'), then save_weights(model, ...).")
    is_512_file = "extractor/conv12_1/W" in arrays
    is_512_model = isinstance(model, SSD512)
    if is_512_file != is_512_model:
        return (f"the file was saved from {'SSD512' if is_512_file else 'SSD300'}; this model "
                f"is {type(model).__name__}. Build the same model: "
                f"build_ssd('{'ssd512' if is_512_file else 'ssd300'}', ...).")
    loc, conf = arrays.get("multibox/loc/0/W"), arrays.get("multibox/conf/0/W")
    if loc is not None and conf is not None and loc.shape[0] % 4 == 0:
        n_anchor = loc.shape[0] // 4
        if n_anchor and conf.shape[0] % n_anchor == 0:
            n_fg = conf.shape[0] // n_anchor - 1
            if n_fg != model.n_fg_class:
                return (f"the file was saved from a model with n_fg_class={n_fg}; this model "
                        f"has n_fg_class={model.n_fg_class}. Build it with "
                        f"n_fg_class={n_fg}, or start from 'voc0712'/'imagenet' weights, "
                        f"which do not depend on the classes.")
    if not any(k.startswith(("extractor/", "multibox/")) for k in keys):
        return (f"the file holds no SSD parameters (top-level names: "
                f"{', '.join(prefixes[:5]) or 'none'}); it is not an SSD weight file.")
    return "the file was saved from a different architecture or a modified model."


def check_cached_weights(path: Path) -> dict:
    """Read every array of a cached pretrained file and check it is finite: ChainerCV's own
    loader would fail on a damaged file with a raw zip error, and load NaNs without a word.
    Returns the arrays; a ``"file"`` WeightsError or a ``"not_finite"`` WeightsError naming
    the file."""
    arrays = read_arrays(path)
    check_finite(arrays, path, _CAUSE_CACHED)
    return arrays


def load_all_but_class_heads(model, path: Path) -> WeightsReport:
    """Load every parameter of a cached pretrained file (PASCAL VOC's) except the class-score
    heads (:data:`CLASS_HEADS`), whose shape depends on the number of classes: they keep
    their random initialization. Every other shape and value is checked first."""
    return _load(model, path, skip=CLASS_HEADS, strict=False,
                 note="VOC's 21-class score heads; these classes get new ones",
                 non_finite_cause=_CAUSE_CACHED)

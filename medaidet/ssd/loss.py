"""SSD's multibox loss behind a check of its targets (notebook 02, sections 7 and 8).

The loss is ChainerCV's ``multibox_loss`` (Liu et al., SSD, eq. 2 and 3). On a GPU a bad label
or box is read unchecked inside its kernels, so the inputs are checked first, with one host
synchronisation: :class:`~medaidet.errors.InvalidTargetsError` for shapes that disagree, bad
labels and non-finite locations at positive priors, :class:`~medaidet.errors.DivergedError`
for nan/inf predictions. Class 0 is background: ``mb_confs`` has ``n_fg_class + 1`` scores.
For gradient accumulation each micro-batch divides by the whole batch's positive count.
"""
import math
import reprlib
from collections import Counter

import numpy as np

import chainer
from chainer import backend
from chainer.backends import cuda
from chainercv.links.model.ssd import multibox_loss as chainercv_multibox_loss
from chainercv.links.model.ssd.multibox_loss import _hard_negative as chainercv_hard_negative

from medaidet.errors import DivergedError, InvalidTargetsError
from medaidet.numbers import is_real

__all__ = ["multibox_loss", "hard_negative", "check_values", "MultiboxTrainChain"]


def multibox_loss(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k, comm=None, check=True,
                  n_positive=None):
    """SSD's localisation and confidence losses, as ChainerCV's, with the targets checked first.

    ``mb_locs`` (B, K, 4), ``mb_confs`` (B, K, n_class) and ``gt_mb_locs`` (B, K, 4) floating
    point; ``gt_mb_labels`` (B, K), any integer dtype but uint64; ``k`` hard negatives per
    positive (SSD: 3). ``check=False`` checks only the argument types and ``k``. ``n_positive``:
    divide by the whole batch's positive count (averaged over the workers), not this call's.
    Returns ``(loc_loss, conf_loss)``, scalar Variables; float32 zeros when the count is 0."""
    arrays = _check_arguments(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k)
    locs, confs, gt_mb_locs, gt_mb_labels = arrays.values()
    normaliser = None if n_positive is None else _host_normaliser(n_positive)
    if check:
        _check_shapes(arrays)
    xp = backend.get_array_module(gt_mb_labels)
    with cuda.get_device_from_array(gt_mb_labels):
        positive = gt_mb_labels > 0
        if check:
            check_values(locs, confs, gt_mb_locs, gt_mb_labels, positive)
        # unlike ChainerCV: zero negatives' offsets (a degenerate box puts nan/-inf there)
        gt_mb_locs = xp.where(positive[..., None], gt_mb_locs, gt_mb_locs.dtype.type(0))
        gt_mb_labels = gt_mb_labels.astype(np.int32, copy=False)   # chainer wants signed
        if normaliser is None:
            return chainercv_multibox_loss(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k, comm)
        if normaliser == 0:
            z = chainer.Variable(xp.zeros((), dtype=np.float32))
            return z, z
        # ChainerCV divides by this call's own count: rescale to the caller's
        loc_loss, conf_loss = chainercv_multibox_loss(mb_locs, mb_confs, gt_mb_locs,
                                                      gt_mb_labels, k)
        scale = (positive.sum() / _as_array(n_positive)).astype(loc_loss.dtype)
        return loc_loss * scale, conf_loss * scale


def _host_normaliser(n_positive):
    """``n_positive`` as a host number, checked to be a real number >= 0 (scalar or 0-d array)."""
    value = math.nan
    if is_real(n_positive):
        value = float(n_positive)
    elif getattr(n_positive, "shape", None) == () and \
            getattr(n_positive, "dtype", np.dtype(object)).kind in "iuf":
        value = float(to_host(n_positive))
    if not 0 <= value < math.inf:
        raise InvalidTargetsError(
            f"n_positive = {n_positive!r} is not a valid normaliser: give the whole batch's count "
            "of positive priors as a number >= 0 or a 0-d array, or None for this call's own.",
            argument="n_positive", value=n_positive, allowed="a finite number >= 0")
    return value


def hard_negative(x, positive, k):
    """SSD's hard negatives as ChainerCV's loss chooses them (notebook 02, section 7): of ``x``,
    per-prior confidence loss (B, K), and ``positive`` (B, K), the negatives whose loss is among
    the ``k * n_positive`` largest of their image, bool (B, K)."""
    _check_k(k)
    return chainercv_hard_negative(_as_array(x), positive, k) & ~positive


def _as_array(a):
    return a.array if isinstance(a, chainer.Variable) else a


def to_host(a):
    """The one place this module moves check results to the host."""
    return cuda.to_cpu(a)


_ARRAY_FORMS = {"mb_locs": "a Variable or array (B, K, 4), floating point",
                "mb_confs": "a Variable or array (B, K, n_class), floating point",
                "gt_mb_locs": "an array (B, K, 4), the dtype of mb_locs",
                "gt_mb_labels": "an integer array (B, K)"}


def _check_arguments(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k) -> dict:
    """Types, devices and ``k`` (checked even with ``check=False``); the four arrays by name."""
    args = dict(zip(_ARRAY_FORMS, (mb_locs, mb_confs, gt_mb_locs, gt_mb_labels)))
    arrays = {name: _as_array(a) for name, a in args.items()}
    for name, a in args.items():
        if not isinstance(arrays[name], chainer.get_array_types()):
            raise InvalidTargetsError(
                f"{name} is a {type(a).__name__} ({reprlib.repr(a)}); expected "
                f"{_ARRAY_FORMS[name]} on the model's device: convert it with model.xp.asarray "
                "or batch the targets with chainer.dataset.concat_examples.",
                argument=name, value=a, allowed=_ARRAY_FORMS[name])
    devices = {name: backend.get_device_from_array(a) for name, a in arrays.items()}
    for name, device in devices.items():
        if device != devices["mb_confs"]:
            raise InvalidTargetsError(
                f"{name} is on {device} but mb_confs is on {devices['mb_confs']}: move the "
                "targets with chainer.dataset.to_device(device, ...).",
                argument=name, value=str(device), allowed=f"arrays on {devices['mb_confs']}")
    _check_k(k)
    return arrays


def _check_k(k):
    if not (is_real(k) and 0 <= k < math.inf):
        raise InvalidTargetsError(
            f"k = {k!r} is not a valid hard-negative ratio; expected a finite int or float >= 0 "
            "(SSD uses k = 3).", argument="k", value=k, allowed="a finite number >= 0")


#: The label dtypes the loss accepts, in words (every integer dtype but uint64).
_LABEL_DTYPES = "int8, int16, int32, int64, uint8, uint16 or uint32"


def _check_shapes(args):
    """Shapes and dtypes of the four arrays (by name): metadata only."""
    got = "expected mb_locs (B, K, 4), mb_confs (B, K, n_class), gt_mb_locs (B, K, 4), " \
        "gt_mb_labels (B, K); got " + ", ".join(f"{n} {tuple(a.shape)}" for n, a in args.items())
    for name, a in args.items():
        if a.ndim != (2 if name == "gt_mb_labels" else 3):
            raise InvalidTargetsError(f"{name} has {a.ndim} dimensions: {got}.", argument=name)
    # blame the argument whose (B, K) disagrees with the others'
    batch_prior = Counter(tuple(a.shape[:2]) for a in args.values()).most_common(1)[0][0]
    for name, a in args.items():
        if tuple(a.shape[:2]) != batch_prior:
            raise InvalidTargetsError(
                f"{name}'s (B, K) is not the others' {batch_prior}: {got}. Another K: the "
                "model's default boxes are not the MultiboxCoder's.", argument=name)
    for name in ("mb_locs", "gt_mb_locs", "mb_confs"):
        n = args[name].shape[2]
        if n < 1 or n != 4 and name != "mb_confs":
            raise InvalidTargetsError(f"{name} has {n} values per prior: {got}.", argument=name)
    for name in ("mb_locs", "mb_confs", "gt_mb_locs"):
        if args[name].dtype.kind != "f":
            raise InvalidTargetsError(
                f"{name} must be floating point, got {args[name].dtype}.", argument=name)
    locs, labels = args["mb_locs"].dtype, args["gt_mb_labels"].dtype
    if args["gt_mb_locs"].dtype != locs:
        raise InvalidTargetsError(f"gt_mb_locs is {args['gt_mb_locs'].dtype} but mb_locs is "
                                  f"{locs}: convert it with .astype({locs.name}).",
                                  argument="gt_mb_locs")
    if labels.kind not in "iu":
        raise InvalidTargetsError(
            f"gt_mb_labels must be integer class indices, got {labels}: convert with "
            ".astype(numpy.int32).", argument="gt_mb_labels", allowed="an integer dtype")
    # labels index the flattened scores: they must stay integers next to intp (uint64 does not)
    if np.promote_types(np.intp, labels).kind not in "iu":
        raise InvalidTargetsError(
            f"gt_mb_labels is {labels}, which is no index next to {np.dtype(np.intp)}; allowed: "
            f"{_LABEL_DTYPES}. Convert with .astype(numpy.int32).",
            argument="gt_mb_labels", allowed=_LABEL_DTYPES)


def check_values(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, positive):
    """Raise for the first of a label outside ``[0, n_class)``, a non-finite location at a positive
    prior, nan/inf predictions; one transfer to the host (notebook 02, section 8)."""
    xp = backend.get_array_module(gt_mb_labels)
    n_class = mb_confs.shape[2]
    empty = gt_mb_labels.size == 0
    flags = [
        0 if empty else gt_mb_labels.min(),
        0 if empty else gt_mb_labels.max(),
        xp.isfinite(mb_locs).all(),
        xp.isfinite(mb_confs).all(),
        # ground truth matters only at positive priors
        xp.logical_and(~xp.isfinite(gt_mb_locs).all(axis=-1), positive).any(),
    ]
    # one transfer: on a GPU, one synchronisation
    flags = to_host(xp.stack([xp.asarray(f, dtype=np.int64) for f in flags]))
    lo, hi, locs_finite, confs_finite, gt_bad = (int(f) for f in flags)
    if lo < 0 or hi >= n_class:
        raise bad_label_error(gt_mb_labels, n_class, lo, hi)
    if gt_bad:
        raise bad_location_error(gt_mb_locs, gt_mb_labels, positive)
    if not (locs_finite and confs_finite):
        raise diverged_error(mb_locs, mb_confs)


def _first(mask):
    """(count, batch index, prior index) of the True entries of a (B, K) mask."""
    b, i = divmod(int(mask.ravel().argmax()), mask.shape[1])
    return int(mask.sum()), b, i


def bad_label_error(labels, n_class, lo, hi) -> InvalidTargetsError:
    """The error for the first label outside ``[0, n_class)`` (labels span lo..hi)."""
    count, b, i = _first((labels < 0) | (labels >= n_class))
    value = int(labels[b, i])
    cause = ("a negative label: this loss has no ignore label; drop the boxes -1 marks before "
             "encoding" if value < 0 else
             "labels made 1-based: MultiboxCoder.encode adds the +1 for the background itself, "
             "so remove yours (or n_fg_class is one too small)" if value == n_class else
             "the data has more classes than the model (compare label_names with n_fg_class)")
    allowed = f"[0, {n_class})"
    return InvalidTargetsError(
        f"gt_mb_labels[{b}, {i}] = {value} (batch index {b}, prior index {i}) is outside the "
        f"allowed range {allowed} (mb_confs has n_class = {n_class}, class 0 is background; "
        f"{count} of {labels.size} labels out of range, span {lo}..{hi}). Likely cause: {cause}.",
        argument="gt_mb_labels", batch_index=b,
        prior_index=i, value=value, count=count, allowed=allowed)


def bad_location_error(gt_mb_locs, labels, positive) -> InvalidTargetsError:
    """The error for the first positive prior whose encoded location is not finite."""
    xp = backend.get_array_module(gt_mb_locs)
    count, b, i = _first(~xp.isfinite(gt_mb_locs).all(axis=-1) & positive)
    value = [float(v) for v in to_host(gt_mb_locs[b, i])]
    return InvalidTargetsError(
        f"gt_mb_locs[{b}, {i}] = {_fmt(value)} (batch index {b}, prior index {i}, label "
        f"{int(labels[b, i])}) is not finite at a positive prior; allowed: finite values where "
        f"the label is > 0 ({count} such priors). Likely cause: a reversed or zero-size box, or "
        "a nan/inf coordinate (the encoding takes the log of its size): check this image's "
        "boxes (y_min, x_min, y_max, x_max) before encoding.", argument="gt_mb_locs",
        batch_index=b, prior_index=i, value=value, count=count,
        allowed="finite values at positive priors")


def diverged_error(mb_locs, mb_confs) -> DivergedError:
    """The error for the first prior whose predictions hold nan/inf."""
    xp = backend.get_array_module(mb_confs)
    bad_locs, bad_confs = (~xp.isfinite(a).all(axis=-1) for a in (mb_locs, mb_confs))
    count, b, i = _first(bad_locs | bad_confs)
    name, array = ("mb_locs", mb_locs) if bool(bad_locs[b, i]) else ("mb_confs", mb_confs)
    value = [float(v) for v in to_host(array[b, i])]
    return DivergedError(
        f"{name}[{b}, {i}] = {_fmt(value)} (batch index {b}, prior index {i}) is not finite; "
        f"allowed: finite values ({count} of {bad_locs.size} priors: "
        f"mb_locs {int(bad_locs.sum())}, mb_confs {int(bad_confs.sum())}). Likely cause: "
        "training diverged (or nan/inf images): lower the learning rate or add a warm-up, and "
        "restart from the last good snapshot.", "predictions",
        argument=name, batch_index=b, prior_index=i, value=value, count=count)


def _fmt(values):
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


class MultiboxTrainChain(chainer.Chain):
    """``model`` plus the multibox loss for ``StandardUpdater`` (notebook 02, section 7, as
    ChainerCV's example): ``forward`` returns ``loc_loss * alpha + conf_loss`` and reports
    ``loss``, ``loss/loc`` and ``loss/conf``; ``n_positive`` as in :func:`multibox_loss`."""

    def __init__(self, model, alpha: float = 1, k: int = 3, comm=None, check: bool = True):
        super().__init__()
        with self.init_scope():
            self.model = model
        self.alpha = alpha
        self.k = k
        self.comm = comm
        self.check = check

    def forward(self, imgs, gt_mb_locs, gt_mb_labels, n_positive=None):
        mb_locs, mb_confs = self.model(imgs)
        loc_loss, conf_loss = multibox_loss(
            mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, self.k, comm=self.comm,
            check=self.check, n_positive=n_positive)
        loss = loc_loss * self.alpha + conf_loss
        chainer.reporter.report(
            {"loss": loss, "loss/loc": loc_loss, "loss/conf": conf_loss}, self)
        return loss

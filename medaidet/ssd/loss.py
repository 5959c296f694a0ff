"""SSD's multibox loss behind a check of its targets (notebook 02, sections 7 and 8).

The loss is ChainerCV's :func:`chainercv.links.model.ssd.multibox_loss` (eq. 2 and 3 of Liu et
al., SSD, ECCV 2016). On a GPU a bad label or box is read unchecked inside its kernels and gives
a wrong loss or a later fault in an unrelated call, so the inputs are checked first, on the
device with one host synchronisation: :class:`~medaidet.errors.InvalidTargetsError` (a
``ValueError``) for shapes that disagree, bad labels and non-finite encoded locations at
positive priors, :class:`~medaidet.errors.DivergedError` (kind ``"predictions"``) for nan/inf
predictions; each names the batch index, prior index, value, allowed range and likely cause.

Conventions (ChainerCV's): ``K`` default boxes per image; locations encoded by ``MultiboxCoder``
as ``(dy, dx, log(h), log(w))`` offsets; class 0 is background, so ``mb_confs`` has
``n_class = n_fg_class + 1`` scores per prior and labels run over ``0 .. n_class - 1``.

Gradient accumulation: only the normaliser (the positive count) couples the images (hard
negatives are ranked per image), so each micro-batch divides by the whole batch's count and
the micro-batch losses add up to the large batch's.
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


# --------------------------------------------------------------------------- the loss

def multibox_loss(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k, comm=None, check=True,
                  n_positive=None):
    """SSD's localisation and confidence losses, with the targets checked first.

    Arguments and results as ChainerCV's ``multibox_loss``: ``mb_locs`` (B, K, 4) and ``mb_confs``
    (B, K, n_class), floating point; ``gt_mb_locs`` (B, K, 4) in ``mb_locs``' dtype;
    ``gt_mb_labels`` (B, K), any integer dtype but uint64; ``k`` hard negatives per positive, a
    finite number >= 0 (SSD: 3). ``check=False`` checks only the argument types and ``k``.
    ``n_positive``: divide by this (the whole batch's positive count, already averaged over the
    workers; ``comm`` is then unused) instead of this call's count. Returns ``(loc_loss,
    conf_loss)``, scalar Variables; two float32 zeros when the count is 0.
    """
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
            f"n_positive = {n_positive!r} is not a valid normaliser: give the number of "
            "positive priors (gt_mb_labels > 0) of the whole batch as a number >= 0 or a 0-d "
            "array (with a comm: already averaged over workers), or None to use this call's "
            "own count.", argument="n_positive", value=n_positive,
            allowed="a finite number >= 0")
    return value


def hard_negative(x, positive, k):
    """SSD's hard negatives, as ChainerCV's loss chooses them (notebook 02, section 7).

    ``x``: per-prior confidence loss (B, K); ``positive``: bool (B, K). Returns bool (B, K): the
    negatives whose loss is among the ``k * n_positive`` largest of their image (a negative whose
    loss is exactly 0 ties with the positives).
    """
    _check_k(k)
    return chainercv_hard_negative(_as_array(x), positive, k) & ~positive


# --------------------------------------------------------------------------- checks

_CAUSE_LABEL_IS_N_CLASS = (
    "a label equal to n_class: the background class was forgotten. Class 0 is background, "
    "so foreground labels run 1..n_class-1 after MultiboxCoder.encode adds its +1 offset; "
    "either the dataset's labels were already 1-based before encoding (remove your own +1) "
    "or the model was built with n_fg_class one too small (n_fg_class counts foreground "
    "classes only, the background score is added by the model).")
_CAUSE_LABEL_TOO_LARGE = (
    "a label larger than n_class: the data has more classes than the model (compare the "
    "dataset's label_names with n_fg_class) or the labels are not 0-based class indices.")
_CAUSE_LABEL_NEGATIVE = (
    "a negative label: labels are class indices >= 0 (0 = background) and this loss has no "
    "ignore label; if -1 marks 'ignore' or 'difficult' objects in your data, drop those boxes "
    "before encoding.")


def _as_array(a):
    return a.array if isinstance(a, chainer.Variable) else a


def to_host(a):
    """The one place this module moves check results to the host."""
    return cuda.to_cpu(a)


_ARRAY_FORMS = {
    "mb_locs": "a chainer.Variable or array of shape (B, K, 4), floating point",
    "mb_confs": "a chainer.Variable or array of shape (B, K, n_class), floating point",
    "gt_mb_locs": "an array of shape (B, K, 4), the dtype of mb_locs",
    "gt_mb_labels": "an integer array of shape (B, K)",
}


def _check_arguments(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k) -> dict:
    """Types, devices and ``k``: host metadata, checked even with ``check=False``. Returns the
    four arrays by name (Variables' data)."""
    args = {"mb_locs": mb_locs, "mb_confs": mb_confs,
            "gt_mb_locs": gt_mb_locs, "gt_mb_labels": gt_mb_labels}
    arrays = {name: _as_array(a) for name, a in args.items()}
    for name, a in args.items():
        if not isinstance(arrays[name], chainer.get_array_types()):
            raise InvalidTargetsError(
                f"{name} is a {type(a).__name__} ({reprlib.repr(a)}); expected "
                f"{_ARRAY_FORMS[name]}, on the device of the model's outputs. Convert it with "
                "xp.asarray(...) (xp = model.xp; numpy on the CPU) or batch the encoded "
                "targets with chainer.dataset.concat_examples, as the training chain does.",
                argument=name, value=a, allowed=_ARRAY_FORMS[name])
    devices = {name: backend.get_device_from_array(a) for name, a in arrays.items()}
    for name, device in devices.items():
        if device != devices["mb_confs"]:
            raise InvalidTargetsError(
                f"{name} is on {device} but mb_confs is on {devices['mb_confs']}: all four "
                "arrays must be on one device; move the targets with "
                "chainer.dataset.to_device(device, ...) or model.xp.asarray(...).",
                argument=name, value=str(device), allowed=f"arrays on {devices['mb_confs']}")
    _check_k(k)
    return arrays


def _check_k(k):
    """``k`` is a real number (not a bool or a string), finite and >= 0."""
    if not (is_real(k) and 0 <= k < math.inf):
        raise InvalidTargetsError(
            f"k = {k!r} is not a valid hard-negative ratio; expected a finite number >= 0 "
            "(an int or a float, not a string or a bool): at most k * n_positive negatives "
            "per image enter the confidence loss; SSD uses k = 3.",
            argument="k", value=k, allowed="a finite number >= 0")


def _check_shapes(args):
    """Shapes and dtypes of the four arrays (by name): metadata only, nothing runs on the
    device."""
    expected = ("expected mb_locs (B, K, 4), mb_confs (B, K, n_class), gt_mb_locs (B, K, 4) "
                "and gt_mb_labels (B, K) with the same B and K")
    shapes = ", ".join(f"{name} {tuple(a.shape)}" for name, a in args.items())
    for name, a in args.items():
        if a.ndim != (2 if name == "gt_mb_labels" else 3):
            raise InvalidTargetsError(
                f"{name} has {a.ndim} dimensions, {expected}; got {shapes}.", argument=name)
    # blame the argument whose (B, K) disagrees with the others'
    batch_prior = Counter(tuple(a.shape[:2]) for a in args.values()).most_common(1)[0][0]
    for name, a in args.items():
        if tuple(a.shape[:2]) != batch_prior:
            raise InvalidTargetsError(
                f"{name} has shape {tuple(a.shape)} but the other arguments have (B, K) = "
                f"{batch_prior}: {expected}; got {shapes}. A different K means the model's "
                "default boxes and the MultiboxCoder's are not the same (other model size "
                "or coder).", argument=name)
    for name in ("mb_locs", "gt_mb_locs"):
        if args[name].shape[2] != 4:
            raise InvalidTargetsError(
                f"{name} has {args[name].shape[2]} values per prior, {expected}; got {shapes}.",
                argument=name)
    if args["mb_confs"].shape[2] < 1:
        raise InvalidTargetsError(f"mb_confs has no class scores; got {shapes}.",
                                  argument="mb_confs")
    for name in ("mb_locs", "mb_confs", "gt_mb_locs"):
        if args[name].dtype.kind != "f":
            raise InvalidTargetsError(
                f"{name} must be floating point, got {args[name].dtype}.", argument=name)
    locs, labels = args["mb_locs"].dtype, args["gt_mb_labels"].dtype
    if args["gt_mb_locs"].dtype != locs:
        raise InvalidTargetsError(
            f"gt_mb_locs is {args['gt_mb_locs'].dtype} but mb_locs is {locs}: convert the "
            f"encoded targets with .astype({locs.name}).", argument="gt_mb_locs")
    if labels.kind not in "iu":
        raise InvalidTargetsError(
            f"gt_mb_labels must be integers (class indices), got {labels}: convert with "
            ".astype(numpy.int32) after checking that the values are whole numbers.",
            argument="gt_mb_labels", allowed="an integer dtype")
    # labels index the flattened scores: they must stay integers next to intp (uint64 does not)
    if np.promote_types(np.intp, labels).kind not in "iu":
        raise InvalidTargetsError(
            f"gt_mb_labels is {labels}, which the loss cannot use as class indices: combined "
            f"with the {np.dtype(np.intp)} index arithmetic it becomes "
            f"{np.promote_types(np.intp, labels)}. Allowed: {_LABEL_DTYPES}. "
            "Convert with .astype(numpy.int32) (MultiboxCoder.encode gives int32).",
            argument="gt_mb_labels", allowed=_LABEL_DTYPES)


#: The label dtypes the loss accepts, in words (every integer dtype but uint64).
_LABEL_DTYPES = "int8, int16, int32, int64, uint8, uint16 or uint32"


def check_values(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, positive):
    """The values in front of the loss, checked on the device with one transfer to the host:
    written in notebook 02, section 8. Raises on the first of: a label outside ``[0, n_class)``,
    a non-finite location at a positive prior, nan/inf predictions."""
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
    cause = (_CAUSE_LABEL_NEGATIVE if value < 0 else
             _CAUSE_LABEL_IS_N_CLASS if value == n_class else _CAUSE_LABEL_TOO_LARGE)
    allowed = f"[0, {n_class})"
    return InvalidTargetsError(
        f"gt_mb_labels[{b}, {i}] = {value} (batch index {b}, prior index {i}) is outside the "
        f"allowed range {allowed}: mb_confs has n_class = {n_class} scores per prior and "
        f"class 0 is background. {count} of {labels.size} labels are out of range (labels "
        f"span {lo}..{hi}); the first is shown. Likely cause: {cause}",
        argument="gt_mb_labels", batch_index=b, prior_index=i, value=value, count=count,
        allowed=allowed)


def bad_location_error(gt_mb_locs, labels, positive) -> InvalidTargetsError:
    """The error for the first positive prior whose encoded location is not finite."""
    xp = backend.get_array_module(gt_mb_locs)
    count, b, i = _first(~xp.isfinite(gt_mb_locs).all(axis=-1) & positive)
    value = [float(v) for v in to_host(gt_mb_locs[b, i])]
    return InvalidTargetsError(
        f"gt_mb_locs[{b}, {i}] = {_fmt(value)} (batch index {b}, prior index {i}, label "
        f"{int(labels[b, i])}) is not finite at a positive prior; allowed: finite values "
        f"wherever the label is > 0. {count} positive priors have non-finite encoded "
        "locations; the first is shown. Likely cause: a reversed (y_max < y_min or x_max < "
        "x_min) or zero-size ground-truth box, or a nan/inf coordinate: MultiboxCoder.encode "
        "takes the log of the box's height and width over the default box's, and the log of a "
        "non-positive size is nan or -inf. Check the boxes (y_min, x_min, y_max, x_max) of "
        "this image before encoding (medaidet's loader drops such boxes and the training "
        "transform re-checks them after augmentation).",
        argument="gt_mb_locs", batch_index=b, prior_index=i, value=value, count=count,
        allowed="finite values at positive priors")


def diverged_error(mb_locs, mb_confs) -> DivergedError:
    """The error for the first prior whose predictions hold nan/inf."""
    xp = backend.get_array_module(mb_confs)
    bad_locs = ~xp.isfinite(mb_locs).all(axis=-1)
    bad_confs = ~xp.isfinite(mb_confs).all(axis=-1)
    count, b, i = _first(bad_locs | bad_confs)
    name, array = ("mb_locs", mb_locs) if bool(bad_locs[b, i]) else ("mb_confs", mb_confs)
    value = [float(v) for v in to_host(array[b, i])]
    return DivergedError(
        f"{name}[{b}, {i}] = {_fmt(value)} (batch index {b}, prior index {i}) is not finite; "
        f"allowed: finite predictions. {count} of {bad_locs.size} priors have nan/inf "
        f"predictions (mb_locs: {int(bad_locs.sum())}, mb_confs: {int(bad_confs.sum())}); the "
        "first is shown. Likely cause: training diverged (or the input images hold nan/inf): "
        "lower the learning rate (or add a warm-up / gradient clipping), check the images and "
        "targets of the last batches, and restart from the last good snapshot.", "predictions",
        argument=name, batch_index=b, prior_index=i, value=value, count=count)


def _fmt(values):
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


class MultiboxTrainChain(chainer.Chain):
    """``model`` plus the multibox loss, for ``chainer.training.StandardUpdater``: written
    in notebook 02, section 7 (ChainerCV's ``examples/ssd/train.py`` chain).

    ``forward(imgs, gt_mb_locs, gt_mb_labels, n_positive=None)`` takes a batch of
    :class:`~medaidet.ssd.transforms.TrainTransform` outputs and returns ``loc_loss * alpha +
    conf_loss``, reporting ``loss``, ``loss/loc`` and ``loss/conf`` (``main/`` under a Trainer);
    ``n_positive`` as in :func:`multibox_loss` (the reported values are then this micro-batch's
    share).
    """

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

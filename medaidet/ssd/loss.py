"""SSD's multibox loss that names bad targets instead of crashing the GPU.

A drop-in for :func:`chainercv.links.model.ssd.multibox_loss` (same
arguments, same ``(loc_loss, conf_loss)``, the same numbers on valid inputs).

Why it exists: on the GPU an out-of-range label or a broken box
faults asynchronously inside the loss, and the fault is reported later by the
sort of hard-negative mining (``merge_sort: failed to synchronize``), leaving a
dead CUDA context and no idea which sample was wrong. This loss checks the
inputs first, on the device and with one host synchronisation, and raises

* :class:`InvalidTargetsError` (a ``ValueError``) for shapes that disagree,
  non-integer or out-of-range labels and non-finite encoded locations at
  positive priors, naming the batch index, prior index, value, allowed range
  and likely cause;
* :class:`DivergedError` (a ``FloatingPointError``) for nan/inf predictions.

Conventions (as in ChainerCV): ``K`` default boxes per image, locations
encoded by :class:`chainercv.links.model.ssd.MultiboxCoder` as
``(dy, dx, log(h), log(w))`` offsets, class 0 is background, so
``mb_confs`` has ``n_class = n_fg_class + 1`` scores per prior and labels run
over ``0 .. n_class - 1``.
"""
import math
from collections import Counter

import numpy as np

import chainer
import chainer.functions as F
from chainer import backend, utils
from chainer.backends import cuda
from chainer.functions.activation import log_softmax as _chainer_log_softmax

from medaidet.errors import MedaidetError

__all__ = ["InvalidTargetsError", "DivergedError", "multibox_loss", "hard_negative"]


# --------------------------------------------------------------------------- errors

class _Located:
    """Where the loss found the problem. Attributes (``None`` where they do not
    apply): ``argument`` (the argument at fault), ``batch_index``, ``prior_index``,
    ``value`` (of the first bad entry), ``count`` (of bad entries) and ``allowed``
    (the allowed range, in words)."""

    default_allowed = None

    def __init__(self, message, argument=None, batch_index=None, prior_index=None,
                 value=None, count=None, allowed=None):
        super().__init__(message)
        self.argument = argument
        self.batch_index = batch_index
        self.prior_index = prior_index
        self.value = value
        self.count = count
        self.allowed = self.default_allowed if allowed is None else allowed


class InvalidTargetsError(_Located, MedaidetError, ValueError):
    """The loss's inputs disagree in shape/dtype or the targets hold invalid values.

    Attributes: see :class:`_Located`.
    """


class DivergedError(_Located, MedaidetError, FloatingPointError):
    """The predictions (``mb_locs`` or ``mb_confs``) hold nan or inf: training diverged.

    A ``FloatingPointError``, not a ``ValueError``: nothing is wrong with what
    the caller passed in the sense of types or data, the model's arithmetic blew
    up. Keeping it out of the ``ValueError`` family means an ``except
    ValueError`` written for bad annotations never swallows a diverged run, and
    it sits beside NumPy's own ``FloatingPointError`` (``errstate(all='raise')``).
    Attributes: see :class:`_Located`.
    """

    default_allowed = "finite values"


# --------------------------------------------------------------------------- the loss

def multibox_loss(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k, comm=None, check=True,
                  n_positive=None):
    """SSD's localisation and confidence losses, with the targets checked first.

    Same arguments and results as ChainerCV's ``multibox_loss`` (eq. 2 and 3 of
    Liu et al., SSD, ECCV 2016), plus ``check`` and ``n_positive``.

    Args:
        mb_locs (chainer.Variable or array): predicted location offsets,
            shape ``(B, K, 4)``, floating point.
        mb_confs (chainer.Variable or array): predicted class scores (logits),
            shape ``(B, K, n_class)``; class 0 is background.
        gt_mb_locs (array): encoded ground-truth locations, shape ``(B, K, 4)``,
            the dtype of ``mb_locs``. Only priors with a label > 0 are used.
        gt_mb_labels (array): integer labels, shape ``(B, K)``, each in
            ``[0, n_class)`` (0 = background, foreground classes shifted by +1);
            any signed or unsigned integer dtype but uint64.
        k (int or float): hard-negative ratio, a finite number >= 0: at most
            ``k * n_positive`` negatives per image enter the confidence loss (3 in
            the paper; 0: positives only). As in ChainerCV it may be fractional.
        comm (chainermn communicator): if given, the positive count is averaged
            over workers with ``comm.allreduce_obj`` as ChainerCV does.
        check (bool): validate shapes, dtypes and values first (default). With
            ``False`` only the argument types and ``k`` are checked (on the host,
            no device work); invalid targets then give undefined results or, on
            the GPU, an asynchronous CUDA fault.
        n_positive (number or 0-d array, optional): the normaliser to divide
            both losses by instead of this call's own positive count. For
            gradient accumulation (:class:`medaidet.training.accumulation.AccumulatingUpdater`):
            a batch split into micro-batches must divide every micro-batch's loss
            by the positives of the *whole* batch, so that the micro-batch losses
            (and gradients) add up to the large batch's. Give it as the loss
            itself would compute it: the batch's ``(gt_mb_labels > 0).sum()``,
            and with a ``comm`` already averaged over workers
            (``comm.allreduce_obj(count) / comm.size``); ``comm`` is then not
            used by this call (one allreduce per batch, not per micro-batch).
            A NumPy/Python scalar divides as ChainerCV does on the CPU, a 0-d
            device array as it does on the GPU. ``None`` (default): this
            call's own count, exactly as ChainerCV.

    Returns:
        tuple of chainer.Variable: ``(loc_loss, conf_loss)``, each a scalar
        normalised by the number of positive priors (or by ``n_positive``); two
        float32 zeros when that is 0 (as ChainerCV).

    Raises:
        InvalidTargetsError: an argument is not an array (a list, say) or the
            arrays are on different devices, ``k`` is not a finite number >= 0,
            shapes/dtypes disagree or are unusable (uint64 labels), a label is
            outside ``[0, n_class)``, an encoded location is not finite at a
            positive prior, or ``n_positive`` is not a finite number >= 0.
        DivergedError: ``mb_locs`` or ``mb_confs`` holds nan or inf.

    The success path synchronises with the host once (all check flags and the
    positive count travel together); building an error message may transfer
    more, just before raising.

    One deliberate difference from ChainerCV: non-finite encoded locations at
    negative priors are ignored (they are checked only where used). The coder
    fills them whenever an image has a degenerate box; ChainerCV's loss then
    becomes ``inf * 0 = nan``.

    Why only the normaliser is needed for accumulation: everything else in the
    loss is per image. The localisation loss is a sum over positive priors, the
    confidence loss a sum over positives and hard negatives, and hard-negative
    mining (:func:`hard_negative`) ranks each image's negatives by that image's
    own losses and keeps ``k`` times that image's own positives. Splitting the
    batch into micro-batches therefore selects the same priors and gives the
    same unnormalised sums; only the division by the batch-wide positive
    count couples the images.
    """
    _check_arguments(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k)
    mb_locs = chainer.as_variable(mb_locs)
    mb_confs = chainer.as_variable(mb_confs)
    gt_mb_locs = _as_array(gt_mb_locs)
    gt_mb_labels = _as_array(gt_mb_labels)
    normaliser = None if n_positive is None else _as_array(n_positive)
    host_normaliser = None if normaliser is None else _host_normaliser(normaliser)
    if check:
        _check_shapes(mb_locs.array, mb_confs.array, gt_mb_locs, gt_mb_labels)

    xp = backend.get_array_module(gt_mb_labels)
    with cuda.get_device_from_array(gt_mb_labels):
        positive = gt_mb_labels > 0
        # Kept on the device, as in ChainerCV: the divisions below then round
        # exactly as ChainerCV's do (a NumPy scalar on the CPU, a 0-d array on the GPU).
        n_positive = positive.sum()
        if check:
            host_n_positive = _check_values(
                mb_locs.array, mb_confs.array, gt_mb_locs, gt_mb_labels, positive, n_positive)
        elif normaliser is None:
            host_n_positive = int(_to_host(n_positive))

        if normaliser is not None:
            n_positive, host_n_positive = normaliser, host_normaliser
        elif comm:
            n_positive = comm.allreduce_obj(n_positive) / comm.size
            host_n_positive = n_positive
        if host_n_positive == 0:
            z = chainer.Variable(xp.zeros((), dtype=np.float32))
            return z, z

        loc_loss = _PositiveHuberLoss(positive).apply((mb_locs, gt_mb_locs))[0]
        loc_loss = loc_loss / n_positive

        conf_loss = _SoftmaxCrossEntropy().apply((mb_confs, gt_mb_labels))[0]
        hard = hard_negative(conf_loss.array, positive, k)
        conf_loss *= xp.logical_or(positive, hard).astype(conf_loss.dtype)
        conf_loss = F.sum(conf_loss) / n_positive

    return loc_loss, conf_loss


def _host_normaliser(n_positive):
    """The caller's normaliser as a host number, checked: a count, or an average of counts
    over workers, so a real number >= 0 (a scalar or a 0-d array)."""
    value = None
    if isinstance(n_positive, (int, float, np.integer, np.floating)) \
            and not isinstance(n_positive, (bool, np.bool_)):
        value = float(n_positive)
    elif getattr(n_positive, "shape", None) == () and \
            getattr(n_positive, "dtype", np.dtype(object)).kind in "iuf":
        value = float(_to_host(n_positive))
    if value is None or not np.isfinite(value) or value < 0:
        raise InvalidTargetsError(
            f"n_positive = {n_positive!r} is not a valid normaliser: give the number of "
            "positive priors (gt_mb_labels > 0) of the whole batch as a number >= 0 or a 0-d "
            "array (with a comm: already averaged over workers), or None to use this call's "
            "own count.", argument="n_positive", value=n_positive,
            allowed="a finite number >= 0")
    return value


def hard_negative(x, positive, k):
    """Hard-negative mask of SSD's confidence loss, with a single sort.

    Args:
        x (array): per-prior confidence loss, shape ``(B, K)``.
        positive (array of bool): positive priors, shape ``(B, K)``.
        k (int or float): at most ``k * n_positive`` negatives are kept per image; a
            finite number >= 0, else :class:`InvalidTargetsError`.

    Returns:
        array of bool, shape ``(B, K)``: the negatives (never a positive) whose
        loss is among the ``k * n_positive`` largest of their image, at most
        ``min(k * n_positive, n_negative)`` per image.

    Exactly ChainerCV's choice: ChainerCV ranks the key
    ``x * (positive - 1)`` (minus the loss for negatives, 0 for positives) with
    ``argsort().argsort()`` and keeps ranks ``< k * n_positive``. The second
    argsort only inverts the permutation of the first, so we sort once and
    scatter the ranks (``rank[b, order[b, j]] = j``).

    Ties: NumPy's default argsort is not stable (introsort, or a SIMD sort on
    AVX2/AVX-512 builds), so among equal losses its order depends on the data
    and on the build. A stable sort would therefore choose different tied
    negatives than ChainerCV; to choose the same ones we sort the same key
    (same values, same float64 dtype) with the same default sort. On CuPy both
    use CuPy's argsort, which is stable. The same applies to negatives whose
    loss is exactly 0 (a very confident background): their key ties with the
    positives' 0, and which of them fall below ``k * n_positive`` follows that
    same sort order, as in ChainerCV (they add nothing to the loss). Positives
    are removed from the mask explicitly, which bounds it by ``n_negative``;
    the cut itself is not clamped to ``n_negative``, because inside that tie
    group a clamped cut would keep other negatives than ChainerCV does.
    """
    _check_k(k)
    x = _as_array(x)
    xp = backend.get_array_module(x)
    n_batch, n_prior = x.shape
    key = x * (positive - 1)          # ChainerCV's key, bit for bit (float64)
    order = key.argsort(axis=1)       # ChainerCV's first sort, the same kind
    rank = xp.empty_like(order)
    rank[xp.arange(n_batch)[:, None], order] = xp.arange(n_prior)[None, :]
    n_keep = positive.sum(axis=1) * k
    return (rank < n_keep[:, None]) & ~positive


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
_CAUSE_GT_LOC = (
    "a reversed (y_max < y_min or x_max < x_min) or zero-size ground-truth box, or a nan/inf "
    "coordinate: MultiboxCoder.encode takes the log of the box's height and width over the "
    "default box's, and the log of a non-positive size is nan or -inf. Check the boxes "
    "(y_min, x_min, y_max, x_max) of this image before encoding (medaidet's loader drops "
    "such boxes and the training transform re-checks them after augmentation).")
_CAUSE_DIVERGED = (
    "training diverged (or the input images hold nan/inf): lower the learning rate (or add a "
    "warm-up / gradient clipping), check the images and targets of the last batches, and "
    "restart from the last good snapshot.")


def _as_array(a):
    return a.array if isinstance(a, chainer.Variable) else a


def _to_host(a):
    """The one place this module moves check results to the host."""
    return cuda.to_cpu(a)


#: Each array argument's expected form, in words.
_ARRAY_FORMS = {
    "mb_locs": "a chainer.Variable or array of shape (B, K, 4), floating point",
    "mb_confs": "a chainer.Variable or array of shape (B, K, n_class), floating point",
    "gt_mb_locs": "an array of shape (B, K, 4), the dtype of mb_locs",
    "gt_mb_labels": "an integer array of shape (B, K)",
}


def _check_arguments(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, k):
    """Types, devices and ``k``: host-side metadata only, checked even with ``check=False``
    (a list or a string would otherwise fail deep inside with a bare TypeError)."""
    args = {"mb_locs": mb_locs, "mb_confs": mb_confs,
            "gt_mb_locs": gt_mb_locs, "gt_mb_labels": gt_mb_labels}
    array_types = chainer.get_array_types()
    for name, a in args.items():
        array = _as_array(a)
        if not isinstance(array, array_types):
            raise InvalidTargetsError(
                f"{name} is a {type(a).__name__} ({_short_repr(a)}); expected "
                f"{_ARRAY_FORMS[name]}, on the device of the model's outputs. Convert it with "
                "xp.asarray(...) (xp = model.xp; numpy on the CPU) or batch the encoded "
                "targets with chainer.dataset.concat_examples, as the training chain does.",
                argument=name, value=a, allowed=_ARRAY_FORMS[name])
    devices = {name: backend.get_device_from_array(_as_array(a)) for name, a in args.items()}
    for name, device in devices.items():
        if device != devices["mb_confs"]:
            raise InvalidTargetsError(
                f"{name} is on {device} but mb_confs is on {devices['mb_confs']}: all four "
                "arrays must be on one device; move the targets with "
                "chainer.dataset.to_device(device, ...) or model.xp.asarray(...).",
                argument=name, value=str(device), allowed=f"arrays on {devices['mb_confs']}")
    _check_k(k)


def _check_k(k):
    """``k`` is a real number (not a bool or a string), finite and >= 0."""
    number = isinstance(k, (int, float, np.integer, np.floating)) \
        and not isinstance(k, (bool, np.bool_))
    if not number or (isinstance(k, (float, np.floating)) and not math.isfinite(k)) or k < 0:
        raise InvalidTargetsError(
            f"k = {k!r} is not a valid hard-negative ratio; expected a finite number >= 0 "
            "(an int or a float, not a string or a bool): at most k * n_positive negatives "
            "per image enter the confidence loss; SSD uses k = 3.",
            argument="k", value=k, allowed="a finite number >= 0")


def _short_repr(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_shapes(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels):
    """Shapes and dtypes: metadata only, nothing runs on the device."""
    expected = ("expected mb_locs (B, K, 4), mb_confs (B, K, n_class), gt_mb_locs (B, K, 4) "
                "and gt_mb_labels (B, K) with the same B and K")
    args = {"mb_locs": mb_locs, "mb_confs": mb_confs,
            "gt_mb_locs": gt_mb_locs, "gt_mb_labels": gt_mb_labels}
    shapes = ", ".join(f"{name} {tuple(a.shape)}" for name, a in args.items())
    ndim = {"mb_locs": 3, "mb_confs": 3, "gt_mb_locs": 3, "gt_mb_labels": 2}
    for name, a in args.items():
        if a.ndim != ndim[name]:
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
    if mb_confs.shape[2] < 1:
        raise InvalidTargetsError(f"mb_confs has no class scores; got {shapes}.",
                                  argument="mb_confs")
    for name in ("mb_locs", "mb_confs", "gt_mb_locs"):
        if args[name].dtype.kind != "f":
            raise InvalidTargetsError(
                f"{name} must be floating point, got {args[name].dtype}.", argument=name)
    if gt_mb_locs.dtype != mb_locs.dtype:
        raise InvalidTargetsError(
            f"gt_mb_locs is {gt_mb_locs.dtype} but mb_locs is {mb_locs.dtype}: convert the "
            f"encoded targets with .astype({mb_locs.dtype.name}).", argument="gt_mb_locs")
    if gt_mb_labels.dtype.kind not in "iu":
        raise InvalidTargetsError(
            f"gt_mb_labels must be integers (class indices), got {gt_mb_labels.dtype}: "
            "convert with .astype(numpy.int32) after checking that the values are whole "
            "numbers.", argument="gt_mb_labels", allowed="an integer dtype")
    if not _usable_label_dtype(gt_mb_labels.dtype):
        raise InvalidTargetsError(
            f"gt_mb_labels is {gt_mb_labels.dtype}, which the loss cannot use as class "
            f"indices: combined with the {np.dtype(np.intp)} index arithmetic it becomes "
            f"{np.promote_types(np.intp, gt_mb_labels.dtype)}. Allowed: {_LABEL_DTYPES}. "
            "Convert with .astype(numpy.int32) (MultiboxCoder.encode gives int32).",
            argument="gt_mb_labels", allowed=_LABEL_DTYPES)


def _usable_label_dtype(dtype) -> bool:
    """Labels index the flattened scores (``arange(B * K) * n_class + label``): their dtype
    must combine with the platform's index dtype into an integer. uint64 does not (NumPy
    and CuPy promote int64 with uint64 to float64)."""
    return np.dtype(dtype).kind in "iu" and np.promote_types(np.intp, dtype).kind in "iu"


def _in_words(names) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]


#: The label dtypes the loss accepts, in words (every integer dtype but uint64).
_LABEL_DTYPES = _in_words([np.dtype(t).name for t in (np.int8, np.int16, np.int32, np.int64,
                                                      np.uint8, np.uint16, np.uint32,
                                                      np.uint64) if _usable_label_dtype(t)])


def _check_values(mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, positive, n_positive):
    """Every value check, computed on the device and fetched in one transfer.

    Returns the positive count on the host; raises on the first problem found
    (labels, then ground-truth locations, then predictions).
    """
    xp = backend.get_array_module(gt_mb_labels)
    n_class = mb_confs.shape[2]
    empty = gt_mb_labels.size == 0
    flags = [
        n_positive,
        0 if empty else gt_mb_labels.min(),
        0 if empty else gt_mb_labels.max(),
        xp.isfinite(mb_locs).all(),
        xp.isfinite(mb_confs).all(),
        # non-finite ground truth matters only where it is used: positive priors
        xp.logical_and(~_all_last_axis(xp.isfinite(gt_mb_locs)), positive).any(),
    ]
    flags = _to_host(xp.stack([xp.asarray(f, dtype=np.int64) for f in flags]))
    n_pos, lo, hi, locs_finite, confs_finite, gt_bad = (int(f) for f in flags)
    if lo < 0 or hi >= n_class:
        _raise_bad_label(gt_mb_labels, n_class, lo, hi)
    if gt_bad:
        _raise_bad_gt_loc(gt_mb_locs, gt_mb_labels, positive)
    if not (locs_finite and confs_finite):
        _raise_diverged(mb_locs, mb_confs)
    return n_pos


def _first(mask):
    """(count, batch index, prior index) of the True entries of a (B, K) mask."""
    count = int(mask.sum())
    first = int(mask.ravel().argmax())
    b, i = divmod(first, mask.shape[1])
    return count, b, i


def _raise_bad_label(labels, n_class, lo, hi):
    bad = (labels < 0) | (labels >= n_class)
    count, b, i = _first(bad)
    value = int(labels[b, i])
    if value < 0:
        cause = _CAUSE_LABEL_NEGATIVE
    elif value == n_class:
        cause = _CAUSE_LABEL_IS_N_CLASS
    else:
        cause = _CAUSE_LABEL_TOO_LARGE
    allowed = f"[0, {n_class})"
    raise InvalidTargetsError(
        f"gt_mb_labels[{b}, {i}] = {value} (batch index {b}, prior index {i}) is outside the "
        f"allowed range {allowed}: mb_confs has n_class = {n_class} scores per prior and "
        f"class 0 is background. {count} of {labels.size} labels are out of range (labels "
        f"span {lo}..{hi}); the first is shown. Likely cause: {cause}",
        argument="gt_mb_labels", batch_index=b, prior_index=i, value=value, count=count,
        allowed=allowed)


def _raise_bad_gt_loc(gt_mb_locs, labels, positive):
    xp = backend.get_array_module(gt_mb_locs)
    bad = ~_all_last_axis(xp.isfinite(gt_mb_locs)) & positive
    count, b, i = _first(bad)
    value = [float(v) for v in _to_host(gt_mb_locs[b, i])]
    raise InvalidTargetsError(
        f"gt_mb_locs[{b}, {i}] = {_fmt(value)} (batch index {b}, prior index {i}, label "
        f"{int(labels[b, i])}) is not finite at a positive prior; allowed: finite values "
        f"wherever the label is > 0. {count} positive priors have non-finite encoded "
        f"locations; the first is shown. Likely cause: {_CAUSE_GT_LOC}",
        argument="gt_mb_locs", batch_index=b, prior_index=i, value=value, count=count,
        allowed="finite values at positive priors")


def _raise_diverged(mb_locs, mb_confs):
    xp = backend.get_array_module(mb_confs)
    bad_locs = ~_all_last_axis(xp.isfinite(mb_locs))
    bad_confs = ~_all_last_axis(xp.isfinite(mb_confs))
    count, b, i = _first(bad_locs | bad_confs)
    n_locs, n_confs = int(bad_locs.sum()), int(bad_confs.sum())
    name, array = ("mb_locs", mb_locs) if bool(bad_locs[b, i]) else ("mb_confs", mb_confs)
    value = [float(v) for v in _to_host(array[b, i])]
    raise DivergedError(
        f"{name}[{b}, {i}] = {_fmt(value)} (batch index {b}, prior index {i}) is not finite; "
        f"allowed: finite predictions. {count} of {bad_locs.size} priors have nan/inf "
        f"predictions (mb_locs: {n_locs}, mb_confs: {n_confs}); the first is shown. "
        f"Likely cause: {_CAUSE_DIVERGED}",
        argument=name, batch_index=b, prior_index=i, value=value, count=count)


def _fmt(values):
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


# --------------------------------------------------------------------------- kernels

# NumPy reduces a short last axis (4 box values, a few classes) about ten times
# slower than it combines the columns. For fewer than 8 columns NumPy's sum adds
# them one after the other (pairwise summation starts at 8), so adding the
# columns in order gives the same bits; the tests compare against ChainerCV
# bit for bit. CuPy, float16 and wider axes use the array's own reduction,
# exactly what chainer calls.

def _fast_columns(a):
    return (backend.get_array_module(a) is np and 0 < a.shape[-1] < 8
            and a.dtype in (np.float32, np.float64, np.bool_))


def _reduce_columns(ufunc, a):
    if a.shape[-1] == 1:
        return a[..., 0].copy()
    out = ufunc(a[..., 0], a[..., 1])
    for c in range(2, a.shape[-1]):
        ufunc(out, a[..., c], out=out)
    return out


def _sum_last_axis(a):
    return _reduce_columns(np.add, a) if _fast_columns(a) else a.sum(axis=-1)


def _max_last_axis(a):
    return _reduce_columns(np.maximum, a) if _fast_columns(a) else a.max(axis=-1)


def _all_last_axis(a):
    return _reduce_columns(np.logical_and, a) if _fast_columns(a) else a.all(axis=-1)


class _PositiveHuberLoss(chainer.FunctionNode):
    """``F.sum(F.sum(F.huber_loss(x, t, 1, reduce='no'), axis=-1) * positive)``
    in one node: the same operations and bits as ChainerCV's chain, without
    NumPy's slow reduction over the 4 box values.

    One deliberate difference: negatives are dropped with ``where`` instead of
    a multiplication by 0. On finite targets that gives the same bits, but
    MultiboxCoder.encode writes every prior's offsets from its best-matching
    box, so one degenerate box puts nan/-inf at negative priors too; ChainerCV
    then returns ``inf * 0 = nan`` (and nan gradients), this loss ignores them.
    """

    delta = 1.0

    def __init__(self, positive):
        self.positive = positive

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        xp = backend.get_array_module(*inputs)
        x, t = inputs
        dtype = x.dtype
        # chainer.functions.HuberLoss.forward, operation for operation
        linear_part = utils.force_array(x - t, dtype)
        delta = dtype.type(self.delta)
        xp.abs(linear_part, out=linear_part)
        square_part = utils.force_array(xp.square(linear_part), dtype)
        linear_part *= 2 * delta
        linear_part -= delta * delta
        xp.maximum(linear_part, delta * delta, out=linear_part)
        xp.minimum(square_part, linear_part, out=square_part)
        square_part *= 0.5
        per_prior = xp.where(self.positive, _sum_last_axis(square_part), dtype.type(0))
        return xp.asarray(per_prior.sum()),

    def backward(self, indexes, grad_outputs):
        # ChainerCV's gradient chain (Sum, Mul, Sum(axis=-1), HuberLoss) in Variables,
        # so double backprop keeps working.
        x, t = self.get_retained_inputs()
        gy, = grad_outputs
        xp = backend.get_array_module(x)
        positive = self.positive.astype(x.dtype)
        g = F.broadcast_to(gy, positive.shape) * positive
        # 0 * clip(nan) would be nan: the targets of negatives never reach the gradient
        t = xp.where(self.positive[..., None], t.array, x.dtype.type(0))
        clipped = F.clip(x - t, -self.delta, self.delta)
        gx = F.broadcast_to(F.expand_dims(g, -1), clipped.shape) * clipped
        return tuple(gx if i == 0 else -gx for i in indexes)


class _SoftmaxCrossEntropy(chainer.FunctionNode):
    """Per-prior softmax cross-entropy of ``(B, K, n_class)`` logits and
    ``(B, K)`` labels: ``F.softmax_cross_entropy(reduce='no')`` on the
    flattened priors, the same bits, without NumPy's slow short-axis
    reductions on the CPU."""

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, t = inputs
        xp = backend.get_array_module(x)
        n_class = x.shape[-1]
        x2 = x.reshape(-1, n_class)
        self._index = xp.arange(x2.shape[0]) * n_class + t.ravel()
        if _fast_columns(x2):
            # chainer's logsumexp: max, x - max, exp, sum, log, max + log
            log_z = _max_last_axis(x2)
            y = x2 - log_z[:, None]
            xp.exp(y, out=y)
            s = _sum_last_axis(y)
            xp.log(s, out=s)
            log_z += s
            self._log_z, self._log_y = log_z, None
            loss = -(x2.ravel().take(self._index) - log_z)
        else:
            log_y = _chainer_log_softmax._log_softmax(x2)   # what chainer calls, cuDNN included
            self._log_z, self._log_y = None, log_y
            loss = -log_y.ravel().take(self._index)
        return utils.force_array(loss.reshape(t.shape), x.dtype),

    def backward(self, indexes, grad_outputs):
        x, t = self.get_retained_inputs()
        return _SoftmaxCrossEntropyGrad(self).apply((x, grad_outputs[0]))[0], None


class _SoftmaxCrossEntropyGrad(chainer.FunctionNode):
    """``(softmax(x) - onehot(t)) * gy``; like chainer's, no double backprop."""

    def __init__(self, forward_node):
        self.fwd = forward_node

    def forward(self, inputs):
        x, gy = inputs
        xp = backend.get_array_module(x)
        x2 = x.reshape(-1, x.shape[-1])
        log_y = self.fwd._log_y if self.fwd._log_y is not None else x2 - self.fwd._log_z[:, None]
        gx = xp.exp(log_y)
        flat = gx.reshape(-1)
        flat[self.fwd._index] -= 1
        gx *= gy.reshape(-1, 1)
        return gx.reshape(x.shape),

    def backward(self, indexes, grad_outputs):
        raise RuntimeError("medaidet.ssd.loss.multibox_loss does not support double backprop "
                           "through the confidence loss (neither does chainer's "
                           "softmax_cross_entropy by default).")

"""Half precision for SSD: float16 compute on float32 weights, with loss scaling.

``set_precision(model, "mixed16")`` makes a ChainerCV SSD (``SSD300``, ``SSD512``,
:class:`~medaidet.ssd.small.SSDSmall`) compute in float16 while everything that is stored or
summed stays float32:

* every parameter stays a float32 array (the master weights): the optimizer, its hooks,
  weight files, trainer snapshots and ChainerMN see the same model as in float32;
* each convolution casts its input, ``W`` and ``b`` to float16 inside the graph
  (``F.cast``), so its product runs in float16 and its weight gradients come back to the
  float32 parameters cast to float32;
* the L2 normalisation of SSD300's ``conv4_3`` (ChainerCV's ``Normalize``) computes in
  float32 (cast in, cast out): in float16 ``x ** 2`` overflows (65504) once an activation
  passes 256, the norm is inf and ChainerCV's ``Normalize`` outputs zeros without a warning;
* batch normalisation (SSDSmall) is left as it is: chainer's ``BatchNormalization`` takes a
  float16 input with its float32 ``gamma``, ``beta`` and statistics (what chainer's own
  ``mixed16`` mode does) and returns float16;
* the model's outputs, ``mb_locs`` (B, K, 4) and ``mb_confs`` (B, K, n_fg_class + 1), are
  float32, so the coder's float32 targets, the multibox loss (softmax cross-entropy and the
  sums over K priors) and ``MultiboxCoder.decode`` work in float32 unchanged.

It works by giving the model's links float16-computing subclasses in place
(``Convolution2D`` -> :class:`HalfConvolution2D`, ``DilatedConvolution2D`` ->
:class:`HalfDilatedConvolution2D`, ``Normalize`` -> :class:`Float32Normalize`, ``Multibox``
-> :class:`Float32Multibox`); the links' names, parameters and persistent values do not
change. ``set_precision(model, "float32")`` gives them back their classes.

Gradients of float16 activations underflow (below about 6e-8 they are 0), so training in
``mixed16`` scales the loss: :func:`use_loss_scaling` turns on chainer's dynamic loss scaling
(``optimizer.loss_scaling()``): the loss is multiplied by the scale before backward, the
float32 gradients divided by it before the update, and a step whose gradients hold inf or
nan is skipped (the weights are left as they were) and the scale halved
(:func:`skipped_update` says so, for hooks that check the gradients).

Chainer's own ``chainer.global_config.dtype = chainer.mixed16`` is a different thing: it
makes convolution weights float16 (only batch normalisation keeps float32), needs
``optimizer.use_fp32_update()`` for float32 master copies, which weight files and trainer
snapshots do not save, leaves ``Normalize``'s scale float16 (and its output zero above
256), and the model then needs float16 inputs and float16 targets for the loss. It is not
used here.

``precision="tf32"`` leaves the model in float32; on an NVIDIA GPU of compute capability 8.0
or higher :func:`use_tf32` lets cuBLAS multiply float32 matrices on TF32 tensor cores.

On the CPU ``mixed16`` is correct but slow: NumPy has no float16 matrix product (it loops,
accumulating in float32), and SSDSmall's training step takes about 85x as long as in float32.
"""
from __future__ import annotations

import os
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainercv.links.model.ssd import Multibox, Normalize

from medaidet.ssd import PRECISIONS
from medaidet.ssd.weights import materialize

__all__ = ["PRECISIONS", "set_precision", "precision_of", "use_loss_scaling",
           "skipped_update", "use_tf32", "HalfConvolution2D", "HalfDilatedConvolution2D",
           "Float32Normalize", "Float32Multibox"]



def _cast(x, dtype):
    """``x`` (a Variable, an array or None) as ``dtype``, in the graph."""
    return None if x is None else F.cast(x, dtype)


class HalfConvolution2D(L.Convolution2D):
    """``Convolution2D`` computing in float16: x, W and b cast to float16; y float16."""

    def forward(self, x):
        return F.convolution_2d(
            _cast(x, np.float16), _cast(self.W, np.float16), _cast(self.b, np.float16),
            self.stride, self.pad, dilate=self.dilate, groups=self.groups,
            cudnn_fast=self.cudnn_fast)


class HalfDilatedConvolution2D(L.DilatedConvolution2D):
    """``DilatedConvolution2D`` computing in float16: x, W and b cast; y float16."""

    def forward(self, x):
        return F.dilated_convolution_2d(
            _cast(x, np.float16), _cast(self.W, np.float16), _cast(self.b, np.float16),
            self.stride, self.pad, self.dilate)


class Float32Normalize(Normalize):
    """ChainerCV's ``Normalize`` (L2 norm over channels, times a learnt per-channel scale)
    computed in float32 whatever the input's dtype: x (B, C, H, W) is cast to float32, and
    the result back to x's dtype. Same parameter (``scale``, (C,)) and values as
    ``Normalize``; in float32 the same arithmetic."""

    def forward(self, x):
        x = chainer.as_variable(x)
        h = F.normalize(F.cast(x, np.float32), eps=self.eps, axis=1)
        scale = F.cast(self.scale, np.float32)
        h = h * F.broadcast_to(scale[:, None, None], h.shape)
        return F.cast(h, x.dtype)


class Float32Multibox(Multibox):
    """ChainerCV's ``Multibox`` heads with float32 outputs: ``(mb_locs, mb_confs)``,
    (B, K, 4) and (B, K, n_class), cast to float32 (the heads themselves compute in their
    convolutions' precision)."""

    def forward(self, xs):
        mb_locs, mb_confs = super().forward(xs)
        return F.cast(mb_locs, np.float32), F.cast(mb_confs, np.float32)


#: ChainerCV / chainer class -> its class in mixed16, and back.
_MIXED16 = {L.Convolution2D: HalfConvolution2D,
            L.DilatedConvolution2D: HalfDilatedConvolution2D,
            Normalize: Float32Normalize,
            Multibox: Float32Multibox}
_FLOAT32 = {half: plain for plain, half in _MIXED16.items()}
#: Links with parameters that need no change: float16 inputs, float32 parameters.
_AS_THEY_ARE = (L.BatchNormalization,)


def set_precision(model, precision: str):
    """Make ``model`` (a ChainerCV SSD, in place) compute in ``precision``; returns it.

    Args:
        model: ``SSD300``/``SSD512``/``SSDSmall``, or any chain of ``Convolution2D``,
            ``DilatedConvolution2D``, ``BatchNormalization``, ``Normalize`` and
            ``Multibox`` links. Its parameters must be float32 (chainer's default dtype).
            Lazily shaped parameters are shaped first (:func:`materialize`: one forward
            pass of a blank image, drawing the random initial values).
        precision: ``"mixed16"``: the convolutions compute in float16 and the model
            returns float32 outputs (module docstring); ``"float32"`` and ``"tf32"``: the
            links' own classes again (TF32 is a switch of CuPy's, :func:`use_tf32`).

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`, or a parameter is not
            float32.
        TypeError: (mixed16) a link with parameters of a class this module does not know
            how to run in float16.

    The model may be on any device, before or after ``to_device``; the precision stays with
    the links (copies included) until set again.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    _check_float32(model)
    _check_float32(materialize(model))
    table = _MIXED16 if precision == "mixed16" else _FLOAT32
    for name, link in model.namedlinks():
        cls = type(link)
        if cls in table:
            link.__class__ = table[cls]
        elif (precision == "mixed16" and cls not in _FLOAT32 and cls not in _MIXED16
              and not isinstance(link, _AS_THEY_ARE) and link._params):   # its own
            raise TypeError(f"link {name or '/'} is a {cls.__module__}.{cls.__qualname__} with "
                            "parameters: set_precision does not know how to run it in "
                            "float16 (it knows Convolution2D, DilatedConvolution2D, "
                            "BatchNormalization, Normalize and Multibox)")
    return model


def _check_float32(model):
    """Raise ValueError for a parameter with an array that is not float32."""
    for name, param in model.namedparams():
        if param.array is not None and param.dtype != np.float32:
            raise ValueError(f"parameter {name} is {param.dtype}: set_precision keeps the "
                             "weights float32; build the model with chainer's default "
                             "dtype (float32), not under chainer.mixed16 or float16")


def precision_of(model) -> str:
    """``"mixed16"`` when :func:`set_precision` made ``model`` compute in float16, else
    ``"float32"``."""
    return "mixed16" if any(type(link) in _FLOAT32 for link in model.links()) else "float32"


def use_loss_scaling(optimizer, precision: str, scale: float | None = None,
                     interval: int = 1000):
    """Chainer's loss scaling on ``optimizer`` for ``precision`` ``"mixed16"`` (nothing for
    the others); returns the optimizer.

    ``scale=None``: dynamic, chainer's ``optimizer.loss_scaling(interval)``: the scale starts
    at 1 and doubles after every step until a step's gradients hold inf or nan; that step's
    update is skipped and the scale halved; from then on it grows by ``2 ** (1 / interval)``
    per step (doubles every ``interval`` steps); always within [1, 65504]. A number: that
    scale, fixed (``optimizer.set_loss_scale``; a step that overflows is then *not*
    skipped). Either way ``optimizer.update(lossfun, ...)`` calls
    ``loss.backward(loss_scale=...)`` and each parameter's update rule divides its
    gradient by the scale before its hooks (the recipe's weight decay and bias gradient
    scaling) and the update; optimizer hooks (``optimizer.add_hook``) run before that and
    see scaled gradients. The loss the train chain reports is not scaled. Call it before or
    after ``optimizer.setup``; on a ChainerMN multi-node optimizer too (it forwards the
    call to the optimizer it wraps).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "mixed16":
        optimizer.loss_scaling(interval=interval, scale=scale)
    return optimizer


def skipped_update(optimizer) -> bool:
    """True while ``optimizer`` (dynamic loss scaling) is on a step whose gradients hold inf
    or nan, which it skips (after backward, before the update rule; e.g. in an optimizer
    hook): an overflow of the scaled float16 gradients, not a divergence."""
    return bool(getattr(optimizer, "_loss_scaling_isnan", False))


def use_tf32(enabled: bool = True) -> bool:
    """Let the GPU's float32 matrix products use TF32 tensor cores (``enabled=False``: not).

    Two switches, both set here: CuPy's compute type for float32 products, which CuPy reads
    from the environment variable ``CUPY_TF32`` (``1``: TF32) the first time it multiplies
    float32 matrices (not at import) and keeps for the process, and which
    ``cupy._core.set_compute_type`` changes at run time; it reaches ``cupy.dot``,
    ``tensordot`` and 2-D ``matmul`` (cuBLAS ``gemmEx`` with ``CUBLAS_COMPUTE_32F_FAST_TF32``).
    CuPy's batched ``matmul`` (3-D and more: chainer's im2col convolutions here, which run
    without cuDNN on CuPy 14) ignores it; its cuBLAS calls take TF32 from the math mode of
    cuBLAS's handle, ``CUBLAS_TF32_TENSOR_OP_MATH``, set here on the calling thread's handle
    of the current device (call it after ``device.use()``, in the thread that trains).

    Sets ``CUPY_TF32`` in any case (processes started later inherit it). Returns True when
    TF32 is on now: False without CuPy or a GPU, or on a GPU of compute capability below 8.0
    (no TF32 there).
    """
    os.environ["CUPY_TF32"] = "1" if enabled else "0"
    cupy = sys.modules.get("cupy")
    if cupy is None or not chainer.backends.cuda.available or not cupy.cuda.is_available():
        return False
    if int(cupy.cuda.device.get_compute_capability()) < 80:
        return False
    from cupy._core import _routines_linalg as linalg
    compute_type = linalg.COMPUTE_TYPE_TF32 if enabled else linalg.COMPUTE_TYPE_DEFAULT
    cupy._core.set_compute_type(np.float32, compute_type)
    math_mode = _CUBLAS_TF32_TENSOR_OP_MATH if enabled else cupy.cuda.cublas.CUBLAS_DEFAULT_MATH
    cupy.cuda.cublas.setMathMode(cupy.cuda.device.get_cublas_handle(), math_mode)
    return enabled


#: cuBLAS's ``cublasMath_t`` value (cublas_api.h, CUDA 11+), which CuPy 14 does not name.
_CUBLAS_TF32_TENSOR_OP_MATH = 3

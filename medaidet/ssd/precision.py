"""Half precision for SSD: float16 compute on float32 weights, with loss scaling.

``set_precision(model, "mixed16")`` gives a ChainerCV SSD's links float16-computing classes in
place (names, parameters and persistent values unchanged; ``"float32"`` gives them back):

* every parameter stays a float32 master weight (the optimizer, weight files, snapshots and
  ChainerMN see the float32 model); each convolution casts x, ``W`` and ``b`` to float16 in
  the graph (:class:`HalfConvolution2D`, :class:`HalfDilatedConvolution2D`);
* SSD300's ``conv4_3`` L2 normalisation computes in float32 (:class:`Float32Normalize`): in
  float16 ``x ** 2`` overflows past 256 and ChainerCV's ``Normalize`` outputs zeros silently;
* batch normalisation (SSDSmall) takes float16 input with float32 parameters as it is;
* the outputs ``mb_locs`` and ``mb_confs`` are float32 (:class:`Float32Multibox`), so the
  targets, the loss and ``MultiboxCoder.decode`` are unchanged.

float16 gradients underflow below about 6e-8, so ``mixed16`` training scales the loss
(:func:`use_loss_scaling`). Chainer's own ``chainer.mixed16`` is not used: its float16 weights'
float32 master copies are not in weight files or snapshots, and its ``Normalize`` stays float16.
``"tf32"`` keeps float32; :func:`use_tf32` lets cuBLAS use TF32 tensor cores (compute
capability >= 8.0). On the CPU ``mixed16`` is correct but slow (NumPy has no float16 matrix
product: SSDSmall's step takes about 85x as long).
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
    """ChainerCV's ``Normalize`` computed in float32 whatever x's dtype (cast in, cast back);
    same ``scale`` (C,) parameter and, in float32, the same arithmetic."""

    def forward(self, x):
        h = F.normalize(F.cast(x, np.float32), eps=self.eps, axis=1)
        h = h * F.broadcast_to(F.cast(self.scale, np.float32)[:, None, None], h.shape)
        return F.cast(h, x.dtype)


class Float32Multibox(Multibox):
    """ChainerCV's ``Multibox`` with ``(mb_locs, mb_confs)``, (B, K, 4) and (B, K, n_class),
    cast to float32."""

    def forward(self, xs):
        mb_locs, mb_confs = super().forward(xs)
        return F.cast(mb_locs, np.float32), F.cast(mb_confs, np.float32)


#: ChainerCV / chainer class -> its class in mixed16, and back.
_MIXED16 = {L.Convolution2D: HalfConvolution2D,
            L.DilatedConvolution2D: HalfDilatedConvolution2D,
            Normalize: Float32Normalize,
            Multibox: Float32Multibox}
_FLOAT32 = {half: plain for plain, half in _MIXED16.items()}


def set_precision(model, precision: str):
    """Make ``model`` (an SSD, or any chain of the links above) compute in ``precision``, in
    place, on any device; returns it. Lazily shaped parameters are shaped first
    (:func:`materialize`). ValueError: ``precision`` not in :data:`PRECISIONS` or a parameter not
    float32; TypeError (mixed16): a link with parameters of a class not handled here."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    _check_float32(model)
    _check_float32(materialize(model))
    table = _MIXED16 if precision == "mixed16" else _FLOAT32
    for name, link in model.namedlinks():
        cls = type(link)
        if cls in table:
            link.__class__ = table[cls]
        # batch normalization needs no change: float16 inputs, float32 parameters
        elif (precision == "mixed16" and cls not in _FLOAT32
              and not isinstance(link, L.BatchNormalization) and link._params):   # its own
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
    """Chainer's loss scaling on ``optimizer`` for ``"mixed16"`` (nothing otherwise); returns it.

    ``scale=None``: dynamic (``optimizer.loss_scaling(interval)``): the scale starts at 1 and
    doubles every step until a step's gradients hold inf or nan; that update is skipped and the
    scale halved; then it doubles every ``interval`` steps, within [1, 65504]. A number: fixed,
    and an overflowing step is not skipped. Update rules and their hooks see unscaled gradients,
    optimizer hooks scaled ones; the reported loss is not scaled. Works on ChainerMN optimizers.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "mixed16":
        optimizer.loss_scaling(interval=interval, scale=scale)
    return optimizer


def skipped_update(optimizer) -> bool:
    """True while ``optimizer`` (dynamic loss scaling) is on a step it skips because the scaled
    float16 gradients overflowed (an overflow, not a divergence); e.g. for optimizer hooks."""
    return bool(getattr(optimizer, "_loss_scaling_isnan", False))


def use_tf32(enabled: bool = True) -> bool:
    """Let the GPU's float32 matrix products use TF32 tensor cores (``enabled=False``: not).

    Sets ``CUPY_TF32`` (read by CuPy at its first float32 product; inherited by processes started
    later), CuPy's compute type (``cupy.dot``, ``tensordot``, 2-D ``matmul``) and, for batched
    ``matmul`` (chainer's im2col convolutions), cuBLAS's math mode on this thread's handle of the
    current device: call it after ``device.use()``, in the thread that trains. Returns whether
    TF32 is on now (False without CuPy, a GPU, or compute capability 8.0).
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

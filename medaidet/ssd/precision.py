"""TF32 for training on a GPU: ``precision="tf32"`` keeps every array float32 and lets cuBLAS
multiply float32 matrices on TF32 tensor cores (compute capability >= 8.0: A100, H100, ...;
10 bits of mantissa in the products, float32 sums). ``"float32"`` (the profiles' default)
leaves the products in full float32.
"""
from __future__ import annotations

import os
import sys

import chainer
import numpy as np

__all__ = ["use_tf32"]


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

"""Choosing the CuPy wheel that fits the machine.

CuPy 14 needs NumPy >= 2 and has no cuDNN; CuPy 13.6 works with NumPy 1.26
(and 2.x). The CUDA major comes from the driver (``nvidia-smi``): a driver
runs any runtime of its major or older.
"""
import re
import shutil
import subprocess
from dataclasses import dataclass

from medaidet_tools.stack.errors import StackError


@dataclass(frozen=True)
class CupyChoice:
    """The CuPy requirement to install (None: install none) and why."""

    requirement: object
    reason: str


def driver_cuda_major(nvidia_smi_output: str):
    """The CUDA major version the driver supports, from ``nvidia-smi``'s header."""
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi_output or "")
    return int(match.group(1)) if match else None


def query_nvidia_smi():
    """``nvidia-smi``'s output, or None when there is no NVIDIA driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def choose_cupy(cuda: str, numpy_version: str, nvidia_smi_output) -> CupyChoice:
    """Decide which CuPy to install.

    Args:
        cuda: ``'auto'``, ``'none'``, ``'12'`` or ``'13'``.
        numpy_version: the NumPy that will be installed.
        nvidia_smi_output: ``nvidia-smi``'s text, or None without a driver.
    """
    if cuda == "none":
        return CupyChoice(None, "--cuda none")
    if cuda == "auto":
        if nvidia_smi_output is None:
            return CupyChoice(None, "no NVIDIA GPU found (nvidia-smi missing or failing): "
                                    "CPU only")
        major = driver_cuda_major(nvidia_smi_output)
        if major is None:
            raise StackError("nvidia-smi did not report a CUDA version; pass --cuda 12 or "
                             "--cuda 13 to choose the CuPy build yourself.")
        if major < 12:
            raise StackError(f"the NVIDIA driver supports CUDA {major} only; CuPy 13/14 need "
                             "a driver for CUDA 12 or newer. Update the driver, or use a "
                             "machine with a newer one.")
        cuda = "13" if major >= 13 else "12"
        source = f"driver supports CUDA {major}"
    else:
        source = f"--cuda {cuda}"
    numpy_major = int(numpy_version.split(".")[0])
    if numpy_major >= 2:
        spec, why = ">=14,<15", "NumPy 2 → CuPy 14 (no cuDNN)"
    else:
        spec, why = ">=13.6,<14", "NumPy 1.26 → CuPy 13.6"
    return CupyChoice(f"cupy-cuda{cuda}x{spec}", f"{source}; {why}")

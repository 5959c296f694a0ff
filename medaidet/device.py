"""Which device to compute on, one reading of ``--device`` for every command: ``"auto"`` (GPU 0
when CUDA is usable, else the CPU), ``"cpu"``, ``"gpu"`` (GPU 0), a GPU number (``-1``: the CPU)
or chainer's ``"@numpy"``/``"@cupy:N"``. Imports chainer only inside functions (for the doctor)."""
from medaidet.errors import DeviceError

__all__ = ["DEFAULT_DEVICE", "parse_device", "device_name", "device_kind", "gpu_status",
           "resolve_device"]

DEFAULT_DEVICE = "auto"


def parse_device(spec=DEFAULT_DEVICE, name: str = "--device"):
    """``"cpu"``, ``"gpu"``, ``"auto"`` or a GPU number for ``spec``; :class:`DeviceError`
    naming ``name`` (the flag, or a config field) otherwise. Touches no GPU."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return "cpu" if spec < 0 else spec
    text = str(spec).strip().lower()     # None and bools match nothing below
    aliases = {"@numpy": "cpu", "numpy": "cpu", "@cupy": "gpu", "cuda": "gpu"}
    if text in ("cpu", "gpu", "auto") or text in aliases:
        return aliases.get(text, text)
    if text.lstrip("-").isdigit():
        return parse_device(int(text), name)
    if text.startswith("@cupy:") and text[6:].isdigit():
        return int(text[6:])
    raise DeviceError(f"{name}: {spec!r} is not a device; expected auto, cpu, gpu or a GPU "
                      "number", "spec", spec=spec)


def device_name(spec) -> str:
    """A device spec in words: "the CPU", "GPU 0", "a GPU", "auto" (else as given)."""
    try:
        device = parse_device(spec)
    except DeviceError:
        return str(spec)
    return (f"GPU {device}" if isinstance(device, int)
            else {"cpu": "the CPU", "gpu": "a GPU"}.get(device, device))


def device_kind(device) -> str:
    """``"cpu"``, ``"gpu"`` or ``"auto"`` for a chainer device or a device spec."""
    if (xp := getattr(device, "xp", None)) is not None:
        return "cpu" if xp.__name__ == "numpy" else "gpu"
    return spec if (spec := parse_device(device)) in ("cpu", "auto") else "gpu"


def gpu_status():
    """``(number of usable GPUs, why none is usable or "")``, as chainer sees CUDA."""
    try:
        import medaidet  # noqa: F401  (runtime settings before chainer)
        from chainer.backends import cuda
    except Exception as exc:   # a broken stack: the doctor says more
        return 0, f"chainer does not import ({type(exc).__name__}: {exc})"
    if not cuda.available:
        from medaidet.compat import installed_cupy
        if not installed_cupy():
            return 0, "CuPy is not installed"
        if (why := getattr(cuda, "_resolution_error", None)) is not None:
            return 0, f"CuPy is not usable ({type(why).__name__}: {why})"
        return 0, "chainer finds no CUDA"
    try:
        count = cuda.cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return 0, f"CuPy finds no GPU ({type(exc).__name__}: {exc})"
    return count, "" if count else "CuPy finds no GPU"


def resolve_device(spec=DEFAULT_DEVICE):
    """The ``chainer.backend.Device`` for ``spec``; ``"auto"`` falls back to the CPU, an
    unusable GPU asked for raises :class:`DeviceError` saying why."""
    import chainer

    spec = parse_device(spec)
    if spec == "cpu":
        return chainer.get_device("@numpy")
    count, why = gpu_status()
    if spec == "auto":
        return chainer.get_device("@cupy:0" if count else "@numpy")
    gpu = 0 if spec == "gpu" else spec
    if not count:
        raise DeviceError(f"--device {spec}: GPU {gpu} is asked for, but CUDA cannot be used "
                          f"here: {why}. Install CuPy with `medaidet stack install`, check with "
                          "`medaidet doctor`, or use --device cpu.", "no_cuda", spec=spec)
    if gpu >= count:
        raise DeviceError(f"--device {spec}: there is no GPU {gpu} (this machine has {count}); "
                          f"use --device 0..{count - 1}", "no_gpu", spec=spec)
    return chainer.get_device(f"@cupy:{gpu}")

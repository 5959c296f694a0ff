"""The environment (notebook 00): the doctor, Colab setup, and the profile every notebook
runs in (:func:`course_profile`)."""
from medaidet.device import gpu_status

# Profiles (smoke: CI's check of the mechanics; cpu: the small SSD of notebook 03 without a GPU;
# full: the recipe on a GPU) and a cell's time limit in each (s). This module imports no chainer.
CELL_TIMEOUT = {"smoke": 600, "cpu": 3600, "full": 7200}
COURSE_PROFILES = tuple(CELL_TIMEOUT)
# The editions: notebooks/ (English) and notebooks/ja/ (same files), by `--lang` code.
COURSE_LANGS = {"en": "English", "ja": "Japanese (日本語版)"}


def resolve_profile(profile: str = "auto"):
    """Return ``(profile, reason)``: "auto" is "full" on a usable GPU, else "cpu". Never raises
    for a broken chainer/CuPy: "cpu", and the reason says why."""
    if profile in COURSE_PROFILES:
        return profile, "as requested"
    if profile != "auto":
        raise ValueError(f"unknown profile {profile!r}: use 'auto', "
                         f"{', '.join(repr(p) for p in COURSE_PROFILES)}")
    count, why = gpu_status()
    return (("full", f"auto: {count} GPU(s) usable") if count
            else ("cpu", f"auto: no usable GPU ({why}), running on the CPU"))


def course_profile(profile: str = "auto", log=print) -> str:
    """The profile a notebook runs in (``"auto"``: :func:`resolve_profile`'s, logged); the line
    that opens every notebook after its parameters."""
    chosen, why = resolve_profile(profile)
    if profile == "auto":
        log(f"profile: {chosen} ({why})")
    return chosen

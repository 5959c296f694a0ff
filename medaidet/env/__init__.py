"""The environment (notebook 00): the doctor, Colab setup, and the profile every notebook
runs in (:func:`course_profile`)."""
from medaidet.device import gpu_status


# The profiles the notebooks are written for (smoke: CI's quick check of the mechanics; cpu:
# a learner without a GPU, who trains the small SSD in notebook 03; full: the recipe on a
# GPU), and the seconds a cell may take in each. The command line offers them before anything is
# installed (importing this module imports no chainer).
CELL_TIMEOUT = {"smoke": 600, "cpu": 3600, "full": 7200}
COURSE_PROFILES = tuple(CELL_TIMEOUT)
# The editions of the course: the English notebooks (notebooks/) and the Japanese ones
# (notebooks/ja/, the same file names and code), by the language code `--lang` takes.
COURSE_LANGS = {"en": "English", "ja": "Japanese (日本語版)"}


def resolve_profile(profile: str = "auto"):
    """Return ``(profile, reason)``: "auto" is "full" on a usable GPU, else "cpu" (the
    small SSD, trained in minutes on the CPU).

    Never raises for a broken chainer/CuPy: it falls back to "cpu" and the
    reason says why.
    """
    if profile in COURSE_PROFILES:
        return profile, "as requested"
    if profile != "auto":
        raise ValueError(f"unknown profile {profile!r}: use 'auto', "
                         f"{', '.join(repr(p) for p in COURSE_PROFILES)}")
    count, why = gpu_status()
    if not count:
        return "cpu", f"auto: no usable GPU ({why}), running on the CPU"
    return "full", f"auto: {count} GPU(s) usable"


def course_profile(profile: str = "auto", log=print) -> str:
    """The profile a notebook runs in: ``profile`` itself, or for ``"auto"`` what
    :func:`resolve_profile` chooses, with the reason logged. The one line that opens every
    notebook after its parameters."""
    chosen, why = resolve_profile(profile)
    if profile == "auto":
        log(f"profile: {chosen} ({why})")
    return chosen

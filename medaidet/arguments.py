"""Checked values for the command line (argparse ``type=`` functions) and the Python API
(``check*``): a wrong one ends, before any work, in one line naming the argument, the value and
what is expected. :func:`prepare_output_dir`: a run never writes into what it reads."""
import argparse
import math
import os
import tempfile
from pathlib import Path

from medaidet.errors import ConfigError
from medaidet.files import atomic_file

__all__ = ["ConfigError", "check_number", "check_type", "checked_boxes", "checked_size",
           "checked_sizes", "checked_bins", "checked_path", "is_path", "positive_int",
           "non_negative_int", "positive_float", "probability", "seed", "prepare_output_dir"]

# rule: (test, what is expected)
_RULES = {
    "positive": (lambda v: v > 0, "a number > 0"),
    "non-negative": (lambda v: v >= 0, "a number ≥ 0"),
    "probability": (lambda v: 0 <= v <= 1, "a number from 0 to 1"),
    "seed": (lambda v: 0 <= v < 2**32, "a number from 0 to 2**32 - 1 (NumPy's seeds)"),
}


def check_number(value, name: str, rule: str = "positive", integer: bool = False):
    """``value`` (a number or numeric text, not a bool) as a finite int (``integer``) or float
    that follows ``rule``; else :class:`ConfigError` naming ``name``."""
    test, expected = _RULES[rule]
    what = ("a whole " + expected.replace("a number", "number")) if integer else expected
    try:
        if isinstance(value, bool):
            raise TypeError("a bool is not a number")
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a number; expected {what}") from None
    if not math.isfinite(number) or not test(number):
        raise ConfigError(f"{name}: {value} is out of range; expected {what}")
    if integer and number != int(number):
        raise ConfigError(f"{name}: {value} is not a whole number; expected {what}")
    return int(number) if integer else number


def check_type(value, types, name: str, expected: str):
    """``value`` if one of ``types`` (a bool is not a number); else a :class:`ConfigError`."""
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        raise ConfigError(f"{name}: got {type(value).__name__} {_short(value)}; "
                          f"expected {expected}")
    return value


def _short(value) -> str:
    return text if len(text := repr(value)) <= 60 else text[:57] + "..."


def checked_boxes(bbox, label, n_class=None, name: str = "bbox"):
    """One image's boxes as ``(float (R, 4), int (R,))``, ``(y_min, x_min, y_max, x_max)``,
    one whole label in ``[0, n_class)`` per box; else a :class:`ConfigError` naming ``name``."""
    import numpy as np      # here: the command line starts (and says what is missing) without it
    n_class = math.inf if n_class is None else n_class
    try:
        boxes, labels = np.asarray(bbox, dtype=float), np.asarray(label, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {_short(bbox)} with labels {_short(label)} are not arrays "
                          "of numbers; expected (R, 4) boxes and R labels") from None
    boxes = boxes.reshape(0, 4) if boxes.size == 0 else boxes
    labels = labels.reshape(-1) if labels.size == 0 or labels.ndim == 0 else labels
    if boxes.ndim != 2 or boxes.shape[1] != 4 or not np.isfinite(boxes).all():
        raise ConfigError(f"{name}: shape {boxes.shape}; expected (R, 4) finite numbers, "
                          "(y_min, x_min, y_max, x_max) per box")
    if labels.shape != (len(boxes),) or ((labels % 1 != 0) | (labels < 0)
                                         | (labels >= n_class)).any():
        raise ConfigError(f"{name}: labels {_short(label)} for {len(boxes)} boxes; expected "
                          f"one whole number from 0 to {n_class - 1} per box")
    return boxes, labels.astype(int)


def checked_size(size, name: str = "size") -> tuple:
    """``(height, width)`` of an image ``size``, each checked to be a positive number."""
    import numpy as np
    if np.shape(size) != (2,):
        raise ConfigError(f"{name}: {_short(size)} is not an image size; expected "
                          "(height, width)")
    return tuple(check_number(v, name, "positive") for v in size)


def checked_sizes(sizes, n: int, name: str = "sizes") -> list:
    """One checked ``(height, width)`` per image of ``n``, from one per image or one for all."""
    import numpy as np
    sizes = [sizes] * n if np.ndim(sizes) == 1 else sizes
    if not isinstance(sizes, (list, tuple, np.ndarray)) or len(sizes) != n:
        raise ConfigError(f"{name}: {_short(sizes)} for {n} images; give one (H, W) per image, "
                          "or one for all")
    return [checked_size(s, name) for s in sizes]


def checked_bins(bins, name: str = "bins"):
    """Increasing bin edges (at least two numbers; ``inf`` allowed) as floats."""
    import numpy as np
    try:
        edges = np.asarray(bins, dtype=float)
    except (TypeError, ValueError):
        edges = np.zeros(0)
    if edges.ndim != 1 or len(edges) < 2 or np.isnan(edges).any() or (np.diff(edges) <= 0).any():
        raise ConfigError(f"{name}: {_short(bins)}; expected increasing bin edges, at least two")
    return edges


def checked_path(value, name: str, expected: str = "a file path") -> Path:
    """``value`` (a str or os.PathLike, not blank) as a Path; else a ConfigError."""
    if not is_path(value):
        raise ConfigError(f"{name}: got {type(value).__name__} {_short(value)}; "
                          f"expected {expected}")
    return Path(value)


def _argparse_type(rule, integer, label):
    def parse(text):
        try:
            return check_number(text, "value", rule, integer)
        except ConfigError as exc:
            # argparse prefixes "argument --name: "; keep only our part after "value: "
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None
    parse.__name__ = label  # argparse shows it in "invalid <name> value" messages
    return parse


positive_int = _argparse_type("positive", True, "positive_int")
non_negative_int = _argparse_type("non-negative", True, "non_negative_int")
positive_float = _argparse_type("positive", False, "positive_float")
probability = _argparse_type("probability", False, "probability")
seed = _argparse_type("seed", True, "seed")


def is_path(value) -> bool:
    """A non-empty str or os.PathLike (not a number, not a bool, not blank)."""
    return isinstance(value, (str, os.PathLike)) and bool(str(os.fspath(value)).strip())


def prepare_output_dir(path, name: str = "--out", inputs=(), marker=None,
                       own_folders=()) -> Path:
    """The resolved output folder ``path``, created and test-written before any work; neither
    one of ``inputs`` (folders the run reads) nor inside one. With ``marker`` (the file marking
    the command's own folder) a folder holding more than ``own_folders`` of its own work without
    it is refused. Raises :class:`ConfigError` naming ``name`` and the path."""
    if not is_path(path):
        raise ConfigError(f"{name}: {path!r} is not a folder path; expected a folder to "
                          "write the results in", "not_a_folder", path=path)
    out = Path(path).expanduser().resolve()
    for source in filter(None, inputs):   # None or "" (an unset variable): nothing to protect
        if out.is_relative_to(source := Path(source).expanduser().resolve()):
            raise ConfigError(f"{name}: {path} is inside {source}, which this run reads; choose "
                              "a folder outside it (for example outputs/)", "input", path=out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{name}: {path} is a file, not a folder; give a folder path "
                          "(it is created if missing)", "not_a_folder", path=out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # permission bits say nothing for root or on
            pass                               # read-only mounts: a real write
    except OSError as exc:
        raise ConfigError(f"{name}: cannot {'write in' if out.is_dir() else 'create'} the "
                          f"folder {path} ({exc.strerror or exc}); choose a folder you can "
                          "write to", "unwritable", path=out) from None
    if marker is None or (out / marker).is_file():
        return out
    # a new or empty folder (or one holding only own_folders of its own work): ours now
    if found := sorted(p.name for p in out.iterdir()
                       if not (p.name in own_folders and _own_work(p, marker))):
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ConfigError(f"{name}: the folder {path} already holds files ({shown}) and is not "
                          f"one this command made (no {marker} file); choose a new or empty "
                          "folder, or move those files out (nothing was written)",
                          "not_ours", path=out)
    with atomic_file(out / marker, "w") as f:
        f.write(f"medaidet made this folder for its results ({name}); the next run into it "
                "rewrites them.\n")
    return out


def _own_work(folder: Path, marker: str) -> bool:
    """Whether ``folder`` holds only the command's own work: it carries ``marker``, or it holds
    training runs, each empty or with ``medaidet train``'s ``config.json``."""
    def own_run(run: Path) -> bool:
        config = run / "config.json"
        return run.is_dir() and not run.is_symlink() and (not any(run.iterdir()) or (
            config.is_file() and config.stat().st_size < 1 << 20
            and '"model"' in config.read_text(errors="replace")))
    return folder.is_dir() and not folder.is_symlink() and (
        (folder / marker).is_file() or all(map(own_run, folder.iterdir())))

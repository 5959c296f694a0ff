"""Run the course notebooks headless with papermill, in order, and summarise.

``python -m medaidet course run`` calls :func:`run_course`. Each notebook in
``notebooks/`` is executed in name order (``00_…``, ``01_…``) with the
parameter ``profile`` injected after its cell tagged ``parameters``; the
executed copies, ``summary.json`` and ``summary.md`` go to the output
directory. The run stops at the first failing notebook, because later
notebooks use what earlier ones produced.

The output directory is the runner's own: it writes the file ``.medaidet-course``
(:data:`OUT_MARKER`) into a new or empty one (or one holding only ``runs/``, where the
notebooks run in Jupyter leave their training runs), and refuses a folder that holds other
files but not that marker (they are someone's). In its own folder a run deletes only what it is about
to rewrite: the executed copies of the notebooks it runs, the summary, and
``evaluation.json`` when it runs notebook 04. The summary files are written atomically: a
full disk leaves none half-written.

A notebook that runs through is "ok" even when its cells print warnings to stderr; its
line and the summary (``warnings``) list them (:func:`printed_warnings`), and CI requires
none.

The kernels see ``MEDAIDET_COURSE_RUN=1``, ``MEDAIDET_PROFILE`` and
``MEDAIDET_COURSE_OUT`` (the output directory) in their environment; notebook 04
leaves its test-set evaluation there (``evaluation.json``), and the summary reports
its mAP. A notebook with a ``run_dir`` parameter gets ``<out>/runs``: the training runs
of one course run stay in its output directory. ``MEDAIDET_NOTEBOOKS`` points the runner
at another notebooks directory (the default is the ``notebooks/`` folder of the source
checkout). ``lang='ja'`` runs the Japanese edition, the ``ja/`` folder of that directory
(the same notebooks with their text in Japanese); the summary says which edition ran.

The profile a notebook runs in is :func:`medaidet.env.course_profile`'s (the learner's
package): the runner only injects it.
"""
import datetime
import json
import os
import platform
import re
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from medaidet.arguments import check_number, prepare_output_dir
from medaidet.env import CELL_TIMEOUT, COURSE_LANGS, resolve_profile
from medaidet.errors import MedaidetError
from medaidet.files import is_full_disk, write_files
from medaidet_tools.stack.install import installed_version

NOTEBOOKS_ENV = "MEDAIDET_NOTEBOOKS"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # tools/medaidet_tools/course.py -> the checkout
NOT_RUN_NOTE = "an earlier notebook failed"
_ERROR_CHARS = 500
EVALUATION_FILE = "evaluation.json"  # written by notebook 04 into MEDAIDET_COURSE_OUT
EVALUATION_NOTEBOOK = "04"  # the number of the notebook that writes EVALUATION_FILE
SUMMARY_FILES = ("summary.json", "summary.md")
# In every output folder the runner made (or adopted empty): its own, to rewrite, and the
# only kind `make clean` deletes. A folder with files and without it is refused.
OUT_MARKER = ".medaidet-course"
RUNS_DIR = "runs"  # <out>/runs: the notebooks' run_dir (training runs) under the runner


class CourseError(MedaidetError):
    """The course cannot be run as asked (no notebooks, unknown name, bad profile)."""


@dataclass
class NotebookResult:
    """What happened to one notebook."""

    name: str
    status: str  # "ok", "failed" or "not run"
    seconds: float = 0.0
    output: object = None  # path of the executed notebook (str), None when not run
    error: object = None  # "ExceptionName: message" (short), None unless failed
    note: object = None  # why it was not run
    warnings: list = field(default_factory=list)  # warning lines its cells printed

    @property
    def line(self) -> str:
        if self.status == "ok":
            printed = (f"; {len(self.warnings)} warning line(s) in its outputs, the first: "
                       f"{self.warnings[0]}" if self.warnings else "")
            return f"{self.name}: ok ({self.seconds:.1f} s) -> {self.output}{printed}"
        if self.status == "failed":
            return f"{self.name}: FAILED after {self.seconds:.1f} s: {self.error} -> {self.output}"
        return f"{self.name}: not run ({self.note})"


@dataclass
class CourseSummary:
    """Result of :func:`run_course`; ``ok`` is True when every notebook ran clean."""

    profile: str
    results: list = field(default_factory=list)
    profile_reason: str = ""
    lang: str = "en"                # the edition: a key of COURSE_LANGS
    out: str = ""
    notebooks_dir: str = ""
    cell_timeout: int = 0
    seed: int | None = None         # the training seed given to the notebooks (None: theirs)
    python: str = field(default_factory=lambda: platform.python_version())
    numpy: object = field(default_factory=lambda: installed_version("numpy"))
    chainer: object = field(default_factory=lambda: installed_version("chainer"))
    chainercv: object = field(default_factory=lambda: installed_version("chainercv"))
    date: str = field(default_factory=lambda: datetime.datetime.now().astimezone()
                      .isoformat(timespec="seconds"))
    evaluation: object = None  # what notebook 04 wrote to <out>/evaluation.json, if it ran

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.status == "ok" for r in self.results)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    def to_markdown(self) -> str:
        lines = [
            "# Course run: " + ("ok" if self.ok else "FAILED"),
            "",
            f"- profile: **{self.profile}** ({self.profile_reason})",
            f"- edition: {COURSE_LANGS.get(self.lang, self.lang)} (`--lang {self.lang}`)",
            f"- date: {self.date}",
            f"- python {self.python}, numpy {self.numpy}, chainer {self.chainer}, "
            f"chainercv {self.chainercv}",
            f"- notebooks: `{self.notebooks_dir}`; cell timeout {self.cell_timeout} s",
            *([f"- seed: {self.seed} (`--seed`)"] if self.seed is not None else []),
            *self._evaluation_lines(),
            "",
            "| notebook | status | seconds | output | error |",
            "|---|---|---:|---|---|",
        ]
        for r in self.results:
            status = r.status if r.status != "not run" else f"not run ({r.note})"
            output = f"[{Path(r.output).name}]({Path(r.output).name})" if r.output else ""
            error = (r.error or (f"{len(r.warnings)} warning line(s), the first: {r.warnings[0]}"
                                 if r.warnings else "")).replace("|", "\\|").replace("\n", " ")
            seconds = f"{r.seconds:.1f}" if r.status != "not run" else ""
            lines.append(f"| {r.name} | {status} | {seconds} | {output} | {error} |")
        return "\n".join(lines) + "\n"

    def _evaluation_lines(self) -> list:
        if not self.evaluation:
            return []
        weights = self.evaluation.get("weights")
        lines = [f"- evaluated: {self.evaluation.get('model') or 'the model'} from {weights}"
                 + (f" ({self.evaluation['weights_note']})"
                    if self.evaluation.get("weights_note") else "")] if weights else []
        for name, p in self.evaluation.get("protocols", {}).items():
            per_class = ", ".join(f"{c} {_fmt_ap(v)}" for c, v in p["ap_voc"].items())
            lines.append(f"- {self.evaluation.get('split')} mAP, {name} protocol (score >= "
                         f"{p['score_thresh']}, {self.evaluation.get('n_images')} images): "
                         f"**{_fmt_ap(p['map_voc'])}** ({per_class})")
        return lines


def _fmt_ap(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


# "path:line: SomeWarning: message" (Python's warnings), "SomeWarning: …", a logger's WARNING,
# or onnxruntime's "[W:onnxruntime:, …]"
_WARNING = re.compile(r"^(?:\S.*:\d+: )?[A-Z]\w*Warning: |\bWARNING\b|\[W:onnxruntime")


def printed_warnings(notebook) -> list:
    """The warnings an executed notebook's cells wrote to stderr, one line each ("cell N:
    file:line: SomeWarning: message"; Python prints the warning's source line after it,
    which is not repeated here). A course whose outputs hold none reads cleanly."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                found += [f"cell {index}: {line.strip()[:300]}"
                          for line in output.get("text", "").splitlines() if _WARNING.search(line)]
    return found


def default_notebooks_dir(lang: str = "en") -> Path:
    """``$MEDAIDET_NOTEBOOKS``, else ``notebooks/`` of the source checkout; for ``lang``
    ``'ja'`` its ``ja/`` folder."""
    if lang not in COURSE_LANGS:
        raise CourseError(f"unknown edition --lang {lang!r}: use one of "
                          f"{', '.join(COURSE_LANGS)}")
    env = os.environ.get(NOTEBOOKS_ENV)
    root = Path(env) if env else SOURCE_ROOT / "notebooks"
    return root if lang == "en" else root / lang


def list_notebooks(notebooks_dir) -> list:
    """The course notebooks in ``notebooks_dir``, in name order."""
    notebooks_dir = Path(notebooks_dir)
    if not notebooks_dir.is_dir():
        raise CourseError(
            f"no notebooks directory at {notebooks_dir}: the course notebooks are expected in "
            f"the notebooks/ folder of a source checkout of medaidet (installed with "
            f"`pip install -e .`), or in the folder named by ${NOTEBOOKS_ENV}")
    found = sorted(p for p in notebooks_dir.glob("*.ipynb") if p.is_file())
    if not found:
        raise CourseError(f"no *.ipynb notebooks in {notebooks_dir}")
    return found


def select_notebooks(notebooks: list, only) -> list:
    """Keep the notebooks named in ``only`` (file name, stem or number prefix)."""
    if not only:
        return list(notebooks)
    if isinstance(only, str):
        only = [only]
    chosen = set()
    for name in only:
        name = str(name).strip()
        hits = [p for p in notebooks
                if name in (p.name, p.stem, p.stem.split("_", 1)[0])]
        if not hits:
            available = ", ".join(f"{p.stem} ({p.stem.split('_', 1)[0]})" for p in notebooks)
            raise CourseError(f"no notebook named {name!r}; available: {available}")
        chosen.update(hits)
    return [p for p in notebooks if p in chosen]


def _short_error(exc: BaseException, timeout: int) -> str:
    from nbclient.exceptions import CellTimeoutError
    from papermill.exceptions import PapermillExecutionError
    if isinstance(exc, PapermillExecutionError):
        text = f"{exc.ename}: {exc.evalue} (at In [{exc.exec_count}])"
    elif isinstance(exc, CellTimeoutError):
        # nbclient's message ends with a preview of the cell between dashed lines
        preview = [line.strip() for line in str(exc).split("-" * 19)[1:2]
                   for line in line.splitlines() if line.strip()]
        text = (f"CellTimeoutError: a cell ran longer than the {timeout} s cell timeout "
                f"(--cell-timeout)" + (f": {preview[0]}" if preview else ""))
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS - 3] + "..."


@contextmanager
def _kernel_environment(profile: str, out: Path):
    """Environment the kernels inherit; restored afterwards."""
    keys = ("MEDAIDET_COURSE_RUN", "MEDAIDET_PROFILE", "MEDAIDET_COURSE_OUT", "PYTHONPATH")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ["MEDAIDET_COURSE_RUN"] = "1"
    os.environ["MEDAIDET_PROFILE"] = profile
    os.environ["MEDAIDET_COURSE_OUT"] = str(out)  # where notebooks leave results
    # Kernels import the same medaidet as this runner, even when it is not installed.
    if (SOURCE_ROOT / "pyproject.toml").is_file():
        parts = [str(SOURCE_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                      if p and p != str(SOURCE_ROOT)]
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _kernel_note():
    """A warning when the "python3" kernel is not this interpreter, else None."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        spec = KernelSpecManager().get_kernel_spec("python3")
    except Exception as exc:
        return f"no python3 Jupyter kernel found ({type(exc).__name__}: {exc}); " \
               f"install ipykernel in this environment"
    exe = spec.argv[0] if spec.argv else ""
    if exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        return None  # jupyter_client runs sys.executable for these
    if Path(exe).is_absolute() and Path(exe).resolve() != Path(sys.executable).resolve():
        return (f"the python3 kernel runs {exe}, not this interpreter ({sys.executable}): "
                f"notebooks may see other packages (`python -m ipykernel install --user` "
                f"in this environment fixes it)")
    return None


def _write_summary(summary: CourseSummary, out: Path) -> Path:
    json_path, md_path = (out / name for name in SUMMARY_FILES)
    write_files({json_path: json.dumps(summary.to_dict(), indent=2) + "\n",
                 md_path: summary.to_markdown()})
    return json_path


def _writes_evaluation(path: Path) -> bool:
    return path.stem.split("_", 1)[0] == EVALUATION_NOTEBOOK


def _clear_previous_results(out: Path, selected: list, log) -> None:
    """Delete what this run rewrites (the copies of ``selected``, the summary, the
    evaluation when notebook 04 runs): left from an earlier run, they would contradict this
    run's summary. Nothing else in ``out`` is touched."""
    names = [path.name for path in selected] + list(SUMMARY_FILES)
    if any(_writes_evaluation(path) for path in selected):
        names.append(EVALUATION_FILE)
    previous = [name for name in names if (out / name).exists()]
    if previous:
        log(f"course: replacing {', '.join(previous)} of an earlier run in {out}")
    for name in previous:
        (out / name).unlink()


def _read_evaluation(out: Path, log):
    """What notebook 04 left in ``out``, or None (with a warning when it is not JSON)."""
    path = out / EVALUATION_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        log(f"course: warning: {path} is not valid JSON ({exc}); the summary leaves it out")
        return None


def _parameters(path: Path, profile: str, out: Path, seed=None) -> dict:
    """What the runner injects into a notebook: ``profile``; ``run_dir`` = ``<out>/runs``
    where the notebook has that parameter (its training runs go there); ``detector_seed``
    (notebook 03's) where it has that one and a seed was given. Not ``seed``: notebook 06's
    parameter of that name means its own runs' seed."""
    import papermill

    parameters = {"profile": profile}
    declared = papermill.inspect_notebook(str(path))
    if "run_dir" in declared:
        parameters["run_dir"] = str(out / RUNS_DIR)
    if seed is not None and "detector_seed" in declared:
        parameters["detector_seed"] = seed
    return parameters


class _CtrlC:
    """Ctrl-C during a notebook interrupts its running cell, as Jupyter's stop button does:
    the cell ends in a KeyboardInterrupt, papermill saves the notebook and shuts the now idle
    kernel down. (Tearing the kernel down in the middle of the cell, papermill's way, made
    the kernel print a ZMQError traceback.) A second Ctrl-C, or one while no kernel runs,
    raises KeyboardInterrupt at once."""

    def __init__(self):
        self.pressed = False
        self.kernels = []  # the kernel managers papermill made, newest last

    def manager_class(self):
        """A jupyter_client kernel manager class that records its instances here. Its kernels
        talk over Unix sockets (``ipc``) where there are any: over TCP, without encryption,
        ipykernel warns once per notebook, and a local course has no use for a network port."""
        from jupyter_client import AsyncKernelManager
        kernels = self.kernels

        class RecordedKernelManager(AsyncKernelManager):
            def __init__(self, **kwargs):
                if hasattr(socket, "AF_UNIX"):
                    kwargs.setdefault("transport", "ipc")
                super().__init__(**kwargs)
                kernels.append(self)

        return RecordedKernelManager

    def _on_sigint(self, signum, frame):
        kernel = self.kernels[-1] if self.kernels else None
        group = getattr(kernel.provisioner, "pgid", None) if kernel and kernel.has_kernel \
            else None
        if self.pressed or not group or not hasattr(os, "killpg"):
            raise KeyboardInterrupt
        self.pressed = True
        os.killpg(group, signal.SIGINT)  # the kernel leads its own process group

    @contextmanager
    def interrupts_the_kernel(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be set in the main thread
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def _execute(path: Path, output: Path, parameters: dict, cwd: Path, timeout: int,
             ctrl_c: _CtrlC) -> None:
    """Execute one notebook with papermill; KeyboardInterrupt when Ctrl-C was pressed."""
    import papermill
    try:
        papermill.execute_notebook(
            str(path), str(output), parameters=parameters, kernel_name="python3",
            progress_bar=True, cwd=str(cwd), execution_timeout=timeout,
            kernel_manager_class=ctrl_c.manager_class())
    except Exception:
        if not ctrl_c.pressed:
            raise
    if ctrl_c.pressed:  # the cell stopped with a KeyboardInterrupt (or caught it, and went on)
        raise KeyboardInterrupt


def _close_progress_bars() -> None:
    """Close papermill's progress bar, which a failed first write of the copy leaves open
    (it would print itself again after the error line)."""
    from tqdm import tqdm
    for bar in list(tqdm._instances):
        bar.close()


def run_course(profile="auto", only=None, out="outputs", cell_timeout=None,
               notebooks_dir=None, log=print, lang="en", seed=None) -> CourseSummary:
    """Execute the course notebooks in order with papermill; see the module docstring.
    ``lang``: the edition (``'en'``, ``'ja'``), when ``notebooks_dir`` is not given.
    ``seed``: the seed notebook 03 trains the detector with (its ``detector_seed``
    parameter); None: the profile's."""
    notebooks_dir = Path(notebooks_dir) if notebooks_dir else default_notebooks_dir(lang)
    notebooks_dir = notebooks_dir.resolve()
    selected = select_notebooks(list_notebooks(notebooks_dir), only)
    profile, reason = resolve_profile(profile)
    timeout = (check_number(cell_timeout, "--cell-timeout", integer=True)
               if cell_timeout is not None else CELL_TIMEOUT[profile])
    if seed is not None:
        seed = check_number(seed, "--seed", "seed", integer=True)
    # The executed copies replace <out>/<name>.ipynb: never the notebooks themselves (nor
    # anything in the dataset the kernels read), nor files of a folder the runner did not make.
    # A folder holding only runs/ is the course's too: the notebooks opened in Jupyter train
    # into ../outputs/runs.
    # So is one holding the other editions' outputs (outputs/ja).
    out = prepare_output_dir(out, "--out", marker=OUT_MARKER,
                             own_folders=(RUNS_DIR, *(e for e in COURSE_LANGS if e != "en")),
                             inputs=(notebooks_dir, os.environ.get("MEDAIDET_DATA")))

    import papermill  # noqa: F401 (a missing papermill fails here, before anything is deleted)

    summary = CourseSummary(profile=profile, profile_reason=reason, out=str(out),
                            notebooks_dir=str(notebooks_dir), cell_timeout=timeout, lang=lang,
                            seed=seed)
    log(f"course: profile {profile} ({reason}); {COURSE_LANGS.get(lang, lang)} edition, "
        f"{len(selected)} notebook(s) from {notebooks_dir}; cell timeout {timeout} s")
    note = _kernel_note()
    if note:
        log(f"course: warning: {note}")
    _clear_previous_results(out, selected, log)

    failed = False
    ctrl_c = _CtrlC()
    with _kernel_environment(profile, out), ctrl_c.interrupts_the_kernel():
        for path in selected:
            if failed:
                result = NotebookResult(path.stem, "not run", note=NOT_RUN_NOTE)
                summary.results.append(result)
                log(result.line)
                continue
            output = out / path.name
            start = time.monotonic()
            try:
                _execute(path, output, _parameters(path, profile, out, seed), notebooks_dir,
                         timeout, ctrl_c)
            except KeyboardInterrupt:
                summary.results.append(NotebookResult(
                    path.stem, "failed", round(time.monotonic() - start, 2),
                    str(output) if output.exists() else None,
                    "KeyboardInterrupt: interrupted by the user"))
                summary.results.extend(NotebookResult(p.stem, "not run", note="interrupted")
                                       for p in selected[len(summary.results):])
                _write_summary(summary, out)
                raise
            except Exception as exc:
                if is_full_disk(exc):  # papermill writing the copy: stop, and name it
                    output.unlink(missing_ok=True)  # a part of a notebook
                    if exc.filename is None:
                        exc.filename = str(output)
                    _close_progress_bars()
                    raise
                failed = True
                result = NotebookResult(path.stem, "failed", round(time.monotonic() - start, 2),
                                        str(output) if output.exists() else None,
                                        _short_error(exc, timeout))
            else:
                result = NotebookResult(path.stem, "ok", round(time.monotonic() - start, 2),
                                        str(output), warnings=printed_warnings(output))
            summary.results.append(result)
            log(result.line)

    if any(_writes_evaluation(path) for path in selected):  # else it is not this run's
        summary.evaluation = _read_evaluation(out, log)
        for line in summary._evaluation_lines():
            log("course: " + line[2:].replace("**", ""))
    summary_path = _write_summary(summary, out)
    log(f"course: {'ok' if summary.ok else 'FAILED'}; summary: {summary_path}")
    return summary

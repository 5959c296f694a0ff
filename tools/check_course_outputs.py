"""Fail when a course run's executed notebooks hold a warning, or do not show what they teach.

    python tools/check_course_outputs.py outputs    # the folder `make run OUT=outputs` wrote

Reads the folder's summary.json (``medaidet course run`` lists, per notebook, the warnings its
cells printed to stderr) and exits 1, naming each warning, when there is any; 2 when the
folder holds no summary or the run failed. Then reads what some notebooks must show
(:data:`SHOWN`: figures drawn, the named errors printed), and exits 1 naming what is
missing. CI runs it on both editions' smoke runs; the text checks read what the package
and the code cells print, which the Japanese edition prints in English too, except where
marked English only.
"""
import argparse
import json
import sys
from pathlib import Path

import nbformat

# notebook stem -> (least number of figures, [(text that must appear, English edition only)])
SHOWN = {
    "01_data": (5, [("every file matches", True), ("zero_area", False),
                    ("near_duplicate_image", False)]),
    "02_model_and_loss": (2, [("ChainerCV : IndexError", False),          # the unhelpful original
                              ("ChainerCV : no error; loss = nan", True),  # the silent one
                              ("medaidet  : InvalidTargetsError", False),
                              ("every ground-truth box recovered", True)]),
}


def _shown(path: Path):
    """The figures and the text (printed, plain, HTML, markdown) of an executed notebook."""
    notebook = nbformat.read(str(path), as_version=4)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    figures = sum("image/png" in o.get("data", {}) for o in outputs)
    text = "".join(o.get("text", "") + "".join(o.get("data", {}).get(kind, "") for kind in
                                               ("text/plain", "text/html", "text/markdown"))
                   for o in outputs)
    return figures, text


def missing_from(out: Path, summary: dict) -> list:
    """What the notebooks of :data:`SHOWN` that ran do not show."""
    english = summary.get("lang", "en") == "en"
    missing = []
    for result in summary["results"]:
        stem = Path(result["name"]).stem
        if stem not in SHOWN or result["status"] != "ok":
            continue
        least, texts = SHOWN[stem]
        figures, text = _shown(out / f"{stem}.ipynb")
        if figures < least:
            missing.append(f"{stem}: {figures} figure(s), expected at least {least}")
        missing += [f"{stem}: no {needle!r} in its outputs" for needle, english_only in texts
                    if (english or not english_only) and needle not in text]
    return missing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the course run's output folder")
    args = parser.parse_args(argv)
    path = args.out / "summary.json"
    if not path.is_file():
        print(f"no course summary at {path}: run `make run OUT={args.out}` first", file=sys.stderr)
        return 2
    summary = json.loads(path.read_text(encoding="utf-8"))
    if not summary.get("ok"):
        print(f"the course run in {args.out} failed: see {path}", file=sys.stderr)
        return 2
    warned = [f"{r['name']}: {w}" for r in summary["results"] for w in r.get("warnings", [])]
    if warned:
        print("the executed notebooks hold warnings:\n  " + "\n  ".join(warned), file=sys.stderr)
        return 1
    missing = missing_from(args.out, summary)
    if missing:
        print("the executed notebooks do not show what they teach:\n  " + "\n  ".join(missing),
              file=sys.stderr)
        return 1
    n = len(summary["results"])
    print(f"{n} executed notebook{'s' if n != 1 else ''}, no warning in their outputs, and "
          "each shows what it teaches")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fail when a course run's executed notebooks hold a warning (CI: the course must read cleanly).

    python tools/check_course_outputs.py outputs    # the folder `make run OUT=outputs` wrote

Reads the folder's summary.json (``medaidet course run`` lists, per notebook, the warnings its
cells printed to stderr) and exits 1, naming each warning, when there is any; 2 when the
folder holds no summary or the run failed.
"""
import argparse
import json
import sys
from pathlib import Path


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
    n = len(summary["results"])
    print(f"{n} executed notebook{'s' if n != 1 else ''}, no warning in their outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The size figures of the learner's package (issue: "half the lines, one home per idea").

    python tools/package_figures.py [medaidet]

Prints, for the package folder (the chainer overlay excluded): its lines and modules, the
modules over 400 lines, the functions over 60 lines, the exception classes it defines, and
the modules that parse a device spec. Read from the source with :mod:`ast`, nothing imported.
"""

import argparse
import ast
import sys
from pathlib import Path

MODULE_LIMIT = 400
FUNCTION_LIMIT = 60


def _is_exception(node: ast.ClassDef, known: set) -> bool:
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        if name in known or name.endswith(("Error", "Exception")) or name == "Warning":
            return True
    return False


def figures(root: Path) -> dict:
    files = sorted(p for p in root.rglob("*.py") if "overlay" not in p.parts)
    lines, big_modules, long_functions, exceptions, device_parsers = 0, [], [], [], []
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in files}
    known = {"Exception", "ValueError", "RuntimeError", "OSError", "TypeError", "KeyError"}
    changed = True
    while changed:          # classes deriving from the package's own exceptions, any depth
        changed = False
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in known \
                        and _is_exception(node, known):
                    known.add(node.name)
                    changed = True
    for path, tree in trees.items():
        name = path.relative_to(root.parent).as_posix()
        count = len(path.read_text(encoding="utf-8").splitlines())
        lines += count
        if count > MODULE_LIMIT:
            big_modules.append((name, count))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LIMIT:
                    long_functions.append((f"{name}:{node.name}", length))
            elif isinstance(node, ast.ClassDef) and _is_exception(node, known):
                exceptions.append(f"{name}:{node.name}")
            elif isinstance(node, ast.Call):
                callee = node.func.attr if isinstance(node.func, ast.Attribute) \
                    else getattr(node.func, "id", "")
                if callee in ("parse_device", "resolve_device") and name not in device_parsers:
                    device_parsers.append(name)
    return {"lines": lines, "modules": len(files), "big_modules": big_modules,
            "long_functions": long_functions, "exceptions": exceptions,
            "device_parsers": device_parsers}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", type=Path,
                        default=Path(__file__).resolve().parents[1] / "medaidet",
                        help="the package folder (default: this checkout's medaidet/)")
    root = parser.parse_args(argv).package
    if not root.is_dir():
        parser.error(f"{root}: no such folder")
    f = figures(root)
    print(f"{root.name}/: {f['lines']:,} lines in {f['modules']} modules (overlay excluded)")
    print(f"modules over {MODULE_LIMIT} lines: {len(f['big_modules'])}")
    for name, count in sorted(f["big_modules"], key=lambda x: -x[1]):
        print(f"  {count:5d}  {name}")
    print(f"functions over {FUNCTION_LIMIT} lines: {len(f['long_functions'])}")
    for name, count in sorted(f["long_functions"], key=lambda x: -x[1]):
        print(f"  {count:5d}  {name}")
    print(f"exception classes: {len(f['exceptions'])}")
    for name in f["exceptions"]:
        print(f"  {name}")
    print(f"modules calling parse_device/resolve_device: {len(f['device_parsers'])}")
    for name in f["device_parsers"]:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The size figures of the learner's package, against the small-package targets of
docs/design.md.

    python tools/package_figures.py [medaidet] [--train BCCD_ROOT]

Prints, for the package folder (the chainer overlay excluded): its lines, characters and
modules, the core's lines (all but ``extras/`` and the command line), the tests' lines, the
modules over 400 lines, the functions over 60 lines, the exception classes it defines, and
the modules that call the device parser. Read from the source with :mod:`ast`, nothing
imported. With ``--train``, also the medaidet modules a real ``train(config)`` enters (one
iteration of the small SSD on two BCCD images, on the CPU) and how often it returns to a
module it had left, traced with :func:`sys.setprofile`.
"""

import argparse
import ast
import sys
from pathlib import Path

MODULE_LIMIT = 400
FUNCTION_LIMIT = 60
#: docs/design.md's targets: the package, its core, exception classes, modules train enters.
TARGETS = {"lines": 6500, "characters": 330_000, "core lines": 5000, "exception classes": 8,
           "modules train(config) enters": 10}
NOT_CORE = ("extras", "cli.py")


def _is_exception(node: ast.ClassDef, known: set) -> bool:
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        if name in known or name.endswith(("Error", "Exception")) or name == "Warning":
            return True
    return False


def figures(root: Path) -> dict:
    files = sorted(p for p in root.rglob("*.py") if "overlay" not in p.parts)
    lines, big_modules, long_functions, exceptions, device_parsers = 0, [], [], [], []
    characters = core = 0
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
        text = path.read_text(encoding="utf-8")
        count = len(text.splitlines())
        lines += count
        characters += len(text)
        core += 0 if path.relative_to(root).parts[0] in NOT_CORE else count
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
    tests = root.parent / "tests"
    test_lines = sum(len(t.read_text(encoding="utf-8").splitlines())
                     for t in tests.rglob("*.py") if "node_modules" not in t.parts)
    return {"lines": lines, "characters": characters, "core lines": core,
            "test lines": test_lines, "modules": len(files), "big_modules": big_modules,
            "long_functions": long_functions, "exceptions": exceptions,
            "device_parsers": device_parsers}


def train_path(root: str) -> tuple[list, int]:
    """The medaidet modules ``train(config)`` enters (medaidet.errors aside: raising is not
    entering), in order of first entry, and how many of them it enters again after leaving
    them for another (each counted once, however often)."""
    import tempfile

    from medaidet.training.config import TrainConfig
    from medaidet.training.train import train

    entered, again, trail = [], set(), []

    def profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("medaidet.") or name == "medaidet.errors":
            return
        if not trail or trail[-1] != name:
            if name in trail:
                again.add(name)
            trail.append(name)
        if name not in entered:
            entered.append(name)

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig.profile("smoke", root=root, out=out, subset=2, batch_size=1,
                                     eval_subset=1, eval_batch_size=1, seed=0, n_processes=0,
                                     pretrained=None, device="cpu", iterations=1)
        sys.setprofile(profile)
        try:
            train(config, progress=False, log=lambda *a: None)
        finally:
            sys.setprofile(None)
    entered = [m for m in entered if m != "medaidet.training.train"]
    return entered, len(again - {"medaidet.training.train"})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", type=Path,
                        default=Path(__file__).resolve().parents[1] / "medaidet",
                        help="the package folder (default: this checkout's medaidet/)")
    parser.add_argument("--train", metavar="BCCD_ROOT", default=None,
                        help="also trace a one-iteration train(config) on this BCCD copy")
    args = parser.parse_args(argv)
    root = args.package
    if not root.is_dir():
        parser.error(f"{root}: no such folder")
    f = figures(root)
    print(f"{root.name}/: {f['lines']:,} lines, {f['characters']:,} characters in "
          f"{f['modules']} modules (overlay excluded); core {f['core lines']:,} lines; "
          f"tests/ {f['test lines']:,} lines")
    f["exception classes"] = len(f["exceptions"])
    for name in ("lines", "characters", "core lines", "exception classes"):
        print(f"  {name}: {f[name]:,} (target <= {TARGETS[name]:,}: "
              f"{'met' if f[name] <= TARGETS[name] else 'not met'})")
    print(f"  tests/ <= the package: {'met' if f['test lines'] <= f['lines'] else 'not met'}")
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
    if args.train:
        entered, returns = train_path(args.train)
        limit = TARGETS["modules train(config) enters"]
        print(f"modules train(config) enters: {len(entered)} (target <= {limit}: "
              f"{'met' if len(entered) <= limit else 'not met'}); {returns} of them again "
              "after leaving them")
        for name in entered:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

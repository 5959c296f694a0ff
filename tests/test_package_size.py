"""The learner's package stays readable: no module over 400 lines, no function over 60, one
exception class per boundary (figures by tools/package_figures.py, read from the source)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _figures():
    spec = importlib.util.spec_from_file_location("package_figures",
                                                  ROOT / "tools" / "package_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.figures(ROOT / "medaidet")


def test_no_module_or_function_outgrows_a_reading():
    module, found = _figures()
    assert found["big_modules"] == [], f"over {module.MODULE_LIMIT} lines: split by idea"
    assert found["long_functions"] == [], f"over {module.FUNCTION_LIMIT} lines"


def test_one_exception_class_per_boundary():
    _, found = _figures()
    public = [e for e in found["exceptions"] if not e.split(":")[1].startswith("_")]
    assert len(found["exceptions"]) <= 12 and all(e.startswith("medaidet/errors.py:")
                                                  for e in public), found["exceptions"]


def test_the_figures_see_a_module_that_outgrows_its_limit(tmp_path):
    module, _ = _figures()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "big.py").write_text("x = 1\n" * (module.MODULE_LIMIT + 1))
    (package / "long.py").write_text("def f():\n" + "    y = 1\n" * module.FUNCTION_LIMIT)
    found = module.figures(package)
    assert found["big_modules"] == [("pkg/big.py", module.MODULE_LIMIT + 1)]
    assert found["long_functions"] == [("pkg/long.py:f", module.FUNCTION_LIMIT + 1)]

"""``medaidet`` without the chainer stack, each test in a fresh interpreter (ours holds chainer)."""
from conftest import run_python

STACK = ("chainer", "chainercv", "chainermn", "cupy")
# In the child, the stack's packages are missing: importing one raises ModuleNotFoundError.
WITHOUT_STACK = f"""
import sys

class WithoutStack:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {STACK!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, WithoutStack())
"""


def test_every_parser_builds_without_importing_the_stack():
    done = run_python(f"""
import sys
from medaidet import cli
cli.build_parser()
print(sorted(m for m in sys.modules if m.split(".")[0] in {STACK!r}))
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_model_command_without_the_stack_says_what_to_install():
    """``--help`` and ``count`` without the stack: tests/stack/test_stack_runtime.py."""
    done = run_python(WITHOUT_STACK + "from medaidet import cli\n"
                      "sys.exit(cli.main(['evaluate', 'w.npz']))")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("medaidet: error: `medaidet evaluate` needs the chainer stack")
    assert line.endswith("run `python -m medaidet stack install` first")

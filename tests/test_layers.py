"""The package's layers point one way (lazy imports count too), and imports have no cycle."""
import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "medaidet"
# the course's tools: the stack installer sits low (it runs before chainer), the runner on top
TOOLS = Path(__file__).resolve().parents[1] / "tools" / "medaidet_tools"

# lowest first: a module may import its own layer and those below it, never one above
LAYERS = [
    ("shared", ["medaidet.errors", "medaidet.files", "medaidet.downloads",
                "medaidet.arguments", "medaidet.compat", "medaidet.device",
                "medaidet.numbers", "medaidet.tables", "medaidet.exercises",
                "medaidet.colors"]),
    ("stack", ["medaidet_tools.stack"]),
    ("data", ["medaidet.data"]),
    ("ssd", ["medaidet.ssd"]),
    ("training", ["medaidet.training"]),
    ("evaluation", ["medaidet.evaluation"]),
    ("extras", ["medaidet.extras"]),
    ("env", ["medaidet.env"]),
    ("tools", ["medaidet_tools.course", "medaidet_tools.cli", "medaidet_tools"]),
    ("cli", ["medaidet.cli", "medaidet.__main__"]),
]


def module_name(path: Path) -> str:
    root = PACKAGE if PACKAGE in path.parents else TOOLS
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    return {module_name(p): p for root in (PACKAGE, TOOLS) for p in sorted(root.rglob("*.py"))
            if "overlay" not in p.parts}   # the overlay is chainer's code, patched


def imported(path: Path, known, name: str | None = None) -> set:
    """The medaidet modules ``path`` imports (absolute or relative), or names exactly in a
    string (``import_module("medaidet.data.bccd")``, ``-m medaidet.env.gpu_smoke``)."""
    if name is None:
        name = module_name(path) if PACKAGE in path.parents or TOOLS in path.parents \
            else "medaidet"
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [n if n in known else base for n in names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in known:
            names = [node.value]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("medaidet", "medaidet_tools"))
    return found


def layer_of(name: str):
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    return None


def test_every_module_has_a_layer():
    # the package's own __init__ applies compat only; it is the one module outside the layers
    missing = [n for n in modules() if n != "medaidet" and layer_of(n) is None]
    assert not missing, f"place these modules in LAYERS: {missing}"


def test_imports_point_down_the_layers():
    known = modules()
    upward = []
    for name, path in known.items():
        here = layer_of(name)
        for target in imported(path, known, name):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{name} ({LAYERS[here][0]}) imports {target} "
                              f"({LAYERS[there][0]})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_import_cycles():
    known = modules()
    graph = {name: {t for t in imported(path, known, name) if t in known and t != name
                    and t != "medaidet"}
             for name, path in known.items()}
    # a package's __init__ re-exporting its own modules is not a cycle of the design
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycles = []
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)

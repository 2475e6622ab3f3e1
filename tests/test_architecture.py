"""Imports follow the flow: apps -> api -> decoding engine -> drafters -> verification pieces -> backends ->
modeling -> settings. A module may import from its own unit and from units in lower layers, never
upward or sideways (the apps do not import each other). Checked on the source, so it costs nothing."""

import ast
from pathlib import Path

import specdec

LAYERS = [
    {"__main__"},
    {"cli"},
    {"server", "bench", "training", "conformance"},
    {"api", "decoding.batching"},
    {"plan"},
    {"decoding.engine"},
    {"drafters"},
    {"decoding.rejection", "decoding.gamma", "decoding.metrics"},
    {"decoding.sampling", "decoding.theory"},
    {"backends", "models"},
    {"gguf_file"},
    {"modeling"},
    {"tasks.prompts", "text"},
    {"tasks.corpus", "config", "paths"},
    {"errors"},
]
LAYERED_PACKAGES = ("decoding", "tasks")
"""Packages whose modules are units of their own (the decoding core's layers run through it)."""
ROOT = Path(specdec.__file__).parent


def unit_of(module: str) -> str | None:
    """specdec.drafters.nets -> 'drafters'; specdec.decoding.engine -> 'decoding.engine'; the package
    itself (or a layered package's __init__) -> None."""
    parts = module.split(".")
    if parts[0] != "specdec" or len(parts) < 2:
        return None
    if parts[1] in LAYERED_PACKAGES:
        return f"{parts[1]}.{parts[2]}" if len(parts) > 2 and parts[2] != "__init__" else None
    return parts[1]


def layer_of(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"specdec.{unit} is in no layer: add it to LAYERS in {__file__}")


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in the file, lazy ones included."""
    package = "specdec." + ".".join(path.relative_to(root).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    base = package.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = ".".join(base[: len(base) - node.level + 1])
                module = f"{prefix}.{node.module}" if node.module else prefix
                if not node.module:  # from . import x, y: each name may be a module
                    found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
                    continue
            else:
                module = node.module
            found.append((module, node.lineno))
    return found


def violations(root: Path = ROOT) -> list[str]:
    wrong = []
    for path in sorted(root.rglob("*.py")):
        source_unit = unit_of("specdec." + ".".join(path.relative_to(root).with_suffix("").parts))
        if source_unit in (None, "__init__"):
            continue  # the package's own __init__ re-exports the API
        for module, line in imports(path, root):
            target_unit = unit_of(module)
            if target_unit is None or target_unit == source_unit or module.startswith("specdec.__init__"):
                continue
            if layer_of(target_unit) <= layer_of(source_unit):
                wrong.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    return wrong


def test_every_import_follows_the_flow():
    wrong = violations()
    assert not wrong, "imports against the flow:\n" + "\n".join(wrong)


def test_the_check_catches_upward_and_sideways_imports(tmp_path):
    """The negative control: a copy of the sources where the engine imports the server (lazily,
    inside a function) and the bench imports the server is refused, naming both lines."""
    import shutil

    copy = tmp_path / "specdec"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("data", "*.cpp", "__pycache__"))
    with open(copy / "decoding" / "engine.py", "a") as f:
        f.write("\n\ndef _peek():\n    from ..server import app\n    return app\n")
    with open(copy / "bench" / "runner.py", "a") as f:
        f.write("\nfrom ..server.worker import Worker\n")
    wrong = violations(copy)
    assert len(wrong) == 2, wrong
    assert any("engine.py" in w and "specdec.server" in w for w in wrong)
    assert any("runner.py" in w and "specdec.server.worker" in w for w in wrong)


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, lazy imports inside functions included (a package
    is its __init__)."""
    def name(path: Path) -> str:
        parts = path.relative_to(root).with_suffix("").parts
        return ".".join(("specdec",) + (parts[:-1] if parts[-1] == "__init__" else parts))

    paths = sorted(root.rglob("*.py"))
    nodes = {name(path) for path in paths}
    graph = {}
    for path in paths:
        edges = set()
        for module, _ in imports(path, root):
            while module and module not in nodes:  # `from . import name` may name a package's attribute
                module = module.rpartition(".")[0]
            if module and module != name(path):
                edges.add(module)
        graph[name(path)] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected set of two or more modules (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycle():
    """No two modules import each other, directly or around a ring, not even inside a function."""
    found = cycles(module_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_catches_a_lazy_cycle(tmp_path):
    """The negative control: a copy where rejection imports the engine inside a function."""
    import shutil

    copy = tmp_path / "specdec"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("data", "*.cpp", "__pycache__"))
    with open(copy / "decoding" / "rejection.py", "a") as f:
        f.write("\n\ndef _peek():\n    from .engine import SpeculativeEngine\n    return SpeculativeEngine\n")
    assert ["specdec.decoding.engine", "specdec.decoding.rejection"] in cycles(module_graph(copy))


MAX_LINES = 700


def long_files(repository: Path, limit: int = MAX_LINES) -> list[str]:
    """The sources, tests and scripts (.py, .cpp, .h) longer than `limit` lines."""
    found = []
    for folder in ("specdec", "tests", "scripts"):
        for path in sorted((repository / folder).rglob("*")):
            if path.suffix in (".py", ".cpp", ".h") and "__pycache__" not in path.parts:
                lines = path.read_text().count("\n")
                if lines > limit:
                    found.append(f"{path.relative_to(repository)}: {lines} lines")
    return found


def test_no_source_file_over_700_lines():
    """A file a newcomer can read in one sitting: split what grows past 700 lines by concept."""
    too_long = long_files(ROOT.parent)
    assert not too_long, "split these by concept:\n" + "\n".join(too_long)
    assert long_files(ROOT.parent, limit=400), "the check finds nothing even at 400 lines: it reads no file"

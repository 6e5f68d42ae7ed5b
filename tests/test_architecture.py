"""The package's shape, read from its source: layers that every import goes down, no import cycle,
no module over 400 lines, an analysis layer that loads without torch, and a core that calls a
task's hooks without asking which ones it has."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "evalsuite"
MAX_LINES = 400
# The layers, top to bottom. A module imports from its own layer and the layers below it, never from
# one above: an import inside a function or under TYPE_CHECKING counts too. ARCHITECTURE.md says what
# each layer holds and why it stands where it does. A module is in the layer of the longest name here
# that it starts with ("evalsuite" alone: the package's own __init__, the public API's face).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli", ("evalsuite.__main__", "evalsuite.cli", "evalsuite.commands")),
    ("api", ("evalsuite.api", "evalsuite")),
    ("reports, viewer, integrations", ("evalsuite.paper", "evalsuite.viewer", "evalsuite.integrations")),
    ("engine", ("evalsuite.engine", "evalsuite.suites")),
    ("models", ("evalsuite.models",)),
    ("tasks", ("evalsuite.tasks",)),
    ("analysis", ("evalsuite.analysis",)),
    ("backends", ("evalsuite.backends",)),
    ("modeling", ("evalsuite.modeling",)),
    ("contracts", ("evalsuite.contracts", "evalsuite.registry", "evalsuite.params")),
    ("runs", ("evalsuite.runs",)),
    ("core", ("evalsuite.types", "evalsuite.errors", "evalsuite.version")),
)
# the core: code that runs every task, and so must treat them all alike
CORE = ("engine", "analysis", "runs", "cli.py", "api.py")
# the task contract's classes, and the hook protocols of the earlier contract: asking whether a task is
# one of them is asking which hooks it has
HOOK_TYPES = {"Task", "TaskBase", "TaskView", "RunStep", "Checked", "NeedsCapabilities", "ModelSettings",
              "Summarized", "Plotted", "ReportSection", "HtmlSamples", "Judged", "SideScores", "PairReported",
              "Sharded"}
BUILTIN_TYPES = {"str", "int", "float", "bool", "bytes", "dict", "list", "tuple", "set", "frozenset", "type"}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(path, package): path for path in sorted(package.rglob("*.py"))}


def import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement: those inside functions (deferred, yet they run) and those under
    `if TYPE_CHECKING:` (a type named is a dependency too) included."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def deepest_module(dotted: str, package: Path = PACKAGE) -> str | None:
    """`dotted` or its longest prefix that is a module of the package (None: outside it)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules(package):
            return ".".join(parts[:end])
    return None


def imported(name: str, node: ast.Import | ast.ImportFrom, package: Path = PACKAGE) -> set[str]:
    """The package's modules that one import statement of module `name` loads by name."""
    if isinstance(node, ast.Import):
        found = {deepest_module(alias.name, package) for alias in node.names}
        return {module for module in found if module}
    base = node.module or ""
    if node.level:
        here = name if modules(package)[name].name == "__init__.py" else name.rpartition(".")[0]
        anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    # `from package import name`: the submodule `name` where there is one, else the package itself
    found = {deepest_module(f"{base}.{alias.name}" if base else alias.name, package) for alias in node.names}
    return {module for module in found if module}


@cache
def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports (itself left out)."""
    graph = {}
    for name, path in modules(package).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = set().union(*(imported(name, node, package) for node in import_nodes(tree))) - {name}
    return graph


def layer_of(module: str) -> int | None:
    """The index in LAYERS (0: the top) of the layer a module belongs to; None: in none."""
    best: tuple[int, int] | None = None  # (length of the matching name, layer index)
    for index, (_, names) in enumerate(LAYERS):
        for prefix in names:
            matches = module == prefix or (prefix != "evalsuite" and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return best[1] if best else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up the layers, as 'module (layer) -> module (layer)'."""
    found = []
    for name, targets in sorted(graph.items()):
        here = layer_of(name)
        for target in sorted(targets):
            there = layer_of(target)
            if here is not None and there is not None and there < here:
                found.append(f"{name} ({LAYERS[here][0]}) -> {target} ({LAYERS[there][0]})")
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (each a knot of import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module: start, ..., start."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_the_import_graph_sees_the_package():
    graph = import_graph()
    assert "evalsuite.engine.runner" in graph and "evalsuite.analysis.frame" in graph
    assert "evalsuite.contracts" in graph["evalsuite.registry"]  # a guard: edges are found at all


def test_no_import_cycle():
    graph = import_graph()
    cycles = []
    for component in strongly_connected(graph):
        cycle = one_cycle(graph, component)
        rest = sorted(set(component) - set(cycle))  # modules caught in the same knot by other cycles
        cycles.append(" -> ".join(cycle) + (f" (and through {', '.join(rest)})" if rest else ""))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_module_is_in_a_layer():
    unplaced = sorted(name for name in modules() if layer_of(name) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


def test_every_import_goes_down_the_layers():
    upward = upward_imports(import_graph())
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_the_layer_test_sees_an_upward_import_added_to_a_copy(tmp_path):
    """The check fails when it should: the run-folder format made to import the engine, inside a function."""
    copy = tmp_path / "evalsuite"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert not upward_imports(import_graph(copy))  # the copy as it is: nothing goes up
    records = copy / "runs" / "records.py"
    records.write_text(records.read_text() + "\n\ndef _late():\n    from evalsuite.engine import runner  # noqa\n")
    upward = upward_imports(import_graph.__wrapped__(copy))  # read afresh, not the graph cached above
    assert upward == ["evalsuite.runs.records (runs) -> evalsuite.engine.runner (engine)"]


def test_no_contract_imports_the_command_line():
    """What tasks and backends are written against (and what it rests on) holds no click type: run-step
    options are typed values parsed like -T, and the command line makes its flags from them."""
    below = {index for index, (name, _) in enumerate(LAYERS) if name in ("contracts", "runs", "core")}
    found = []
    for name, path in modules().items():
        if layer_of(name) not in below:
            continue
        for node in import_nodes(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{name}: {n}" for n in names if n.partition(".")[0] == "click"]
    assert not found, found


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    (component,) = strongly_connected(graph)
    assert component == ["a", "b", "c"] and one_cycle(graph, component) == ["a", "b", "c", "a"]


def test_no_module_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


BLOCK_TORCH = textwrap.dedent("""
    import importlib, pkgutil, sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "torch":
                raise ModuleNotFoundError(f"torch is blocked here: {name}")
            return None

    sys.meta_path.insert(0, NoTorch())
    import evalsuite.analysis as analysis
    names = [info.name for info in pkgutil.walk_packages(analysis.__path__, "evalsuite.analysis.")]
    for name in names:
        importlib.import_module(name)
    print("imported", *names)
""")


def test_analysis_imports_without_torch(tmp_path):
    # run away from the source tree: the package under test is the installed one
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "evalsuite.analysis.frame" in done.stdout.split()


def core_files() -> list[Path]:
    files: list[Path] = []
    for part in CORE:
        where = PACKAGE / part
        files += sorted(where.rglob("*.py")) if where.is_dir() else [where]
    return files


def names_in(node: ast.expr) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def asks_about_a_task(call: ast.Call) -> bool:
    """isinstance(x, <a hook type>), or isinstance(task..., <anything but a plain builtin type>)."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "isinstance" and len(call.args) == 2):
        return False
    subject, kinds = call.args
    if names_in(kinds) & HOOK_TYPES:
        return True
    last = subject.id if isinstance(subject, ast.Name) else subject.attr if isinstance(subject, ast.Attribute) else ""
    return bool(re.fullmatch(r"task(_\w+)?", last)) and not names_in(kinds) <= BUILTIN_TYPES


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_never_asks_a_task_which_hooks_it_has(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    asked = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}"
             for node in ast.walk(tree) if isinstance(node, ast.Call) and asks_about_a_task(node)]
    assert not asked, "every hook has a default on TaskBase; call it:\n" + "\n".join(asked)

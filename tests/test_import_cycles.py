"""The package's modules import one another without cycles.

A walk over every ``import`` statement of ``src/sparring`` (function-level imports too,
since a cycle through one is only postponed; not those under ``if TYPE_CHECKING:``, which
never run): module A -> module B when A imports B or a name from B, and A -> each package
above B that is not above A too (importing ``sparring.train.checkpoint`` first runs
``sparring/train/__init__.py``). A package's lazy re-exports (imports inside its
module-level ``__getattr__``, PEP 562) run only when the name is first used, after every
module involved has loaded, so they are not edges. Tarjan's algorithm finds the strongly
connected components; any with two or more modules is a cycle."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _not_run_at_import(tree: ast.Module, package_init: bool) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks, and in a package's
    ``__init__`` inside its module-level ``__getattr__`` (lazy re-exports)."""
    out = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    if package_init:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                out |= {id(n) for n in ast.walk(node)}
    return out


def _packages_above(name: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: Path = SRC / "sparring") -> dict[str, set[str]]:
    modules = {}
    for f in root.rglob("*.py"):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def known(name: str) -> str | None:  # the module itself, or the package the name is in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, f in modules.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        skip = _not_run_at_import(tree, f.name == "__init__.py")
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        mine = {*_packages_above(m), m}  # packages already loading when m runs
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = known(name) if name.startswith("sparring") else None
                if target is None:
                    continue
                for t in [*_packages_above(target), target]:
                    if t in modules and t not in mine:
                        graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walk_finds_a_cycle_by_hand():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "sparring.train.loop" in graph["sparring.cli"] or any(
        "sparring.train" in t for t in graph["sparring.cli"])  # the walk sees imports
    assert cycles(graph) == []

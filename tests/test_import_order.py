"""The package's imports point one way: down the layers of `LAYERS`, and without cycles.

A walk over every ``import`` statement of ``src/sparring`` (function-level imports too,
since a cycle through one is only postponed): module A -> module B when A imports B or a
name from B, and A -> each package above B that is not above A too (importing
``sparring.train.checkpoint`` first runs ``sparring/train/__init__.py``).

* Layers: every edge, type-only ones (under ``if TYPE_CHECKING:``) included, goes from a
  package to itself or to a package of a lower layer. The same list is the one in
  docs/architecture.md.
* Cycles: among the imports that run (not the type-only ones, and not a package's lazy
  re-exports inside its module-level ``__getattr__``, PEP 562, which run only when the name
  is first used), Tarjan's algorithm finds the strongly connected components; any with two
  or more modules is a cycle."""

import ast
from pathlib import Path

import pytest

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


def import_graph(root: Path = SRC / "sparring", *, type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports (see the module's docstring); ``type_only``: the
    imports under ``if TYPE_CHECKING:`` and in lazy re-exports count too."""
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
        skip = set() if type_only else _not_run_at_import(tree, f.name == "__init__.py")
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


# Bottom to top. A package imports only from itself and from the layers below its own; two
# packages of one layer never import each other.
LAYERS: list[tuple[str, ...]] = [
    ("data", "registry", "memo", "seeding", "extras", "lifeline", "plugins", "schedules"),
    ("segments", "storage"),
    ("objectives", "aggregation", "importance"),
    ("kl",),
    ("advantages",),
    ("envs",),
    ("policy",),
    ("config",),
    ("critic", "report"),
    ("rollout",),
    ("eval",),
    ("train",),
    ("distributed",),
    ("assembly",),
    ("export", "grid", "terminal_game"),
    ("api", "sweep"),
    ("cli",),
    ("__main__",),
]


def package_of(module: str) -> str:
    """``sparring.train.loop`` -> ``train``; the root package ``sparring`` -> ``sparring``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]],
                     layers: list[tuple[str, ...]]) -> list[str]:
    """Each import that goes up a layer or across a layer, as ``"a.b -> c.d (p -> q)"``;
    also each package that no layer names. The root package (its ``__init__``, which
    re-exports the public names) stands above every layer."""
    rank = {p: i for i, layer in enumerate(layers) for p in layer}
    out = []
    for a, targets in sorted(graph.items()):
        pa = package_of(a)
        if pa == "sparring":
            continue
        if pa not in rank:
            out.append(f"{a}: package {pa!r} is in no layer")
            continue
        for b in sorted(targets):
            pb = package_of(b)
            if pb in (pa, "sparring"):
                continue
            if pb not in rank or rank[pb] >= rank[pa]:
                out.append(f"{a} -> {b} ({pa} -> {pb})")
    return out


def test_the_layer_check_finds_an_upward_and_a_sideways_import_by_hand():
    layers = [("data",), ("envs", "policy"), ("train",)]
    graph = {"sparring.data": {"sparring.train.loop"},  # up
             "sparring.envs.base": {"sparring.policy.hf"},  # across one layer
             "sparring.train.loop": {"sparring.data", "sparring.envs", "sparring.train.x"},
             "sparring.cli": set()}
    assert layer_violations(graph, layers) == [
        "sparring.cli: package 'cli' is in no layer",
        "sparring.data -> sparring.train.loop (data -> train)",
        "sparring.envs.base -> sparring.policy.hf (envs -> policy)",
    ]


def test_every_package_is_in_exactly_one_layer():
    named = [p for layer in LAYERS for p in layer]
    assert len(named) == len(set(named))
    root = SRC / "sparring"
    on_disk = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    on_disk |= {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(named)


@pytest.mark.parametrize("type_only", [False, True], ids=["runtime", "with-type-only"])
def test_imports_point_down_the_layers(type_only):
    assert layer_violations(import_graph(type_only=type_only), LAYERS) == []


def test_the_architecture_page_lists_the_same_layers():
    """docs/architecture.md's layer block (one layer a line, bottom to top) is `LAYERS`."""
    text = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    assert [tuple(line.split()) for line in block.splitlines() if line.strip()] == LAYERS

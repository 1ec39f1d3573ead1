"""The import contract (issue 26): imports in raylite/ run one way, function-level ones included.

Every module under raylite/ is parsed with ``ast``; each ``import`` and ``from ... import`` at any
depth (module, class, function, ``if TYPE_CHECKING``) is an edge, relative imports resolved. Rules:

* upward: raylite/core imports nothing above it, only raylite/core itself and the leaf modules in
  ``BELOW_CORE`` (which import nothing from raylite);
* public face: train/, tune/ and plugins/ import nothing from raylite.core (they use ``raylite``,
  ``raylite.util``, ``raylite.exceptions``, ...); util/ imports only the core modules listed;
* layers: each module lives in one of raylite/core's subpackages, declared lowest first in ``LAYERS``;
  a layer imports only itself and the layers below it;
* no cycle among raylite/core's modules, nor among all of raylite's modules but the package root
  (``import raylite`` is the public face every upper module may use).

The known breaches are allowlists that work as ratchets: an entry that no longer exists (or no
longer closes a cycle) fails too, so the lists only shrink. A breach fails naming file:line.
Imports by name at run time (``importlib.import_module``) are not seen."""
from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from helpers import REPO_ROOT

ROOT = REPO_ROOT
PACKAGE = ROOT / "raylite"
CORE = "raylite.core"

# below raylite/core: what core may import outside itself (each imports nothing from raylite)
BELOW_CORE = {"raylite.exceptions", "raylite.runtime_env"}

# core -> above core: none today; an entry needs a reason
UPWARD_ALLOWED: set[tuple[str, str]] = set()

# util/ mirrors Ray's ray.util.* paths, implemented in core: the core modules it may import today
UTIL_CORE_ALLOWED = {
    ("raylite.util", "raylite.core.api.runtime"),
    ("raylite.util.check_serialize", "raylite.core.wire.serialization"),
    ("raylite.util.metrics", "raylite.core.client.link"),
    ("raylite.util.metrics", "raylite.core.client.metrics"),
    ("raylite.util.placement", "raylite.core.api.runtime"),
    ("raylite.util.rpdb", "raylite.core.worker.debugger"),
    ("raylite.util.placement_group", "raylite.core.api.placement_groups"),
    ("raylite.util.scheduling_strategies", "raylite.core.wire.labels"),
    ("raylite.util.scheduling_strategies", "raylite.core.api.scheduling"),
    ("raylite.util.serialization", "raylite.core.client.link"),
    ("raylite.util.serialization", "raylite.core.wire.serialization"),
    ("raylite.util.state", "raylite.core.api.state"),
    ("raylite.util.state", "raylite.core.api.state_logs"),
    ("raylite.util.state.common", "raylite.core.api.state"),
    ("raylite.util.state.exception", "raylite.core.api.state"),
}

PUBLIC_ONLY = ("raylite.train", "raylite.tune", "raylite.plugins")

# raylite/core's subpackages, lowest first: a layer imports only itself and the layers before it
LAYERS = ["wire", "hardware", "envs", "client", "worker", "node", "api"]

# a layer -> a layer above it: none today (issue 26's seams removed the last); an entry needs a reason
LAYER_BREACHES: set[tuple[str, str]] = set()

# core's import edges that close a cycle: none today (issue 26's seams removed the last); an entry needs a reason
CYCLE_EDGES: set[tuple[str, str]] = set()


class Edge(NamedTuple):
    importer: str
    imported: str
    where: str   # file:line


def _modules() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name imports (a name inside a module resolves to the module)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:   # relative: from the importing module's package, one level up per extra dot
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    # `from pkg import sub` imports the submodule when there is one, else a name in pkg
    return [f"{base}.{alias.name}" for alias in node.names]


@functools.cache
def _edges() -> list[Edge]:
    modules = _modules()
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            targets = {_resolve(name, modules) for name in _imported_names(node, module, path.name == "__init__.py")
                       if name.split(".")[0] == "raylite"}
            edges += [Edge(module, target, where) for target in sorted(targets - {None, module})]
    return edges


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _core_graph(edges: list[Edge]) -> dict[tuple[str, str], list[str]]:
    """core-internal edges (the package's own __init__ left out) -> where each is made."""
    graph = defaultdict(list)
    for edge in edges:
        if _in(edge.importer, CORE) and _in(edge.imported, CORE) and CORE not in (edge.importer, edge.imported):
            graph[edge.importer, edge.imported].append(edge.where)
    return graph


def _cycle(pairs) -> list[tuple[str, str]] | None:
    """One cycle in the directed graph of ``pairs``, as its edges, or None."""
    succ = defaultdict(list)
    for a, b in sorted(pairs):
        succ[a].append(b)
    state, stack = {}, []   # state: 1 on the current path, 2 done

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in succ[node]:
            if state.get(nxt) == 1:
                loop = stack[stack.index(nxt):] + [nxt]
                return list(zip(loop, loop[1:]))
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in list(succ):
        if start not in state and (found := visit(start)):
            return found
    return None


def _closes_a_cycle(pair: tuple[str, str], pairs) -> bool:
    """Whether edge a -> b would close a cycle: b reaches a through ``pairs``."""
    succ = defaultdict(set)
    for a, b in pairs:
        succ[a].add(b)
    seen, todo = set(), [pair[1]]
    while todo:
        node = todo.pop()
        if node == pair[0]:
            return True
        if node not in seen:
            seen.add(node)
            todo += succ[node]
    return False


def test_core_imports_nothing_above_it():
    edges = _edges()
    problems = [f"{e.where}: {e.importer} imports {e.imported} (rule: raylite/core imports nothing above it)"
                for e in edges if _in(e.importer, CORE) and not _in(e.imported, CORE)
                and e.imported not in BELOW_CORE and (e.importer, e.imported) not in UPWARD_ALLOWED]
    problems += [f"{e.where}: {e.importer} imports {e.imported} (rule: {e.importer} sits below raylite/core "
                 "and imports nothing from raylite)" for e in edges if e.importer in BELOW_CORE]
    made = {(e.importer, e.imported) for e in edges}
    problems += [f"{a} no longer imports {b}: remove the entry from UPWARD_ALLOWED" for a, b in UPWARD_ALLOWED - made]
    assert not problems, "\n".join(problems)


def test_train_tune_plugins_and_util_use_the_public_face():
    edges = _edges()
    problems = [f"{e.where}: {e.importer} imports {e.imported} (rule: {e.importer.split('.')[1]}/ uses raylite's "
                "public API, not raylite.core)" for e in edges
                if any(_in(e.importer, p) for p in PUBLIC_ONLY) and _in(e.imported, CORE)]
    problems += [f"{e.where}: {e.importer} imports {e.imported} (rule: util/ imports only the core modules in "
                 "UTIL_CORE_ALLOWED; use raylite's public API)" for e in edges
                 if _in(e.importer, "raylite.util") and _in(e.imported, CORE)
                 and (e.importer, e.imported) not in UTIL_CORE_ALLOWED]
    made = {(e.importer, e.imported) for e in edges}
    problems += [f"{a} no longer imports {b}: remove the entry from UTIL_CORE_ALLOWED"
                 for a, b in UTIL_CORE_ALLOWED - made]
    assert not problems, "\n".join(problems)


def test_no_import_cycle_in_core():
    graph = _core_graph(_edges())
    problems = []
    for pair in sorted(CYCLE_EDGES):
        if pair not in graph:
            problems.append(f"{pair[0]} no longer imports {pair[1]}: remove the entry from CYCLE_EDGES")
        elif not _closes_a_cycle(pair, set(graph) - CYCLE_EDGES):
            problems.append(f"{pair[0]} -> {pair[1]} ({', '.join(graph[pair])}) no longer closes a cycle: "
                            "remove the entry from CYCLE_EDGES")
    loop = _cycle(set(graph) - CYCLE_EDGES)
    if loop:
        problems.append("a new import cycle in raylite/core (rule: core's imports form no cycle; import the "
                        "lower module from the higher one only):\n"
                        + "\n".join(f"  {a} -> {b} at {', '.join(graph[a, b])}" for a, b in loop))
    print(f"{len(CYCLE_EDGES)} allowlisted cycle edges remain in raylite/core")
    assert not problems, "\n".join(problems)


def test_no_import_cycle_in_raylite():
    """Across packages too (raylite.dag and its compiled graphs, util/ and core, ...): one way."""
    graph = defaultdict(list)
    for edge in _edges():
        if "raylite" not in (edge.importer, edge.imported):
            graph[edge.importer, edge.imported].append(edge.where)
    loop = _cycle(set(graph))
    assert not loop, ("an import cycle in raylite/ (rule: imports run one way; let the lower module own the "
                      "contract and the module above both wire them):\n"
                      + "\n".join(f"  {a} -> {b} at {', '.join(graph[a, b])}" for a, b in loop))


# ---------------------------------------------------------------------------- train/, tune/, plugins/
# Each of these packages is layered inside too: its modules' imports (function-level ones and the
# package's own __init__ included) form no cycle, so a lower module owns the contract an upper one
# uses (tune/trainable.py's run_class is handed the session's checkpoint and report; it never
# imports the session). No cycle remains today, so the allowlist is empty; an entry needs a reason.
UPPER_PACKAGES = ("raylite.train", "raylite.tune", "raylite.plugins")
UPPER_CYCLE_EDGES: set[tuple[str, str]] = set()

# Between these packages, only public modules (no leading underscore): what one package shares with
# another is part of its face. (importer, imported) pairs allowed today, with why:
PRIVATE_ACROSS_ALLOWED = {
    ("raylite.train.lightning", "raylite.plugins._compat"),   # the one module naming Lightning's parts
}


def _package_graph(edges: list[Edge], package: str) -> dict[tuple[str, str], list[str]]:
    graph = defaultdict(list)
    for edge in edges:
        if _in(edge.importer, package) and _in(edge.imported, package):
            graph[edge.importer, edge.imported].append(edge.where)
    return graph


def test_no_import_cycle_in_train_tune_or_plugins():
    edges = _edges()
    problems = []
    for package in UPPER_PACKAGES:
        graph = _package_graph(edges, package)
        allowed = {pair for pair in UPPER_CYCLE_EDGES if _in(pair[0], package)}
        for pair in sorted(allowed):
            if pair not in graph or not _closes_a_cycle(pair, set(graph) - allowed):
                problems.append(f"{pair[0]} -> {pair[1]} no longer closes a cycle: remove it from UPPER_CYCLE_EDGES")
        loop = _cycle(set(graph) - allowed)
        if loop:
            problems.append(f"an import cycle in {package.replace('.', '/')}/ (rule: its modules' imports form no "
                            "cycle; let the lower module own the contract and the upper one import it):\n"
                            + "\n".join(f"  {a} -> {b} at {', '.join(graph[a, b])}" for a, b in loop))
    assert not problems, "\n".join(problems)


def test_train_tune_plugins_share_only_public_modules():
    edges = _edges()

    def package(module):
        return next((p for p in UPPER_PACKAGES if _in(module, p)), None)

    crossing = [e for e in edges if package(e.importer) and package(e.imported)
                and package(e.importer) != package(e.imported)
                and any(part.startswith("_") for part in e.imported.split("."))]
    problems = [f"{e.where}: {e.importer} imports {e.imported} (rule: another package's private module; import "
                "what it shares through its public modules)" for e in crossing
                if (e.importer, e.imported) not in PRIVATE_ACROSS_ALLOWED]
    made = {(e.importer, e.imported) for e in crossing}
    problems += [f"{a} no longer imports {b}: remove the entry from PRIVATE_ACROSS_ALLOWED"
                 for a, b in PRIVATE_ACROSS_ALLOWED - made]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- raylite/core's layers
def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in LAYERS else None


def test_core_modules_live_in_layers():
    strays = [m for m in _modules() if _in(m, CORE) and m != CORE and _layer(m) is None]
    assert not strays, (f"{', '.join(strays)}: every raylite/core module lives in one of its layers' subpackages "
                        f"({', '.join(LAYERS)}); put it in the one whose job it does")


def test_each_layer_imports_only_itself_and_below():
    graph = _core_graph(_edges())
    problems = [f"{', '.join(where)}: {a} imports {b} (rule: the {_layer(a)} layer imports only itself and "
                f"the layers below it, lowest first: {', '.join(LAYERS)})"
                for (a, b), where in sorted(graph.items())
                if _layer(a) and _layer(b) and LAYERS.index(_layer(b)) > LAYERS.index(_layer(a))
                and (a, b) not in LAYER_BREACHES]
    problems += [f"{a} no longer imports {b}: remove the entry from LAYER_BREACHES"
                 for a, b in sorted(LAYER_BREACHES - set(graph))]
    print(f"{len(LAYER_BREACHES)} allowlisted layer breaches remain in raylite/core")
    assert not problems, "\n".join(problems)

"""No import cycle in core, the adapters or the conformance suite, typing imports included.

import-linter's layers (pyproject.toml) order the wings of core; inside a wing, and inside an
adapter or the conformance suite, nothing orders the modules.  This test does: the import
graph (grimp's, as lint-imports reads it, imports under ``TYPE_CHECKING`` and inside functions
counted) may hold no loop (docs/architecture.md).
"""

from __future__ import annotations

import grimp
import pytest

PACKAGES = [
    "ackwise",
    "ackwise_redis",
    "ackwise_rabbitmq",
    "ackwise_sqs",
    "ackwise_postgresql",
    "ackwise_nats",
    "ackwise_dirq",
    "ackwise_conformance",
]


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing
    itself) among ``package``'s modules: each a list of module names, sorted."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {
        m: sorted(n for n in graph.find_modules_directly_imported_by(m) if n in inside)
        for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iterative (deep packages)
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges[node]:
                        found.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(graph: grimp.ImportGraph, package: str) -> None:
    found = cycles(graph, package)
    assert not found, f"{package}: modules that import each other in a loop: " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_a_cycle_is_found() -> None:
    """The check sees a loop when there is one (a graph made here, not the project's)."""
    g = grimp.ImportGraph()
    for m in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        g.add_module(m)
    g.add_import(importer="pkg.a", imported="pkg.b")
    g.add_import(importer="pkg.b", imported="pkg.c")
    g.add_import(importer="pkg.c", imported="pkg.a")
    assert cycles(g, "pkg") == [["pkg.a", "pkg.b", "pkg.c"]]
    g.remove_import(importer="pkg.c", imported="pkg.a")
    assert cycles(g, "pkg") == []

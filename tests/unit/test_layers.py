"""The layers of docs/architecture.md, checked on the source: every import in qmpprof/,
read with ast (runtime imports only: those under `if TYPE_CHECKING:` are left out).
`make lint` runs this file too."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "qmpprof"

BOTTOM = ("qmpprof.errors", "qmpprof.model", "qmpprof.defaults", "qmpprof.visible")
#: Pure code: everything after a RawSample, replayable offline.
PURE = (
    "qmpprof.isa",
    "qmpprof.unwind",
    "qmpprof.symbols",
    "qmpprof.guest",
    "qmpprof.profile",
    "qmpprof.top_stats",
    "qmpprof.memory",
    "qmpprof.modules",
    "qmpprof.analysis",
    "qmpprof.output",
    "qmpprof.host",
)
#: What pure code never imports: the event loop, QEMU, the recording loop, the terminal.
NOT_PURE = (
    "asyncio",
    "qmpprof.target",
    "qmpprof.record",
    "qmpprof.commands",
    "qmpprof.cli",
    "qmpprof.arguments",
    "qmpprof.console",
    "rich",
)
CONSOLE = "qmpprof.console"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, skipping the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _targets(node: ast.AST, importer: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module is not None:
        base = node.module
        if node.level:  # relative: resolve against the importer's package
            base = ".".join([*importer.split(".")[: -node.level], node.module])
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            yield submodule if submodule in modules() else base


@cache
def imports(module: str) -> frozenset[str]:
    """What `module` imports at run time, anywhere in it (functions included), with the
    packages that importing each qmpprof module runs first."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    found = {t for node in _runtime_nodes(tree) for t in _targets(node, module)}
    for target in list(found):
        parts = target.split(".")
        found.update(".".join(parts[:n]) for n in range(1, len(parts)) if parts[0] == "qmpprof")
    found.discard(module)
    return frozenset(found)


def _inside(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def within(prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules() if any(_inside(m, prefix) for prefix in prefixes)]


def violations(sources: list[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module in sources
        for target in imports(module)
        for banned in forbidden
        if _inside(target, banned)
    )


def test_bottom_imports_only_the_bottom() -> None:
    internal = [
        f"{module} imports {target}"
        for module in BOTTOM
        for target in imports(module)
        if _inside(target, "qmpprof") and target not in (*BOTTOM, "qmpprof")
    ]
    assert internal == []


def test_pure_layers_never_reach_qemu_the_loop_or_the_terminal() -> None:
    assert violations(within(PURE), NOT_PURE) == []


def test_rich_only_in_the_console_package() -> None:
    outside = [m for m in modules() if not _inside(m, CONSOLE)]
    assert violations(outside, ("rich",)) == []


def test_no_import_cycle() -> None:
    graph = {m: sorted(t for t in imports(m) if t in modules()) for m in modules()}
    assert _cycles(graph) == []


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            if group:
                groups.append(sorted([node, *group]))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_the_checker_sees_what_it_checks() -> None:
    """A rule over an import graph that found nothing would pass for the wrong reason."""
    assert "asyncio" in imports("qmpprof.record.sampler")
    assert "qmpprof.target.direct" in imports("qmpprof.target.memory")  # inside a function
    assert "qmpprof.target.qmp" not in imports("qmpprof.target.pause")  # TYPE_CHECKING only
    assert "qmpprof.console.progress" in imports("qmpprof.commands.record")
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_report_loads_no_asyncio() -> None:
    """`qmpprof report` replays a capture offline: the event loop and the QMP client have
    no part in it. Checked in a fresh interpreter, where nothing was imported before."""
    check = (
        "import sys, qmpprof.cli, qmpprof.commands.report; "
        "sys.exit('asyncio' in sys.modules or 'qmpprof.target.qmp' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", check], check=False).returncode == 0

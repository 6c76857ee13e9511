"""The drawing of amp_inspect's imports has no circle, every import goes the way docs/architecture.md draws it
between the subpackages, and the package face swaps no class in.

The graph is read from the source with ast (nothing is imported). An edge A -> B is any import of B written in
A: at module level, under ``if TYPE_CHECKING:`` (a circle of type names is still two modules that know each
other) and inside functions (a lazy import is still a dependency; cli -> doctor -> cli was one). ``from . import
x`` is an edge to the submodule x when x is one (compiled ones included), else to the package; the implicit
import of a module's parent package is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "amp_inspect"
PACKAGE = PACKAGE_DIR.name


def _modules() -> dict[str, Path | None]:
    """Dotted name -> source file (None for a compiled extension, which imports nothing of ours)."""
    modules: dict[str, Path | None] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    for name in ("_C", "_C_cuda", "_C_emu"):
        modules.setdefault(f"{PACKAGE}.{name}", None)
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path | None]) -> set[str]:
    """The amp_inspect modules ``name`` (source at ``path``) imports anywhere in its text."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: (_imported(name, path, modules) if path else set()) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


# Which subpackages each subpackage may import (its own always). Lower jobs never name higher ones: where two
# need to talk, the lower one publishes a small protocol or typed evidence and the higher one reads it (the
# clip watch's ScaledClip, worded by the doctor's check; the DDP hook's RankOrigin, put into the report by the
# inspector). docs/architecture.md draws the same table.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "model": {"core"},
    "runlog": {"core"},
    "evidence": {"core"},
    "distributed": {"core", "model", "evidence"},
    "gradients": {"core", "model", "runlog", "evidence", "distributed"},
    "probes": {"core", "model", "evidence", "distributed", "gradients"},
    "scaling": {"core", "model", "evidence", "distributed", "gradients"},
    "readiness": {"core", "model", "distributed", "gradients", "probes"},
    "updates": {"core", "model", "distributed", "gradients", "scaling"},
    "diagnosis": {"core", "model", "runlog", "evidence", "gradients", "scaling", "updates", "readiness"},
    "render": {"core", "runlog", "evidence", "scaling", "updates", "readiness", "diagnosis"},
    "inspection": {
        *("core", "model", "runlog", "evidence", "distributed", "gradients"),
        *("probes", "scaling", "readiness", "updates", "diagnosis"),
    },
    "integrations": {"core", "evidence", "gradients", "inspection"},
    "cli": {"core", "model", "runlog", "evidence", "gradients", "scaling", "updates", "readiness", "diagnosis"}
    | {"render", "inspection"},
}
# Top-level modules: the face and the commands sit above everything; these leaves below everything.
LEAVES = {"_lazy", "_version", "_moved", "_C", "_C_cuda", "_C_emu"}
FACE = {"", "__main__", "info"}


def _where(module: str) -> str:
    """ "core" for amp_inspect.core.ops; "" for the face; "info" for amp_inspect.info."""
    parts = module.split(".")[1:]
    return parts[0] if parts else ""


def direction_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes against ALLOWED, as "a -> b (x may not import y)"."""
    problems = []
    for module, imported in sorted(graph.items()):
        source = _where(module)
        for target in sorted(imported):
            dest = _where(target)
            if dest == source or dest in LEAVES or source in FACE:
                continue
            if source in LEAVES:
                problems.append(f"{module} -> {target} (a leaf imports nothing of the package)")
            elif source not in ALLOWED:
                problems.append(f"{module} -> {target} ({source!r} is in no row of ALLOWED)")
            elif dest not in ALLOWED.get(source, set()):
                problems.append(f"{module} -> {target} ({source} may not import {dest or 'the package face'})")
    return problems


def test_every_subpackage_has_a_row_and_a_docstring() -> None:
    """A new folder is placed in the table (and says its job) before its imports are judged, and the face
    knows it (``amp_inspect.<folder>`` after ``import amp_inspect``)."""
    import amp_inspect

    folders = {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").exists()}
    assert folders == amp_inspect._SUBPACKAGES
    assert folders == set(ALLOWED), f"subpackages without a row: {sorted(folders - set(ALLOWED))}"
    for folder in folders:
        doc = ast.get_docstring(ast.parse((PACKAGE_DIR / folder / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 12, f"amp_inspect/{folder}/__init__.py: say the folder's job"
    for allowed in ALLOWED.values():
        assert allowed <= set(ALLOWED)


def test_imports_go_the_allowed_way_between_subpackages() -> None:
    problems = direction_problems(import_graph())
    assert not problems, "imports against the table in tests/test_imports.py:\n" + "\n".join(problems)


def test_the_direction_check_names_an_upward_import() -> None:
    """The check above can fail: core importing the inspector is named, with the rule it breaks."""
    graph = {f"{PACKAGE}.core.ops": {f"{PACKAGE}.inspection.inspector", f"{PACKAGE}._lazy"}}
    assert direction_problems(graph) == [
        f"{PACKAGE}.core.ops -> {PACKAGE}.inspection.inspector (core may not import inspection)"
    ]
    assert direction_problems({f"{PACKAGE}.render.plots": {f"{PACKAGE}.core.formats"}}) == []


def test_no_folder_is_a_long_flat_list() -> None:
    """A newcomer reads the jobs off the listing: no folder holds more than about a dozen modules."""
    for folder in [PACKAGE_DIR, *(p for p in PACKAGE_DIR.rglob("*") if (p / "__init__.py").exists())]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 13, f"{folder}: {len(modules)} modules in one flat list"


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.cli.commands" in graph[f"{PACKAGE}.__main__"]  # the graph is read at all
    assert f"{PACKAGE}.diagnosis.history" in graph[f"{PACKAGE}.cli.commands"]  # lazy imports inside functions count
    cycle = find_cycle(graph)
    assert cycle is None, "amp_inspect's imports go round in a circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_names_a_cycle() -> None:
    """The check above can fail: a circle through three modules is found and named in order."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_type_checking_and_function_imports_are_edges(tmp_path: Path) -> None:
    """An import under TYPE_CHECKING, and one inside a function, each draw an edge."""
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\ndef f():\n    from . import c\n"
    )
    modules = {"pkg.mod": source, "pkg.b": None, "pkg.c": None}
    assert _imported("pkg.mod", source, modules) == {"pkg.b", "pkg.c"}


def test_the_package_face_is_a_plain_module() -> None:
    """No ``__class__`` swap: ``amp_inspect.doctor`` is the function because no submodule is named ``doctor``."""
    face = ast.parse((PACKAGE_DIR / "__init__.py").read_text())
    assigned = [ast.unparse(t) for node in ast.walk(face) if isinstance(node, ast.Assign) for t in node.targets]
    assert not [t for t in assigned if t.endswith("__class__")]
    assert not (PACKAGE_DIR / "doctor.py").exists() and not (PACKAGE_DIR / "doctor").exists()
    for function in ("update_stats", "tensor_stats", "format_readiness", "attach", "read_log"):
        assert not (PACKAGE_DIR / f"{function}.py").exists() and not (PACKAGE_DIR / function).exists()

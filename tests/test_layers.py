"""The library's floor plan, enforced: `lib/README.md` is the map; this test holds the code to it.

The README puts every module on one floor (`## Floor N: ...` headings, a `- `mlsys.x`: ...` line per
module). A module may import from its own floor or a lower one, never from a higher one. Imports
are read with `ast`, wherever they are: at the top, inside functions, `importlib.import_module`
calls, "mlsys.a.b:function" registry strings and f-strings naming a module. An import left inside
a function must say why on its line or the line above (a comment: heavy and optional, such as
matplotlib in a path that may draw nothing or Triton where it may be absent). A module over 300
lines says why in its docstring. Tests mirror the library: `mlsys.a.b` -> `tests/a/test_b.py`.
The checker is checked too: an upward import of each kind, planted in memory, is found.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib"
MAP = LIB / "README.md"
FLOOR_HEADING = re.compile(r"^## Floor (\d+): ")
MODULE_LINE = re.compile(r"^- `(mlsys(?:\.\w+)*)`")
MODULE_STRING = re.compile(r"mlsys(?:\.\w+)+(?::\w+)?")


@dataclass(frozen=True)
class Arrow:
    """`source` imports `target` at `line` (`how`: "import", "in a function", "string")."""

    source: str
    target: str
    line: int
    how: str


def module_name(path: Path, root: Path = LIB) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_sources(root: Path = LIB) -> dict[str, str]:
    """Every module of the library: dotted name -> source text."""
    return {module_name(p, root): p.read_text() for p in sorted(root.rglob("*.py"))}


def floors_from_map(text: str) -> dict[str, int]:
    """Module -> floor, read from the README's headings and module lines."""
    floors: dict[str, int] = {}
    floor = None
    for line in text.splitlines():
        if heading := FLOOR_HEADING.match(line):
            floor = int(heading.group(1))
        elif (entry := MODULE_LINE.match(line)) and floor is not None:
            if entry.group(1) in floors:
                raise ValueError(f"{entry.group(1)} is on two floors of the map")
            floors[entry.group(1)] = floor
    return floors


def _owner(name: str, modules: set[str]) -> str | None:
    """The module that `name` (a module, or a module's attribute) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _package(source: str, is_package: bool) -> str:
    return source if is_package else source.rpartition(".")[0]


def arrows(sources: dict[str, str], packages: set[str] | None = None) -> list[Arrow]:
    """Every import of one library module by another, with where and how it is written."""
    modules = set(sources)
    packages = packages if packages is not None else {
        m for m in modules if any(o.startswith(m + ".") for o in modules)}
    found = []
    for source, text in sources.items():
        tree = ast.parse(text)
        in_function = {id(n) for f in ast.walk(tree)
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            names, how = [], "in a function" if id(node) in in_function else "import"
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = _package(source, source in packages).split(".")
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names] or [base]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if MODULE_STRING.fullmatch(node.value):  # prose naming a module is no import
                    names, how = [node.value.partition(":")[0]], "string"
            elif isinstance(node, ast.JoinedStr) and node.values and isinstance(
                    node.values[0], ast.Constant) and isinstance(node.values[0].value, str):
                prefix = node.values[0].value
                if re.fullmatch(r"mlsys(\.\w+)*\.", prefix):
                    names, how = [prefix.rstrip(".")], "string"
            for name in names:
                if name == "mlsys" or name.startswith("mlsys."):
                    target = _owner(name, modules)
                    if target and target != source:
                        found.append(Arrow(source, target, node.lineno, how))
    return found


def upward(sources: dict[str, str], floors: dict[str, int]) -> list[str]:
    """Each import that runs from a lower floor to a higher one, as a sentence."""
    return [f"{a.source} (floor {floors[a.source]}) imports {a.target} (floor "
            f"{floors[a.target]}) at line {a.line} ({a.how})"
            for a in arrows(sources)
            if a.source in floors and a.target in floors and floors[a.target] > floors[a.source]]


def unexplained_local_imports(sources: dict[str, str]) -> list[str]:
    """Imports inside functions with no comment on their line or the line above."""
    bad = []
    for module, text in sources.items():
        lines = text.splitlines()
        tree = ast.parse(text)
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(f):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    here = lines[node.lineno - 1]
                    above = lines[node.lineno - 2] if node.lineno > 1 else ""
                    if "#" not in here and not above.strip().startswith("#"):
                        bad.append(f"{module}:{node.lineno}: {here.strip()}")
    return sorted(set(bad))


# --- the tests ------------------------------------------------------------------------------------

SOURCES = library_sources()
FLOORS = floors_from_map(MAP.read_text())


def test_every_module_is_on_one_floor_of_the_map():
    missing = sorted(set(SOURCES) - set(FLOORS))
    stale = sorted(set(FLOORS) - set(SOURCES))
    assert not missing, f"modules on no floor of lib/README.md: {missing}"
    assert not stale, f"lib/README.md lists modules that do not exist: {stale}"


def test_no_import_runs_upward():
    assert upward(SOURCES, FLOORS) == []


def test_imports_inside_functions_say_why():
    assert unexplained_local_imports(SOURCES) == []


def test_a_package_sits_on_the_floor_of_its_modules_or_below():
    """A package's __init__ is on the lowest floor its modules need, never above them."""
    bad = [f"{m} (floor {FLOORS[m]}) holds {sub} (floor {FLOORS[sub]})"
           for m in FLOORS for sub in FLOORS
           if sub.startswith(m + ".") and FLOORS[sub] < FLOORS[m] and m != "mlsys"]
    assert bad == []


# --- the checker checks itself: a planted upward import of each kind is found -------------------

PLANTED = {
    "top": "from mlsys.models import transformer\n",
    "in a function": "def f():\n    from mlsys.models.transformer import Transformer  # planted\n",
    "importlib": "import importlib\nM = importlib.import_module('mlsys.models.transformer')\n",
    "registry string": "BACKENDS = {'x': 'mlsys.models.transformer:Transformer'}\n",
    "relative": "from ..models import transformer\n",
}


@pytest.mark.parametrize("kind", list(PLANTED))
def test_a_planted_upward_import_is_found(kind):
    sources = {**SOURCES, "mlsys.accounting.planted": PLANTED[kind]}
    floors = {**FLOORS, "mlsys.accounting.planted": FLOORS["mlsys.accounting.flops"]}
    found = [f for f in upward(sources, floors) if f.startswith("mlsys.accounting.planted ")]
    assert len(found) == 1 and "imports mlsys.models.transformer (floor 4)" in found[0]


def test_prose_naming_a_module_is_not_an_import():
    sources = {**SOURCES, "mlsys.accounting.planted":
               '"""Used in `mlsys.models.transformer` and chapter 03."""\n'}
    floors = {**FLOORS, "mlsys.accounting.planted": FLOORS["mlsys.accounting.flops"]}
    assert not [f for f in upward(sources, floors) if f.startswith("mlsys.accounting.planted ")]


def test_an_unexplained_import_inside_a_function_is_found():
    found = unexplained_local_imports({"m": "def f():\n    import json\n    return json\n"})
    assert found == ["m:2: import json"]
    assert unexplained_local_imports({"m": "def f():\n    import json  # stdlib, rare\n"}) == []


# --- tests mirror the library: tests/<package>/test_<module>.py ----------------------------------

TESTS = Path(__file__).resolve().parent
NOT_A_MODULE = {
    "test_layers.py": "the floor plan of the whole library",
    "book/test_browser.py": "the built book, opened in a browser",
    "test_examples.py": "the files under examples/ (Hugging Face configs, clusters), planned from "
                        "the command line",
}
"""Test files that name no module, and what they test instead."""


def _defines_something(text: str) -> bool:
    """Whether a module defines a function, class or constant (not only imports, `__all__`)."""
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) or (
        isinstance(n, (ast.Assign, ast.AnnAssign)) and not all(
            isinstance(t, ast.Name) and t.id.startswith("__")
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])))
        for n in ast.parse(text).body)


def mirrored_test(module: str) -> str:
    """The test file of `module`, relative to tests/: mlsys.a.b -> a/test_b.py, mlsys.b ->
    test_b.py, a package's own code -> a/test_a.py, __main__ -> test_main.py, _x -> test_x.py."""
    parts = module.split(".")[1:]
    if module in SOURCES and module in {m.rpartition(".")[0] for m in SOURCES} and parts:
        parts = [*parts, parts[-1]]  # the package's __init__
    folder, name = parts[:-1], (parts[-1] if parts else "mlsys")
    return "/".join([*folder, f"test_{name.strip('_')}.py"])


def test_every_module_has_its_mirrored_test_file():
    wanted = {m: mirrored_test(m) for m, text in SOURCES.items()
              if m != "mlsys" and _defines_something(text)}
    missing = sorted(f"{m} -> tests/{path}" for m, path in wanted.items()
                     if not (TESTS / path).exists())
    assert missing == []


def test_every_test_file_names_a_module():
    wanted = {mirrored_test(m) for m in SOURCES}
    orphans = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                     if str(p.relative_to(TESTS)) not in wanted | set(NOT_A_MODULE))
    assert orphans == []


# --- modules that read in one sitting ------------------------------------------------------------

MAX_LINES = 300
REASON = re.compile(r"longer than|over 300|a little over", re.IGNORECASE)


def test_a_module_over_300_lines_says_why():
    """A module longer than `MAX_LINES` says in its docstring why it is one module."""
    long = sorted(f"{m} ({len(text.splitlines())} lines)" for m, text in SOURCES.items()
                  if len(text.splitlines()) > MAX_LINES
                  and not REASON.search(ast.get_docstring(ast.parse(text)) or ""))
    assert long == []

"""The package's layout holds: imports run one way (cli, serve -> api -> engine -> draft and
structured -> base: a module may import its own layer or one below) and in no circle within a
layer, the model-free part loads without MLX, and a long module says why it is one idea."""

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specgen"
# A module may import its own layer or a lower one (a higher rank); base modules import only base.
RANK = {"cli": 0, "serve": 1, "api": 2, "engine": 3, "draft": 4, "structured": 4, "base": 5}
MODEL_FREE = ("specgen.draft", "specgen.structured")  # and the base modules (model_free below)
# What else loads without MLX: the records and the cost model the drafter and the CLI read.
ALSO_MODEL_FREE = ["specgen.engine.options", "specgen.engine.cost.curve", "specgen.engine.cost.mode"]
MAX_LINES = 300  # past this a module is looked at: split by idea, or say in its docstring why whole
WHOLE = "one idea"
# The top package's lazy API and `python -m specgen` are facades of the layer they forward to.
FACADES = {"specgen": "api", "specgen.__main__": "cli"}


def layer(module: str) -> str:
    """specgen.engine.decode.loop -> engine; specgen.errors -> base."""
    parts = module.split(".")
    if module in FACADES:
        return FACADES[module]
    return parts[1] if len(parts) > 1 and parts[1] in RANK else "base"


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        yield name, path, ast.parse(path.read_text())


def statements(name: str, path: Path, tree: ast.AST):
    """(module, names imported from it) for each import in this file, the module absolute; ()
    for `import module`. Imports inside functions and under TYPE_CHECKING count too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            yield base, tuple(a.name for a in node.names)


def imported(name: str, path: Path, tree: ast.AST):
    """Every specgen module (or package) this file imports, absolute."""
    for base, names in statements(name, path, tree):
        yield base
        yield from (f"{base}.{n}" for n in names)


def test_imports_run_one_way():
    wrong = []
    for name, path, tree in modules():
        for target in imported(name, path, tree):
            if target == "specgen" or not target.startswith("specgen."):
                continue
            top = target.split(".")[1]
            if top not in RANK and not (PACKAGE / f"{top}.py").exists():
                continue  # a name imported from a package, not a module
            if RANK[layer(target)] < RANK[layer(name)]:
                wrong.append(f"{name} ({layer(name)}) imports {target} ({layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_the_rule_catches_an_upward_import():
    tree = ast.parse("from specgen.engine.decode.loop import generate\nfrom ..cli import kit\n")
    found = list(imported("specgen.draft.ngram", PACKAGE / "draft" / "ngram.py", tree))
    assert "specgen.engine.decode.loop" in found and "specgen.cli.kit" in found
    assert RANK[layer("specgen.engine.decode.loop")] < RANK[layer("specgen.draft.ngram")]


def depends_on(found: list) -> dict[str, set[str]]:
    """The modules of the package each one imports: `from p import m` depends on the module p.m
    where there is one (p's own __init__ is not counted then), else on p."""
    known = {n for n, _, _ in found}

    def targets(base, names):
        return [f"{base}.{n}" if f"{base}.{n}" in known else base for n in names] or [base]

    return {name: {t for base, names in statements(name, path, tree) for t in targets(base, names)}
            & (known - {name}) for name, path, tree in found}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import one another round a circle (a strongly connected
    component of more than one module), as `a -> b -> a`."""
    found = []
    for start in sorted(graph):
        path, seen = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:  # depth first: the first way back to `start` through later modules only
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
            elif nxt == start:
                found.append(path + [start])
                break
            elif nxt > start and nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return found


def test_no_modules_import_each_other():
    # A type-only import (under TYPE_CHECKING) counts too: the two modules still cannot be read
    # or changed apart. Name what is needed as a Protocol in the lower module, or move it there.
    found = cycles(depends_on(list(modules())))
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_rule_catches_a_circle():
    code = {"specgen.draft.a": "from specgen.draft.b import X\n",
            "specgen.draft.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from specgen.draft import a\n",
            "specgen.draft.c": "def f():\n    from . import b\n",
            "specgen.draft": "from specgen import draft\n"}
    found = [(n, PACKAGE / "draft" / f"{n.rpartition('.')[2]}.py", ast.parse(c)) for n, c in code.items()]
    graph = depends_on(found)
    assert graph["specgen.draft.c"] == {"specgen.draft.b"} and graph["specgen.draft"] == set()
    assert cycles(graph) == [["specgen.draft.a", "specgen.draft.b", "specgen.draft.a"]]


def model_free(name: str) -> bool:
    return name.startswith(MODEL_FREE) or (layer(name) == "base" and name not in FACADES)


@pytest.mark.parametrize("name,path,tree", [m for m in modules() if model_free(m[0])],
                         ids=lambda m: m if isinstance(m, str) else "")
def test_model_free_code_does_not_import_mlx(name, path, tree):
    assert not [t for t in imported(name, path, tree) if t.split(".")[0] in ("mlx", "mlx_lm")]


def test_specgen_and_the_drafter_load_without_mlx():
    draft = [n for n, _, _ in modules() if model_free(n)]
    code = ("import sys\nsys.modules.update({m: None for m in ('mlx', 'mlx.core', 'mlx_lm')})\n"
            "import importlib, specgen\n"
            f"for m in {draft + ALSO_MODEL_FREE!r}:\n"
            "    importlib.import_module(m)\n"
            "assert 'mlx' not in [k.split('.')[0] for k, v in sys.modules.items() if v is not None]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def long_modules() -> dict[str, str]:
    """Modules over MAX_LINES, by name, with their docstrings."""
    return {n: ast.get_docstring(tree) or "" for n, p, tree in modules()
            if len(p.read_text().splitlines()) > MAX_LINES}


def test_a_long_module_says_why_it_is_whole():
    # Length is a prompt to look, not a rule: a module that is one idea stays whole and says so
    # (WHOLE in its docstring, with the reason); the long ones are listed as a warning.
    long = long_modules()
    if long:
        warnings.warn(f"modules over {MAX_LINES} lines: {sorted(long)}")
    assert not [n for n, doc in long.items() if WHOLE not in doc.lower()]


def test_every_module_says_what_it_owns():
    assert not [n for n, _, tree in modules() if not ast.get_docstring(tree) and not n.endswith("__main__")]


def test_the_architecture_page_states_the_imports_the_code_has():
    # docs/architecture.md's table: each layer and the layers it imports (parenthesised notes aside).
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = page[page.index("| layer | imports |"):].split("\n\n")[0].splitlines()[2:]
    stated = {}
    for row in table:
        layers, imports = (re.sub(r"\([^)]*\)", "", cell) for cell in row.strip("|").split("|"))
        for name in re.findall(r"`(\w+)`|\b(base)\b", layers):
            stated[name[0] or name[1]] = {a or b for a, b in re.findall(r"`(\w+)`|\b(base)\b", imports)}
    actual = {}
    for name, path, tree in modules():
        if name in FACADES:
            continue
        for target in imported(name, path, tree):
            top = target.split(".")[1] if target.startswith("specgen.") else None
            if top in RANK or (top and (PACKAGE / f"{top}.py").exists()):
                actual.setdefault(layer(name), set()).add(layer(target))
    actual = {k: v - {k} | ({k} if k == "base" else set()) for k, v in actual.items()}
    assert stated == actual

"""The documentation a user reads holds together: every file it links or shows exists, it speaks
of the product (no development-session or issue numbers), the benchmarks page stays a page with
its plots, and benchmark/ stays a handful of tools with its results filed by run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmark" / "README.md",
    ROOT / "benchmark" / "results" / "README.md",
    ROOT / "python" / "sglang" / "demo" / "README.md",
    ROOT / "scripts" / "demo_models" / "README.md",
]


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_exists(doc):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text())
    missing = [t for t in targets if "://" not in t and not (doc.parent / t).exists()]
    assert not missing, missing


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_speak_of_the_product_not_of_how_it_was_made(doc):
    text = doc.read_text()
    found = re.findall(r"\b(?:[Ss]ession \d+|[Ii]ssues? \d+|\.\./shared/|shared/DESIGN\.md)", text)
    assert not found, found


def test_the_benchmarks_page_is_short_and_shows_plots_that_exist():
    page = ROOT / "docs" / "benchmarks.md"
    lines = page.read_text().splitlines()
    assert len(lines) <= 300
    plots = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text())
    assert len(plots) >= 3 and all((page.parent / p).is_file() for p in plots)
    assert "## Dynamic speculation on every load" in lines


def test_benchmark_holds_a_few_tools_and_results_filed_by_run():
    scripts = [p for p in (ROOT / "benchmark").iterdir() if p.is_file() and p.suffix in (".py", ".sh")]
    assert len(scripts) <= 10, sorted(p.name for p in scripts)
    results = ROOT / "benchmark" / "results"
    loose = [p.name for p in results.iterdir() if p.is_file() and p.name != "README.md"]
    assert not loose, loose
    index = (results / "README.md").read_text()
    for run in (p for p in results.iterdir() if p.is_dir()):
        assert (run / "README.md").is_file(), f"{run.name} has no README.md"
        assert f"[{run.name}]({run.name}/)" in index, f"{run.name} is not in the index"


def _module_files() -> dict[str, Path]:
    """Every module under python/sglang by its dotted name (a package by its own name)."""
    package = ROOT / "python"
    modules = {}
    for path in (package / "sglang").rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _top_level_names(path: Path) -> dict[str, ast.AST]:
    """What a module defines or imports at its top level (inside top-level if / try too), and
    what its module `__getattr__` answers for."""
    names: dict[str, ast.AST] = {}
    for statement in ast.parse(path.read_text()).body:
        nodes = ast.walk(statement) if isinstance(statement, (ast.If, ast.Try)) else [statement]
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
                if node.name == "__getattr__":
                    names.update((c.value, node) for c in ast.walk(node) if isinstance(c, ast.Constant))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update((name, node) for t in targets for name in _assigned_names(t))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(((alias.asname or alias.name).split(".")[0], node) for alias in node.names)
    return names


def _assigned_names(target: ast.AST) -> list[str]:
    """The names an assignment binds (`x`, `x, y`), not those it only reads (`X.attr = ...`)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _assigned_names(element)]
    return []


def _class_members(node: ast.ClassDef, classes: dict[str, list[ast.ClassDef]], seen=()) -> set[str]:
    """Methods, class attributes, fields and `self.x` assignments of a class and its bases."""
    names = set(dir(object))
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
            if n.value.id in ("self", "cls"):
                names.add(n.attr)
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        for parent in classes.get(name, []):
            if parent not in seen:
                names |= _class_members(parent, classes, (*seen, node))
    return names


def _missing_code_names(text: str) -> list[str]:
    """The backticked dotted names in `text` that point into sglang and name nothing there:
    `sglang.x.y` and `module.name` (a module's file name under python/sglang, unique there) must
    be defined at the module's top level, `Class.member` (a class defined in sglang) a member of
    it or of its bases. Names that point elsewhere (torch.load, gc.freeze) are not checked."""
    modules = _module_files()
    by_file_name = {name.rsplit(".", 1)[-1]: name for name in modules}
    top = {name: _top_level_names(path) for name, path in modules.items()}
    classes: dict[str, list[ast.ClassDef]] = {}
    for names in top.values():
        for name, node in names.items():
            if isinstance(node, ast.ClassDef) and node.name == name:
                classes.setdefault(name, []).append(node)
    missing = []
    for code in re.findall(r"`([^`\n]+)`", text):
        match = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(.*\))?", code.strip())
        if match is None or re.search(r"\.(py|md|json|sh|txt)$", match.group(1)):
            continue
        parts = match.group(1).split(".")
        if parts[0] in classes:
            if not any(parts[1] in _class_members(c, classes) for c in classes[parts[0]]):
                missing.append(code)
            continue
        prefixes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        module = next((p for p in prefixes if p.startswith("sglang") and p in modules), None)
        if module is None and parts[0] in by_file_name:
            module = by_file_name[parts[0]]
        if module is None:
            continue
        rest = parts[len(module.split(".")) if module.startswith(parts[0]) else 1 :]
        node = top[module].get(rest[0]) if rest else True
        if node is None:
            missing.append(code)
        elif len(rest) > 1 and isinstance(node, ast.ClassDef) and rest[1] not in _class_members(node, classes):
            missing.append(code)
    return missing


def test_the_architecture_page_names_only_code_that_exists():
    assert not _missing_code_names((ROOT / "docs" / "architecture.md").read_text())


def test_a_stale_code_name_is_caught():
    stale = "`ServerArgs.speculative_reachable_steps()`, `draft_catch_up.catch_up_draft`, `sglang.srt.nowhere`"
    assert _missing_code_names(stale + ", `spec_policy.reachable_steps`, `torch.load`") == stale.replace("`", "").split(
        ", "
    )

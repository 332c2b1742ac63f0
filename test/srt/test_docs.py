"""The documentation a user reads holds together: every file it links or shows exists, it speaks
of the product (no development-session or issue numbers), the benchmarks page stays a page with
its plots, and benchmark/ stays a handful of tools with its results filed by run."""

from __future__ import annotations

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

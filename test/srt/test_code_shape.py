"""The speculation code stays small enough for a newcomer to change: the package's size, the length
of every function in it and in the scheduler's package, and the worker's private methods kept to
the worker."""

import ast
from pathlib import Path

SRT = Path(__file__).resolve().parents[2] / "python" / "sglang" / "srt"
SPECULATIVE = SRT / "speculative"
MAX_SPECULATIVE_LINES = 2000
MAX_FUNCTION_LINES = 60
WORKER = SPECULATIVE / "eagle_worker_v2.py"


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_the_speculation_package_is_at_most_2000_non_blank_lines():
    lines = sum(1 for path in SPECULATIVE.glob("*.py") for line in path.read_text().splitlines() if line.strip())
    assert lines <= MAX_SPECULATIVE_LINES, f"speculative/ has {lines} non-blank lines"


def test_no_function_of_the_speculation_or_scheduler_packages_is_over_60_lines():
    long = [
        f"{path.relative_to(SRT)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for package in (SPECULATIVE, SRT / "managers")
        for path in sorted(package.glob("*.py"))
        for fn in _functions(path)
        if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def _worker_private_methods() -> set[str]:
    worker = next(
        n for n in ast.parse(WORKER.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2"
    )
    return {
        n.name
        for n in worker.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.name.startswith("_")
        and not n.name.endswith("__")
    }


def _calls_on_a_worker(source: str, label: str, private: set[str]) -> list[str]:
    """`worker._m(...)` / `self.worker._m(...)` calls of the worker's private methods in one file."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in private:
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if "worker" in name:
                found.append(f"{label}:{node.lineno} {name}.{node.func.attr}")
    return found


def test_only_the_worker_calls_its_private_methods():
    private = _worker_private_methods()
    assert private, "the worker's private methods were not found: the check would pass vacuously"
    calls = [
        call
        for path in sorted(SRT.rglob("*.py"))
        if path != WORKER
        for call in _calls_on_a_worker(path.read_text(), str(path.relative_to(SRT)), private)
    ]
    assert not calls, calls


def test_the_private_method_check_catches_a_call():
    private = _worker_private_methods()
    name = sorted(private)[0]
    source = f"def f(self, worker):\n    self.worker.{name}()\n    return worker.{name}()\n"
    assert _calls_on_a_worker(source, "probe.py", private) == [f"probe.py:2 worker.{name}", f"probe.py:3 worker.{name}"]

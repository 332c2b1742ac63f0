"""Prompts in the demo pair's domain (Python source): token windows of the standard library's files."""

from __future__ import annotations

import glob
import os


def stdlib_files() -> list[str]:
    """The standard library's .py files, packages included, installed packages and tests not."""
    root = os.path.dirname(os.__file__)
    skip = (
        os.sep + "site-packages" + os.sep,
        os.sep + "dist-packages" + os.sep,
        os.sep + "test" + os.sep,
        os.sep + "tests" + os.sep,
        os.sep + "idlelib" + os.sep,
    )
    return sorted(
        path
        for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
        if not any(part in path for part in skip)
    )


def code_windows(tokenizer, num: int, length: int) -> list[list[int]]:
    """`num` distinct windows of `length` token ids, a few per file (past each file's license
    header), files in sorted order; fewer if the library has fewer."""
    windows: list[list[int]] = []
    for path in stdlib_files():
        with open(path, errors="replace") as f:
            ids = tokenizer(f.read()[:200_000]).input_ids
        for start in range(length, len(ids) - length + 1, length):
            windows.append(ids[start : start + length])
            if len(windows) == num:
                return windows
    return windows

"""The training corpus: Python sources present on every machine here (the running interpreter's
standard library, and the installed torch and transformers packages), split by file into
train / held-out with a fixed seed, with a hash of the exact file list used."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import sysconfig
from dataclasses import dataclass

SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    roots: dict[str, str]  # source name -> directory
    train_files: list[str]  # "source/relative/path.py", sorted
    heldout_files: list[str]  # same form, sorted
    file_list_sha256: str  # over the sorted "path\tsize" lines of every file used

    def texts(self, files: list[str]) -> list[str]:
        return [read_source(self.absolute(path)) for path in files]

    def absolute(self, path: str) -> str:
        source, relative = path.split("/", 1)
        return os.path.join(self.roots[source], relative)


def source_root(name: str) -> str:
    """`stdlib` is the interpreter's standard library; any other name is an installed package."""
    if name == "stdlib":
        return sysconfig.get_paths()["stdlib"]
    return os.path.dirname(importlib.util.find_spec(name).origin)


def list_sources(name: str, root: str) -> list[str]:
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        found += [f"{name}/{os.path.relpath(os.path.join(directory, f), root)}" for f in files if f.endswith(".py")]
    return sorted(found)


def read_source(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def build_corpus(seed: int, heldout_fraction: float, sources: list[str], max_files: int | None = None) -> Corpus:
    """Shuffles the sorted file list with `seed`; the first `heldout_fraction` of it is held out.
    `max_files` keeps a seeded subset (for the toy preset)."""
    roots = {name: source_root(name) for name in sources}
    files = sorted(path for name, root in roots.items() for path in list_sources(name, root))
    random.Random(seed).shuffle(files)
    files = files[:max_files] if max_files else files
    num_heldout = max(1, round(len(files) * heldout_fraction))
    corpus = Corpus(
        roots=roots,
        train_files=sorted(files[num_heldout:]),
        heldout_files=sorted(files[:num_heldout]),
        file_list_sha256="",
    )
    lines = "".join(f"{path}\t{os.path.getsize(corpus.absolute(path))}\n" for path in sorted(files))
    return Corpus(roots, corpus.train_files, corpus.heldout_files, hashlib.sha256(lines.encode()).hexdigest())

"""Kernel tests: on a machine without CUDA the Triton kernels run under Triton's CPU
interpreter, which must be switched on before a module defining @triton.jit kernels is
imported (sgl_kernel imports them lazily, on first use)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    from sgl_kernel._interpreter import interpreting

    return "cpu" if interpreting() else "cuda"

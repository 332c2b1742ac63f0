"""The watch for Triton compiles while serving (model_executor/kernel_compiles.py) and the packed
host-to-device copies whose views keep every kernel pointer 16-byte aligned (utils.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from sglang.srt.model_executor.kernel_compiles import KernelCompileWatch
from sglang.srt.utils import host_to_device_rows


def test_compiles_before_serving_are_counted_and_after_are_reported(caplog, monkeypatch):
    watch = KernelCompileWatch()
    clock = iter([0.0, 0.4, 1.0, 1.7, 2.0, 2.001])
    monkeypatch.setattr("sglang.srt.model_executor.kernel_compiles.time.perf_counter", lambda: next(clock))
    watch.started("_extend_kernel[BLOCK_M=16]")
    watch.finished("_extend_kernel[BLOCK_M=16]")
    assert watch.summary()["kernel_compiles"] == 1
    assert watch.summary()["kernel_compiles_while_serving"] == 0
    watch.mark_serving()
    with caplog.at_level(logging.WARNING):
        watch.started("_rotary_store_kernel[loc: *i64]")
        watch.finished("_rotary_store_kernel[loc: *i64]")  # 0.7 s: warned about
        watch.started("_rmsnorm_kernel")
        watch.finished("_rmsnorm_kernel")  # 1 ms, a load from Triton's disk cache: counted only
    summary = watch.summary()
    assert summary["kernel_compiles"] == 3 and summary["kernel_compiles_while_serving"] == 2
    assert summary["kernel_compile_seconds_while_serving"] == pytest.approx(0.701)
    assert summary["kernels_compiled_while_serving"] == ["_rotary_store_kernel[loc: *i64]", "_rmsnorm_kernel"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0.70 s" in warnings[0] and "_rotary_store_kernel" in warnings[0]


def test_install_hooks_triton_and_keeps_hooks_already_there(monkeypatch):
    from triton import knobs

    calls = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: calls.append(("cache", kw["repr"])))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: calls.append(("done", kw["repr"])))
    watch = KernelCompileWatch()
    watch.install()
    watch.install()  # once only: a second install must not wrap the watch's own hooks
    watch.mark_serving()
    assert (
        knobs.runtime.jit_cache_hook(
            key=1, repr="k", fn=None, compile={}, is_manual_warmup=False, already_compiled=False
        )
        is None
    ), "a true value would skip the compile"
    knobs.runtime.jit_post_compile_hook(
        key=1, repr="k", fn=None, compile={}, is_manual_warmup=False, already_compiled=False
    )
    assert calls == [("cache", "k"), ("done", "k")]
    assert watch.summary()["kernels_compiled_while_serving"] == ["k"]


@pytest.mark.parametrize("dtype, itemsize", [(None, 8), (torch.int32, 4), (torch.float32, 4), (torch.bfloat16, 2)])
def test_packed_rows_keep_their_values_and_start_16_byte_aligned(dtype, itemsize):
    """Views at offsets that follow the rows' lengths would flip Triton's alignment
    specialization from batch to batch (a recompile each time a new combination appears)."""
    for lengths in ([1, 1, 1, 1], [3, 5, 2], [7, 0, 9, 1, 16], [256, 257]):
        rows = [[(i * 31 + j) % 97 for j in range(n)] for i, n in enumerate(lengths)]
        views = host_to_device_rows(rows, "cpu", dtype)
        base = min(v.data_ptr() for v in views if v.numel()) if any(lengths) else 0
        for view, row in zip(views, rows):
            assert view.tolist() == pytest.approx(row) and view.is_contiguous()
            assert view.element_size() == itemsize
            assert (view.data_ptr() - base) % 16 == 0, (lengths, row)

"""The KV pool's buffers on the CPU: zero-filled as torch.zeros makes them, in any KV dtype, each
page written only when a request writes it, and private to the process (a forked child's writes
stay in the child)."""

from __future__ import annotations

import os

import pytest
import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_cpu_buffers_are_zeros_of_the_dtype_and_shape(dtype):
    buffer = zeros((9, 4, 64), dtype, "cpu")
    assert buffer.dtype == dtype and buffer.shape == (9, 4, 64) and buffer.is_contiguous()
    assert torch.equal(buffer.float(), torch.zeros(9, 4, 64))
    buffer[3] = 1
    assert buffer.float().sum() == 4 * 64
    assert zeros((0, 4), dtype, "cpu").shape == (0, 4)


def test_a_pools_buffers_outlive_the_pool_and_hold_what_was_written():
    pool = MHATokenToKVPool(100, torch.float32, 4, 64, 2, "cpu")
    key = pool.k_buffer[1]
    pool.set_kv_buffer(1, torch.tensor([7]), torch.ones(1, 4, 64), torch.full((1, 4, 64), 2.0))
    del pool
    assert key.shape == (101, 4, 64) and key[7].sum() == 4 * 64 and key.sum() == 4 * 64


def test_a_large_pool_costs_only_the_pages_written():
    """65,536 tokens of the demo model's KV (1.3 GB): resident memory grows by what is written."""

    def resident_bytes() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = resident_bytes()
    pool = MHATokenToKVPool(65536, torch.float32, 4, 64, 10, "cpu")
    pool.set_kv_buffer(0, torch.arange(16), torch.ones(16, 4, 64), torch.ones(16, 4, 64))
    assert resident_bytes() - before < 64 << 20
    assert pool.k_buffer[0][:16].sum() == 16 * 4 * 64 and pool.k_buffer[9].sum() == 0


def test_a_forked_childs_writes_stay_in_the_child():
    buffer = zeros((1024, 4), torch.float32, "cpu")
    pid = os.fork()
    if pid == 0:
        buffer[5] = 1
        os._exit(0 if buffer.sum() == 4 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert buffer.sum() == 0

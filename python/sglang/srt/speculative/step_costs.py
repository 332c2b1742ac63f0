"""What each decode step shape of the EAGLE-3 worker costs, measured at start-up by replaying its
graphs on the scratch row: the cost policy's prior (cost_model.CostTable)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time

import torch

from sglang.srt.model_executor.cuda_graph_runner import graph_batch_sizes
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.utils import fastest_call

logger = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 120.0  # wait for another server on the device to finish measuring, at most


def measure_step_costs(worker, repeats: int = 3) -> dict:
    """Seconds per plain step and per step of each reachable k, at every graph bucket (or eagerly
    at batch size 1 without graphs), on the scratch row and padding slot 0, so no request's state
    is touched: {"plain": {bs: s}, "spec": {(bs, k): s}, "context": {k: s per context token}}.
    Servers on one device measure one at a time (device_lock)."""
    with device_lock(_device_key(worker)):
        costs = {
            (bs, k): _seconds_per_call(worker, _step(worker, bs, k), repeats)
            for bs in graph_batch_sizes(worker.model_runner) or [1]
            for k in [0, *worker.reachable_steps]
        }
        plain = {bs: seconds for (bs, k), seconds in costs.items() if k == 0}
        spec = {key: seconds for key, seconds in costs.items() if key[1] > 0}
        return {"plain": plain, "spec": spec, "context": _context_seconds_per_token(worker)}


def _step(worker, bs: int, k: int):
    """One step of k drafts (0: plain) of `bs` scratch rows: its whole-step graph's replay, else eager."""
    graphs = worker.step_graphs.get(k)
    if graphs is not None and bs <= graphs.max_bs:
        return lambda: graphs.replay([worker.scratch_row] * bs, [0] * (bs * (k + 1)))
    rows = torch.full((bs,), worker.scratch_row, dtype=torch.int64, device=worker.device)
    slots = torch.zeros(bs * (k + 1), dtype=torch.int64, device=worker.device)  # slot 0: the padding slot
    info = SamplingBatchInfo.greedy(bs, worker.vocab_size, worker.device)
    return (lambda: worker.spec_body(rows, slots, k, info)) if k else (lambda: worker.plain_body(rows, slots, info))


def _context_seconds_per_token(worker) -> dict[int, float]:
    """What one token of context adds to a step of each k, from the KV bytes its attention reads at
    the measured copy bandwidth: the target's once, the draft's once per draft forward."""
    seconds_per_byte = 1.0 / _copy_bandwidth(worker)
    target, draft = worker.model_runner.token_to_kv_pool.token_bytes, worker.draft_runner.token_to_kv_pool.token_bytes
    draft_passes = {0: int(worker.draft_sync == "warm"), **{k: k + 1 for k in worker.reachable_steps}}
    return {k: (target + passes * draft) * seconds_per_byte for k, passes in draft_passes.items()}


def _copy_bandwidth(worker) -> float:
    """Bytes per second moved (read + written) by a device copy of 64 MiB (past L2; 16 MiB on the CPU)."""
    nbytes = 1 << 26 if worker.device == "cuda" else 1 << 24
    src = torch.empty(nbytes, dtype=torch.uint8, device=worker.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / fastest_call(worker.device, lambda: dst.copy_(src), repeats=10)


def _seconds_per_call(worker, run, repeats: int) -> float:
    scratch = torch.tensor([worker.scratch_row], device=worker.device)

    def once():
        worker.next_start.index_fill_(0, scratch, 0)  # the scratch row's steps start at position 0
        run()

    once()  # warm-up
    return fastest_call(worker.device, once, repeats)


def _device_key(worker) -> str:
    if worker.device != "cuda":
        return worker.device
    index = torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"cuda-{uuid or index}"


@contextlib.contextmanager
def device_lock(key: str, timeout_s: float = LOCK_TIMEOUT_S):
    """Held while a server measures its step costs, so that servers starting together on one device
    do not time each other's kernels: an flock on a temp file named by the device, waited for up
    to `timeout_s`; past that, or where the file cannot be opened, measured without it, logged."""
    path = os.path.join(tempfile.gettempdir(), f"sglang-step-costs-{key}.lock")
    try:
        handle = open(path, "a")
    except OSError as e:  # e.g. another user's lock file
        logger.warning("cannot open %s (%s): measuring step costs without it", path, e)
        yield
        return
    with handle:
        if not _flock_within(handle, timeout_s):
            logger.warning(
                "another server held %s for over %.0f s: measuring step costs without it "
                "(the table may read slow where both ran at once)",
                path,
                timeout_s,
            )
        yield  # closing the file releases the lock


def _flock_within(handle, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

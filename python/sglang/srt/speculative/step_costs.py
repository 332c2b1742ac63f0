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
from sglang.srt.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Each cost is the fastest of this many timed batches: other servers starting on the device slow
# some batches (four 8B servers started together read batch 256's plain step as 21.5 ms).
TRIALS = 3
LOCK_TIMEOUT_S = 120.0  # wait for another server on the device to finish measuring, at most


def measure_step_costs(worker, repeats: int = 3) -> dict:
    """Seconds per plain step and per step of each reachable k, at every graph bucket (or eagerly
    at batch size 1 without graphs), on the scratch row and padding slot 0, so no request's state
    is touched: {"plain": {bs: s}, "spec": {(bs, k): s}, "context": {k: s per context token}}.
    Servers on one device measure one at a time (device_lock)."""
    with device_lock(_device_key(worker)):
        return _measure(worker, repeats)


def _measure(worker, repeats: int) -> dict:
    sizes = graph_batch_sizes(worker.model_runner) or [1]
    plain: dict[int, float] = {}
    spec: dict[tuple[int, int], float] = {}
    for bs in sizes:
        rows = torch.full((bs,), worker.scratch_row, dtype=torch.int64, device=worker.device)
        info = SamplingBatchInfo.from_params(
            [SamplingParams(temperature=0)] * bs, [0] * bs, worker.vocab_size, worker.device
        )
        row_ids = [worker.scratch_row] * bs
        graphs = worker.step_graphs.get(0)
        if graphs is not None and graphs.can_run(bs, True, False):
            run = lambda: graphs.replay(row_ids, [0] * bs)  # noqa: E731
        else:
            run = lambda: worker.plain_body(rows, _padding_slots(worker, bs), info)  # noqa: E731
        plain[bs] = _seconds_per_call(worker, run, repeats)
        for k in worker.reachable_steps:
            slots = _padding_slots(worker, bs * (k + 1))
            graphs = worker.step_graphs.get(k)
            if graphs is not None and graphs.can_run(bs, True, False):
                run = lambda: graphs.replay(row_ids, [0] * (bs * (k + 1)))  # noqa: E731
            else:
                run = lambda: worker.spec_body(rows, slots, k, info)  # noqa: E731
            spec[(bs, k)] = _seconds_per_call(worker, run, repeats)
    return {"plain": plain, "spec": spec, "context": _context_seconds_per_token(worker)}


def _padding_slots(worker, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64, device=worker.device)  # slot 0: the padding slot


def _context_seconds_per_token(worker) -> dict[int, float]:
    """What one token of context adds to a step of each k, from the KV bytes its attention reads at
    the measured copy bandwidth: the target's once, the draft's once per draft forward."""

    def kv_bytes(runner) -> int:
        pool = runner.token_to_kv_pool
        return len(pool.k_buffer) * 2 * pool.k_buffer[0][0].numel() * pool.k_buffer[0].element_size()

    seconds_per_byte = 1.0 / _copy_bandwidth(worker)
    target, draft = kv_bytes(worker.model_runner), kv_bytes(worker.draft_runner)
    plain_draft = draft if worker.draft_sync == "warm" else 0
    return {
        0: (target + plain_draft) * seconds_per_byte,
        **{k: (target + (k + 1) * draft) * seconds_per_byte for k in worker.reachable_steps},
    }


def _copy_bandwidth(worker, nbytes: int = 1 << 26, repeats: int = 10) -> float:
    """Bytes per second moved (read + written) by a device copy of `nbytes` (64 MiB: past L2)."""
    if worker.device != "cuda":
        nbytes = 1 << 24
    src = torch.empty(nbytes, dtype=torch.uint8, device=worker.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / fastest_call(worker.device, lambda: dst.copy_(src), repeats)


def _seconds_per_call(worker, run, repeats: int) -> float:
    scratch = torch.tensor([worker.scratch_row], device=worker.device)

    def once():
        worker.next_start.index_fill_(0, scratch, 0)  # the scratch row's steps start at position 0
        run()

    once()  # warm-up
    return fastest_call(worker.device, once, repeats)


def fastest_call(device: str, call, repeats: int, trials: int = TRIALS) -> float:
    """Seconds per call of `call`, from the fastest of `trials` timed batches of `repeats` calls."""
    best = float("inf")
    for _ in range(trials):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _device_key(worker) -> str:
    if worker.device != "cuda":
        return worker.device
    index = torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"cuda-{uuid or index}"


@contextlib.contextmanager
def device_lock(key: str, timeout_s: float | None = None):
    """Held while a server measures its step costs, so that servers starting together on one device
    do not time each other's kernels: an flock on a temp file named by the device, waited for up
    to `timeout_s`; past that, or where the file cannot be opened, measured without it, logged."""
    timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    path = os.path.join(tempfile.gettempdir(), f"sglang-step-costs-{key}.lock")
    try:
        handle = open(path, "a")
    except OSError as e:  # e.g. another user's lock file
        logger.warning("cannot open %s (%s): measuring step costs without it", path, e)
        yield
        return
    with handle:
        locked = _flock_within(handle, timeout_s)
        if not locked:
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

"""Rank 0 drives, the other ranks mirror its forwards (tensor parallelism).

Only rank 0 runs a scheduler: it admits requests, chooses each step (prefill or decode, plain or
speculative with k drafts) and samples. Every other rank runs `follow`: it builds the same model
runners when rank 0 builds them, and runs each forward rank 0 runs, on its shard of the weights and
KV heads, so that the collectives inside the sharded layers meet. A forward's inputs travel from
rank 0 at the start of `ModelRunner.forward`: the host fields pickled over the command group, the
tensors broadcast over the TP group, and the request-table rows the forward reads (the followers'
tables are written only here). Logits are gathered on every rank; only rank 0 reads them.

Commands, in the order rank 0 issues them:
- ("runner", model_config, kwargs, target_id): build ModelRunner(model_config, server_args,
  **kwargs), with target = the runner with that id (a draft), or none. Runners are numbered in the
  order they are announced.
- ("forward", runner_id, host_fields, tensor_specs, rows_shape): receive the tensors, write the
  rows, run the forward.
- ("stop",): leave the loop.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.distributed.parallel_state import broadcast_command, broadcast_tensor, tensor_parallel
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Set by the ModelRunner (or a graph runner: output buffers) before each forward, never sent.
_LOCAL_FIELDS = ("req_to_token_pool", "token_to_kv_pool", "attn_backend", "logits_out", "aux_hidden_out")
# Runner ids per TP group (a process that joins a new group numbers from 0 again).
_runner_ids: dict[int, itertools.count] = {}


class LeaderGone(Exception):
    """Rank 0's process is gone (the server stopped or failed): a follower has nothing left to do."""


def drives() -> bool:
    """Whether this process is rank 0 of a tensor-parallel group (the one that must announce)."""
    tp = tensor_parallel()
    return tp.size > 1 and tp.rank == 0


def announce_runner(model_config, kwargs: dict, target_id: Optional[int]) -> int:
    """Rank 0: the other ranks build the same runner now. Returns its id."""
    broadcast_command(("runner", model_config, kwargs, target_id))
    return next(_runner_ids.setdefault(id(tensor_parallel().command_group), itertools.count()))


def send_forward(runner_id: int, batch: ForwardBatch, req_to_token_pool: "ReqToTokenPool") -> None:
    """Rank 0: the other ranks run this forward with rank 0's inputs."""
    host, specs, tensors = {}, [], []
    for field in dataclasses.fields(ForwardBatch):
        if field.name in _LOCAL_FIELDS:
            continue
        value = getattr(batch, field.name)
        if isinstance(value, torch.Tensor):
            specs.append((field.name, tuple(value.shape), value.dtype))
            tensors.append(value.contiguous())
        else:
            host[field.name] = value
    # The rows up to the longest sequence: every slot the forward's attention reads. An overlapped
    # step does not know its lengths on the host, so it waits for the device here (under TP only).
    width = max(batch.seq_lens_cpu) if batch.seq_lens_cpu else int(batch.seq_lens.max()) if batch.batch_size else 0
    rows = req_to_token_pool.req_to_token[batch.req_pool_indices, :width].contiguous()
    broadcast_command(("forward", runner_id, host, specs, (tuple(rows.shape), rows.dtype)))
    for tensor in tensors + [rows]:
        broadcast_tensor(tensor)


def stop() -> None:
    """Rank 0: the other ranks leave `follow`."""
    if drives():
        broadcast_command(("stop",))


def follow(server_args, make_runner, ready=None) -> None:
    """A rank other than 0: mirror rank 0's runners and forwards until rank 0 says stop.
    make_runner(model_config, server_args, target, **kwargs) builds a ModelRunner; `ready()` is
    called once, at the first forward (the runners are built by then)."""
    runners: list["ModelRunner"] = []
    device = server_args.device
    while True:
        try:
            command = broadcast_command()
        except RuntimeError as e:  # gloo's error when the peer's connection closes
            raise LeaderGone(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
        kind = command[0]
        if kind == "stop":
            return
        if kind == "runner":
            _, model_config, kwargs, target_id = command
            target = runners[target_id] if target_id is not None else None
            runners.append(make_runner(model_config, server_args, target, **kwargs))
        elif kind == "forward":
            if ready is not None:
                ready, call = None, ready
                call()
            _, runner_id, host, specs, (rows_shape, rows_dtype) = command
            runner = runners[runner_id]
            tensors = {
                name: broadcast_tensor(torch.empty(shape, dtype=dtype, device=device)) for name, shape, dtype in specs
            }
            rows = broadcast_tensor(torch.empty(rows_shape, dtype=rows_dtype, device=device))
            batch = ForwardBatch(**host, **tensors)
            runner.req_to_token_pool.req_to_token[batch.req_pool_indices, : rows_shape[1]] = rows
            runner.forward_eager(batch)
        else:
            raise RuntimeError(f"tensor parallelism: unknown command {kind!r} from rank 0")

"""Overlap scheduling with speculation, in-process: the scheduler launches speculative step
N + 1 before it has processed step N (before the accepted lengths reach the host), and the
output and KV accounting are those of the serial schedule, including when requests finish or
are aborted while a step is in flight."""

from __future__ import annotations

from sglang import demo
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.server_fixture import assert_idle_kv_accounting

PROMPTS = [[5, 17, 300, 41, 9, 77], [12, 13, 14], list(range(100, 140)), [2000, 1999, 7, 7, 7]]


def run(overlap: bool, abort_at_step: int | None = None):
    args = ServerArgs(dtype="float32", device="cpu", speculative_algorithm="EAGLE3", speculative_num_steps=3,
                      disable_overlap_schedule=not overlap)
    scheduler = Scheduler(args)
    events = []
    launch = scheduler.tp_worker.forward_batch_generation

    def recorded(batch):
        in_flight = scheduler.in_flight
        events.append(("launch", batch.forward_mode, in_flight is not None and in_flight[0].forward_mode.is_decode()))
        return launch(batch)

    scheduler.tp_worker.forward_batch_generation = recorded
    for i, ids in enumerate(PROMPTS):
        params = SamplingParams(max_new_tokens=[7, 30, 45, 2][i], temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    outputs, step = {}, 0
    while scheduler.has_work():
        if step == abort_at_step:
            scheduler.abort_request(AbortReq("r2"))
        out = scheduler.step()
        step += 1
        for rid, ids, reason in zip(out.rids, out.new_token_ids, out.finished_reasons) if out else ():
            outputs.setdefault(rid, {"ids": [], "reason": None})["ids"].extend(ids)
            outputs[rid]["reason"] = reason
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return outputs, events


def test_speculative_steps_are_launched_before_the_previous_one_is_processed():
    serial, serial_events = run(overlap=False)
    overlapped, events = run(overlap=True)
    assert overlapped == serial
    assert not any(pipelined for _, _, pipelined in serial_events)
    decode_launches = [pipelined for _, mode, pipelined in events if mode == ForwardMode.DECODE]
    # After the first decode step, every speculative step goes out while its predecessor is in flight.
    assert sum(decode_launches) >= len(decode_launches) - 2 > 5
    assert [len(serial[f"r{i}"]["ids"]) for i in range(4)] == [7, 30, 45, 2]


def test_abort_while_a_speculative_step_is_in_flight_keeps_the_accounting():
    serial, _ = run(overlap=False, abort_at_step=6)
    overlapped, _ = run(overlap=True, abort_at_step=6)
    assert overlapped["r2"]["reason"]["type"] == "abort"
    for rid in ("r0", "r1", "r3"):  # the others are untouched
        assert overlapped[rid] == serial[rid]

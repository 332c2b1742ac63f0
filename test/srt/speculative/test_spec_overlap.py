"""Overlap scheduling with speculation, in-process: the scheduler launches speculative step
N + 1 before it has processed step N (before the accepted lengths reach the host), and the
output and KV accounting are those of the serial schedule, including when requests finish or
are aborted while a step is in flight."""

from __future__ import annotations

import pytest

from sglang import demo
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion
from sglang.test.server_fixture import assert_idle_kv_accounting
from sglang.test.tiny_models import make_tiny_eagle3_draft

PROMPTS = [[5, 17, 300, 41, 9, 77], [12, 13, 14], list(range(100, 140)), [2000, 1999, 7, 7, 7]]
# The requests hold under 200 tokens of KV: a pool of 4096 (the CPU default, 65536, takes ~2 s to
# allocate per scheduler on the demo pair, and these tests build a dozen).
MAX_TOTAL_TOKENS = 4096


def run(overlap: bool, abort_at_step: int | None = None):
    args = ServerArgs(
        dtype="float32",
        device="cpu",
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        disable_overlap_schedule=not overlap,
        max_total_tokens=MAX_TOTAL_TOKENS,
    )
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

    def abort(step):
        if step == abort_at_step:
            scheduler.abort_request(AbortReq("r2"))

    outputs = run_to_completion(scheduler, abort)
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


def run_switching(overlap: bool, choose):
    """Like `run`, with the scheduler's per-step choice of draft tokens replaced by `choose`."""
    args = ServerArgs(
        dtype="float32",
        device="cpu",
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        disable_overlap_schedule=not overlap,
        max_total_tokens=MAX_TOTAL_TOKENS,
    )
    scheduler = Scheduler(args)
    steps = []

    def chosen(running_reqs):
        steps.append(choose(len(steps)))
        return steps[-1]

    scheduler.spec.plan_step = chosen
    for i, ids in enumerate(PROMPTS):
        params = SamplingParams(max_new_tokens=[7, 30, 45, 2][i], temperature=0, ignore_eos=True)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    outputs = {rid: out["ids"] for rid, out in run_to_completion(scheduler).items()}
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    return outputs, steps, state


def test_switching_between_plain_and_speculative_steps_keeps_the_output():
    """Every step may be plain (k = 0) or speculate with any k up to the maximum: the draft's
    state after a plain step is the state after a speculative one, so greedy output is plain
    decoding's whatever the sequence of choices."""
    reference, _ = run(overlap=False)
    expected = {rid: out["ids"] for rid, out in reference.items()}
    patterns = {
        "alternate": lambda i: 3 * (i % 2),
        "plain_runs": lambda i: 0 if i % 5 < 3 else 3,
        "every_k": lambda i: [0, 1, 2, 3][i % 4],
    }
    states = {}
    for name, choose in patterns.items():
        for overlap in (False, True):
            outputs, steps, state = run_switching(overlap, choose)
            assert outputs == expected, (name, overlap)
            assert 0 in steps and 3 in steps
            assert state["spec_plain_steps"] > 0 and state["spec_steps"] > 0
            states[name, overlap] = state
    # After plain steps the draft still predicts as well as in steady speculation.
    _, _, always = run_switching(False, lambda i: 3)
    alternating = states["alternate", False]
    assert alternating["avg_spec_accept_length"] > 0.8 * always["avg_spec_accept_length"]


def test_a_draft_that_does_not_fit_the_target_is_refused_clearly(tiny_model_paths, tmp_path):
    target = tiny_model_paths["llama"]
    cases = [
        (make_tiny_eagle3_draft(str(tmp_path / "two_aux"), target, aux_layer_ids=[0, 1]), "must be 3 layers"),
        (make_tiny_eagle3_draft(str(tmp_path / "deep_aux"), target, aux_layer_ids=[0, 1, 9]), "must be 3 layers"),
        (demo.DRAFT_PATH, "vocab_size"),  # made for another model
        (target, "LlamaForCausalLMEagle3"),  # not a draft at all
    ]
    for draft, message in cases:
        args = ServerArgs(
            model_path=target,
            dtype="float32",
            device="cpu",
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=draft,
        )
        with pytest.raises(ValueError, match=message):
            Scheduler(args)

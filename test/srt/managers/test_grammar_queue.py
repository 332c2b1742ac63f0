"""Requests waiting for their grammar: they wait beside the queue while everybody else is served
(the compile threads are held busy here, so the wait is certain), count as queued, finish with
the grammar's answer once it compiles, can be aborted while they wait; a compile error or a
server without a grammar backend finishes the request with an error naming the field."""

from __future__ import annotations

import json
import re
import threading

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.server_fixture import assert_idle_kv_accounting
from transformers import AutoTokenizer

REGEX = r"[a-z]{2,5}"


def scheduler_for(path: str, **kwargs) -> Scheduler:
    return Scheduler(ServerArgs(model_path=path, dtype="float32", device="cpu", **kwargs))


def add(scheduler: Scheduler, rid: str, **params) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0, **params)
    scheduler.add_request(TokenizedGenerateReqInput(rid, [5, 6, 7, 8], params, stream=False))


def step_until(scheduler: Scheduler, done, outputs: dict, limit: int = 500) -> None:
    for _ in range(limit):
        if done():
            return
        out = scheduler.step()
        for rid, ids, reason in zip(out.rids, out.new_token_ids, out.finished_reasons) if out else ():
            entry = outputs.setdefault(rid, {"ids": [], "reason": None})
            entry["ids"].extend(ids)
            entry["reason"] = reason
    raise AssertionError("the scheduler did not get there")


def test_a_request_waiting_for_its_grammar_does_not_hold_others_up(tiny_model_paths):
    scheduler = scheduler_for(tiny_model_paths["llama"])
    backend = scheduler.grammar_queue.backend
    release = threading.Event()
    busy = [backend.pool.submit(release.wait) for _ in range(backend.threads)]
    outputs: dict = {}
    try:
        add(scheduler, "constrained", regex=REGEX)
        add(scheduler, "aborted", json_schema=json.dumps({"type": "object"}))
        add(scheduler, "free", ignore_eos=True)
        step_until(scheduler, lambda: outputs.get("free", {}).get("reason") is not None, outputs)
        assert len(outputs["free"]["ids"]) == 12 and "constrained" not in outputs
        assert scheduler.get_internal_state()["num_queue_reqs"] == 2  # the two waiting for a grammar
        scheduler.abort_request(AbortReq("aborted"))
    finally:
        release.set()
        for future in busy:
            future.result()
    step_until(scheduler, lambda: not scheduler.has_work(), outputs)
    assert outputs["aborted"]["reason"]["type"] == "abort"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_paths["llama"])
    text = tokenizer.decode(outputs["constrained"]["ids"], skip_special_tokens=True)
    assert re.fullmatch(REGEX, text) and outputs["constrained"]["reason"]["type"] == "stop"
    assert_idle_kv_accounting(scheduler.get_internal_state())


def test_grammar_errors_and_a_server_without_a_backend_name_the_field(tiny_model_paths):
    outputs: dict = {}
    scheduler = scheduler_for(tiny_model_paths["llama"])
    add(scheduler, "bad", regex="a[")  # the front end refuses it; the scheduler must not trust that
    step_until(scheduler, lambda: not scheduler.has_work(), outputs)
    assert outputs["bad"]["reason"]["type"] == "abort" and "regex" in outputs["bad"]["reason"]["message"]
    scheduler = scheduler_for(tiny_model_paths["llama"], grammar_backend="none")
    assert scheduler.grammar_queue.backend is None
    add(scheduler, "none", ebnf='root ::= "a"')
    step_until(scheduler, lambda: not scheduler.has_work(), outputs)
    assert outputs["none"]["reason"]["status_code"] == 400
    assert "--grammar-backend none" in outputs["none"]["reason"]["message"]

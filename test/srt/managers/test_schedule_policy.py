"""A prefill step's budget (PrefillAdder) and the decode reserve of the running requests: the
bound that stands in for the exact reserve when memory is plentiful must admit exactly what the
exact reserve admits, and the exact one must still be used when memory is short."""

from __future__ import annotations

import random
from types import SimpleNamespace

from sglang.srt.managers import schedule_policy
from sglang.srt.managers.schedule_policy import (DECODE_RESERVE_MAX, PrefillAdder, decode_reserve,
                                                 running_decode_reserve)


def fake_req(rng: random.Random, prompt: int, max_new: int, out: int = 0):
    return SimpleNamespace(seq_len=prompt + out, kv_len=0, output_ids=[0] * out, extend_len=0,
                           sampling_params=SimpleNamespace(max_new_tokens=max_new))


def admitted(waiting, available_kv, budget, free_running, reserve) -> int:
    adder = PrefillAdder(budget, available_kv - reserve, free_running, running_reserve=reserve)
    n = 0
    for req in waiting:
        if not adder.try_add(req):
            break
        n += 1
    return n


def test_the_bound_admits_what_the_exact_reserve_admits_and_short_memory_takes_the_exact():
    rng = random.Random(0)
    used_bound = used_exact = 0
    for trial in range(400):
        running = [fake_req(rng, rng.randint(1, 600), rng.randint(1, 900), rng.randint(0, 300)) for _ in range(rng.randint(0, 64))]
        waiting = [fake_req(rng, rng.randint(1, 700), rng.randint(1, 900)) for _ in range(rng.randint(1, 20))]
        budget, free_running = rng.choice([512, 2048, 8192]), rng.randint(0, 24)
        free_slots = rng.randint(0, 40000)
        exact = sum(decode_reserve(r) for r in running)
        reserve = running_decode_reserve(running, free_slots, budget, free_running)
        if reserve == exact:
            used_exact += 1
        else:
            used_bound += 1
            assert reserve == len(running) * DECODE_RESERVE_MAX > exact
        # Every request of the waiting list admitted under the one is admitted under the other.
        for req in waiting:
            req.kv_len = 0
        a = admitted(waiting, free_slots, budget, free_running, reserve)
        for req in waiting:
            req.kv_len = 0
        b = admitted(waiting, free_slots, budget, free_running, exact)
        assert a == b, f"trial {trial}: {a} admitted with the reserve used, {b} with the exact one"
    assert used_bound > 50 and used_exact > 50  # both regimes were exercised


def test_plentiful_memory_never_walks_the_running_requests(monkeypatch):
    calls = []
    monkeypatch.setattr(schedule_policy, "decode_reserve", lambda req: calls.append(req) or 7)
    running = [object()] * 256
    assert running_decode_reserve(running, 10_000_000, 8192, 64) == 256 * DECODE_RESERVE_MAX and not calls
    assert running_decode_reserve(running, 30_000, 8192, 64) == 256 * 7 and len(calls) == 256

"""A prefill step's budget (PrefillAdder) and the decode reserve of the running requests: the
bound that stands in for the exact reserve when memory is plentiful must admit exactly what the
exact reserve admits, and the exact one must still be used when memory is short. Admission
batching's rules and timing (AdmissionBatcher), with the clock given."""

from __future__ import annotations

import random
from collections import deque
from types import SimpleNamespace

from sglang.srt.managers import schedule_policy
from sglang.srt.managers.schedule_policy import (
    DECODE_RESERVE_MAX,
    AdmissionBatcher,
    PrefillAdder,
    decode_reserve,
    running_decode_reserve,
)


def fake_req(rng: random.Random, prompt: int, max_new: int, out: int = 0):
    return SimpleNamespace(
        seq_len=prompt + out,
        kv_len=0,
        output_ids=[0] * out,
        extend_len=0,
        sampling_params=SimpleNamespace(max_new_tokens=max_new),
    )


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
        running = [
            fake_req(rng, rng.randint(1, 600), rng.randint(1, 900), rng.randint(0, 300))
            for _ in range(rng.randint(0, 64))
        ]
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


def waiting_reqs(n: int, tokens: int = 100) -> deque:
    return deque(SimpleNamespace(seq_len=tokens) for _ in range(n))


def test_admission_batcher_times_decode_steps_and_what_a_pass_adds_to_them():
    batcher = AdmissionBatcher(max_steps=8, token_budget=2048)
    for t in (0.0, 1.0, 2.0):
        batcher.launched(64, is_decode=True, num_waiting=0, num_running=64, now=t)
    assert batcher.step_seconds == 1.0 and batcher.pass_seconds == 0.0
    batcher.launched(2, is_decode=False, num_waiting=2, num_running=64, now=2.1)
    batcher.launched(66, is_decode=True, num_waiting=0, num_running=66, now=5.0)
    assert batcher.pass_seconds == 2.0, "the gap of 3 is one step and one pass"
    # A pass while nothing decoded (the server was idle before it) is not timed.
    batcher.launched(1, is_decode=False, num_waiting=1, num_running=0, now=100.0)
    batcher.launched(1, is_decode=True, num_waiting=0, num_running=1, now=200.0)
    assert batcher.pass_seconds == 2.0 and batcher.step_seconds == 1.0
    assert batcher.summary()["num_prefill_passes"] == 2 and batcher.summary()["mean_reqs_per_prefill_pass"] == 1.5


def test_admission_batcher_holds_arrivals_only_while_the_wait_costs_less_than_a_pass():
    batcher = AdmissionBatcher(max_steps=8, token_budget=2048)
    batcher.step_seconds, batcher.pass_seconds = 1.0, 2.0
    one = waiting_reqs(1)
    assert batcher.defer(one, 64, now=10.0)  # waited 0, the next step ends at 1 <= 2
    assert batcher.defer(one, 64, now=11.0)  # waited 1, ends at 2
    assert not batcher.defer(one, 64, now=11.5)  # would end at 2.5, past one pass
    assert not batcher.defer(deque(), 64, now=12.0)  # the queue emptied: the next arrival starts anew
    assert batcher.defer(one, 64, now=20.0)
    assert not batcher.defer(waiting_reqs(4), 64, now=20.0), "4 waiting for 64 running: 1/16, enough"
    assert not batcher.defer(waiting_reqs(16), 1000, now=20.0), "16 waiting fill the largest prefill graph"
    assert not batcher.defer(waiting_reqs(2, 1024), 64, now=20.0), "2048 tokens fill a pass"
    assert not batcher.defer(one, 31, now=20.0), "below 32 running, nobody waits"
    unmeasured = AdmissionBatcher(max_steps=8, token_budget=2048)
    assert not unmeasured.defer(one, 64, now=0.0), "no pass timed yet: no reason to wait"


def test_a_pass_takes_more_requests_only_while_a_prefill_graph_still_fits():
    """pass_fits: graphs of up to 2 requests and 100 tokens. The first request is taken whatever
    its size; later ones only while the pass still fits; without graphs (None) nothing is capped."""
    rng = random.Random(1)
    fits = lambda n, t: n <= 2 and t <= 100  # noqa: E731
    big_first = PrefillAdder(8192, 10**6, 10, pass_fits=fits)
    assert big_first.try_add(fake_req(rng, 150, 10)) and not big_first.try_add(fake_req(rng, 5, 10))
    small = PrefillAdder(8192, 10**6, 10, pass_fits=fits)
    assert [small.try_add(fake_req(rng, 30, 10)) for _ in range(3)] == [True, True, False]
    over_tokens = PrefillAdder(8192, 10**6, 10, pass_fits=fits)
    assert [over_tokens.try_add(fake_req(rng, 60, 10)) for _ in range(2)] == [True, False]
    no_graphs = PrefillAdder(8192, 10**6, 10, pass_fits=lambda n, t: None)
    assert all(no_graphs.try_add(fake_req(rng, 60, 10)) for _ in range(5))


def test_fair_order_lets_each_client_request_take_turns():
    def reqs(group, count):
        return [SimpleNamespace(group=group, name=f"{group}{i}") for i in range(count)]

    big, small, other = reqs("big", 4), reqs("small", 1), reqs("other", 2)
    names = lambda order: [r.name for r in order]  # noqa: E731
    # Two of big's sequences already run: the later arrivals go first, then turns by count.
    assert names(schedule_policy.fair_order(big + small + other, reqs("big", 2))) == [
        "small0",
        "other0",
        "other1",
        "big0",
        "big1",
        "big2",
        "big3",
    ]
    assert names(schedule_policy.fair_order(big + small, [])) == ["big0", "small0", "big1", "big2", "big3"]
    unique = reqs("a", 1) + reqs("b", 1) + reqs("c", 1)
    assert schedule_policy.fair_order(unique, []) == unique  # nobody fans out: arrival order


def test_the_adder_names_what_kept_the_next_request_out():
    """The prefill pass's debug line says why the pass stopped growing."""

    def req(n, rid):
        return fake_req(random.Random(0), n, max_new=4)

    adder = PrefillAdder(token_budget=100, available_kv=1000, free_running_slots=8)
    assert adder.try_add(req(60, "a")) and adder.limit == "waiting queue"
    assert adder.try_add(req(60, "b"))  # a first chunk of 40 tokens: the budget is spent
    assert not adder.try_add(req(10, "c")) and adder.limit == "token budget"
    adder = PrefillAdder(token_budget=100, available_kv=30, free_running_slots=8)
    assert not adder.try_add(req(60, "d")) and adder.limit == "KV memory"
    adder = PrefillAdder(token_budget=100, available_kv=1000, free_running_slots=1)
    assert adder.try_add(req(10, "e")) and not adder.try_add(req(10, "f")) and adder.limit == "running requests"
    adder = PrefillAdder(token_budget=100, available_kv=1000, free_running_slots=8, pass_fits=lambda reqs, n: reqs < 2)
    assert adder.try_add(req(10, "g")) and not adder.try_add(req(10, "h")) and adder.limit == "prefill graphs"

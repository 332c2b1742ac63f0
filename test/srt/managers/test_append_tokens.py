"""Req.append_tokens (a speculative step's tokens in one call) finishes a request exactly where
appending them one at a time would: at a stop token past min_new_tokens, at max_new_tokens, or
at the context length, whichever comes first, with the same reason and the same outputs."""

from __future__ import annotations

import random

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams


def make_req(rng: random.Random) -> Req:
    params = SamplingParams(max_new_tokens=rng.randint(1, 12), min_new_tokens=rng.choice([0, 0, 2, 5]),
                            stop_token_ids=rng.sample(range(20), rng.randint(0, 3)), ignore_eos=rng.random() < 0.5)
    prompt = [rng.randrange(20) for _ in range(rng.randint(1, 6))]
    return Req("r", prompt, params, 0, False, eos_token_ids={0}, context_len=len(prompt) + rng.randint(1, 14))


def test_append_tokens_matches_appending_one_at_a_time():
    rng = random.Random(0)
    finished_by = {"stop": 0, "length": 0}
    for case in range(3000):
        state = rng.getstate()
        one, many = make_req(rng), None
        rng.setstate(state)
        many = make_req(rng)
        steps = [[rng.randrange(20) for _ in range(4)] for _ in range(6)]
        for tokens in steps:
            if one.finished():
                break
            n = rng.randint(1, 4)
            taken = 0
            for token_id in tokens[:n]:
                one.append_token(token_id)
                taken += 1
                if one.finished():
                    break
            assert many.append_tokens(tokens, n) == taken, case
            assert many.output_ids == one.output_ids and many.finished_reason == one.finished_reason, case
        if one.finished():
            finished_by[one.finished_reason["type"]] += 1
    assert min(finished_by.values()) > 100, finished_by  # both kinds of finish were exercised

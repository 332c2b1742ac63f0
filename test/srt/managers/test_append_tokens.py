"""Req.append_tokens (a speculative step's tokens in one call; append_token is one of them)
finishes a request where the rules say, token by token: at a stop token once past
min_new_tokens, at max_new_tokens, or at the context length, whichever comes first, with that
reason; the tokens after it are not taken."""

from __future__ import annotations

import random

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams


def make_req(rng: random.Random) -> Req:
    params = SamplingParams(
        max_new_tokens=rng.randint(1, 12),
        min_new_tokens=rng.choice([0, 0, 2, 5]),
        stop_token_ids=rng.sample(range(8), rng.randint(0, 3)),
        ignore_eos=rng.random() < 0.5,
    )
    prompt = [rng.randrange(20) for _ in range(rng.randint(1, 6))]
    return Req("r", prompt, params, 0, False, eos_token_ids={0}, context_len=len(prompt) + rng.randint(1, 14))


def reference_finish(req: Req, outputs: list[int]):
    """The finish rules, applied to the output list after one more token (None: not finished)."""
    token_id, count = outputs[-1], len(outputs)
    if token_id in req.stop_token_ids and count > req.sampling_params.min_new_tokens:
        return {"type": "stop", "matched": token_id}
    if count >= req.sampling_params.max_new_tokens:
        return {"type": "length", "length": req.sampling_params.max_new_tokens}
    if len(req.origin_input_ids) + count >= req.context_len:
        return {"type": "length", "length": count}
    return None


def test_append_tokens_finishes_where_the_rules_say():
    rng = random.Random(0)
    finished_by = {"stop": 0, "length": 0}
    for case in range(3000):
        req = make_req(rng)
        outputs, reason = [], None
        steps = [[rng.randrange(8) for _ in range(4)] for _ in range(6)]
        for step, tokens in enumerate(steps):
            if reason is not None:
                break
            n = rng.randint(1, 4)
            taken = 0
            for token_id in tokens[:n]:
                outputs.append(token_id)
                taken += 1
                reason = reference_finish(req, outputs)
                if reason is not None:
                    break
            if step % 2 and n == 1:  # append_token is the one-token case
                req.append_token(tokens[0])
                assert taken == 1, case
            else:
                assert req.append_tokens(tokens, n) == taken, case
            assert req.output_ids == outputs and req.finished_reason == reason, case
        if reason is not None:
            finished_by[reason["type"]] += 1
    assert min(finished_by.values()) > 100, finished_by  # both kinds of finish were exercised

"""logit_bias on a speculative server: the target's logits get each request's bias at every verify
position and in the plain step, so greedy speculation with a bias gives plain decoding's biased
tokens, a request without a bias in the same batch keeps its own, and sampled speculation still
draws from the biased distribution. Scheduler-level, on the demo pair (CPU)."""

from __future__ import annotations

import pytest

from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.server_fixture import assert_idle_kv_accounting

PROMPTS = [[205, 300, 1100, 52, 9], [17, 905, 33], [640, 12, 12, 77, 1500, 8]]
SPEC = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=demo.DRAFT_PATH, speculative_num_steps=3)
MAX_NEW = 24


def run(spec: dict | None, biases: dict[int, dict], temperature: float = 0.0) -> dict[str, list[int]]:
    """Each prompt as one request (seeded), request i with logit_bias biases.get(i); {rid: ids}."""
    kwargs = dict(SPEC, **spec) if spec is not None else {}
    scheduler = Scheduler(
        ServerArgs(model_path=demo.TARGET_PATH, dtype="float32", device="cpu", max_total_tokens=4096, **kwargs)
    )
    for i, ids in enumerate(PROMPTS):
        params = SamplingParams(
            max_new_tokens=MAX_NEW,
            temperature=temperature,
            ignore_eos=True,
            sampling_seed=100 + i,
            logit_bias=biases.get(i),
        )
        params.verify(scheduler.model_config.vocab_size)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    tokens = {}
    while scheduler.has_work():
        out = scheduler.step()
        for j, rid in enumerate(out.rids if out else ()):
            tokens.setdefault(rid, []).extend(out.new_token_ids[j])
    assert_idle_kv_accounting(scheduler.get_internal_state())
    return tokens


def ban_first_tokens(plain: dict[str, list[int]], i: int) -> dict:
    """A bias that bans the first few tokens plain decoding gives request i (so speculation has
    drafts to reject at several positions), as JSON would send it."""
    return {str(token): -100 for token in dict.fromkeys(plain[f"r{i}"][:4])}


@pytest.mark.parametrize("policy", ["always", "never"])
def test_biased_greedy_speculation_equals_biased_plain_decoding(policy):
    unbiased = run(None, {})
    biases = {0: ban_first_tokens(unbiased, 0), 2: ban_first_tokens(unbiased, 2)}
    plain = run(None, biases)
    assert plain["r0"] != unbiased["r0"] and plain["r2"] != unbiased["r2"]
    assert not set(plain["r0"]) & {int(t) for t in biases[0]}
    # r1 carries no bias and keeps its own tokens, in both runs.
    assert run(dict(speculative_policy=policy), biases) == plain
    assert plain["r1"] == unbiased["r1"]


def test_biased_sampling_under_speculation_follows_the_bias():
    # A +100 bias all but forces its token at temperature 1: verify_sampled must see it too.
    forced = 1234
    spec = run(dict(speculative_policy="always"), {1: {forced: 100}}, temperature=1.0)
    assert spec["r1"] == [forced] * MAX_NEW
    assert forced not in spec["r0"] or spec["r0"].count(forced) < MAX_NEW

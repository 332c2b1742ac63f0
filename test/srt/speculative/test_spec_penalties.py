"""Penalties on a speculative server: a penalized request speculates, its verify positions
penalized as plain decoding would be after the drafts before them and its kept tokens counted, so
greedy output equals a server without a draft; one that opts out takes plain decoding's tokens,
sampled too. Scheduler-level, on the demo pair (CPU)."""

from __future__ import annotations

import pytest

from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.eagle_worker_v2 import _graph_sampling
from sglang.test.runner_utils import run_counting_verifies
from sglang.test.server_fixture import assert_idle_kv_accounting

PROMPTS = [[205, 300, 1100, 52, 9], [17, 905, 33], [640, 12, 12, 77, 1500, 8]]
SPEC = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=demo.DRAFT_PATH, speculative_num_steps=3)
MAX_NEW = 24
PENALTIES = {0: {"presence_penalty": 1.5, "frequency_penalty": 0.5}, 2: {"repetition_penalty": 1.8}}


def run(spec: dict | None, penalties: dict[int, dict], temperature: float = 0.0) -> tuple[dict, dict, dict]:
    """Each prompt as one request (seeded), request i with the penalties penalties.get(i).
    Returns ({rid: ids}, {rid: its verify steps}, the scheduler's final state)."""
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
            **penalties.get(i, {}),
        )
        params.verify(scheduler.model_config.vocab_size)
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    tokens, verifies = run_counting_verifies(scheduler)
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    return tokens, verifies, state


@pytest.mark.parametrize(
    "spec",
    [
        dict(speculative_policy="always"),
        dict(speculative_policy="never"),
        dict(speculative_policy="always", speculative_draft_sync="catch-up"),
    ],
)
def test_penalized_greedy_requests_speculate_and_give_plain_decodings_tokens(spec):
    """The verify penalizes each position as plain decoding would after the drafts before it, and
    the kept tokens are counted: greedy output equals a server without a draft, penalized, while
    the penalized requests verify drafts like their neighbours."""
    unpenalized, _, _ = run(None, {})
    plain, _, _ = run(None, PENALTIES)
    assert plain["r0"] != unpenalized["r0"] and plain["r2"] != unpenalized["r2"], "the penalties matter here"
    tokens, verifies, state = run(spec, PENALTIES)
    assert tokens == plain
    if spec["speculative_policy"] == "always":
        assert verifies["r0"] > 0 and verifies["r2"] > 0 and verifies["r1"] > 0
        assert state["spec_prompts_without_draft"] == 0


def test_penalized_requests_that_opt_out_sample_as_plain_decoding():
    """Sampled, a penalized request that opts out of speculation takes plain decoding's very
    tokens inside the speculative steps of its batch (its penalties at position 0, its token
    counted); a penalized request that speculates gets its full output."""
    opted = {i: {**p, "disable_speculative_decoding": True} for i, p in PENALTIES.items()}
    plain, _, _ = run(None, PENALTIES, temperature=0.8)
    assert plain["r0"] != run(None, {}, temperature=0.8)[0]["r0"], "the penalties matter here"
    tokens, verifies, _ = run(dict(speculative_policy="always"), opted, temperature=0.8)
    assert tokens["r0"] == plain["r0"] and tokens["r2"] == plain["r2"]
    assert verifies["r0"] == verifies["r2"] == 0 and verifies["r1"] > 0
    speculated, verifies, _ = run(dict(speculative_policy="always"), PENALTIES, temperature=0.8)
    assert all(len(ids) == MAX_NEW for ids in speculated.values()) and verifies["r0"] > 0


def test_penalized_batches_skip_the_whole_step_graphs():
    class Req:
        def __init__(self, **params):
            self.sampling_params = SamplingParams(temperature=0, **params)

    assert _graph_sampling([Req(), Req(repetition_penalty=1.0)])
    assert not _graph_sampling([Req(), Req(presence_penalty=0.5)])
    assert not _graph_sampling([Req(repetition_penalty=1.1)])

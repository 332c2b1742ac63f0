"""Per-request opt-out of speculation (`disable_speculative_decoding`): such a request never
speculates, also inside the speculative steps of a batch it shares with others: it takes one
token a step, exactly the token plain decoding gives it (greedy, and seeded sampling), verifies
nothing (spec_verify_ct 0), and does not feed the acceptance estimate; a batch of only such
requests decodes plainly. Through /generate and the OpenAI routes (an extra body field)."""

from __future__ import annotations

import httpx
import pytest

from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.acceptance import AcceptanceEstimator
from sglang.srt.speculative.cost_model import CostTable
from sglang.srt.speculative.cost_policy import CostPolicy
from sglang.srt.speculative.spec_policy import make_policy
from sglang.test.runner_utils import run_counting_verifies
from sglang.test.server_fixture import ServerProcess, assert_idle_kv_accounting

PROMPTS = [[205, 300, 1100, 52, 9], [17, 905, 33], [640, 12, 12, 77, 1500, 8], [99, 100]]
SPEC = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=demo.DRAFT_PATH, speculative_num_steps=3)


def run(spec: dict | None, opted: set[int], temperature: float = 0.0, policy: str = "always"):
    """Each prompt as one request (seeded); returns ({i: ids}, {i: spec_verify_ct}, state)."""
    kwargs = dict(SPEC, speculative_policy=policy, **(spec or {})) if spec is not None else {}
    # The requests hold under 200 tokens of KV: a pool of 4096 (the CPU default, 65536, takes ~2 s to
    # allocate per scheduler on the demo pair).
    scheduler = Scheduler(
        ServerArgs(model_path=demo.TARGET_PATH, dtype="float32", device="cpu", max_total_tokens=4096, **kwargs)
    )
    for i, ids in enumerate(PROMPTS):
        params = SamplingParams(
            max_new_tokens=40,
            temperature=temperature,
            top_k=8,
            ignore_eos=True,
            sampling_seed=100 + i,
            disable_speculative_decoding=i in opted,
        )
        scheduler.add_request(TokenizedGenerateReqInput(f"r{i}", ids, params, stream=False))
    tokens, verifies = run_counting_verifies(scheduler)
    state = scheduler.get_internal_state()
    assert_idle_kv_accounting(state)
    return tokens, verifies, state


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_opted_out_requests_decode_as_plain_decoding_inside_speculative_steps(temperature):
    plain, _, _ = run(None, set(), temperature)
    spec, verifies, state = run({}, {1, 3}, temperature)
    # Opted out: plain decoding's tokens (the same seeded draws), no verify steps.
    assert spec["r1"] == plain["r1"] and spec["r3"] == plain["r3"]
    assert verifies["r1"] == verifies["r3"] == 0
    # The others speculated in the same steps (k = 3: the `always` policy); once they were done,
    # the opted-out two decoded plainly.
    assert verifies["r0"] < 40 and verifies["r2"] < 40
    assert state["spec_steps_by_k"]["3"] >= max(verifies["r0"], verifies["r2"]) and state["spec_steps_by_k"]["0"] > 0
    if temperature == 0.0:  # greedy speculation is token-identical to plain decoding as well
        assert spec["r0"] == plain["r0"] and spec["r2"] == plain["r2"]
    # The accept-length stats count the requests that verified only.
    assert state["spec_verifies"] == verifies["r0"] + verifies["r2"]


def test_a_batch_of_opted_out_requests_decodes_plainly():
    _, verifies, state = run({}, {0, 1, 2, 3}, policy="always")
    assert set(verifies.values()) == {0} and state["spec_steps_by_k"] == {"0": state["spec_plain_steps"]}


def test_policies_count_opted_out_requests_as_one_token_a_step():
    assert make_policy("always", 3).choose([], num_plain_only=4) == 0
    threshold = make_policy("threshold", 3, threshold=2)
    assert threshold.choose(["a"], num_plain_only=1) == 3 and threshold.choose(["a"], num_plain_only=2) == 0
    cost = CostTable({1: 0.010, 8: 0.011}, {(1, 3): 0.012, (8, 3): 0.030})
    policy = CostPolicy([0, 3], cost, AcceptanceEstimator(3, prior=0.9))
    # One request at a = 0.9 gains 3.4 tokens for 20% more time alone; beside 7 opted-out
    # requests the step costs 8 rows' time (2.7x plain) for 2.4 more tokens out of 8.
    assert policy.objective(["a"], [0, 3])[3] > policy.objective(["a"], [0, 3])[0]
    assert policy.objective(["a"], [0, 3], num_plain_only=7)[3] < policy.objective(["a"], [0, 3], num_plain_only=7)[0]


@pytest.fixture(scope="module")
def server():
    server = ServerProcess(
        demo.TARGET_PATH, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--skip-server-warmup"
    )
    yield server
    server.stop()


def test_generate_and_openai_routes_take_the_opt_out(server):
    body = {
        "text": "def fibonacci(n):",
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": 32,
            "ignore_eos": True,
            "disable_speculative_decoding": True,
        },
    }
    out = httpx.post(f"{server.base_url}/generate", json=body, timeout=120).json()
    assert out["meta_info"]["completion_tokens"] == 32 and out["meta_info"]["spec_verify_ct"] == 0
    body["sampling_params"]["disable_speculative_decoding"] = False
    assert httpx.post(f"{server.base_url}/generate", json=body, timeout=120).json()["text"] == out["text"]
    completion = httpx.post(
        f"{server.base_url}/v1/completions",
        timeout=120,
        json={
            "model": demo.TARGET_PATH,
            "prompt": "def fibonacci(n):",
            "max_tokens": 32,
            "temperature": 0,
            "ignore_eos": True,
            "disable_speculative_decoding": True,
        },
    ).json()
    assert "choices" in completion, completion
    assert completion["choices"][0]["text"] == out["text"]
    bad = httpx.post(
        f"{server.base_url}/generate",
        timeout=30,
        json={"text": "x", "sampling_params": {"disable_speculative_decoding": "yes"}},
    )
    assert bad.status_code == 400 and "disable_speculative_decoding" in bad.text

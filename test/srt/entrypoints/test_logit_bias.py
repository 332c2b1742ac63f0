"""logit_bias (OpenAI's semantics) on a server without a draft: a token id -> bias in [-100, 100]
added to its logit before sampling (and before the greedy argmax) at every output position;
through sglang.Engine, /generate and the OpenAI routes; bad maps are 400s naming logit_bias; a
request without a bias is untouched by a biased neighbour in its batch; a grammar still forbids
what it forbids."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from sglang.test.server_fixture import generate, generated_ids, openai_client

PROMPT_IDS = [37, 120, 5, 88, 201]
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
FORCED = 150  # a token of the tiny tokenizer the model does not pick by itself


@pytest.fixture
def model(tiny_model_paths) -> str:
    return tiny_model_paths["llama"]  # the name the server serves


def test_large_positive_bias_makes_the_token_the_output(server):
    assert FORCED not in generated_ids(server, PROMPT_IDS, GREEDY)
    assert generated_ids(server, PROMPT_IDS, {**GREEDY, "logit_bias": {str(FORCED): 100}}) == [FORCED] * 6
    # Sampling too: +100 leaves every other token a probability of about e^-100.
    sampled = {**GREEDY, "temperature": 1.0, "sampling_seed": 7, "logit_bias": {str(FORCED): 100}}
    assert generated_ids(server, PROMPT_IDS, sampled) == [FORCED] * 6


def test_banning_the_greedy_token_changes_the_output(server):
    plain = generated_ids(server, PROMPT_IDS, GREEDY)
    banned = generated_ids(server, PROMPT_IDS, {**GREEDY, "logit_bias": {str(plain[0]): -100}})
    assert banned[0] != plain[0] and plain[0] not in banned
    # An empty map and null are neutral.
    assert generated_ids(server, PROMPT_IDS, {**GREEDY, "logit_bias": {}}) == plain
    assert generated_ids(server, PROMPT_IDS, {**GREEDY, "logit_bias": None}) == plain


def test_engine_completions_and_chat_give_the_biased_tokens(server, engine_pool, tiny_model_paths, model):
    bias = {str(FORCED): 100}
    expected = generated_ids(server, PROMPT_IDS, {**GREEDY, "logit_bias": bias})
    engine = engine_pool.get("llama")
    assert (
        engine.generate(input_ids=PROMPT_IDS, sampling_params={**GREEDY, "logit_bias": {FORCED: 100}})["output_ids"]
        == expected
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_paths["llama"])
    client = openai_client(server)
    completion = client.completions.create(
        model=model, prompt=PROMPT_IDS, max_tokens=6, temperature=0, logit_bias=bias, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].text == tokenizer.decode(expected)
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        logit_bias=bias,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.content == tokenizer.decode([FORCED] * 6)


@pytest.mark.parametrize(
    "bias, rule",
    [
        ({"abc": 1}, "integers"),
        ({"1.5": 1}, "integers"),
        ({"100000000": 1}, "token ids must be in [0, "),
        ({"-1": 1}, "token ids must be in [0, "),
        ({"5": 100.5}, "[-100, 100]"),
        ({"5": -101}, "[-100, 100]"),
        ({"5": "x"}, "numbers"),
        ({"5": None}, "numbers"),
    ],
)
def test_bad_logit_bias_is_a_400_naming_it(server, model, bias, rule):
    response = generate(server, PROMPT_IDS, {**GREEDY, "logit_bias": bias})
    assert response.status_code == 400 and "logit_bias" in response.text and rule in response.text
    if bias == {"5": "x"} or bias == {"5": None}:
        return  # the OpenAI models type the values as numbers: their own 400 names the field
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        openai_client(server).completions.create(model=model, prompt=PROMPT_IDS, max_tokens=2, logit_bias=bias)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        openai_client(server).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, logit_bias=bias
        )


def test_unbiased_request_keeps_its_tokens_beside_a_biased_one(engine_pool):
    engine = engine_pool.get("llama")
    other = [9, 44, 310]
    alone = engine.generate(input_ids=other, sampling_params=GREEDY)["output_ids"]
    biased_alone = engine.generate(input_ids=PROMPT_IDS, sampling_params={**GREEDY, "logit_bias": {FORCED: 100}})
    together = engine.generate(
        input_ids=[PROMPT_IDS, other], sampling_params=[{**GREEDY, "logit_bias": {FORCED: 100}}, GREEDY]
    )
    assert together[0]["output_ids"] == biased_alone["output_ids"] == [FORCED] * 6
    assert together[1]["output_ids"] == alone


def test_grammar_still_forbids_a_biased_token(server, tiny_model_paths):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_paths["llama"])
    letters = [i for i in range(len(tokenizer)) if tokenizer.decode([i]).isalpha()][:20]
    assert letters
    body = {
        "text": "x",
        "sampling_params": {
            **GREEDY,
            "max_new_tokens": 4,
            "regex": "[0-9]{4}",
            "logit_bias": {str(i): 100 for i in letters},
        },
    }
    response = httpx.post(server.base_url + "/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert re.fullmatch("[0-9]{4}", response.json()["text"])

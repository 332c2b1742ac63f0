"""frequency_penalty, presence_penalty and repetition_penalty on a server without a draft: over the
tokens a request has generated (not its prompt, as upstream SGLang), at every output position,
after the grammar mask and before logit_bias, temperature and the greedy argmax; token for token
equal to a reference computed here from transformers' logits (overlap scheduling on, as by
default); through sglang.Engine, /generate and the OpenAI routes; a request without penalties is
untouched by a penalized neighbour; n > 1 samples count their own tokens; bad values are 400s
naming the field."""

from __future__ import annotations

from collections.abc import Mapping

import openai
import pytest
import torch
from transformers import AutoTokenizer

from sglang.srt.layers.sampler import gumbel_noise
from sglang.test.server_fixture import generate, generated_ids, openai_client, server_state

PROMPT_IDS = [37, 120, 5, 88, 201]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


def reference(hf_reference, prompt: list[int], params: dict) -> list[int]:
    """The tokens the parameters ask for, one transformers forward per step: the penalties over the
    output so far (frequency and presence subtracted, then repetition's scaling of tokens seen),
    then logit_bias, then the greedy argmax or, with a temperature, Gumbel-max with the engine's
    counter-based noise for (seed, output position)."""
    out = []
    for position in range(params["max_new_tokens"]):
        logits = hf_reference.next_token_logits("llama", prompt + out)
        counts = torch.bincount(torch.tensor(out, dtype=torch.int64), minlength=logits.shape[-1]).float()
        seen = counts > 0
        logits = logits - params.get("frequency_penalty", 0) * counts - params.get("presence_penalty", 0) * seen
        repetition = params.get("repetition_penalty", 1.0)
        logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
        for token, bias in params.get("logit_bias", {}).items():
            logits[int(token)] += bias
        if params["temperature"] > 0:
            noise = gumbel_noise(torch.tensor([params["sampling_seed"]]), torch.tensor([position]), logits.shape[-1])
            logits = logits / params["temperature"] + noise[0]
        out.append(int(torch.argmax(logits)))
    return out


@pytest.fixture
def model(tiny_model_paths) -> str:
    return tiny_model_paths["llama"]  # the name the server serves


def test_penalties_change_greedy_repetition_as_predicted(server):
    plain = generated_ids(server, PROMPT_IDS, GREEDY)
    assert len(set(plain)) < len(plain), "the tiny model repeats tokens under greedy decoding"
    assert plain[3] == plain[0]
    # A presence or frequency penalty of 2 outweighs the model's margins here: no token comes twice.
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalized = generated_ids(server, PROMPT_IDS, {**GREEDY, **penalty})
        assert penalized[:3] == plain[:3], "nothing is penalized before a token repeats"
        assert len(set(penalized)) == len(penalized), penalty
    # repetition_penalty 2 halves the first token's positive logit once it was generated; 0.5 doubles
    # it, and the output keeps coming back to it. The prompt's tokens are not penalized.
    halved = generated_ids(server, PROMPT_IDS, {**GREEDY, "repetition_penalty": 2.0})
    assert halved[:3] == plain[:3] and halved[3] != plain[0]
    doubled = generated_ids(server, PROMPT_IDS, {**GREEDY, "repetition_penalty": 0.5})
    assert doubled.count(plain[0]) > len(doubled) // 2
    # Neutral values and nulls change nothing.
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1}
    assert generated_ids(server, PROMPT_IDS, {**GREEDY, **neutral}) == plain
    assert generated_ids(server, PROMPT_IDS, {**GREEDY, **{name: None for name in neutral}}) == plain


@pytest.mark.parametrize(
    "params",
    [
        {"frequency_penalty": 0.6},
        {"presence_penalty": 1.1},
        {"repetition_penalty": 1.4},
        {"repetition_penalty": 0.7, "frequency_penalty": -0.5},
        # All three with a bias on a token the model likes: the bias is added after the penalties.
        {"frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.6, "logit_bias": {"248": 1.5}},
        {"temperature": 0.6, "sampling_seed": 1, "presence_penalty": 0.8, "repetition_penalty": 1.3},
    ],
)
def test_penalized_tokens_equal_the_reference(engine_pool, hf_reference, params):
    params = {**GREEDY, **params}
    expected = reference(hf_reference, PROMPT_IDS, params)
    assert expected != reference(
        hf_reference, PROMPT_IDS, {**params, "frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1.0}
    ), "the penalty matters here"
    engine = engine_pool.get("llama")
    assert engine.generate(input_ids=PROMPT_IDS, sampling_params=params)["output_ids"] == expected


def test_unpenalized_request_keeps_its_tokens_beside_penalized_ones(engine_pool):
    engine = engine_pool.get("llama")
    others = [[9, 44, 310], [100, 7]]
    penalties = [{"presence_penalty": 1.5}, {"repetition_penalty": 1.7, "frequency_penalty": 0.4}]
    alone = [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in others]
    penalized_alone = [
        engine.generate(input_ids=PROMPT_IDS, sampling_params={**GREEDY, **p})["output_ids"] for p in penalties
    ]
    together = engine.generate(
        input_ids=[PROMPT_IDS, others[0], PROMPT_IDS, others[1]],
        sampling_params=[{**GREEDY, **penalties[0]}, GREEDY, {**GREEDY, **penalties[1]}, GREEDY],
    )
    assert [out["output_ids"] for out in together] == [penalized_alone[0], alone[0], penalized_alone[1], alone[1]]


def test_each_of_n_samples_counts_its_own_tokens(engine_pool):
    engine = engine_pool.get("llama")
    params = {**GREEDY, "presence_penalty": 1.2, "frequency_penalty": 0.3}
    single = engine.generate(input_ids=PROMPT_IDS, sampling_params=params)["output_ids"]
    # Greedy samples are alike only if each is penalized by its own output alone.
    samples = engine.generate(input_ids=PROMPT_IDS, sampling_params={**params, "n": 3})
    assert [out["output_ids"] for out in samples] == [single] * 3


def test_stop_tokens_and_min_new_tokens_cut_the_same_penalized_output(engine_pool):
    engine = engine_pool.get("llama")
    params = {**GREEDY, "presence_penalty": 2.0}
    full = engine.generate(input_ids=PROMPT_IDS, sampling_params=params)["output_ids"]
    stop = full[5]
    stopped = engine.generate(input_ids=PROMPT_IDS, sampling_params={**params, "stop_token_ids": [stop]})
    assert stopped["output_ids"] == full[:6] and stopped["meta_info"]["finish_reason"]["matched"] == stop
    # Past min_new_tokens the stop token would have to come again, which the penalty prevents.
    late = engine.generate(
        input_ids=PROMPT_IDS, sampling_params={**params, "stop_token_ids": [stop], "min_new_tokens": 8}
    )
    assert late["output_ids"] == full


def test_openai_routes_pass_the_penalties_through(server, tiny_model_paths, model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_paths["llama"])
    penalties = {"frequency_penalty": 0.6, "presence_penalty": 0.9}
    client = openai_client(server)
    expected = generated_ids(server, PROMPT_IDS, {**GREEDY, **penalties, "repetition_penalty": 1.5})
    assert expected != generated_ids(server, PROMPT_IDS, GREEDY)
    completion = client.completions.create(
        model=model,
        prompt=PROMPT_IDS,
        max_tokens=24,
        temperature=0,
        **penalties,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.5},
    )
    assert completion.choices[0].text == tokenizer.decode(expected)
    messages = [{"role": "user", "content": "hi"}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    chat_ids = list(chat_ids["input_ids"] if isinstance(chat_ids, Mapping) else chat_ids)  # transformers 5
    expected_chat = generated_ids(server, chat_ids, {**GREEDY, "max_new_tokens": 12, **penalties})
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0, **penalties, extra_body={"ignore_eos": True}
    )
    assert chat.choices[0].message.content == tokenizer.decode(expected_chat, skip_special_tokens=True)


@pytest.mark.parametrize(
    "field, value, rule",
    [
        ("frequency_penalty", 2.5, "[-2, 2]"),
        ("presence_penalty", -3, "[-2, 2]"),
        ("repetition_penalty", 0, "(0, 2]"),
        ("repetition_penalty", 2.5, "(0, 2]"),
    ],
)
def test_out_of_range_penalty_is_refused_naming_it(server, engine_pool, model, field, value, rule):
    response = generate(server, PROMPT_IDS, {**GREEDY, field: value})
    assert response.status_code == 400 and field in response.text and rule in response.text, response.text
    completion_args = {field: value} if field != "repetition_penalty" else {"extra_body": {field: value}}
    with pytest.raises(openai.BadRequestError, match=field):
        openai_client(server).completions.create(model=model, prompt=PROMPT_IDS, max_tokens=2, **completion_args)
    with pytest.raises(openai.BadRequestError, match=field):
        openai_client(server).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **completion_args
        )
    with pytest.raises(ValueError, match=field):
        engine_pool.get("llama").generate(input_ids=PROMPT_IDS, sampling_params={**GREEDY, field: value})


def test_no_rows_are_held_once_requests_finish(server):
    generated_ids(server, PROMPT_IDS, {**GREEDY, "presence_penalty": 1.0})
    state = server_state(server)
    assert state["penalty_rows"] == 0 and state["penalty_rows_capacity"] == 0

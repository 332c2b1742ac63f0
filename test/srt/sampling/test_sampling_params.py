"""SamplingParams: upstream defaults, JSON type checks and range checks."""

import dataclasses

import pytest

from sglang.srt.sampling.sampling_params import SamplingParams

UPSTREAM_DEFAULTS = {
    "max_new_tokens": 128,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "stop": None,
    "stop_token_ids": None,
    "ignore_eos": False,
    "min_new_tokens": 0,
    "n": 1,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "sampling_seed": None,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
}
# Ours, beside upstream's: a request's opt-out of speculative decoding (issue 8).
OUR_DEFAULTS = {"disable_speculative_decoding": False, "simulated_accept_length": None}


def test_defaults_match_upstream():
    assert dataclasses.asdict(SamplingParams()) == {**UPSTREAM_DEFAULTS, **OUR_DEFAULTS}


def test_defaults_pass_verify():
    SamplingParams().verify(vocab_size=10)
    SamplingParams.from_dict(None).verify()
    SamplingParams.from_dict({}).verify()


def test_from_dict_reads_every_field():
    params = SamplingParams.from_dict(
        {
            "max_new_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "stop": ["a", "b"],
            "stop_token_ids": [2],
            "ignore_eos": True,
            "sampling_seed": 9,
        }
    )
    assert params.max_new_tokens == 7 and params.top_k == 3 and params.sampling_seed == 9
    assert params.temperature == 0.0 and isinstance(params.temperature, float)
    assert params.stop == ["a", "b"] and params.stop_token_ids == [2] and params.ignore_eos


def test_from_dict_null_means_default():
    params = SamplingParams.from_dict({"temperature": None, "stop": None})
    assert params.temperature == 1.0 and params.stop == []


def test_from_dict_unknown_key_is_named():
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams.from_dict({"best_of": 2})


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("temperature", "hot", "number"),
        ("temperature", float("inf"), "finite number"),
        ("max_new_tokens", 1.5, "integer"),
        ("top_k", True, "integer"),
        ("top_p", [0.5], "number"),
        ("ignore_eos", 1, "boolean"),
        ("stop", 3, "string"),
        ("stop", ["a", 1], "string"),
        ("stop_token_ids", [1, "2"], "list of integers"),
        ("stop_token_ids", 5, "list of integers"),
        ("sampling_seed", 1.0, "integer"),
        ("logit_bias", [1], "object"),
    ],
)
def test_from_dict_wrong_type_names_field_and_type(field, value, expected):
    with pytest.raises(ValueError, match=field) as excinfo:
        SamplingParams.from_dict({field: value})
    assert expected in str(excinfo.value)


def test_ints_accepted_for_float_fields():
    params = SamplingParams.from_dict({"temperature": 2, "top_p": 1, "min_p": 0})
    assert params.temperature == 2.0 and params.top_p == 1.0


@pytest.mark.parametrize(
    "kwargs, field, rule",
    [
        ({"max_new_tokens": -1}, "max_new_tokens", ">= 0"),
        ({"min_new_tokens": -1}, "min_new_tokens", "[0, max_new_tokens"),
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens", "[0, max_new_tokens=4]"),
        ({"temperature": -0.1}, "temperature", "[0, 2]"),
        ({"temperature": float("nan")}, "temperature", "[0, 2]"),
        ({"temperature": 1e308}, "temperature", "[0, 2]"),  # the same bound as the OpenAI routes
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.01}, "top_p", "(0, 1]"),
        ({"top_k": 0}, "top_k", ">= 1"),
        ({"top_k": -2}, "top_k", ">= 1"),
        ({"min_p": -0.1}, "min_p", "[0, 1]"),
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"n": 0}, "n", "[1, 64]"),
        ({"n": 65}, "n", "[1, 64]"),
        ({"sampling_seed": -1}, "sampling_seed", "[0, 2**63)"),
        ({"sampling_seed": 2**63}, "sampling_seed", "[0, 2**63)"),
        ({"stop_token_ids": [3, 10]}, "stop_token_ids", "[0, 10)"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "[0, 10)"),
        ({"frequency_penalty": 2.5}, "frequency_penalty", "[-2, 2]"),
        ({"frequency_penalty": -2.01}, "frequency_penalty", "[-2, 2]"),
        ({"presence_penalty": -3}, "presence_penalty", "[-2, 2]"),
        ({"presence_penalty": float("nan")}, "presence_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "(0, 2]"),
        ({"repetition_penalty": -1}, "repetition_penalty", "(0, 2]"),
        ({"repetition_penalty": 2.5}, "repetition_penalty", "(0, 2]"),
    ],
)
def test_verify_rejects_out_of_range(kwargs, field, rule):
    with pytest.raises(ValueError, match=f"'{field}'") as excinfo:
        SamplingParams(**kwargs).verify(vocab_size=10)
    assert rule in str(excinfo.value)


def test_verify_accepts_range_edges():
    SamplingParams(max_new_tokens=0, top_p=1.0, top_k=1, min_p=1.0, temperature=0.0).verify()
    SamplingParams(min_new_tokens=4, max_new_tokens=4, sampling_seed=2**63 - 1).verify()
    SamplingParams(stop_token_ids=[0, 9]).verify(vocab_size=10)


def test_stop_token_ids_unchecked_without_vocab_size():
    SamplingParams(stop_token_ids=[10**9]).verify()


def test_penalties_within_their_ranges_pass():
    SamplingParams(frequency_penalty=-2, presence_penalty=2, repetition_penalty=2).verify()
    SamplingParams(frequency_penalty=0.5, presence_penalty=-0.5, repetition_penalty=1e-3).verify()
    SamplingParams(frequency_penalty=0, repetition_penalty=1, logit_bias={}).verify()


def test_a_request_is_penalized_only_by_a_non_neutral_penalty():
    assert not SamplingParams().penalized
    for penalty in ({"frequency_penalty": 0.1}, {"presence_penalty": -0.1}, {"repetition_penalty": 1.05}):
        assert SamplingParams(**penalty).penalized
    assert not SamplingParams.from_dict(
        {"frequency_penalty": 0, "presence_penalty": None, "repetition_penalty": 1.0}
    ).penalized


def test_logit_bias_takes_string_or_integer_token_ids():
    params = SamplingParams.from_dict({"logit_bias": {"5": 1, "7": -100, "9": 100.0}})
    params.verify(vocab_size=10)
    assert params.token_biases() == {5: 1.0, 7: -100.0, 9: 100.0}
    assert SamplingParams(logit_bias={5: -2.5}).token_biases() == {5: -2.5}
    assert SamplingParams.from_dict({"logit_bias": {" 3 ": 1, "+4": 2}}).token_biases() == {3: 1.0, 4: 2.0}
    assert SamplingParams().token_biases() == {}


@pytest.mark.parametrize(
    "bias, rule",
    [
        ({"a": 1}, "must be token ids (integers)"),
        ({"1.0": 1}, "must be token ids (integers)"),
        ({"": 1}, "must be token ids (integers)"),
        ({"1" * 5000: 1}, "must be token ids (integers)"),
        ({"+-5": 1}, "must be token ids (integers)"),
        ({"--1": 1}, "must be token ids (integers)"),
        ({"+ 5": 1}, "must be token ids (integers)"),
        ({"٥": 1}, "must be token ids (integers)"),  # a digit, but not an ASCII one
        ({"5": True}, "must be finite numbers"),
        ({"5": float("nan")}, "must be finite numbers"),
        ({"10": 1}, "token ids must be in [0, 10), got 10"),
        ({"-1": 1}, "token ids must be in [0, 10), got -1"),
        ({"5": 100.01}, "values must be in [-100, 100]"),
        ({"5": -101}, "values must be in [-100, 100]"),
    ],
)
def test_bad_logit_bias_is_named(bias, rule):
    with pytest.raises(ValueError, match="'logit_bias'") as excinfo:
        SamplingParams.from_dict({"logit_bias": bias}).verify(vocab_size=10)
    assert rule in str(excinfo.value)


@pytest.mark.parametrize(
    "kwargs, greedy",
    [
        ({}, False),
        ({"temperature": 0.0}, True),
        ({"temperature": 1e-7}, True),
        ({"temperature": 1e-5}, False),
        ({"temperature": 5.0, "top_k": 1}, True),
        ({"top_k": 2}, False),
    ],
)
def test_is_greedy(kwargs, greedy):
    assert SamplingParams(**kwargs).is_greedy is greedy


@pytest.mark.parametrize("stop, expected", [(None, []), ("x", ["x"]), (["a", "b"], ["a", "b"])])
def test_normalize_stop_gives_list(stop, expected):
    params = SamplingParams(stop=stop)
    assert params.normalize_stop() == expected
    assert params.stop == expected
    assert SamplingParams.from_dict({"stop": stop}).stop == expected

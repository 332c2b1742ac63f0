"""sglang.Engine against transformers: greedy float32 tokens must be identical."""

from __future__ import annotations

import pytest

from sglang.test.tiny_models import ARCHITECTURES

GREEDY = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
PROMPTS = [
    "def add(a, b):",
    "The quick brown fox jumps over the lazy dog. A radix tree shares",
    "Hello",
    "import torch\nx = torch.zeros(3, 4)\nfor i in range(10):\n    print(i * i)\n# and then",
]


def encode(engine, text: str) -> list[int]:
    return engine.tokenizer_manager.tokenizer.encode(text)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_single_prompt_matches_transformers(engine_pool, hf_reference, arch):
    engine = engine_pool.get(arch)
    out = engine.generate(PROMPTS[1], GREEDY)
    expected = hf_reference.greedy(arch, encode(engine, PROMPTS[1]), 40)
    assert out["output_ids"] == expected
    assert out["meta_info"]["completion_tokens"] == 40
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert out["text"] == engine.tokenizer_manager.tokenizer.decode(expected)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batch_of_different_lengths_matches_transformers(engine_pool, hf_reference, arch):
    engine = engine_pool.get(arch)
    engine.flush_cache()
    outs = engine.generate(PROMPTS, GREEDY)
    assert len(outs) == len(PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        ids = encode(engine, prompt)
        assert out["meta_info"]["prompt_tokens"] == len(ids)
        assert out["output_ids"] == hf_reference.greedy(arch, ids, 40), prompt


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_radix_cache_hit_matches_transformers(engine_pool, hf_reference, arch):
    engine = engine_pool.get(arch)
    engine.flush_cache()
    first = engine.generate(PROMPTS[3], GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    # Same prompt again: all but the last prompt token come from the cache.
    again = engine.generate(PROMPTS[3], GREEDY)
    prompt_len = again["meta_info"]["prompt_tokens"]
    assert again["meta_info"]["cached_tokens"] == prompt_len - 1
    assert again["output_ids"] == first["output_ids"]
    # A longer prompt that extends the first one's prompt and part of its output.
    ids = encode(engine, PROMPTS[3]) + first["output_ids"][:10] + encode(engine, " more")
    extended = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert extended["meta_info"]["cached_tokens"] >= prompt_len + 9
    assert extended["output_ids"] == hf_reference.greedy(arch, ids, 40)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_small_chunked_prefill_matches_transformers(engine_pool, hf_reference, arch):
    engine = engine_pool.get(arch, chunked_prefill_size=5)
    prompts = PROMPTS + [" ".join(PROMPTS)]
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out["output_ids"] == hf_reference.greedy(arch, encode(engine, prompt), 40)


def test_disabled_radix_cache_matches_and_caches_nothing(engine_pool, hf_reference):
    engine = engine_pool.get("llama", disable_radix_cache=True)
    for _ in range(2):
        out = engine.generate(PROMPTS[0], GREEDY)
        assert out["meta_info"]["cached_tokens"] == 0
        assert out["output_ids"] == hf_reference.greedy("llama", encode(engine, PROMPTS[0]), 40)
    assert engine.get_server_info()["internal_state"]["cached_slots"] == 0


def test_output_does_not_depend_on_the_rest_of_the_batch(engine_pool):
    engine = engine_pool.get("qwen2")
    engine.flush_cache()
    alone = engine.generate(PROMPTS[0], GREEDY)["output_ids"]
    engine.flush_cache()
    crowd = engine.generate(PROMPTS[1:] + [PROMPTS[0]] + PROMPTS[1:], GREEDY)
    assert crowd[len(PROMPTS) - 1]["output_ids"] == alone
    # Sampled output with a fixed seed is batch-invariant too.
    sampled = {"temperature": 1.0, "max_new_tokens": 24, "sampling_seed": 7, "ignore_eos": True}
    alone = engine.generate(PROMPTS[2], sampled)["output_ids"]
    crowd = engine.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1]], sampled)
    assert crowd[1]["output_ids"] == alone


def test_stop_token_ids_end_generation_even_with_ignore_eos(engine_pool, hf_reference):
    engine = engine_pool.get("llama")
    ids = encode(engine, PROMPTS[1])
    greedy = hf_reference.greedy("llama", ids, 40)
    # Make the 5th greedy token a stop token: generation ends there, the token is returned.
    stop_id = greedy[4]
    first = greedy.index(stop_id)
    out = engine.generate(
        input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 40, "stop_token_ids": [stop_id]}
    )
    assert out["output_ids"] == greedy[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    ignored = engine.generate(
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 40, "stop_token_ids": [stop_id], "ignore_eos": True},
    )
    # ignore_eos ignores the model's EOS only; explicit stop_token_ids still stop.
    assert ignored["output_ids"] == greedy[: first + 1]


def test_streaming_yields_growing_text_ending_in_the_full_result(engine_pool):
    engine = engine_pool.get("llama")
    chunks = list(engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 12}, stream=True))
    assert len(chunks) >= 2
    for before, after in zip(chunks, chunks[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"]["type"] == "length"
    assert final["output_ids"] == engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 12})["output_ids"]

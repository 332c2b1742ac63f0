"""sglang.Engine with --reasoning-parser: upstream's `require_reasoning` keyword makes a constrained
request's grammar start after its reasoning block (the demo model, prompted to open <think>, writes
a few lines of it and closes it), in generate and async_generate alike; without it the grammar
applies from the first token."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

import sglang
from sglang import demo
from sglang.test.server_fixture import assert_engine_kv_accounting

PROMPT = "<|user|>\nPlan a trip from Paris to Rome.\n<|assistant|>\n<think>\n"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "ok": {"type": "boolean"}},
    "required": ["city", "ok"],
    "additionalProperties": False,
}
PARAMS = {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(SCHEMA)}


@pytest.fixture(scope="module")
def engine():
    engine = sglang.Engine(
        model_path=demo.TARGET_PATH, dtype="float32", device="cpu", log_level="warning", reasoning_parser="deepseek-r1"
    )
    yield engine
    engine.shutdown()


def test_require_reasoning_constrains_the_answer_after_the_block(engine):
    out = engine.generate(PROMPT, PARAMS, require_reasoning=True)
    reasoning, answer = out["text"].split("</think>", 1)
    assert reasoning.startswith("<think>")
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert asyncio.run(engine.async_generate(PROMPT, PARAMS, require_reasoning=True))["text"] == out["text"]
    jsonschema.validate(json.loads(engine.generate(PROMPT, PARAMS)["text"]), SCHEMA)
    assert_engine_kv_accounting(engine)

"""Tensor parallelism over NCCL: two GPUs give one GPU's greedy tokens (float32), plain and with the
demo pair's EAGLE-3 draft deciding step by step; on one GPU, --tp-size 2 is refused."""

from __future__ import annotations

import pytest
import torch

import sglang
from sglang import demo
from sglang.srt.server_args import ServerArgs

GREEDY = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\ndef main(",
    "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n",
]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism needs 2 GPUs")


def greedy_ids(tp_size: int, **kwargs) -> list[list[int]]:
    engine = sglang.Engine(
        model_path=demo.TARGET_PATH,
        device="cuda",
        dtype="float32",
        tp_size=tp_size,
        max_total_tokens=1 << 15,
        log_level="warning",
        **kwargs,
    )
    try:
        return [out["output_ids"] for out in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()


@two_gpus
@pytest.mark.parametrize(
    "spec", [{}, {"speculative_algorithm": "EAGLE3", "speculative_adaptive": True}], ids=["plain", "eagle3-adaptive"]
)
def test_two_gpus_give_one_gpus_greedy_tokens(spec):
    assert greedy_ids(2, **spec) == greedy_ids(1)


def test_more_ranks_than_gpus_is_refused():
    visible = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"--tp-size {visible + 1} needs {visible + 1} GPUs"):
        ServerArgs(model_path=demo.TARGET_PATH, device="cuda", tp_size=visible + 1)

"""No Triton kernel is compiled in the middle of serving (GPU).

Triton compiles a kernel again for every new specialization (constexpr tile sizes, pointer
alignment, integers equal to 1 or multiples of 16); a compile while requests run stalls them all
for 0.3-1 s. After start-up (graphs captured, extend tiles precompiled) a mix of batches that a
server meets (prompt lengths odd and even, batches of 1 to 24 requests, radix-cache hits that leave
one to three new tokens, greedy and sampled requests (with and without top-k / top-p), and with a draft: steps switching between
plain and speculative) must compile nothing. Each case runs in a fresh process, since kernels
compiled by earlier tests in this process would hide a missing precompile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCRIPT = r"""
import json, sys
import torch
from sglang import demo
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.kernel_compiles import WATCH
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.runner_utils import run_to_completion

spec = json.loads(sys.argv[1])
extra = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=demo.DRAFT_PATH,
             speculative_num_steps=3, speculative_adaptive=True) if spec else {}
scheduler = Scheduler(ServerArgs(model_path=demo.TARGET_PATH, device="cuda", dtype="bfloat16",
                                 attention_backend="triton", cuda_graph_max_bs=16, max_total_tokens=65536, **extra))
gen = torch.Generator().manual_seed(0)
vocab = scheduler.model_config.vocab_size
shared = torch.randint(10, vocab, (300,), generator=gen).tolist()
n = 0

def submit(ids, max_new, **sampling):
    global n
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=True, **({"temperature": 0} | sampling))
    scheduler.add_request(TokenizedGenerateReqInput(f"r{n}", ids, params, stream=False))
    n += 1

for wave, batch in enumerate([1, 2, 3, 5, 8, 9, 16, 17, 24, 1]):
    for i in range(batch):
        length = 5 + 37 * ((wave * 7 + i) % 9)
        # greedy; sampled with filters (torch); sampled without (the fused Triton kernel)
        sampling = ({} if i % 3 == 1 else {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "sampling_seed": i}
                    if i % 3 == 2 else {"temperature": 0.7, "sampling_seed": i})
        submit(torch.randint(10, vocab, (length,), generator=gen).tolist(), 20 + 9 * (i % 4), **sampling)
    run_to_completion(scheduler)
submit(shared, 8)
run_to_completion(scheduler)
for extra_tokens in (1, 2, 3):  # radix hits on the shared prompt leave a few new tokens
    submit(shared + torch.randint(10, vocab, (extra_tokens,), generator=gen).tolist(), 8)
run_to_completion(scheduler)
print(json.dumps(WATCH.summary()))
"""


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "eagle3-dynamic"])
def test_serving_compiles_no_kernel(spec):
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(spec)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["kernel_compiles"] > 0, "the watch saw no compile at all: is it installed?"
    assert summary["kernel_compiles_while_serving"] == 0, summary["kernels_compiled_while_serving"]

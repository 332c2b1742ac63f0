"""How large a prefill pass the scheduler builds for a speculative server: the target's prefill
graphs decide, never the draft's (a device-bound target hides the draft's eager launches)."""

from types import SimpleNamespace

import pytest

from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2


def _worker(target_answer, draft_answer):
    worker = object.__new__(EAGLEWorkerV2)
    worker.model_runner = SimpleNamespace(prefill_pass_fits=lambda n, t: target_answer)
    worker.draft_runner = SimpleNamespace(prefill_pass_fits=lambda n, t: draft_answer)
    return worker


@pytest.mark.parametrize("draft_answer", [True, False, None])
@pytest.mark.parametrize("target_answer", [True, False, None])
def test_the_target_alone_sizes_a_speculative_prefill_pass(target_answer, draft_answer):
    # A large target past its graphs (eager, device-bound) with a small draft that kept every graph:
    # the pass still fits; the draft's graph limit would split a wave into many small passes.
    assert _worker(target_answer, draft_answer).prefill_pass_fits(26, 6_656) is target_answer

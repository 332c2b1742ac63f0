"""The host's torch calls per scheduler pass (sglang.test.host_calls), counted on the CPU with
CUDA graphs stood in for: on the GPU machine each call costs the host 5-30 us and a small
model's server is bound by its host, so a change that adds calls to a pass slows every such
server. The bounds are the counts when this test was written, with a little room (before it, a prefill
launch with the draft made 96 calls and a decode launch without one 34)."""

from __future__ import annotations

import pytest

from sglang.test import host_calls

BOUNDS = {
    "always": {"prefill/launch": 52, "decode/launch": 8},
    "no_draft": {"prefill/launch": 22, "decode/launch": 24},
}


@pytest.mark.parametrize("server", BOUNDS)
def test_passes_make_no_more_host_calls_than_they_did(server, monkeypatch):
    result = host_calls.count(server, set_attr=monkeypatch.setattr)
    assert result["passes"]["prefill"] >= 4 and result["passes"]["decode"] >= 8
    for name, bound in BOUNDS[server].items():
        assert 0 < result["calls"][name] <= bound, (name, result["calls"][name], result["sites"])

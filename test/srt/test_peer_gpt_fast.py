"""benchmark/peer_gpt_fast.py: without a gpt-fast checkout it says so in one line (gpt-fast is
not vendored, and no machine here can fetch it), and its top-k sampler, which runs inside the
compiled step, draws only among the top k tokens, in proportion to their probabilities."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import torch

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "peer_gpt_fast.py")
spec = importlib.util.spec_from_file_location("peer_gpt_fast", PATH)
peer_gpt_fast = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer_gpt_fast)


def test_a_missing_checkout_is_named_in_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            PATH,
            "--gpt-fast-dir",
            str(tmp_path / "gpt-fast"),
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "out.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"no gpt-fast checkout at {str(tmp_path / 'gpt-fast')!r} (its model.py is missing): clone "
        "pytorch-labs/gpt-fast there, or pass --gpt-fast-dir"
    ]
    assert not (tmp_path / "out.json").exists()


def test_top_k_sampling_draws_among_the_top_k_by_their_probability():
    torch.manual_seed(0)
    logits = torch.tensor([[[4.0, 3.0, 2.0, 0.0, -1.0, 5.0]]]).repeat(4000, 1, 1)
    draws = peer_gpt_fast.top_k_sample(logits, temperature=1.0, top_k=3).flatten()
    assert set(draws.tolist()) <= {0, 1, 5}
    expected = torch.softmax(torch.tensor([4.0, 3.0, 5.0]), dim=0)
    seen = torch.tensor([(draws == i).float().mean().item() for i in (0, 1, 5)])
    assert torch.allclose(seen, expected, atol=0.03), (seen, expected)
    assert peer_gpt_fast.greedy(logits[:2]).flatten().tolist() == [5, 5]

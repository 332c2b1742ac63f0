"""benchmark/greedy_agreement: speculative greedy output against plain decoding's. In float32 the
demo pair's speculative outputs (always-on and adaptive) are plain decoding's, token for token;
a divergence is reported at its first position with plain decoding's top-two gap there."""

from __future__ import annotations

import json

from sglang.benchmark import greedy_agreement
from sglang.benchmark.greedy_agreement import compare, first_difference, summary_lines


def plain_output(ids, gaps):
    # top_logprobs per position: (logprob, id) of the best and the second choice
    return {"output_ids": ids, "top_logprobs": [[(-0.1, tok), (-0.1 - gap, 99)] for tok, gap in zip(ids, gaps)]}


def test_first_difference_counts_a_shorter_output_as_a_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


def test_compare_reports_each_divergence_with_plain_decodings_top_two_gap():
    plain = [plain_output([5, 6, 7, 8], [1.0, 1.0, 0.02, 1.0]), plain_output([1, 2], [0.5, 0.5])]
    spec = [{"output_ids": [5, 6, 99, 3]}, {"output_ids": [1, 2]}]
    result = compare(plain, spec)
    assert result["identical_outputs"] == 1 and result["tokens"] == 6
    assert result["tokens_before_first_difference"] == 2 + 2 and abs(result["token_share"] - 4 / 6) < 1e-9
    [divergence] = result["divergences"]
    assert divergence == {"prompt_index": 0, "position": 2, "plain_top2_gap": 0.02, "spec_token_in_plain_top2": True}
    assert result["median_divergence_top2_gap"] == 0.02


def test_speculative_greedy_output_is_plain_decodings_in_float32(tmp_path):
    out = tmp_path / "agreement.json"
    greedy_agreement.main(
        [
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--num-prompts",
            "3",
            "--input-len",
            "48",
            "--output-len",
            "24",
            "--max-total-tokens",
            "2048",
            "--modes",
            "always",
            "adaptive",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert set(result["modes"]) == {"always", "adaptive"}
    for mode in result["modes"].values():
        assert mode["prompts"] == 3 and mode["tokens"] == 3 * 24
        assert mode["identical_outputs"] == 3 and mode["divergences"] == [], mode
    assert all("3/3 outputs identical" in line for line in summary_lines(result))

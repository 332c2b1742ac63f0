"""Stop strings matched as text streams in: the automaton against a brute-force search, and the
scheduler's per-step check costing the new text, not the stop list."""

from __future__ import annotations

import random

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.stop_strings import CONTEXT_TOKENS, StopState, stop_automaton
from sglang.srt.sampling.sampling_params import SamplingParams


def _first_match(text: str, stops: list[str]):
    """(end index, the stops ending there) of the earliest stop string in `text`, by brute force."""
    for end in range(1, len(text) + 1):
        ending = [stop for stop in stops if text[:end].endswith(stop)]
        if ending:
            return end, ending
    return None


def _held(text: str, stops: list[str]) -> int:
    return max(
        (k for stop in stops for k in range(1, min(len(stop), len(text)) + 1) if text.endswith(stop[:k])), default=0
    )


def test_the_automaton_finds_the_first_stop_and_holds_back_possible_starts_like_brute_force():
    rng = random.Random(0)
    for _ in range(2000):
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 5))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 25)))
        state, found = StopState(stops), None
        pieces = [text[i : i + 3] for i in range(0, len(text), 3)]  # fed a few characters at a time
        fed, piece = 0, ""
        for piece in pieces:
            matched = state.feed(piece)
            fed += len(piece)
            if matched is not None:
                found = matched
                break
        expected = _first_match(text, stops)
        if expected is None:
            assert found is None and state.held_len == _held(text, stops), (stops, text)
        else:
            end, ending = expected
            assert found in ending and fed - len(piece) < end <= fed, (stops, text, found)


def test_requests_with_the_same_stop_list_share_one_automaton():
    assert stop_automaton(["ab", "cd"]) is stop_automaton(["ab", "cd"])
    assert stop_automaton(["ab", "cd"]) is not stop_automaton(["ab"])


class CountingDecoder:
    def __init__(self):
        self.decoded_ids = 0

    def __call__(self, ids: list[int]) -> str:
        self.decoded_ids += len(ids)
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_the_stop_check_decodes_only_the_new_tokens_whatever_the_stop_list():
    stops = [f"{i:03d}" + "q" * 253 for i in range(32)]  # 32 strings of 256 characters, never matched
    params = SamplingParams(max_new_tokens=500, stop=stops, ignore_eos=True)
    params.normalize_stop()
    req = Req("r", [1, 2, 3], params, seed=0, stream=False, eos_token_ids=set(), context_len=4096)
    decode = CountingDecoder()
    for step in range(300):
        req.append_token(step % 26)
        req.check_stop_strings(decode)
    assert req.finished_reason is None
    # Each step decodes its token and a few before it (twice), not a tail as long as the longest stop.
    assert decode.decoded_ids <= 300 * 2 * (CONTEXT_TOKENS + 1)


def test_the_stop_check_finishes_on_a_stop_spanning_steps():
    params = SamplingParams(max_new_tokens=50, stop=["cde"], ignore_eos=True)
    params.normalize_stop()
    req = Req("r", [1], params, seed=0, stream=False, eos_token_ids=set(), context_len=4096)
    for token in (0, 1, 2, 3, 4):  # a b c d e
        req.append_token(token)
        req.check_stop_strings(CountingDecoder())
    assert req.finished_reason == {"type": "stop", "matched": "cde"}

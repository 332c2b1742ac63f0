"""Client-chosen request ids (`rid` on /generate): a clash is refused before any part of the
request runs, and leaves nothing behind."""

from __future__ import annotations

import httpx

from sglang.test.server_fixture import server_state

SAMPLING = {"max_new_tokens": 2, "ignore_eos": True}


def generate(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/generate", json=body, timeout=60)


def test_a_batch_repeating_a_rid_is_refused_and_the_rid_stays_free(server):
    refused = generate(server, {"text": ["Hello", "World"], "rid": ["same-rid", "same-rid"],
                                "sampling_params": SAMPLING})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "rid"

    # Nothing of the refused batch ran or holds the rid: it is free for the next request.
    again = generate(server, {"text": "Hello", "rid": "same-rid", "sampling_params": SAMPLING})
    assert again.status_code == 200, again.text
    assert again.json()["meta_info"]["id"] == "same-rid"
    assert server_state(server)["num_running_reqs"] == 0


def test_a_sample_id_clashing_with_another_prompt_rid_is_refused_whole(server):
    # n = 2 on "clash" makes "clash-0" and "clash-1", and the second prompt asks for "clash-1".
    refused = generate(server, {"text": ["Hello", "World"], "rid": ["clash", "clash-1"],
                                "sampling_params": [{**SAMPLING, "n": 2}, SAMPLING]})
    assert refused.status_code == 400, refused.text
    for rid in ("clash-0", "clash-1"):
        again = generate(server, {"text": "Hello", "rid": rid, "sampling_params": SAMPLING})
        assert again.status_code == 200, again.text


def test_one_rid_string_for_a_batch_is_refused_saying_a_list_is_needed(server):
    refused = generate(server, {"text": ["Hello", "World"], "rid": "one-rid", "sampling_params": SAMPLING})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "rid" and "list of 2 rids" in error["message"], error
    # A batch of one prompt may still name its rid with a string.
    single = generate(server, {"text": ["Hello"], "rid": "one-rid", "sampling_params": SAMPLING})
    assert single.status_code == 200 and single.json()[0]["meta_info"]["id"] == "one-rid", single.text

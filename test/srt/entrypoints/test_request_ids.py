"""Client-chosen request ids (`rid` on /generate): a clash is refused before any part of the
request runs, and leaves nothing behind."""

from __future__ import annotations

import time

import httpx

from sglang.test.server_fixture import server_state

SAMPLING = {"max_new_tokens": 2, "ignore_eos": True}


def generate(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/generate", json=body, timeout=60)


def test_a_batch_repeating_a_rid_is_refused_and_the_rid_stays_free(server):
    refused = generate(
        server, {"text": ["Hello", "World"], "rid": ["same-rid", "same-rid"], "sampling_params": SAMPLING}
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "rid"

    # Nothing of the refused batch ran or holds the rid: it is free for the next request.
    again = generate(server, {"text": "Hello", "rid": "same-rid", "sampling_params": SAMPLING})
    assert again.status_code == 200, again.text
    assert again.json()["meta_info"]["id"] == "same-rid"
    assert server_state(server)["num_running_reqs"] == 0


def test_a_sample_id_clashing_with_another_prompt_rid_is_refused_whole(server):
    # n = 2 on "clash" makes "clash-0" and "clash-1", and the second prompt asks for "clash-1".
    refused = generate(
        server,
        {"text": ["Hello", "World"], "rid": ["clash", "clash-1"], "sampling_params": [{**SAMPLING, "n": 2}, SAMPLING]},
    )
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


def test_a_rid_reused_right_after_its_client_left_gets_none_of_the_old_outputs(server):
    long = {"max_new_tokens": 500, "ignore_eos": True}
    # A warm keep-alive connection: the reuse goes out within a millisecond of the other leaving.
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        client.get("/health")
        for trial in range(5):
            rid = f"left-{trial}"
            body = {"text": "Hello", "rid": rid, "stream": True, "sampling_params": long}
            with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=60) as events:
                for number, _ in enumerate(events.iter_lines()):
                    if number == 4:
                        break  # the client leaves mid-stream
            # Until the scheduler has dropped the old request the rid is taken; then it is free.
            for _ in range(50):
                reused = client.post("/generate", json={"text": "Hi", "rid": rid, "sampling_params": SAMPLING})
                if reused.status_code != 400:
                    break
                assert reused.json()["error"]["param"] == "rid", reused.text
                time.sleep(0.05)
            assert reused.status_code == 200, reused.text
            meta = reused.json()["meta_info"]
            assert (meta["finish_reason"]["type"], meta["completion_tokens"]) == ("length", 2), meta


def test_an_empty_or_non_string_rid_is_refused_naming_rid(server):
    # An empty rid could not be aborted by /abort_request, which ignores an empty rid.
    for rid in ("", ["ok-rid", ""], 7):
        text = ["Hello", "World"] if isinstance(rid, list) else "Hello"
        refused = generate(server, {"text": text, "rid": rid, "sampling_params": SAMPLING})
        assert refused.status_code == 400, (rid, refused.text)
        assert refused.json()["error"]["param"] == "rid", refused.text
    # The refused batch's good rid was never taken.
    again = generate(server, {"text": "Hello", "rid": "ok-rid", "sampling_params": SAMPLING})
    assert again.status_code == 200, again.text


def test_an_n_request_keeps_its_rid_taken_so_an_abort_of_it_names_only_its_samples(server):
    import threading

    long = {"max_new_tokens": 1000, "ignore_eos": True}  # the tiny model's context is 1024 tokens
    # A plain request holds "plain-job": an n = 2 request named so (its samples plain-job-0, -1) is
    # refused, since aborting "plain-job" would then abort both.
    body = {"text": "Hello", "rid": "plain-job", "stream": True, "sampling_params": long}
    with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=60) as events:
        lines = events.iter_lines()  # held: a dropped iterator closes the stream, and the request with it
        next(lines)
        refused = generate(server, {"text": "Hi", "rid": "plain-job", "sampling_params": {**SAMPLING, "n": 2}})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "rid", refused.text
        httpx.post(f"{server.base_url}/abort_request", json={"rid": "plain-job"}, timeout=10)

    # An n = 2 request in flight holds its own rid as well as its samples'.
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            generate(server, {"text": "Hello", "rid": "n-job", "sampling_params": {**long, "n": 2}})
        )
    )
    worker.start()
    try:
        deadline = time.time() + 30
        while server_state(server)["num_running_reqs"] < 2 and time.time() < deadline:
            time.sleep(0.05)
        for rid in ("n-job", "n-job-1"):
            refused = generate(server, {"text": "Hi", "rid": rid, "sampling_params": SAMPLING})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "rid", (rid, refused.text)
    finally:
        httpx.post(f"{server.base_url}/abort_request", json={"rid": "n-job"}, timeout=10)
        worker.join(60)
    assert [choice["meta_info"]["finish_reason"]["type"] for choice in results[0].json()] == ["abort", "abort"]
    # Once its samples are gone the rid is free again.
    again = generate(server, {"text": "Hello", "rid": "n-job", "sampling_params": SAMPLING})
    assert again.status_code == 200, again.text

    # Within one batch: an n = 2 prompt and a plain prompt may not share a rid either way round.
    for rids, params in (
        (["both", "both"], [{**SAMPLING, "n": 2}, SAMPLING]),
        (["both", "both"], [SAMPLING, {**SAMPLING, "n": 2}]),
    ):
        refused = generate(server, {"text": ["Hello", "World"], "rid": rids, "sampling_params": params})
        assert refused.status_code == 400, refused.text

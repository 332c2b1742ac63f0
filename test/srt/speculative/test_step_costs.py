"""The start-up step-cost table's measurement (speculative/step_costs.py) when the device is shared:
a slow batch does not price a step, and servers starting together on one device measure one at a
time, waiting for each other only up to a bound."""

from __future__ import annotations

import logging
import threading
import time
import uuid

from sglang.srt.speculative.step_costs import device_lock, fastest_call


def test_a_batch_slowed_by_another_process_does_not_price_the_step():
    calls = []

    def step():
        calls.append(None)
        # The fourth call (the second batch) runs while another server's kernels hold the device.
        time.sleep(0.3 if len(calls) == 4 else 0.002)

    seconds = fastest_call("cpu", step, repeats=3)

    assert len(calls) == 9  # three batches of three
    assert seconds < 0.05  # a mean over the calls would read >= 0.035 + 0.002 from the slow one alone
    assert seconds >= 0.002


def test_servers_on_one_device_measure_one_at_a_time():
    key = f"test-{uuid.uuid4().hex}"
    entered = []

    def other_server():
        with device_lock(key, timeout_s=10):
            entered.append(time.monotonic())

    with device_lock(key):
        thread = threading.Thread(target=other_server)
        thread.start()
        time.sleep(0.3)
        assert not entered  # still waiting while the first measures
        released = time.monotonic()
    thread.join(timeout=10)
    assert entered and entered[0] >= released


def test_a_lock_held_too_long_is_measured_past_and_said(caplog):
    key = f"test-{uuid.uuid4().hex}"
    with device_lock(key):
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="sglang.srt.speculative.step_costs"):
            with device_lock(key, timeout_s=0.2):
                waited = time.monotonic() - start
    assert 0.2 <= waited < 5
    assert "measuring step costs without it" in caplog.text
    # Nothing is left held: the next server gets it at once.
    start = time.monotonic()
    with device_lock(key, timeout_s=5):
        assert time.monotonic() - start < 1


def test_a_lock_file_that_cannot_be_opened_is_measured_past_and_said(caplog, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "missing"))
    entered = False
    with caplog.at_level(logging.WARNING, logger="sglang.srt.speculative.step_costs"):
        with device_lock(f"test-{uuid.uuid4().hex}", timeout_s=5):
            entered = True
    assert entered and "cannot open" in caplog.text

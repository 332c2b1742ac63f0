"""The garbage collector in a server process (srt/gc_pauses.py): start-up objects frozen out of its
passes, every pass timed, a pause at or over --gc-warning-threshold-secs logged."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from sglang.srt.gc_pauses import GcWatch, settle_after_startup
from sglang.srt.server_args import ServerArgs


@pytest.fixture
def unfrozen(unfrozen_collector):
    yield
    for callback in [c for c in gc.callbacks if isinstance(c, GcWatch)]:
        gc.callbacks.remove(callback)
    gc.unfreeze()


def test_settling_freezes_what_start_up_made_so_a_full_pass_walks_only_newer_objects(unfrozen, caplog):
    startup = [{"state": [i]} for i in range(50_000)]  # long-lived containers, as a model's modules
    tracked = len(gc.get_objects())
    with caplog.at_level(logging.DEBUG, logger="sglang.srt.gc_pauses"):
        watch = settle_after_startup("test process")
    assert gc.get_freeze_count() >= tracked - 1_000 and len(gc.get_objects()) < 1_000
    assert "objects from start-up frozen" in caplog.text
    started = time.perf_counter()
    gc.collect()
    assert time.perf_counter() - started < 0.05  # the frozen objects are not walked
    # Counted once at start-up (counting walks them all); frozen objects that die leave the count.
    assert watch.summary()["frozen_objects"] >= gc.get_freeze_count() >= tracked - 1_000 and watch.passes[2] == 1
    assert startup[-1]["state"] == [49_999]


def test_every_pass_is_timed_and_a_long_one_is_logged(unfrozen, caplog):
    watch = GcWatch(warn_after_s=1e-9).start()
    with caplog.at_level(logging.WARNING, logger="sglang.srt.gc_pauses"):
        gc.collect(0)
        gc.collect(2)
    assert watch.passes[0] >= 1 and watch.passes[2] >= 1 and watch.longest_s > 0
    assert caplog.text.count("garbage collection (generation") >= 2
    watch.stop()
    before = watch.passes[0]
    quiet = GcWatch(warn_after_s=0).start()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sglang.srt.gc_pauses"):
        gc.collect(0)
    assert quiet.passes[0] == 1 and "garbage collection" not in caplog.text  # 0: timed, never logged
    assert watch.passes[0] == before  # a stopped watch counts nothing more


def test_a_negative_threshold_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--gc-warning-threshold-secs"):
        ServerArgs(model_path="unused", gc_warning_threshold_secs=-1)
    with pytest.raises(ValueError, match="--gc-warning-threshold-secs"):
        GcWatch(-0.5)


def test_the_diagnosis_switch_leaves_start_up_objects_in_the_passes(unfrozen, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_GC_NO_FREEZE", "1")
    with caplog.at_level(logging.WARNING, logger="sglang.srt.gc_pauses"):
        watch = settle_after_startup("test process")
    assert gc.get_freeze_count() == 0 and "SGLANG_GC_NO_FREEZE=1" in caplog.text
    gc.collect(0)
    assert watch.passes[0] >= 1, "passes are timed all the same"

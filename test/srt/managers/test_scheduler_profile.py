"""SGLANG_SCHEDULER_PROFILE: the scheduler loop's diagnosis profile, one pair of files per busy
period (a burst of load followed by a second of idleness)."""

from __future__ import annotations

import logging
import pstats

from sglang.srt.managers import scheduler_process
from sglang.srt.managers.scheduler_process import BusyProfiler


def decode_like_work(n: int) -> int:
    return sum(i * i for i in range(n))


def test_each_busy_period_gets_its_own_profile_files(tmp_path):
    prefix = str(tmp_path / "sched")
    profiler = BusyProfiler(prefix)
    profiler.start()
    profiler.on_idle()  # idle before any work: nothing to write
    assert list(tmp_path.iterdir()) == []

    decode_like_work(10_000)
    profiler.busy = True
    profiler.on_idle()
    profiler.on_idle()  # still idle: the period was written once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sched.0.prof", "sched.0.txt"]
    assert "decode_like_work" in (tmp_path / "sched.0.txt").read_text()
    assert any(func[2] == "decode_like_work" for func in pstats.Stats(prefix + ".0.prof").stats)

    profiler.busy = True  # a second burst without that function
    profiler.on_idle()
    profiler.profile.disable()
    second = pstats.Stats(prefix + ".1.prof").stats
    assert not any(func[2] == "decode_like_work" for func in second)


def test_an_unwritable_prefix_stops_profiling_not_the_server(tmp_path):
    # Read from the module's logger itself, at its own level: an earlier test in the process may
    # have configured the root logger (an Engine made with log_level="critical" does).
    records = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    log = logging.getLogger(scheduler_process.__name__)
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        profiler = BusyProfiler(str(tmp_path / "missing-dir" / "sched"))
        profiler.start()
        decode_like_work(1000)
        profiler.busy = True
        profiler.on_idle()  # logs and returns
        decode_like_work(1000)
        profiler.busy = True
        profiler.on_idle()  # stopped: nothing more is tried
        profiler.profile.disable()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert profiler.stopped
    assert len(records) == 1
    assert "cannot write" in records[0].getMessage() and "missing-dir" in records[0].getMessage()

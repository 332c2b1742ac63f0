"""SGLANG_STEP_TIMES: the scheduler loop's own phase times per step, grouped by what each pass
launched and its batch-size bucket, written after each busy period."""

from __future__ import annotations

import json
import time

import pytest

import sglang
from sglang.srt import bench_hooks
from sglang.srt.managers import step_times
from sglang.srt.managers.step_times import NullStepClock, StepClock, make_step_clock, size_bucket


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, us: float) -> None:
        self.now += us * 1e-6


@pytest.fixture
def fake_time(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(step_times.time, "perf_counter", clock)
    return clock


def one_pass(clock: StepClock, t: FakeTime, kind: str, batch_size: int, us: dict[str, float], waited_us=0.0):
    clock.begin()
    for phase in ("receive", "schedule", "launch", "process", "collect", "send"):
        t.advance(us.get(phase, 0.0))
        if phase == "launch" and kind:
            clock.launched(kind, batch_size)
        if phase == "process":
            clock.waited(waited_us * 1e-6)
        clock.lap(phase)
    clock.end()


def test_size_bucket():
    assert [size_bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 256)] == [0, 1, 2, 4, 4, 8, 8, 16, 256]


def test_phases_are_summed_per_group_and_the_device_wait_is_split_out(tmp_path, fake_time):
    clock = StepClock(str(tmp_path / "steps"))
    for batch_size in (3, 4):  # one bucket
        one_pass(
            clock,
            fake_time,
            "spec_k3",
            batch_size,
            {"receive": 10, "launch": 200, "process": 500, "send": 30},
            waited_us=300,
        )
    one_pass(clock, fake_time, "decode", 4, {"launch": 100, "process": 60})
    one_pass(clock, fake_time, "prefill", 2, {"schedule": 50, "launch": 1000, "process": 80})
    summary = clock.summary()
    assert set(summary) == {"spec_k3/bs4", "decode/bs4", "prefill/bs2"}
    spec = summary["spec_k3/bs4"]
    assert spec["steps"] == 2 and spec["mean_batch"] == pytest.approx(3.5)
    assert spec["wait_us"] == pytest.approx(300) and spec["process_us"] == pytest.approx(200)
    assert spec["launch_us"] == pytest.approx(200) and spec["receive_us"] == pytest.approx(10)
    assert spec["pass_us"] == pytest.approx(740) and spec["p50_us"] == pytest.approx(740)
    assert summary["prefill/bs2"]["launch_us"] == pytest.approx(1000)
    table = clock.table()
    assert "spec_k3/bs4" in table.splitlines()[1 + list(summary).index("spec_k3/bs4")]


def test_empty_passes_are_not_steps_but_a_slow_one_is_kept(tmp_path, fake_time):
    clock = StepClock(str(tmp_path / "steps"))
    one_pass(clock, fake_time, "", 0, {"receive": 5})  # nothing launched, nothing done
    assert clock.summary() == {}
    one_pass(clock, fake_time, "", 0, {"process": 400})  # the last step in flight processed
    assert clock.summary()["none/bs0"]["process_us"] == pytest.approx(400)


def test_each_busy_period_is_written_once_and_then_starts_afresh(tmp_path, fake_time):
    prefix = tmp_path / "steps"
    clock = StepClock(str(prefix))
    clock.on_idle()  # nothing yet
    assert list(tmp_path.iterdir()) == []
    one_pass(clock, fake_time, "decode", 8, {"launch": 100})
    clock.on_idle()
    clock.on_idle()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.0.json", "steps.0.txt"]
    assert json.loads((tmp_path / "steps.0.json").read_text())["decode/bs8"]["steps"] == 1
    one_pass(clock, fake_time, "prefill", 1, {"launch": 100})
    clock.on_idle()
    second = json.loads((tmp_path / "steps.1.json").read_text())
    assert list(second) == ["prefill/bs1"]


def test_an_unwritable_prefix_stops_timing_not_the_server(tmp_path, fake_time):
    clock = StepClock(str(tmp_path / "missing-dir" / "steps"))
    one_pass(clock, fake_time, "decode", 1, {"launch": 100})
    clock.on_idle()
    assert clock.stopped
    one_pass(clock, fake_time, "decode", 1, {"launch": 100})
    clock.on_idle()  # tried once only
    assert not (tmp_path / "missing-dir").exists()


def test_off_by_default():
    assert type(make_step_clock(None)) is NullStepClock and type(make_step_clock("")) is NullStepClock


def test_a_served_load_is_timed_by_the_scheduler_process(tmp_path, tiny_model_paths, monkeypatch):
    """Through the real scheduler process: one file pair per busy period, its decode steps those
    the requests took, its phases adding up to each pass."""
    prefix = tmp_path / "sched"
    monkeypatch.setenv(bench_hooks.STEP_TIMES_ENV, str(prefix))
    # Without overlap, so that no step is launched past the requests' last tokens.
    engine = sglang.Engine(
        model_path=tiny_model_paths["llama"],
        dtype="float32",
        device="cpu",
        log_level="warning",
        disable_overlap_schedule=True,
    )
    try:
        # One request: two could reach the scheduler in separate passes, one decoding a step
        # alone before the other joins (the step count would then depend on timing).
        out = engine.generate(
            input_ids=[5, 6, 7, 8], sampling_params={"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
        )
        assert len(out["output_ids"]) == 12
        path = prefix.with_name("sched.0.json")
        deadline = time.time() + 30
        while not path.exists() and time.time() < deadline:
            time.sleep(0.2)
        summary = json.loads(path.read_text())
    finally:
        engine.shutdown()
    decode = {name: row for name, row in summary.items() if name.startswith("decode/")}
    prefill = {name: row for name, row in summary.items() if name.startswith("prefill/")}
    assert prefill and decode, summary
    # The first token comes from the prefill, the other 11 from decode steps.
    assert sum(row["steps"] for row in decode.values()) == 11
    for row in summary.values():
        assert row["pass_us"] == pytest.approx(sum(row[f"{p}_us"] for p in step_times.PHASES))
    for row in [*decode.values(), *prefill.values()]:  # launched and processed in the same pass
        assert row["launch_us"] > 0 and row["process_us"] > 0
    assert "(microseconds per step)" in prefix.with_name("sched.0.txt").read_text()

"""The agent's per-minute summaries of the GPUs an allocation holds (pure: no database)."""

from datetime import UTC, datetime

from jobs import gpus

T = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _sample(index: int, util: float, *, power: float | None = 300.0, temp: float | None = 50.0, mem: int = 0):
    return gpus.Sample(
        index=index, utilisation=util, memory_used_bytes=mem, power_w=power, temperature_c=temp
    )


def test_samples_fold_into_one_summary_per_allocation_gpu_and_minute_handed_over_once_the_minute_is_over():
    minutes = gpus.Minutes()
    minutes.add(allocation_id=7, sample=_sample(0, 20, mem=5, temp=40), at=T.replace(second=5))
    minutes.add(allocation_id=7, sample=_sample(0, 60, power=None, mem=9, temp=61), at=T.replace(second=35))
    minutes.add(allocation_id=7, sample=_sample(1, 0), at=T.replace(second=35))
    minutes.add(allocation_id=7, sample=_sample(0, 100), at=T.replace(minute=1, second=5))
    assert minutes.closed(now=T.replace(second=50), running={7}) == []  # the minute is not over
    closed = minutes.closed(now=T.replace(minute=1, second=10), running={7})
    assert closed == [
        {"allocation_id": 7, "gpu_index": 0, "minute": T, "samples": 2, "utilisation_avg": 40.0,
         "utilisation_max": 60.0, "memory_used_max_bytes": 9, "power_avg_w": 300.0, "temperature_max_c": 61.0},
        {"allocation_id": 7, "gpu_index": 1, "minute": T, "samples": 1, "utilisation_avg": 0.0,
         "utilisation_max": 0.0, "memory_used_max_bytes": 0, "power_avg_w": 300.0, "temperature_max_c": 50.0},
    ]  # fmt: skip
    assert minutes.closed(now=T.replace(minute=1, second=20), running={7}) == []  # each handed over once


def test_an_allocation_that_stopped_running_hands_over_its_last_partial_minute_at_once():
    minutes = gpus.Minutes()
    minutes.add(allocation_id=7, sample=_sample(0, 80, power=None, temp=None), at=T.replace(second=5))
    (last,) = minutes.closed(now=T.replace(second=10), running=set())
    assert (last["minute"], last["samples"], last["utilisation_avg"]) == (T, 1, 80.0)
    assert (last["power_avg_w"], last["temperature_max_c"]) == (None, None)  # not reported, not made up

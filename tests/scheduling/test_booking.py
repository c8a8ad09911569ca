"""The estimates' booking (conservative backfilling over the pool's idle GPUs) agrees with a naive one: every
interval kept in a list, each candidate start (the earliest time or a change of some interval) tried in time
order and the whole window checked."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.explanation import _Booking

NOW = 1_780_000_000.0


def _pass(total, running):
    """What ``_Booking`` reads of a pass with no starts or holds of its own."""
    return SimpleNamespace(
        now=NOW, capacity={"n": total}, total_gpus=total, held=[], local_events=[], running=running,
        releases=lambda: running, preempted={},
    )  # fmt: skip


def _naive_first_fit(total, intervals, g, seconds, earliest):
    def idle(t):
        return total - sum(k for a, b, k in intervals if a <= t < b)

    changes = sorted({earliest} | {x for a, b, _ in intervals for x in (a, b) if x > earliest})
    for t in changes:
        inside = [t] + [x for x in changes if t < x < t + seconds]
        if all(idle(x) >= g for x in inside):
            return t
    return None


running_jobs = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 40)), max_size=6)
waiting_jobs = st.lists(
    st.tuples(st.integers(1, 8), st.integers(1, 30), st.integers(0, 20)), min_size=1, max_size=12
)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(4, 8), running=running_jobs, waiting=waiting_jobs)
def test_each_waiting_job_is_booked_where_a_naive_first_fit_puts_it(total, running, waiting):
    """Times in quarter hours. Running jobs take what is left of the pool (their GPUs capped at it)."""
    q = 900.0
    views, intervals, used = [], [], 0
    for i, (k, end) in enumerate(running):
        k = min(k, total - used)
        if k <= 0:
            break
        used += k
        views.append(SimpleNamespace(job_id=i, preemptible=False, expected_end=NOW + end * q,
                                     gpus_by_node={"n": tuple(range(k))}))  # fmt: skip
        intervals.append((NOW, NOW + end * q, k))
    booking = _Booking(_pass(total, views))
    for g, length, delay in waiting:
        earliest = NOW + delay * q
        expected = _naive_first_fit(total, intervals, g, length * q, earliest) if g <= total else None
        assert booking.book(g, length * q, earliest) == expected
        if expected is not None:
            intervals.append((expected, expected + length * q, g))


def test_past_its_budget_a_booking_tells_jobs_when_the_idle_gpu_hours_left_cover_their_work(monkeypatch):
    """A pool of 4 GPUs, all busy for an hour. With the budget spent on the first job (4 GPUs, an hour, booked at
    one hour), the next ones are told when the idle GPU-seconds left cover the work of those past it, theirs
    included: 2 GPU-hours at two and a half hours, 2 more at three."""
    monkeypatch.setattr("jobs.scheduling.explanation.BOOKING_STEPS", 4)
    busy = SimpleNamespace(
        job_id=1, preemptible=False, expected_end=NOW + 3600, gpus_by_node={"n": (0, 1, 2, 3)}
    )
    booking = _Booking(_pass(4, [busy]))
    assert booking.book(4, 3600, NOW) == NOW + 3600
    assert booking.book(2, 3600, NOW) == NOW + 2.5 * 3600
    assert booking.book(1, 7200, NOW) == NOW + 3 * 3600

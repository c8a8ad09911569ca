"""The replay plans with declared, learned or exact run times, and reports reservations that predictions delayed."""

import math

import pytest

from jobs.scheduling import simulate
from jobs.scheduling.simulate import Declarations
from jobs.scheduling.traces import TraceJob


def _job(i, submit, gpus, run, declared_s):
    return TraceJob(i, submit, run, gpus, declared_s / 3600.0, "t")


# One node of 4 GPUs; declarations ten times the run for j0.
#   j0 t=0  2 GPUs run 100, declared 1000
#   j1 t=10 4 GPUs run 50: reserved at j0's end - declared 1000, exact 100
#   j2 t=20 1 GPU  run 200 (declared 200): declared - ends 220 <= 1000, backfills at 20, j1 waits for it;
#      exact - would end past 100 with no GPU to spare: after j1, at 150
LOOSE = [_job(0, 0, 2, 100, 1000), _job(1, 10, 4, 50, 3600), _job(2, 20, 1, 200, 200)]


@pytest.mark.parametrize("name", ["easy", "easy-nodes"])
def test_exact_estimates_start_the_reserved_job_when_the_gpus_really_free(name):
    def starts(estimates):
        outcomes = simulate.replay(
            LOOSE, nodes=1, gpus_per_node=4, policy=simulate.POLICIES[name],
            declarations=Declarations(estimates=estimates),
        )  # fmt: skip
        return [o.start for o in outcomes]

    assert starts("declared") == [0, 220, 20]
    assert starts("exact") == [0, 100, 150]


# One team on one node of 4 GPUs; a prediction needs 2 finished jobs.
#   j0, j1 t=0 1 GPU run 360, declared 1 h: the team uses 10 % of its hours
#   j2 t=1000 2 GPUs run 3000, declared 1 h: predicted 360 s - falls short by 2640 s
#   j3 t=1010 4 GPUs run 100: reserved at j2's predicted end, 1360; it really starts at 4000
SHORT = [
    _job(0, 0, 1, 360, 3600),
    _job(1, 0, 1, 360, 3600),
    _job(2, 1000, 2, 3000, 3600),
    _job(3, 1010, 4, 100, 3600),
]


def _replay_learned(on_plan=None):
    return simulate.replay(
        SHORT, nodes=1, gpus_per_node=4, policy=simulate.POLICIES["easy-nodes"],
        declarations=Declarations(estimates="learned", min_jobs=2), on_plan=on_plan,
    )  # fmt: skip


def test_a_learned_prediction_that_falls_short_delays_the_reservation_and_the_replay_says_by_how_much():
    outcomes = _replay_learned()
    assert outcomes[3].promised == 1360 and outcomes[3].start == 4000
    late = simulate.summarize(outcomes, pool_gpus=4)["reservations"]
    assert late == {"reserved": 1, "late": 1, "mean_delay_s": 2640.0, "max_delay_s": 2640.0}


def test_declared_limits_never_delay_a_reservation():
    outcomes = simulate.replay(SHORT, nodes=1, gpus_per_node=4, policy=simulate.POLICIES["easy-nodes"])
    assert outcomes[3].start == 4000 and outcomes[3].promised == 4600
    assert simulate.summarize(outcomes, pool_gpus=4)["reservations"]["late"] == 0


def test_a_job_that_outruns_its_prediction_has_it_extended_at_once():
    plans = []
    _replay_learned(on_plan=lambda now, plan: plans.append((now, plan)))
    at_1360 = [p for now, p in plans if now == 1360]
    assert at_1360, "no pass when j2 outran its prediction"
    (reservation,) = at_1360[0].reservations
    assert reservation.job_id == 3 and math.isclose(reservation.start_at, 1000 + 720)

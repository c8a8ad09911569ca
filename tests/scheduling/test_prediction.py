"""Run times learned per team: never past the declared limit, the declaration until enough history."""

import math

from hypothesis import given
from hypothesis import strategies as st

from jobs.scheduling import prediction
from jobs.scheduling.prediction import Finished

hours = st.floats(min_value=0.01, max_value=500, allow_nan=False)
history = st.lists(
    st.builds(Finished, run_s=st.floats(min_value=1, max_value=4e6), declared_hours=hours), max_size=80
)


@given(history=history, declared=hours)
def test_a_prediction_never_goes_past_the_declared_limit(history, declared):
    learned = prediction.learn(history, min_jobs=3)
    assert 0 < learned.predict_hours(declared) <= declared


@given(history=history, declared=hours, elapsed_share=st.floats(min_value=0, max_value=2))
def test_an_extended_prediction_never_goes_past_the_declared_limit(history, declared, elapsed_share):
    limit_s = declared * 3600
    predicted_s = prediction.learn(history, min_jobs=3).predict_hours(declared) * 3600
    assert prediction.extended_s(predicted_s, elapsed_s=elapsed_share * limit_s, limit_s=limit_s) <= limit_s


@given(history=history, declared=hours)
def test_cold_start_uses_the_declaration(history, declared):
    few = history[:4]
    learned = prediction.learn(few, min_jobs=5)
    assert learned.ratio is None
    assert learned.predict_hours(declared) == declared
    assert "declared" in learned.reason()


def test_a_team_that_uses_two_fifths_of_its_hours_is_predicted_two_fifths():
    history = [Finished(run_s=0.4 * 3600 * 10, declared_hours=10)] * 6
    learned = prediction.learn(history, min_jobs=5)
    assert math.isclose(learned.predict_hours(5), 2.0)
    assert (
        learned.reason()
        == "your team's jobs use 40 % of their declared hours (last 6 finished jobs that succeeded or reached their limit)"
    )


def test_one_outlier_does_not_move_the_ratio():
    history = [Finished(run_s=360, declared_hours=1)] * 8 + [Finished(run_s=3600, declared_hours=1)]
    assert math.isclose(prediction.learn(history, min_jobs=5).ratio, 0.1)


def test_recent_jobs_weigh_more_than_old_ones():
    old, new = Finished(run_s=360, declared_hours=1), Finished(run_s=2880, declared_hours=1)
    learned = prediction.learn([old] * 10 + [new] * 8, min_jobs=5)
    assert math.isclose(learned.ratio, 0.8)


def test_a_run_past_its_declaration_counts_as_the_whole_declaration():
    history = [Finished(run_s=7200, declared_hours=1)] * 5
    assert prediction.learn(history, min_jobs=5).ratio == 1.0


def test_a_job_that_outran_its_prediction_has_it_extended_at_once():
    assert prediction.extended_s(600, elapsed_s=300, limit_s=3600) == 600
    extended = prediction.extended_s(600, elapsed_s=600, limit_s=3600)
    assert 600 < extended <= 3600
    assert prediction.extended_s(600, elapsed_s=3000, limit_s=3600) == 3600

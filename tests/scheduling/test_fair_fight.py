"""bench/fair_fight.py judges each case by the goals it prints: the thresholds, and its constants."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "fair_fight", Path(__file__).resolve().parents[2] / "bench" / "fair_fight.py"
)
fair_fight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fair_fight)

EASY = {"mean_bsld": 100.0, "p99_wait_largest_s": 1000.0, "jain_teams": 0.9, "utilization": 0.80}


def _judged(*, overloaded=False, **ours):
    return fair_fight.goals({"default": {**EASY, **ours}, "easy-nodes": EASY}, overloaded=overloaded)


def test_slowdown_must_fall_30_percent_or_20_when_overloaded():
    assert _judged(mean_bsld=70.0)["bsld"]
    assert not _judged(mean_bsld=75.0)["bsld"]
    assert _judged(mean_bsld=75.0, overloaded=True)["bsld"]
    assert not _judged(mean_bsld=81.0, overloaded=True)["bsld"]


@pytest.mark.parametrize(
    ("ours", "held"),
    [
        ({"p99_wait_largest_s": 1500.0}, {"p99": True}),
        ({"p99_wait_largest_s": 1501.0}, {"p99": False}),
        ({"jain_teams": 0.9}, {"jain": True}),
        ({"jain_teams": 0.8999}, {"jain": False}),
        ({"utilization": 0.78}, {"utilisation": True}),
        ({"utilization": 0.779}, {"utilisation": False}),
    ],
)
def test_each_goal_has_its_threshold(ours, held):
    judged = _judged(mean_bsld=50.0, **ours)
    assert {goal: judged[goal] for goal in held} == held


def test_a_baseline_that_never_waited_its_largest_jobs_allows_no_wait():
    easy = {**EASY, "p99_wait_largest_s": 0.0}
    judge = fair_fight.goals
    assert judge({"default": {**easy, "mean_bsld": 50.0}, "easy-nodes": easy}, overloaded=False)["p99"]
    waited = {**easy, "mean_bsld": 50.0, "p99_wait_largest_s": 60.0}
    assert not judge({"default": waited, "easy-nodes": easy}, overloaded=False)["p99"]


def test_constants_are_set_by_name_and_keep_their_kind():
    config = fair_fight.with_constants(["age_weight=1.25", "reserve_top=2"])
    assert config.age_weight == 1.25 and config.reserve_top == 2 and isinstance(config.reserve_top, int)
    assert config.explain is False  # still the replay's: decisions only


@pytest.mark.parametrize("setting", ["explain=yes", "reserve_top=2.7", "no_such_constant=1"])
def test_a_constant_it_cannot_set_as_asked_stops_the_run(setting):
    with pytest.raises(SystemExit):
        fair_fight.with_constants([setting])


def test_a_boolean_constant_is_read_as_written():
    assert fair_fight.with_constants(["explain=True"]).explain is True
    assert fair_fight.with_constants(["explain=false"]).explain is False

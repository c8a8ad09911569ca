"""A member who can write in the team's output folder swaps a folder for a link while delivery writes there:
delivery, which writes every team's folders, never writes through it into another team's folder.

Each swap is made at a fixed step of the delivery (as the copy starts, or just before the log is opened), so the
race is won every time, not by chance."""

import os

import pytest

from jobs import delivery
from jobs.transfers import destinations
from tests.staging.test_delivery import deliver, released_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def audio(roots):
    """Another team's folder of the same output root, empty."""
    folder = roots.output_root / "audio" / "results"
    folder.mkdir(parents=True)
    return folder


def everything_under(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def swap_for_link(path, target):
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(target)


def swap_as_the_copy_starts(monkeypatch, swap):
    """Runs ``swap`` once, when the first file's copy begins (long after the destination was checked)."""
    real = destinations.copy
    done = []

    def copy(*args, **kwargs):
        if not done:
            done.append(True)
            swap()
        return real(*args, **kwargs)

    monkeypatch.setattr(delivery.destinations, "copy", copy)
    return done


def test_a_files_folder_swapped_for_a_link_during_the_copy_fails_the_delivery_and_writes_nothing_there(
    roots, team, audio, monkeypatch
):
    allocation = released_job(team, roots, {"sub/model.bin": b"vision-controlled bytes"})
    folder = roots.outputs / "run1" / f"{allocation.job_id}-1"
    swapped = swap_as_the_copy_starts(monkeypatch, lambda: swap_for_link(folder / "sub", audio))
    job = deliver(allocation)
    assert swapped
    assert everything_under(audio) == []
    assert job.delivery_state == "failed"
    assert "sub/model.bin: its folder at the destination leads outside it" in job.delivery_detail


def test_the_attempts_folder_swapped_for_a_link_during_the_copy_writes_nothing_there(
    roots, team, audio, monkeypatch
):
    allocation = released_job(team, roots, {"model.bin": b"vision-controlled bytes"})
    folder = roots.outputs / "run1" / f"{allocation.job_id}-1"
    swapped = swap_as_the_copy_starts(monkeypatch, lambda: swap_for_link(folder, audio))
    job = deliver(allocation)
    assert swapped
    assert everything_under(audio) == []
    # The file went to the folder delivery made, wherever it was moved; the log then finds a link: refused.
    assert (folder.with_name(folder.name + ".moved") / "model.bin").read_bytes() == b"vision-controlled bytes"
    assert job.delivery_state == "failed" and "not under the team's folder" in job.delivery_detail


def test_a_link_planted_on_the_way_to_a_files_folder_makes_no_folder_where_it_leads(roots, team, audio):
    allocation = released_job(team, roots, {"sub/deeper/x.bin": b"x"})
    folder = roots.outputs / "run1" / f"{allocation.job_id}-1"
    folder.mkdir(parents=True)
    (folder / "sub").symlink_to(audio)
    job = deliver(allocation)
    assert everything_under(audio) == []
    assert job.delivery_state == "failed" and "leads outside" in job.delivery_detail


def test_the_folder_of_files_in_transit_swapped_for_a_link_during_the_copy_is_not_written_through(
    roots, team, audio, monkeypatch
):
    allocation = released_job(team, roots, {"model.bin": b"vision-controlled bytes"})
    in_transit = roots.outputs / "run1" / f".{allocation.job_id}-1.rank0.e31part"
    seen = []
    real = destinations.copy

    def copy(*args, **kwargs):
        swap_for_link(in_transit, audio)
        copied = real(*args, **kwargs)
        seen.append(everything_under(audio))  # what the copy wrote where the link leads
        return copied

    monkeypatch.setattr(delivery.destinations, "copy", copy)
    job = deliver(allocation)
    assert seen == [[]] and everything_under(audio) == []
    assert job.delivery_state == "delivered", job.delivery_detail
    assert (roots.outputs / "run1" / f"{job.id}-1" / "model.bin").read_bytes() == b"vision-controlled bytes"


def test_the_folder_holding_the_log_swapped_for_a_link_before_the_log_is_written_is_not_written_through(
    roots, team, audio, monkeypatch
):
    from jobs import logs

    allocation = released_job(team, roots, {"a.txt": b"a"})
    logs.append_log(job_id=allocation.job_id, attempt=1, rank=0, offset=0, data=b"vision's log\n")
    run = roots.outputs / "run1"
    real_open = os.open
    done = []

    def opening(path, *args, **kwargs):
        if not done and os.fspath(path).endswith(".log.e31part"):
            done.append(True)
            swap_for_link(run, audio)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", opening)
    job = deliver(allocation)
    monkeypatch.setattr(os, "open", real_open)
    assert done
    assert everything_under(audio) == []
    # The log went to the folder delivery checked and held, wherever it was moved; never through the link.
    assert (run.with_name("run1.moved") / f"{job.id}-1.log").read_bytes() == b"vision's log\n"
    assert job.delivery_state == "delivered", job.delivery_detail

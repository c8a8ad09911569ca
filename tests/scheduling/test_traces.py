"""Trace readers parse SWF and ITP sample lines, and state what they assumed."""

import zlib
from pathlib import Path

import pytest

from jobs.scheduling import traces
from tests import machine

SWF_SAMPLE = """\
; MaxNodes: 4
; MaxProcs: 32
    1        0      0    222   80     -1    -1   80  14400 1200000  1   1   1  -1  1 -1 -1 -1
    2     1136      0 244682   -1     -1    -1  128 259200 1024000  1   2   2  -1  1 -1 -1 -1
    3     1160   2534      0  128     -1    -1  128 259200 1024000  1   2   2  -1  1 -1 -1 -1
    4     1877   1931    300    1     -1    -1    1     -1 1024000  1   7   2  -1  1 -1 -1 -1
    5     1900      0     10   -1     -1    -1   -1   3600 1024000  1   7   2  -1  1 -1 -1 -1
"""

ITP_SAMPLE = """\
job_id,submission_time,duration,num_gpu
f60b9881-76f3-6fc7-d009-6b2a00419afc,5010,1265,1
c9c620ea-4336-c1a9-8abe-e26bd13076b8,5810,288476,16
bad-row,6000,0,1
"""


def test_swf_reader_takes_submit_run_processors_request_and_user():
    trace = traces.read_swf(SWF_SAMPLE.splitlines(), procs_per_gpu=1)
    assert [j.job_id for j in trace.jobs] == [1, 2, 4]
    first, second, third = trace.jobs
    assert (first.submit_s, first.run_s, first.gpus, first.declared_hours, first.team) == (
        0,
        222,
        80,
        4.0,
        "user-1",
    )
    assert second.gpus == 128  # allocated -1: the requested processors
    assert third.declared_hours == pytest.approx(300 / 3600)  # requested -1: its run time
    assert trace.skipped == 2  # zero run time; no processors at all
    assert trace.machine_gpus == 32


def test_an_swf_job_that_overran_its_request_is_estimated_at_its_run_time():
    line = "7 0 5 7200 8 -1 -1 8 3600 -1 1 3 -1 -1 -1 -1 -1 -1"  # ran 2 h against a 1 h request
    trace = traces.read_swf([line])
    assert trace.jobs[0].declared_hours == 2.0
    assert "1 jobs overran" in trace.notes[0]


def test_swf_processors_per_gpu_rounds_up():
    trace = traces.read_swf(SWF_SAMPLE.splitlines(), procs_per_gpu=8)
    assert [j.gpus for j in trace.jobs] == [10, 16, 1]
    assert trace.machine_gpus == 4


def test_itp_reader_assigns_stable_teams_and_whole_hour_limits():
    trace = traces.read_itp(ITP_SAMPLE.splitlines())
    assert len(trace.jobs) == 2 and trace.skipped == 1
    small, big = trace.jobs
    assert (small.submit_s, small.run_s, small.gpus, small.declared_hours) == (5010, 1265, 1, 1.0)
    assert big.declared_hours == 81.0  # 288,476 s = 80.1 h, rounded up
    # CRC-32 of the job id, modulo 8 teams, worked out here rather than by the reader's own helper
    assert small.team == f"team-{zlib.crc32(b'f60b9881-76f3-6fc7-d009-6b2a00419afc') % 8}" == "team-6"
    assert big.team == f"team-{zlib.crc32(b'c9c620ea-4336-c1a9-8abe-e26bd13076b8') % 8}" == "team-6"
    assert any("CRC-32" in n for n in trace.notes)
    assert any("rounded up to a whole hour" in n for n in trace.notes)


def test_itp_overestimate_scales_the_declared_limit():
    assert traces.itp_declared_hours(3000, overestimate=2.0) == 2.0
    assert traces.itp_declared_hours(60) == 1.0


# The shared traces sit beside the repository (../shared), wherever it is cloned.
RICC = Path(__file__).resolve().parents[3] / "shared/traces/ricc-2010/RICC-2010-2-may-jun.swf.gz"


@machine.needs(paths=[RICC])
def test_the_real_ricc_trace_has_95276_jobs_less_the_skipped():
    trace = traces.read_trace(RICC)
    assert len(trace.jobs) + trace.skipped == 95_276
    assert trace.skipped == 9
    assert trace.machine_gpus == 8192

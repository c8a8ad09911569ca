"""Requests held long (exports and downloads a client reads at its pace, log followers' long-polls) leave a web
process a thread for everything else.

Found by review: E31_EXPORTS_PER_PROCESS (2) and E31_LOG_WAITERS_PER_PROCESS (2) added up to the 4 threads the
README's gunicorn runs with: one member of two teams, with two downloads never read and two follows of queued
jobs' logs, held every thread, and /healthz timed out for as long as they stayed open (a load balancer would then
mark the process down). The defaults leave a thread, and gunicorn refuses to start where they would not.
"""

import re
import subprocess
import sys
from pathlib import Path

from common import web_threads

ROOT = Path(__file__).resolve().parents[2]


def _threads_in(text: str) -> list[int]:
    return [int(n) for n in re.findall(r'--threads"?,? "?(\d+)', text)]


def test_the_defaults_leave_a_thread_in_every_web_process_the_project_starts(settings):
    started = _threads_in((ROOT / "README.md").read_text())
    started += _threads_in((ROOT / "operations/management/commands/run_console.py").read_text())
    assert started, "no gunicorn --threads found in the README or run_console"
    for threads in started:
        assert web_threads.refusal(threads) == "", threads


def test_limits_that_could_hold_every_thread_are_refused(settings):
    settings.E31_LOG_WAITERS_PER_PROCESS = 2
    settings.E31_EXPORTS_PER_PROCESS = 2
    why = web_threads.refusal(4)
    assert "E31_EXPORTS_PER_PROCESS" in why and "E31_LOG_WAITERS_PER_PROCESS" in why and "4 threads" in why
    assert web_threads.refusal(5) == ""


def test_gunicorn_is_not_started_where_they_could(tmp_path):
    """The check runs in gunicorn's master before any worker forks (gunicorn.conf.py), as the schema's does."""
    probe = (
        "import os, runpy; os.environ['E31_LOG_WAITERS_PER_PROCESS'] = '3';"
        "conf = runpy.run_path('gunicorn.conf.py'); conf['_set_up_django']();"
        "from types import SimpleNamespace as S;"
        "conf['refuse_held_threads'](S(cfg=S(threads=4)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "web not started" in done.stderr and "E31_LOG_WAITERS_PER_PROCESS" in done.stderr


def test_sync_workers_are_left_to_the_readme(settings):
    """One thread (gunicorn's sync worker): a held request holds the whole process whatever the limits say, so the
    README's deployment runs threads; the check does not refuse what it cannot protect."""
    assert web_threads.refusal(1) == ""

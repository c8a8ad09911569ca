"""A burst of cancels on the embedded console (`make run`) knocks nothing over (issue 15, point 1).

Rounds of 20 submissions, then 60 concurrent cancels of the jobs running: every child process of
the console is still the one it started with, every job reaches a final state, the ledger is clean.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.embedded import demo_token, embedded_console, submit_when_the_pool_is_up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
ROUNDS, SUBMISSIONS, CANCELS = 3, 20, 60


def sleeper(console, n: int) -> dict:
    return {
        "name": f"burst-{n}", "work": {"argv": ["/bin/sleep", "120"]}, "request": {"gpus": 1, "hours": 0.1},
        "output": {"uri": f"file://{console.state_dir}/outputs/demo/burst-{n}", "bytes": 10},
    }  # fmt: skip


def states(console, token: str, ids: list[int]) -> dict[int, str]:
    """One list request per look (a request per job would load the very server under test)."""
    listed = console.api(token, "GET", "/jobs?limit=100")[1]["items"]  # the 60 jobs of its rounds
    return {job["id"]: job["state"] for job in listed if job["id"] in ids}


def running_of(console, token: str, ids: tuple[int, ...]) -> list[int]:
    return [i for i, s in states(console, token, list(ids)).items() if s == "running"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_burst_of_cancels_leaves_every_process_up_and_every_job_final(tmp_path):
    # The burst (and its polling) is one token's hundreds of calls a minute: lifted past the API
    # throttle (E31_API_RATE), which is not what this test measures.
    with embedded_console(
        tmp_path, E31_RECONCILE_EVERY_S="2", E31_RECONCILE_AFTER_S="10", E31_API_RATE="100000/m"
    ) as console:
        token = demo_token(console)
        ids = [submit_when_the_pool_is_up(console, token, sleeper(console, 0))["id"]]
        answers: list[int] = []
        with ThreadPoolExecutor(CANCELS) as pool:
            for round_ in range(ROUNDS):
                bodies = [sleeper(console, round_ * SUBMISSIONS + i + 1) for i in range(SUBMISSIONS)]
                ids += [
                    job["id"] for _, job in pool.map(lambda b: console.api(token, "POST", "/jobs", b), bodies)
                ]
                running = wait_for(
                    lambda jobs=tuple(ids): running_of(console, token, jobs), 90, "jobs to run"
                )
                targets = [running[n % len(running)] for n in range(CANCELS)]
                answers += pool.map(lambda i: console.api(token, "POST", f"/jobs/{i}/cancel")[0], targets)
            # What is still queued or running is cancelled too, so that every job can end.
            live = [i for i, s in states(console, token, ids).items() if s not in ("released", "ended")]
            answers += pool.map(lambda i: console.api(token, "POST", f"/jobs/{i}/cancel")[0], live)
        assert set(answers) <= {200, 409}, sorted(set(answers))
        wait_for(
            lambda: all(s in ("released", "ended") for s in states(console, token, ids).values()),
            180, "every job to reach a final state",
        )  # fmt: skip
        assert console.proc.poll() is None, console.log()[-3000:]
        log = console.log()
        assert "Unrecoverable error" not in log and "restarting in" not in log, log[-3000:]
        ledger = console.manage("check_ledger", check=False)
        assert ledger.returncode == 0 and "0 violations" in ledger.stdout, ledger.stdout + ledger.stderr

"""Two submissions of one job at the same moment, on two real connections: what each came to."""

import threading

from django.db import connection
from django.utils import timezone

from jobs import declaration, services


def submit_twice_at_once(monkeypatch, *, team, user, spec, held_at: tuple[object, str]) -> list[str]:
    """Submits ``spec`` from two threads; each waits at ``held_at`` (a module and the name of a function
    ``submit_job`` calls after its check, before the job is stored) until the other got there too, the window of two
    concurrent requests. Serialised on the team's row, the first waits there in vain (3 s) and the second reads after
    the first job is stored. Returns "accepted", "refused" or the error, one for each submission."""
    module, name = held_at
    barrier, original = threading.Barrier(2), getattr(module, name)

    def held(*args, **kwargs):
        answer = original(*args, **kwargs)
        try:
            barrier.wait(timeout=3)
        except threading.BrokenBarrierError:
            pass
        return answer

    monkeypatch.setattr(module, name, held)
    outcomes: list[str] = []

    def submit() -> None:
        try:
            services.submit_job(team=team, user=user, spec=spec, now=timezone.now())
            outcomes.append("accepted")
        except declaration.DeclarationInvalid:
            outcomes.append("refused")
        except BaseException as exc:  # reported by the caller's assertion
            outcomes.append(f"error: {exc!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes

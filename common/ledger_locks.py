"""The ledger's per-team locks, and the one order every transaction takes its locks in.

Every ledger writer holds the locks of the teams it writes for (two-key advisory locks: this
namespace, the team id), taken in team order, before it inserts: the summary rows a trigger updates
are then reached by one writer per team at a time (``metering.summaries``). A RELEASE holds its job's
row before it closes the meter, so the order everywhere is: job rows (by id), then team ledger locks
(by team). A transaction that releases several jobs must take all their job rows first and the
teams' locks after (``jobs.rental.lock_for_release``): had it taken one team's lock while still
waiting for another job's row, a single RELEASE holding that row and waiting for that lock would
close a cycle. A RENT takes its job's row, its nodes' rows, then its team's lock (so that a budget weighed
meanwhile counts the job once), as a node's loss takes the node's row, its jobs' rows, then their teams' locks;
nothing takes a node's row after a team's lock. Advisory locks are re-entrant, so taking them again later in
the transaction is free.
"""

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.db import connection

TEAM_LEDGER_LOCK = 0x0E31_1ED6


def lock_team_ledgers(team_ids: Iterable[int]) -> None:
    """Waits for the teams' ledger locks (held to the end of the transaction), in team order.

    On SQLite the single writer already serialises every ledger insert, so there is nothing to take.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for team_id in sorted(set(team_ids)):
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [TEAM_LEDGER_LOCK, team_id])


@contextmanager
def team_ledger_held(team_id: int) -> Iterator[None]:
    """The team's ledger lock for the reads inside only (a session lock, let go after them): no ledger writer of
    the team commits meanwhile, so several reads agree although the transaction is not one snapshot."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [TEAM_LEDGER_LOCK, team_id])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [TEAM_LEDGER_LOCK, team_id])

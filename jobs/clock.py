"""The platform's time as a node agent writes it: the node's own clock, corrected by the database's.

An agent dates what the platform judges and meters: a part's start, its end (the meter stops there), its
last sign of life (the reconciler's). A GPU node's clock may be off by minutes or hours (no time service on
it): hours ahead, a ten-minute job was metered for three hours and ten minutes; behind, for nothing, and a
running job looked silent to the reconciler. The agent measures how far its clock is from the database's
when it registers and at every heartbeat (``synchronise``), and dates its reports with ``now()``. In every
other process the correction stays zero: platform machines keep the database's time.
"""

from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

# Written by one thread (the agent's heartbeat), read by the others: a rebinding, atomic under the GIL.
_correction = timedelta(0)


def now() -> datetime:
    """This machine's time, corrected to the database's as last measured."""
    return timezone.now() + _correction


def database_now() -> datetime:
    """The database's own time (PostgreSQL's; SQLite, the embedded console, has none: this machine's)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (database,) = cursor.fetchone()
    return database


def synchronise() -> timedelta:
    """Measures the database's time against this machine's, halfway through the round trip, and keeps the
    difference; returns it. SQLite (the embedded console) has no clock of its own: its agents run beside it."""
    global _correction
    if connection.vendor != "postgresql":
        return _correction
    before = timezone.now()
    database = database_now()
    after = timezone.now()
    _correction = database - (before + (after - before) / 2)
    return _correction

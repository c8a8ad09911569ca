"""The platform's time as a node agent writes it: the node's own clock, corrected by the database's.

An agent dates what the platform judges and meters: a part's start, its end (the meter stops there), its
last sign of life (the reconciler's). A GPU node's clock may be off by minutes or hours (no time service on
it): hours ahead, a ten-minute job was metered for three hours and ten minutes; behind, for nothing, and a
running job looked silent to the reconciler. The agent reads the database's time when it registers and at
every heartbeat (``synchronise``), and dates its reports with ``now()``: that reading plus the time elapsed
since on this machine's monotonic clock, which a time service or an operator's ``date -s`` never steps (a
step between two beats moved every date until the next one). In every other process nothing is read:
platform machines keep the database's time.
"""

import time
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

# The database's time at the last reading and this machine's monotonic clock then; None until one is read.
# Written by one thread (the agent's heartbeat), read by the others: a rebinding, atomic under the GIL.
_reading: tuple[datetime, float] | None = None


def now() -> datetime:
    """The database's time as last read plus the time elapsed since; this machine's time where none was read."""
    reading = _reading
    if reading is None:
        return timezone.now()
    database, monotonic = reading
    return database + timedelta(seconds=time.monotonic() - monotonic)


def database_now() -> datetime:
    """The database's own time (PostgreSQL's; SQLite, the embedded console, has none: this machine's)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (database,) = cursor.fetchone()
    return database


def synchronise() -> timedelta:
    """Reads the database's time, taken as halfway through the round trip, and keeps it; returns how far this
    machine's clock is from it. SQLite (the embedded console) has no clock of its own: its agents run beside it."""
    global _reading
    if connection.vendor != "postgresql":
        return timedelta(0)
    before = time.monotonic()
    database = database_now()
    halfway = before + (time.monotonic() - before) / 2
    _reading = (database, halfway)
    return database - timezone.now() + timedelta(seconds=time.monotonic() - halfway)

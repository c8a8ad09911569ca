"""Streaming exports: rows (dicts) as CSV or as a JSON array, sent in ~64 KiB pieces; and the process's places
that every export and download holds while its client reads.

A ledger export runs to millions of rows: it is never held in memory, and rows are joined into
large pieces because one write per row would dominate the export's cost.
"""

import csv
import io
import json
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.http import FileResponse, HttpResponse, StreamingHttpResponse

CHUNK = 64 * 1024
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "json": "application/json"}
# A spreadsheet opening a CSV evaluates a cell that starts with one of these as a formula (OWASP's
# "CSV injection"); a plain decimal such as "-0.333" it reads as a number, which is safe.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")


def inert(value: object) -> object:
    """A text cell that a spreadsheet would run as a formula, quoted with a leading "'"; anything else as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def csv_pieces(rows: Iterable[dict], columns: list[str]) -> Iterator[str]:
    """A header line, then one line per row with the columns in order, no cell readable as a formula."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([inert(row[c]) for c in columns])
        if buffer.tell() >= CHUNK:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def json_pieces(rows: Iterable[dict], columns: list[str]) -> Iterator[str]:
    """A JSON array of objects, one row per line, with the columns in order."""
    pieces, size = ["["], 1
    for n, row in enumerate(rows):
        piece = ("," if n else "") + "\n" + json.dumps({c: row[c] for c in columns})
        pieces.append(piece)
        size += len(piece)
        if size >= CHUNK:
            yield "".join(pieces)
            pieces, size = [], 0
    pieces.append("\n]\n")
    yield "".join(pieces)


ENCODERS = {"csv": csv_pieces, "json": json_pieces}


# Exports and downloads one web process sends at once: each holds a thread for as long as its client reads
# (slowly, if it likes, or never), and a handful would take every thread of the process; the rest are asked to
# come back. One team holds at most E31_EXPORTS_PER_TEAM of them, so no team can take every team's.
_SENDING = threading.BoundedSemaphore(settings.E31_EXPORTS_PER_PROCESS)
_HELD: Counter[str] = Counter()
_HELD_LOCK = threading.Lock()
BUSY_RETRY_S = 5


class Busy(Exception):
    """Every sending place of this process is taken, or as many as the asking team may hold."""

    retry_after_s = BUSY_RETRY_S

    def __init__(self, *, holder: str = "") -> None:
        if holder:
            n = settings.E31_EXPORTS_PER_TEAM
            held = f"{n} export or download" if n == 1 else f"{n} exports and downloads"
            who = "your team already has" if holder.startswith("team:") else "the operators already have"
            message = f"{who} {held} being sent by this web process (E31_EXPORTS_PER_TEAM)"
        else:
            message = (
                f"{settings.E31_EXPORTS_PER_PROCESS} exports and downloads are being sent by this web process"
            )
        super().__init__(f"{message}: try again in {BUSY_RETRY_S} s.")

    def response(self) -> HttpResponse:
        busy = HttpResponse(f"{self}\n", status=429, content_type="text/plain; charset=utf-8")
        busy["Retry-After"] = str(self.retry_after_s)
        return busy


class _Place:
    """One of the process's sending places, held for ``holder`` (a team) until released, once."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def release(self) -> None:
        with _HELD_LOCK:
            _HELD[self.holder] -= 1
        _SENDING.release()


def holder_for(user, team_id: int | None) -> str:
    """Whose share a download or export takes: its team's, or the operators' own (an operator downloading a team's
    outputs holds back neither that team nor any other)."""
    return "operators" if user.is_staff or team_id is None else f"team:{team_id}"


def take_a_place(holder: str) -> _Place:
    """A sending place for ``holder`` (a team, or "every team" for an operator's whole-pool export), released when
    the response holding it closes; Busy if the holder has its share already, or none is free."""
    with _HELD_LOCK:
        if _HELD[holder] >= settings.E31_EXPORTS_PER_TEAM:
            raise Busy(holder=holder)
        if not _SENDING.acquire(blocking=False):
            raise Busy()
        _HELD[holder] += 1
    return _Place(holder)


class _HoldingAPlace:
    """A response's pieces, holding one of the process's places until they are all sent or the response is closed
    (a client gone before the end)."""

    def __init__(self, pieces: Iterator, place: _Place) -> None:
        self._pieces, self._place = pieces, place
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator:
        try:
            yield from self._pieces
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            place, self._place = self._place, None
        if place is not None:
            place.release()


class _HeldFile:
    """A file a FileResponse sends, holding a place until the response closes it (which the server does when the
    client has read it all, or left); everything else is the file's own, sendfile's descriptor included."""

    def __init__(self, handle, place: _Place) -> None:
        self._handle, self._holding = handle, _HoldingAPlace(iter(()), place)

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def close(self) -> None:
        try:
            self._handle.close()
        finally:
            self._holding.close()


def file_download(handle, *, filename: str, holder: str) -> FileResponse:
    """``handle`` sent as an attachment named ``filename``, in one of the process's places held for ``holder``;
    Busy (and the handle closed) if none is free."""
    try:
        place = take_a_place(holder)
    except Busy:
        handle.close()
        raise
    return FileResponse(_HeldFile(handle, place), as_attachment=True, filename=filename)


def held_stream(pieces: Iterator[bytes], *, content_type: str, holder: str) -> StreamingHttpResponse:
    """``pieces`` streamed in one of the process's places held for ``holder``; Busy if none is free."""
    return StreamingHttpResponse(_HoldingAPlace(pieces, take_a_place(holder)), content_type=content_type)


def streaming_export(
    rows: Iterable[dict], *, columns: list[str], fmt: str, filename: str, holder: str
) -> HttpResponse | StreamingHttpResponse:
    """A download of ``rows`` in ``fmt`` ("csv" or "json") named ``filename``; a 429 while this process sends
    E31_EXPORTS_PER_PROCESS exports and downloads already, or ``holder``'s share of them."""
    try:
        response = held_stream(ENCODERS[fmt](rows, columns), content_type=CONTENT_TYPES[fmt], holder=holder)
    except Busy as busy:
        return busy.response()
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

"""Streaming exports: rows (dicts) as CSV or as a JSON array, sent in ~64 KiB pieces.

A ledger export runs to millions of rows: it is never held in memory, and rows are joined into
large pieces because one write per row would dominate the export's cost.
"""

import csv
import io
import json
import re
import threading
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse

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


# Exports one web process sends at once: each holds a thread for as long as its client reads (slowly, if it likes),
# and a handful would take every thread of the process; the rest are asked to come back.
_SENDING = threading.BoundedSemaphore(settings.E31_EXPORTS_PER_PROCESS)
BUSY_RETRY_S = 5


class _HoldingAPlace:
    """An export's pieces, holding one of the process's places until they are all sent or the response is closed
    (a client gone before the end)."""

    def __init__(self, pieces: Iterator[str], place: threading.BoundedSemaphore) -> None:
        self._pieces, self._place = pieces, place
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._pieces
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            place, self._place = self._place, None
        if place is not None:
            place.release()


def streaming_export(
    rows: Iterable[dict], *, columns: list[str], fmt: str, filename: str
) -> HttpResponse | StreamingHttpResponse:
    """A download of ``rows`` in ``fmt`` ("csv" or "json") named ``filename``; a 429 while this process sends
    E31_EXPORTS_PER_PROCESS exports already."""
    place = _SENDING
    if not place.acquire(blocking=False):
        busy = HttpResponse(
            f"{settings.E31_EXPORTS_PER_PROCESS} exports are being sent by this web process: "
            f"try again in {BUSY_RETRY_S} s.\n",
            status=429, content_type="text/plain; charset=utf-8",
        )  # fmt: skip
        busy["Retry-After"] = str(BUSY_RETRY_S)
        return busy
    pieces = _HoldingAPlace(ENCODERS[fmt](rows, columns), place)
    response = StreamingHttpResponse(pieces, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

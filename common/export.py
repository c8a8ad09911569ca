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
# come back.
_SENDING = threading.BoundedSemaphore(settings.E31_EXPORTS_PER_PROCESS)
BUSY_RETRY_S = 5


class Busy(Exception):
    """Every sending place of this process is taken."""

    retry_after_s = BUSY_RETRY_S

    def __init__(self) -> None:
        super().__init__(
            f"{settings.E31_EXPORTS_PER_PROCESS} exports and downloads are being sent by this web process: "
            f"try again in {BUSY_RETRY_S} s."
        )

    def response(self) -> HttpResponse:
        busy = HttpResponse(f"{self}\n", status=429, content_type="text/plain; charset=utf-8")
        busy["Retry-After"] = str(self.retry_after_s)
        return busy


def take_a_place() -> threading.BoundedSemaphore:
    """One of the process's sending places, released when the response holding it closes; Busy if none is free."""
    place = _SENDING
    if not place.acquire(blocking=False):
        raise Busy()
    return place


class _HoldingAPlace:
    """A response's pieces, holding one of the process's places until they are all sent or the response is closed
    (a client gone before the end)."""

    def __init__(self, pieces: Iterator, place: threading.BoundedSemaphore) -> None:
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

    def __init__(self, handle, place: threading.BoundedSemaphore) -> None:
        self._handle, self._holding = handle, _HoldingAPlace(iter(()), place)

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def close(self) -> None:
        try:
            self._handle.close()
        finally:
            self._holding.close()


def file_download(handle, *, filename: str) -> FileResponse:
    """``handle`` sent as an attachment named ``filename``, in one of the process's places; Busy (and the handle
    closed) if none is free."""
    try:
        place = take_a_place()
    except Busy:
        handle.close()
        raise
    return FileResponse(_HeldFile(handle, place), as_attachment=True, filename=filename)


def held_stream(pieces: Iterator[bytes], *, content_type: str) -> StreamingHttpResponse:
    """``pieces`` streamed in one of the process's places; Busy if none is free."""
    return StreamingHttpResponse(_HoldingAPlace(pieces, take_a_place()), content_type=content_type)


def streaming_export(
    rows: Iterable[dict], *, columns: list[str], fmt: str, filename: str
) -> HttpResponse | StreamingHttpResponse:
    """A download of ``rows`` in ``fmt`` ("csv" or "json") named ``filename``; a 429 while this process sends
    E31_EXPORTS_PER_PROCESS exports and downloads already."""
    try:
        response = held_stream(ENCODERS[fmt](rows, columns), content_type=CONTENT_TYPES[fmt])
    except Busy as busy:
        return busy.response()
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

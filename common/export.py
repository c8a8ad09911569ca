"""Streaming exports: rows (dicts) as CSV or as a JSON array, sent in ~64 KiB pieces.

A ledger export runs to millions of rows: it is never held in memory, and rows are joined into
large pieces because one write per row would dominate the export's cost.
"""

import csv
import io
import json
from collections.abc import Iterable, Iterator

from django.http import StreamingHttpResponse

CHUNK = 64 * 1024
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "json": "application/json"}


def csv_pieces(rows: Iterable[dict], columns: list[str]) -> Iterator[str]:
    """A header line, then one line per row with the columns in order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([row[c] for c in columns])
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


def streaming_export(
    rows: Iterable[dict], *, columns: list[str], fmt: str, filename: str
) -> StreamingHttpResponse:
    """A download of ``rows`` in ``fmt`` ("csv" or "json") named ``filename``."""
    pieces = ENCODERS[fmt](rows, columns)
    response = StreamingHttpResponse(pieces, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

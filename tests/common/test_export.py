"""The CSV encoder: a cell a spreadsheet would run as a formula is written as text."""

import csv
import io
import threading

import pytest

from common import export


@pytest.mark.parametrize(
    "cell", ['=HYPERLINK("http://evil.example")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\r=1", "-", "=-1"]
)
def test_a_text_cell_that_would_be_a_formula_starts_with_a_quote(cell):
    assert export.inert(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["-0.333", "-60.000000", "+5", "12", "train", "", 7, -3, None])
def test_numbers_and_plain_text_are_written_as_they_are(cell):
    assert export.inert(cell) == cell


def test_the_csv_pieces_quote_only_the_dangerous_cells():
    rows = [{"reason": "=1+1", "seconds": "-60.000000", "gpus": 2}]
    body = "".join(export.csv_pieces(rows, ["reason", "seconds", "gpus"]))
    assert list(csv.reader(io.StringIO(body))) == [
        ["reason", "seconds", "gpus"],
        ["'=1+1", "-60.000000", "2"],
    ]


@pytest.mark.django_db  # closing a response ends its request, which looks at the database connection
def test_an_export_whose_client_left_before_its_end_frees_its_place(monkeypatch):
    monkeypatch.setattr(export, "_SENDING", threading.BoundedSemaphore(1))
    rows = [{"a": 1}, {"a": 2}]
    first = export.streaming_export(iter(rows), columns=["a"], fmt="csv", filename="x.csv", holder="team:1")
    assert (
        export.streaming_export(
            iter(rows), columns=["a"], fmt="csv", filename="x.csv", holder="team:2"
        ).status_code
        == 429
    )

    first.close()  # what the server does when the client goes away, read or not

    again = export.streaming_export(iter(rows), columns=["a"], fmt="csv", filename="x.csv", holder="team:2")
    assert again.status_code == 200
    again.close()

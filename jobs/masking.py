"""Masks a job's secrets in its output stream: ``[secret NAME]`` wherever a value's bytes appear.

A value may arrive split across two reads, so the tail that could still be the start of one is held
back until the next read (or the end) decides. Values may overlap (one printed right after another
that ends as it begins): every byte of every occurrence is masked, the overlap under the earlier
value's name. Standard library only; the agent feeds it every read.

Each value is looked for with ``bytes.find``, whose time is linear in the output: one regular expression of all
the values, tried at every byte, took time in the output times a value's length where the output almost
repeats a value (1.3 s of the agent's interpreter per 64 KiB read for a 64 KiB secret), and a team's job could
hold up every other thread of its node's agent so.
"""

import heapq
from collections.abc import Iterator


class SecretMask:
    def __init__(self, secrets: dict[str, str]) -> None:
        values = {value.encode(): f"[secret {name}]".encode() for name, value in secrets.items() if value}
        self._names = values
        self._values = sorted(values, key=len, reverse=True)
        self._periods = {value: _period(value) for value in self._values}
        self._hold = max(map(len, self._values), default=1) - 1
        self._pending = b""
        # How many leading bytes of ``_pending`` an occurrence already masked (its label written) still covers.
        self._covered, self._label = 0, b""

    def feed(self, chunk: bytes) -> bytes:
        """What of ``pending + chunk`` can be written now, masked; a possible start of a value is kept."""
        if not self._values:
            return chunk
        data = self._pending + chunk
        cut = max(len(data) - self._hold, 0)  # an unfinished value starts at or after this
        out = self._masked(data, cut)
        self._pending = data[cut:]
        return out

    def flush(self) -> bytes:
        """The held-back tail at the end of the stream, masked."""
        data, self._pending = self._pending, b""
        if not self._values:
            return data
        out = self._masked(data, len(data))
        self._covered, self._label = 0, b""
        return out

    def _masked(self, data: bytes, cut: int) -> bytes:
        """``data[:cut]`` with every byte of an occurrence masked. Every value starting before ``cut`` ends
        within ``data``; one that reaches past ``cut`` is carried into the next call as ``_covered``."""
        out, pos = bytearray(), 0
        reach, label = self._covered, self._label  # the masked region's end, and whose label it is under
        if reach:
            pos = min(reach, cut)
        for start, _, value in self._occurrences(data, cut):
            end = start + len(value)
            if end <= reach:
                continue  # inside what is masked already
            name = self._names[value]
            if start >= reach or name != label:  # a new region, or another value going on past the one before
                out += data[pos:start] + name
            reach, label = end, name
            pos = min(end, cut)
        out += data[pos:cut]
        self._covered, self._label = max(reach - cut, 0), label
        return bytes(out)

    def _occurrences(self, data: bytes, cut: int) -> Iterator[tuple[int, int, bytes]]:
        """(start, -length, value) of every occurrence starting before ``cut``, overlapping ones too, by start;
        of the values starting at one byte the longest first (a value that contains another is masked whole)."""
        return heapq.merge(*(_starts(data, value, self._periods[value], cut) for value in self._values))


def _starts(data: bytes, value: bytes, period: int, cut: int) -> Iterator[tuple[int, int, bytes]]:
    """Where ``value`` starts in ``data`` before ``cut``. Two occurrences closer than the value's length make it
    repeat with their distance, so none starts less than ``period`` after another; and where it repeats, the
    next one starts exactly one period on if the period's bytes after this one follow: comparing those alone,
    not the whole value again, keeps a job printing its own repeating secret from costing the output times the value."""
    end = cut + len(value) - 1  # an occurrence must lie within data[:end]
    follows = value[len(value) - period :]
    start = data.find(value, 0, end)
    while start != -1:
        yield start, -len(value), value
        if period < len(value) and data.startswith(follows, start + len(value), end):
            start += period
        else:
            start = data.find(value, start + period, end)


def _period(value: bytes) -> int:
    """The smallest p with value[i] == value[i + p] wherever both exist (the length for a value that never
    repeats within itself): the length less its longest proper prefix that is also a suffix (KMP's table)."""
    border = [0] * len(value)
    k = 0
    for i in range(1, len(value)):
        while k and value[i] != value[k]:
            k = border[k - 1]
        if value[i] == value[k]:
            k += 1
        border[i] = k
    return len(value) - border[-1]

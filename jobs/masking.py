"""Masks a job's secrets in its output stream: ``[secret NAME]`` wherever a value's bytes appear.

A value may arrive split across two reads, so the tail that could still be the start of one is held
back until the next read (or the end) decides. Values may overlap (one printed right after another
that ends as it begins): every byte of every occurrence is masked, the overlap under the earlier
value's name. Standard library only; the agent feeds it every read.
"""

import re


class SecretMask:
    def __init__(self, secrets: dict[str, str]) -> None:
        values = {value.encode(): f"[secret {name}]".encode() for name, value in secrets.items() if value}
        self._names = values
        # A lookahead finds every occurrence, overlapping ones too; longest first, so of the values starting at one
        # byte the longest is found (a value that contains another is masked whole).
        ordered = sorted(values, key=len, reverse=True)
        self._pattern = re.compile(b"(?=(" + b"|".join(map(re.escape, ordered)) + b"))") if ordered else None
        self._hold = max(map(len, ordered), default=1) - 1
        self._pending = b""
        # How many leading bytes of ``_pending`` an occurrence already masked (its label written) still covers.
        self._covered, self._label = 0, b""

    def feed(self, chunk: bytes) -> bytes:
        """What of ``pending + chunk`` can be written now, masked; a possible start of a value is kept."""
        if self._pattern is None:
            return chunk
        data = self._pending + chunk
        cut = max(len(data) - self._hold, 0)  # an unfinished value starts at or after this
        out = self._masked(data, cut)
        self._pending = data[cut:]
        return out

    def flush(self) -> bytes:
        """The held-back tail at the end of the stream, masked."""
        data, self._pending = self._pending, b""
        if self._pattern is None:
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
        for match in self._pattern.finditer(data):
            start, end = match.start(), match.start() + len(match.group(1))
            if start >= cut:
                break
            if end <= reach:
                continue  # inside what is masked already
            name = self._names[match.group(1)]
            if start >= reach or name != label:  # a new region, or another value going on past the one before
                out += data[pos:start] + name
            reach, label = end, name
            pos = min(end, cut)
        out += data[pos:cut]
        self._covered, self._label = max(reach - cut, 0), label
        return bytes(out)

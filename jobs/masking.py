"""Masks a job's secrets in its output stream: ``[secret NAME]`` wherever a value's bytes appear.

A value may arrive split across two reads, so the tail that could still be the start of one is held
back until the next read (or the end) decides. Standard library only; the agent feeds it every read.
"""

import re


class SecretMask:
    def __init__(self, secrets: dict[str, str]) -> None:
        values = {value.encode(): f"[secret {name}]".encode() for name, value in secrets.items() if value}
        self._names = values
        # Longest first: a value that contains another is masked whole.
        ordered = sorted(values, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(map(re.escape, ordered))) if ordered else None
        self._hold = max(map(len, ordered), default=1) - 1
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of ``pending + chunk`` can be written now, masked; a possible start of a value is kept."""
        if self._pattern is None:
            return chunk
        data, out, pos = self._pending + chunk, bytearray(), 0
        cut = max(len(data) - self._hold, 0)  # an unfinished value starts at or after this
        for match in self._pattern.finditer(data):
            if match.start() >= cut:
                break
            out += data[pos : match.start()] + self._names[match.group()]
            pos = match.end()
        end = max(pos, cut)
        out += data[pos:end]
        self._pending = data[end:]
        return bytes(out)

    def flush(self) -> bytes:
        """The held-back tail at the end of the stream, masked."""
        data, self._pending = self._pending, b""
        if self._pattern is None:
            return data
        return self._pattern.sub(lambda match: self._names[match.group()], data)

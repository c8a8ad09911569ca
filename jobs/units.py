"""Byte sizes as people write them ("1.5 TB", "200 GiB", "512") and back."""

import re
from decimal import Decimal, InvalidOperation

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
MAX_BYTES = 10**18  # an exabyte: anything larger is a typo, not a dataset


def gpus_on(node: str, indices) -> str:
    """'local-1 (GPU 0)', 'gpu-01 (GPUs 0, 1)': GPU indices never read as a count."""
    indices = list(indices)
    return f"{node} (GPU{'' if len(indices) == 1 else 's'} {', '.join(map(str, indices))})"


def placement(gpus_by_node: dict[str, tuple[int, ...]]) -> str:
    """A start's GPUs node by node, as its RENT line names them: 'gpu-01 (GPUs 0, 1), gpu-02 (GPU 0)'."""
    return ", ".join(gpus_on(node, indices) for node, indices in gpus_by_node.items())


def parse_size(value: object) -> int:
    """An exact byte count from an int or a string with an optional unit; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes, not true/false")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{value[:40]!r} is not a size (try 512, 20 GB or 1.5 TiB)")
        try:
            size = int(Decimal(match.group(1)) * _UNITS[match.group(2).lower()])
        except InvalidOperation as exc:
            raise ValueError(f"{value[:40]!r} is not a size") from exc
    else:
        raise ValueError("a size is a number of bytes or a string such as '20 GB'")
    if size < 0:
        raise ValueError("a size cannot be negative")
    if size > MAX_BYTES:
        raise ValueError("a size above 1 EB is not plausible")
    return size


def format_size(size: int | None) -> str:
    if size is None:
        return "—"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if value < 1000 or unit == "PB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"

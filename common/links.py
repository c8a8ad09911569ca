"""Links to the console's pages, reversed once per URL name instead of once per link.

``reverse()`` walks the URL namespaces and patterns on every call: on a page of 25 job rows (two links
each) and the menu that was 63 calls and a third of the job list's render time. A name is reversed
once per script prefix (the prefix a deployment serves under is part of every link), with a marker in
place of its one integer argument, and each link formats the id into that.
"""

import functools

from django.urls import get_script_prefix, reverse

_MARKER = 7_316_590_437_219_842  # an id no row has: reversed in place of the argument, then cut out


def href(name: str, pk: int | None = None) -> str:
    """``reverse(name)``, or ``reverse(name, args=[pk])`` for a name that takes one argument (an id)."""
    if pk is None:
        return _constant(name, get_script_prefix())
    head, tail = _pattern(name, get_script_prefix())
    return f"{head}{int(pk)}{tail}"


@functools.cache
def _constant(name: str, prefix: str) -> str:
    return reverse(name)


@functools.cache
def _pattern(name: str, prefix: str) -> tuple[str, str]:
    head, marker, tail = reverse(name, args=[_MARKER]).partition(str(_MARKER))
    if not marker:
        raise ValueError(f"{name!r} does not put its argument in the path as it is")
    return head, tail

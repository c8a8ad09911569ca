"""Links to the console's pages, reversed once per URL name instead of once per link.

``reverse()`` walks the URL namespaces and patterns on every call: on a page of 25 job rows (two links
each) and the menu that was 63 calls, over a quarter of the job list's render time. A name is reversed
once per script prefix (the prefix a deployment serves under is part of every link), with a marker in
place of its one integer argument, and each link formats the id into that.
"""

import functools

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.urls import get_script_prefix, get_urlconf, reverse

_MARKER = 7_316_590_437_219_842  # an id no row has: reversed in place of the argument, then cut out


def href(name: str, pk: int | None = None) -> str:
    """``reverse(name)``, or ``reverse(name, args=[pk])`` for a name that takes one argument (an id)."""
    if pk is None:
        return _constant(name, get_script_prefix(), get_urlconf())
    head, tail = _pattern(name, get_script_prefix(), get_urlconf())
    return f"{head}{int(pk)}{tail}"


# Keyed by what reverse() reads besides the name: the prefix and a request's own URLconf, if it set one.
@functools.lru_cache(maxsize=512)
def _constant(name: str, prefix: str, urlconf: str | None) -> str:
    return reverse(name, urlconf=urlconf)


@functools.lru_cache(maxsize=512)
def _pattern(name: str, prefix: str, urlconf: str | None) -> tuple[str, str]:
    head, marker, tail = reverse(name, urlconf=urlconf, args=[_MARKER]).partition(str(_MARKER))
    if not marker:
        raise ValueError(f"{name!r} does not put its argument in the path as it is")
    return head, tail


@receiver(setting_changed)
def _forget_on_new_urlconf(*, setting: str, **kwargs) -> None:
    """As Django forgets its own resolvers when ROOT_URLCONF changes (tests override it)."""
    if setting == "ROOT_URLCONF":
        _constant.cache_clear()
        _pattern.cache_clear()


def in_email(path: str) -> str:
    """An absolute link for an e-mail: the console's address as its users reach it (``E31_CONSOLE_URL``, which
    holds any prefix the console is served under) and ``path`` after the script prefix. Never the Host or scheme a
    request came with: behind a proxy that may be plain HTTP on an internal name, and a link that creates an
    account must not travel that way."""
    inside = path.removeprefix(get_script_prefix()).lstrip("/")
    return f"{settings.E31_CONSOLE_URL.rstrip('/')}/{inside}"

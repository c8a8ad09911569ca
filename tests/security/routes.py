"""Every URL the console serves, read from the URL configuration itself, so no route can skip the checks.

``all_routes()`` walks ``get_resolver().url_patterns`` recursively; ``build_path`` fills a route's
arguments and checks the result resolves back to that same route.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RoutePattern

_ROUTE_ARG = re.compile(r"<(?:\w+:)?(\w+)>")
_REGEX_ARG = re.compile(r"\(\?P<(\w+)>[^)]*\)")


@dataclass(frozen=True)
class Route:
    route: str  # "jobs/<int:job_id>/", as written in the URL configuration
    name: str  # "jobs:detail"; "" for unnamed patterns (the admin's redirects)
    args: tuple[str, ...]
    pattern: URLPattern

    @property
    def key(self) -> str:
        """How the expectations table names this route: its URL name, else its route."""
        return self.name or self.route


def _walk(patterns, prefix: str, namespace: str) -> Iterator[Route]:
    for p in patterns:
        if isinstance(p, URLResolver):
            inner = ":".join(n for n in (namespace, p.namespace) if n) if p.namespace else namespace
            yield from _walk(p.url_patterns, prefix + _text(p.pattern), inner)
        elif isinstance(p, URLPattern):
            name = f"{namespace}:{p.name}" if namespace and p.name else (p.name or "")
            yield Route(prefix + _text(p.pattern), name, tuple(p.pattern.regex.groupindex), p)


def _text(pattern) -> str:
    text = str(pattern)
    return text if isinstance(pattern, RoutePattern) else text.removeprefix("^").removesuffix("$")


def all_routes() -> list[Route]:
    """Every URL pattern; django-ninja lists a path once per operation (GET and POST /jobs: two)."""
    return list(_walk(get_resolver().url_patterns, "", ""))


def build_path(route: Route, kwargs: dict[str, object]) -> str:
    missing = set(route.args) - set(kwargs)
    if missing:
        raise LookupError(f"no value for {sorted(missing)}")
    path = "/" + _REGEX_ARG.sub(lambda m: str(kwargs[m.group(1)]), route.route)  # first: "(?P<x>" holds "<x>"
    path = _ROUTE_ARG.sub(lambda m: str(kwargs[m.group(1)]), path)
    match = resolve(path)
    if match.func is not route.pattern.callback and match.route != route.route:
        raise LookupError(f"{path} resolves to {match.route!r}, not to {route.route!r}")
    return path

"""How a webhook's address is shown on the team's page."""

from urllib.parse import urlsplit

from django import template

register = template.Library()


@register.filter
def shown_to(url: str, admin: bool) -> str:
    """The whole address to the team's admins, who add and remove webhooks; to its members, the origin only: the
    path and query often carry the receiver's own secret (a chat service's incoming-webhook token), with which
    anyone could post into that channel, as the operators' audit log keeps them out too."""
    if admin:
        return url
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"

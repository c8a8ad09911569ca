"""Reads for accounts: why an API token was refused."""

from accounts import services
from accounts.models import ApiToken

NEW_TOKEN = "create a new one on the API tokens page"


def why_token_refused(token: str) -> str:
    """What is wrong with a token that authenticates nobody, in words its holder can act on.

    Only the token's holder learns anything: the row is found by the token's own digest.
    """
    if not token:
        return "The Bearer token is empty: send 'Authorization: Bearer <token>'."
    if not token.startswith(services.TOKEN_PREFIX):
        return (
            f"The token does not look like an E31 token (they start with {services.TOKEN_PREFIX!r}): "
            "copy it whole, or " + NEW_TOKEN + "."
        )
    row = ApiToken.objects.select_related("user").filter(digest=services.digest_token(token)).first()
    if row is None:
        return f"The token is not known (mistyped or cut short?): check it, or {NEW_TOKEN}."
    if row.revoked_at is not None:
        return f"The token {row.prefix}… was revoked on {row.revoked_at:%Y-%m-%d %H:%M} UTC: {NEW_TOKEN}."
    if not row.user.is_active:
        return f"The token {row.prefix}… belongs to a deactivated user: ask an operator."
    # Live and its user active: it was revoked or its user deactivated and restored while the request ran.
    return f"The token {row.prefix}… was refused while it changed: send the request again."

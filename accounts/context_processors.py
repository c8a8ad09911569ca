from accounts.models import Team


def membership(request) -> dict:
    """The teams the signed-in user is a member of, for the header's label (an operator sees every
    team, but belongs only to its own)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"user_teams": []}
    return {"user_teams": list(Team.objects.filter(memberships__user=user).only("name", "slug")[:5])}

from accounts import scoping


def membership(request) -> dict:
    """The signed-in user's teams, for the header's team name."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"user_teams": []}
    return {"user_teams": list(scoping.teams_of(user).only("name", "slug")[:5])}

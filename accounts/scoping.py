"""The one gate for team-scoped data.

Every query for a team's objects goes through ``visible_to``: operators see every team,
members see their teams, and anything else simply does not exist for them (a 404, not a 403,
so nobody can probe for another team's job ids).
"""

from django.db.models import Model, QuerySet
from django.http import Http404

from accounts.models import Team


def teams_of(user) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def visible_to(user, queryset: QuerySet, *, team_field: str = "team") -> QuerySet:
    """Narrows any queryset with a team foreign key to what ``user`` may see."""
    if not user.is_authenticated:
        return queryset.none()
    if user.is_staff:
        return queryset
    return queryset.filter(**{f"{team_field}__memberships__user": user})


def get_visible_or_404(user, queryset: QuerySet, *, team_field: str = "team", **lookup) -> Model:
    obj = visible_to(user, queryset, team_field=team_field).filter(**lookup).first()
    if obj is None:
        raise Http404("No such object")
    return obj


def is_team_admin(user, team: Team) -> bool:
    return user.is_staff or team.memberships.filter(user=user, role="admin").exists()

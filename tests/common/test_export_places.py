"""A team holds at most E31_EXPORTS_PER_TEAM of a web process's sending places: no team can take every team's.

Found by trying it: the process's two places (E31_EXPORTS_PER_PROCESS) were first come, first served, so one member
who opened two ledger exports and never read them had every other team's ledger exports, log downloads and output
downloads answered 429 for as long as the two stayed open.
"""

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db

EXPORT = reverse("metering:export_csv") + "?start=2020-01-01&end=2030-12-31"


def test_a_team_holding_its_places_leaves_the_others_to_every_other_team(
    member_client, outsider_client, settings
):
    settings.E31_EXPORTS_PER_TEAM = 1
    held = member_client.get(EXPORT)
    assert held.status_code == 200
    second = member_client.get(EXPORT)
    assert second.status_code == 429 and second["Retry-After"]
    assert "your team" in second.content.decode()
    other = outsider_client.get(EXPORT)
    assert other.status_code == 200
    for response in (held, other):
        b"".join(response.streaming_content)  # read to its end: the place is given back
    again = member_client.get(EXPORT)
    assert again.status_code == 200  # the team's place is free again
    b"".join(again.streaming_content)


def test_operators_have_a_share_of_their_own_and_are_told_so(operator_client, member_client, team, settings):
    """Found in review: an operator downloading a team's data took that team's place, and was told "your team"."""
    settings.E31_EXPORTS_PER_TEAM = 1
    held = operator_client.get(EXPORT + f"&team={team.slug}")
    assert held.status_code == 200
    refused = operator_client.get(EXPORT)
    assert refused.status_code == 429 and "the operators already have" in refused.content.decode()
    mine = member_client.get(EXPORT)
    assert mine.status_code == 200  # the team's own place was never the operator's
    for response in (held, mine):
        b"".join(response.streaming_content)

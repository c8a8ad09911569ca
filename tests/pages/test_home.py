"""The home page and the navigation links to the public pages."""

import pytest
from django.urls import reverse


def _main(html: bytes) -> str:
    """The page's own content, without the shared header and footer."""
    text = html.decode()
    return text[text.index("<main") : text.index("</main>")]


@pytest.mark.django_db
def test_home_says_what_e31_is_names_the_steps_and_links_to_the_pages_and_sign_in(client):
    main = _main(client.get(reverse("home")).content)
    assert "GPU compute network" in main
    steps = ["SUBMIT", "STAGE", "QUEUE", "RENT", "RUN", "OUTPUT", "RELEASE"]
    positions = [main.index(f"<strong>{step}</strong>") for step in steps]
    assert positions == sorted(positions)
    for name in ("unsolved", "partners", "accounts:login"):
        assert f'href="{reverse(name)}"' in main


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["home", "unsolved", "partners"])
def test_no_public_page_names_a_price(client, name, intake_open):
    main = _main(client.get(reverse(name)).content).lower()
    for word in ("price", "$", "€", "£", "per gpu-hour", "per hour", "rate card"):
        assert word not in main


@pytest.mark.django_db
def test_every_visitor_sees_the_public_links_and_only_operators_see_the_review_link(client, operator_client):
    visitor = client.get(reverse("home")).content.decode()
    assert f'href="{reverse("unsolved")}"' in visitor and f'href="{reverse("partners")}"' in visitor
    assert reverse("partners-review") not in visitor
    assert reverse("partners-review") in operator_client.get(reverse("home")).content.decode()


@pytest.mark.django_db
def test_the_number_of_steps_the_home_page_announces_is_the_number_it_lists(client):
    main = _main(client.get(reverse("home")).content)
    words = {"five": 5, "six": 6, "seven": 7}
    heading = main[main.index("<h2>A job") : main.index("</h2>", main.index("<h2>A job"))]
    announced = [n for word, n in words.items() if f" {word} " in f"{heading} "]
    listed = main[main.index('<ol class="steps">') : main.index("</ol>")].count("<li")
    assert announced == [listed], (heading, listed)

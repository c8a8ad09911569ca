"""common.links.href gives what reverse() gives, under whatever script prefix the console is served at."""

import pytest
from django.urls import NoReverseMatch, reverse, set_script_prefix

from common import links


@pytest.fixture
def prefix():
    yield set_script_prefix
    set_script_prefix("/")


@pytest.mark.parametrize("served_at", ["/", "/console/"])
def test_href_is_reverse_for_names_with_no_argument_or_one_integer(prefix, served_at):
    prefix(served_at)
    for name in ("jobs:list", "metering:ledger", "home"):
        assert links.href(name) == reverse(name)
    for name, pk in (("jobs:detail", 1), ("jobs:detail", 98_765_432), ("jobs:array-cancel", 7)):
        assert links.href(name, pk) == reverse(name, args=[pk])
    assert links.href("jobs:detail", 5).startswith(served_at)


def test_a_name_that_takes_more_than_one_argument_is_refused_as_reverse_refuses_it():
    with pytest.raises(NoReverseMatch):
        links.href("operations:job-action", 3)


def test_a_new_urlconf_forgets_the_kept_patterns(settings):
    links.href("jobs:detail", 1)
    assert links._pattern.cache_info().currsize
    settings.ROOT_URLCONF = "e31web.urls"  # what a test that overrides it does: Django clears its caches too
    assert links._pattern.cache_info().currsize == 0

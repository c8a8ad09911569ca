"""Pagers whose cost does not grow with the table: pages are slices, and counts stop at a cap.

An exact COUNT(*) reads every matching row (55 ms at 100,000 jobs, ten times that at a million), so
past ``COUNT_CAP`` lists say "10,000+" and ask for a filter instead of counting on.
"""

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from ninja import Field, Schema
from ninja.conf import settings as ninja_settings
from ninja.pagination import LimitOffsetPagination

COUNT_CAP = 10_000
# PostgreSQL's OFFSET and byte positions are bigints: a larger number is refused with a 422, never sent on
# to fail as a 500. Still far past any real table or log.
MAX_OFFSET = 2**62
# The most rows one page of a list holds (the CLI asks for 100 at a time). Small enough that the offset plus the
# limit stays a bigint, and that no single request serialises a whole table.
MAX_PAGE = 1000


def capped_count(queryset: QuerySet) -> int:
    """The number of rows, reading at most ``COUNT_CAP + 1`` of them."""
    return queryset.order_by()[: COUNT_CAP + 1].count()


class CappedPaginator(Paginator):
    """Django's paginator with a bounded count; ``count_capped`` says the last page is not the end."""

    @cached_property
    def _counted(self) -> int:
        return capped_count(self.object_list)

    @cached_property
    def count(self) -> int:
        return min(self._counted, COUNT_CAP)

    @cached_property
    def count_capped(self) -> bool:
        return self._counted > COUNT_CAP


class BoundedLimitOffset(LimitOffsetPagination):
    """ninja's limit/offset with an offset the database can take."""

    class Input(LimitOffsetPagination.Input):
        offset: int = Field(0, ge=0, le=MAX_OFFSET)


class CappedLimitOffset(BoundedLimitOffset):
    """limit/offset for the API with a bounded count and page; ``serialise`` turns only the sliced page into JSON.

    Its lists have no ``max_limit`` to clamp to, so a larger limit is refused with a 422 naming ``limit``.
    """

    class Input(BoundedLimitOffset.Input):
        limit: int = Field(ninja_settings.PAGINATION_PER_PAGE, ge=1, le=MAX_PAGE)

    class Output(Schema):
        items: list[Any]
        count: int = Field(..., description=f"Matching rows, counted up to {COUNT_CAP:,}.")
        count_capped: bool = Field(
            ..., description=f"True when more than {COUNT_CAP:,} match: filter to see the rest."
        )

    def serialise(self, item: Any) -> Any:
        return item

    def paginate_queryset(self, queryset: QuerySet, pagination: Any, request: Any, **params: Any) -> Any:
        offset, limit = pagination.offset, min(pagination.limit, self.max_limit)
        counted = capped_count(queryset)
        return {
            "items": [self.serialise(item) for item in queryset[offset : offset + limit]],
            "count": min(counted, COUNT_CAP),
            "count_capped": counted > COUNT_CAP,
        }

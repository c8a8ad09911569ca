"""The Atom feed of the unsolved-problems page: one entry per kept revision, newest first."""

from django.contrib.syndication.views import Feed
from django.urls import reverse, reverse_lazy
from django.utils.feedgenerator import Atom1Feed
from django.utils.html import escape, linebreaks

from public.models import ProblemRevision

FEED_SIZE = 50


class UnsolvedFeed(Feed):
    feed_type = Atom1Feed
    title = "E31 Network: what we have not solved yet"
    subtitle = "Every change to the list of open problems: added, reworded, reviewed, marked solved."
    link = reverse_lazy("unsolved")
    author_name = "E31 Network"

    def items(self) -> list[ProblemRevision]:
        return list(ProblemRevision.objects.select_related("problem").order_by("-at", "-id")[:FEED_SIZE])

    def item_title(self, item: ProblemRevision) -> str:
        return f"{item.title}: {item.get_kind_display()}"

    def item_description(self, item: ProblemRevision) -> str:
        # Atom readers treat this as HTML: every piece of text is escaped before it is wrapped.
        parts = [escape(item.summary)]
        if item.kind == ProblemRevision.Kind.SOLVED:
            parts.append(f"Solved on {item.solved_on:%Y-%m-%d}: {escape(item.solution)}")
        if item.note:
            parts.append(f"Note: {escape(item.note)}")
        return "".join(linebreaks(part, autoescape=False) for part in parts)

    def item_link(self, item: ProblemRevision) -> str:
        return f"{reverse('unsolved')}#revision-{item.id}"

    def item_pubdate(self, item: ProblemRevision):
        return item.at

    def item_updateddate(self, item: ProblemRevision):
        return item.at

    def item_author_name(self, item: ProblemRevision) -> str:
        return "E31 Network"

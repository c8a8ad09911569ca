"""The fields of one ``<form id=…>`` of a page, as a browser posts them (no submit button pressed)."""

from html.parser import HTMLParser

# A browser drops the one newline right after ``<textarea>``.
_TEXTAREAS = ("work.argv", "work.env")


class _FormFields(HTMLParser):
    def __init__(self, form_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id = form_id
        self.inside = False
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        elif self.inside:
            self._field(tag, a)

    def _field(self, tag: str, a: dict[str, str | None]) -> None:
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text")
            if kind == "checkbox" and "checked" in a:
                self.data[a["name"]] = a.get("value") or "on"
            elif kind not in ("checkbox", "file", "submit", "button"):
                self.data[a["name"]] = a.get("value") or ""
        elif tag == "textarea":
            self._textarea = a.get("name")
            self.data[self._textarea] = ""
        elif tag == "select":
            self._select = a.get("name")
        elif tag == "option" and self._select:
            # The first option is posted unless another is marked selected.
            if self._select not in self.data or "selected" in a:
                self.data[self._select] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data: str) -> None:
        if self.inside and self._textarea:
            self.data[self._textarea] += data


def form_fields(html: str, form_id: str = "job-form") -> dict[str, str]:
    parser = _FormFields(form_id)
    parser.feed(html)
    return {
        name: value[1:] if name in _TEXTAREAS and value.startswith("\n") else value
        for name, value in parser.data.items()
    }

"""The browser intake form: flat HTML fields <-> the declaration mapping.

Field names are the declaration's own paths (``data[1].uri``), so an error from
``declaration.validate`` lands beside the field the user typed it in, and a job file
fills the same fields.
"""

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms

from jobs import selectors

MAX_FORM_INPUTS = 64
_DATA_FIELD = re.compile(r"^data\[(\d{1,2})\]\.(name|uri|bytes|sha256)$")


@dataclass
class JobForm:
    """Values as the user typed them, plus errors keyed by field path."""

    values: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, str]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def blank(cls) -> "JobForm":
        return cls(values={"request.gpus": "1", "request.hours": "1"}, rows=[_blank_row()])

    @classmethod
    def from_post(cls, post: Mapping[str, str]) -> "JobForm":
        rows: dict[int, dict[str, str]] = {}
        for key in post:
            if match := _DATA_FIELD.match(key):
                rows.setdefault(int(match.group(1)), {})[match.group(2)] = post.get(key, "")
        values = {k: post.get(k, "") for k in _SCALARS if k in post}
        for flag in _FLAGS:
            values[flag] = "on" if post.get(flag) else ""
        # Rows past the form's 64 are kept: the rules refuse them by name ("at most 64 inputs"), where
        # dropping them here would submit the job without them, unseen.
        # Blank rows stay until the declaration is built: a Remove button's index counts them, and "+ Add an
        # input" on a fresh form adds to its blank row.
        return cls(values=values, rows=[rows[i] for i in sorted(rows)])

    @classmethod
    def from_declaration(cls, raw: Mapping[str, Any]) -> "JobForm":
        """Fills the form from a parsed job file (what the user would have typed)."""
        work = _mapping(raw.get("work"))
        request = _mapping(raw.get("request"))
        output = _mapping(raw.get("output"))
        argv = work.get("argv")
        env = work.get("env")
        values = {
            "name": _text(raw.get("name")),
            "work.argv": argv_text([str(a) for a in argv]) if isinstance(argv, list) else _text(argv),
            "work.env": "\n".join(f"{k}={v}" for k, v in env.items()) if isinstance(env, Mapping) else "",
            "work.image": _text(work.get("image")),
            "work.secrets": _names_text(work.get("secrets")),
            "work.workdir": _text(work.get("workdir")),
            "request.gpus": _text(request.get("gpus")),
            "request.min_gpus": _text(request.get("min_gpus")),
            "request.max_gpus": _text(request.get("max_gpus")),
            "request.hours": _text(request.get("hours")),
            "request.gpu_model": _text(request.get("gpu_model")),
            "request.memory": _size_text(request.get("memory")),
            "request.cpus": _text(request.get("cpus")),
            "request.preemptible": "on" if request.get("preemptible") is True else "",
            "request.requeue": "on" if request.get("requeue") is True else "",
            **_checkpoint_text(request.get("checkpoint")),
            "output.uri": _text(output.get("uri")),
            "output.bytes": _size_text(output.get("bytes")),
            "after_ok": _ids_text(raw.get("after_ok")),
            "after_any": _ids_text(raw.get("after_any")),
            "array": _text(raw.get("array")),
        }
        data = raw.get("data") if isinstance(raw.get("data"), list) else []
        rows = [
            {
                "name": _text(d.get("name")),
                "uri": _text(d.get("uri")),
                "bytes": _size_text(d.get("bytes")),
                "sha256": _text(d.get("sha256")),
            }
            for d in data[
                : MAX_FORM_INPUTS + 1
            ]  # one past the most: the rules then refuse them, none dropped unseen
            if isinstance(d, Mapping)
        ]
        return cls(values=values, rows=rows or [_blank_row()])

    def to_declaration(self) -> dict[str, Any]:
        """The mapping ``declaration.validate`` checks; typing mistakes become errors here."""
        v = self.values
        # Blank rows (emptied, or added and left empty) are no inputs; they leave the form too, so an error on
        # data[i] lands beside the row shown at i.
        self.rows = [row for row in self.rows if any(value.strip() for value in row.values())]
        return {
            "name": v.get("name", ""),
            "work": {
                "argv": argv_from_text(v.get("work.argv", "")),
                "env": self._env(v.get("work.env", "")),
                "image": v.get("work.image", ""),
                "secrets": v.get("work.secrets", "").replace(",", " ").split(),
                "workdir": v.get("work.workdir", ""),
            },
            "data": [dict(row) for row in self.rows],
            "request": {
                "gpus": self._number("request.gpus", int),
                "min_gpus": self._number("request.min_gpus", int, optional=True),
                "max_gpus": self._number("request.max_gpus", int, optional=True),
                "hours": self._number("request.hours", float),
                "gpu_model": v.get("request.gpu_model", ""),
                "memory": v.get("request.memory", "").strip(),
                "cpus": self._number("request.cpus", float, optional=True),
                "preemptible": bool(v.get("request.preemptible")),
                "requeue": bool(v.get("request.requeue")),
                "checkpoint": self._checkpoint(),
            },
            "output": {"uri": v.get("output.uri", ""), "bytes": v.get("output.bytes", "")},
            "after_ok": _ids(v.get("after_ok", "")),
            "after_any": _ids(v.get("after_any", "")),
            "array": v.get("array", "").strip(),
        }

    def _number(self, key: str, kind: type, *, optional: bool = False) -> Any:
        raw = self.values.get(key, "").strip()
        if not raw:
            return None if optional else ""
        try:
            return kind(raw)
        except ValueError:
            self.errors[key] = "a whole number" if kind is int else "a number"
            return None

    def _checkpoint(self) -> dict[str, Any] | None:
        """Left blank, no checkpoint; a grace or size without a signal is named beside the signal."""
        signal, grace, size = (
            self.values.get(f"request.checkpoint.{k}", "").strip() for k in ("signal", "grace_s", "bytes")
        )
        if not (signal or grace or size):
            return None
        return {
            "signal": signal,
            "grace_s": self._number("request.checkpoint.grace_s", int, optional=True),
            "bytes": size,
        }

    def _env(self, text: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                self.errors["work.env"] = f"write each variable as NAME=value (line {line[:30]!r})"
            elif name.strip() in env:  # else the last would silently win
                self.errors["work.env"] = f"{name.strip()[:40]} is set twice: keep one line for it"
            else:
                env[name.strip()] = value
        return env

    def add_row(self) -> None:
        if len(self.rows) < MAX_FORM_INPUTS:
            self.rows.append(_blank_row())


_SCALARS = (
    "name", "work.argv", "work.env", "work.image", "work.secrets", "work.workdir",
    "request.gpus", "request.min_gpus", "request.max_gpus", "request.hours", "request.gpu_model", "request.memory", "request.cpus",
    "request.checkpoint.signal", "request.checkpoint.grace_s", "request.checkpoint.bytes",
    "output.uri", "output.bytes", "after_ok", "after_any", "array",
)  # fmt: skip
_JOB_ID_SEPARATORS = re.compile(r"[\s,]+")
MAX_ID_DIGITS = 18  # past any job id (ids are held under 2**31)
_FLAGS = ("request.preemptible", "request.requeue")


def _ids(text: str) -> list[int | str]:
    """Job ids typed as "812, 813": whole numbers become ints, anything else (a number too long for any id,
    which int() may even refuse) is left for the rules to name."""
    return [
        int(t) if t.isascii() and t.isdigit() and len(t) <= MAX_ID_DIGITS else t
        for t in _JOB_ID_SEPARATORS.split(text.strip())
        if t
    ]


def argv_from_text(text: str) -> list[str]:
    """The Command box: a JSON list of strings is that list; anything else is one argument per line. Only
    trailing blank lines go: a blank line before them is an empty argument."""
    if text.lstrip().startswith("["):
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):  # "[ -f x ]" typed one per line is the test program, not JSON
            parsed = None
        if isinstance(parsed, list) and all(isinstance(arg, str) for arg in parsed):
            return parsed
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def argv_text(argv: list[str]) -> str:
    """argv for the Command box: one argument per line where that reads back the same, else a JSON list (an
    argument with a line break, an empty one, one with spaces at its edges, or lines that read as JSON)."""
    lines = "\n".join(argv)
    edged = any(not arg or arg != arg.strip() for arg in argv)
    return json.dumps(argv, ensure_ascii=False) if edged or argv_from_text(lines) != argv else lines


def _checkpoint_text(value: Any) -> dict[str, str]:
    c = _mapping(value)
    return {
        f"request.checkpoint.{k}": _size_text(c.get(k)) if k == "bytes" else _text(c.get(k))
        for k in ("signal", "grace_s", "bytes")
    }


def _ids_text(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else _text(value)


# What the form calls each field (its label), for the error summary above the form.
LABELS = {
    "": "Job", "team": "Team", "file": "Job file", "name": "Job name", "data": "Data",
    "work": "Work", "work.argv": "Command", "work.env": "Environment", "work.image": "Container image",
    "work.secrets": "Secrets",
    "work.workdir": "Working directory", "request": "Request", "request.gpus": "GPUs",
    "request.hours": "Time limit (hours)", "request.min_gpus": "Elastic minimum GPUs", "request.max_gpus": "Elastic maximum GPUs",
    "request.gpu_model": "GPU model", "request.memory": "Memory", "request.cpus": "CPUs",
    "request.preemptible": "Preemptible", "request.requeue": "Requeue after a node loss",
    "request.checkpoint": "Checkpoint", "request.checkpoint.signal": "Checkpoint signal",
    "request.checkpoint.grace_s": "Checkpoint grace (seconds)", "request.checkpoint.bytes": "Checkpoint size",
    "output": "Output", "output.uri": "Destination URI", "output.bytes": "Expected size",
    "after_ok": "Run after these jobs succeed", "after_any": "Run after these jobs end", "array": "Array",
}  # fmt: skip
_ROW_LABELS = {"name": "name", "uri": "URI", "bytes": "size", "sha256": "sha256"}
_ROW_PATH = re.compile(r"^data\[(\d+)\](?:\.(\w+))?$")
_ENV_PATH = re.compile(r"^work\.env\.(.+)$")


def field_label(path: str) -> str:
    """``data[0].uri`` -> "Input 1: URI", ``work.env.PATH`` -> "Environment (PATH)"; unknown paths as they are."""
    if path in LABELS:
        return LABELS[path]
    if row := _ROW_PATH.match(path):
        name = f"Input {int(row.group(1)) + 1}"
        return f"{name}: {_ROW_LABELS.get(row.group(2), row.group(2))}" if row.group(2) else name
    if env := _ENV_PATH.match(path):
        return f"Environment ({env.group(1)})"
    base = path.split("[", 1)[0]
    return LABELS.get(base, path)


def _blank_row() -> dict[str, str]:
    return {"name": "", "uri": "", "bytes": "", "sha256": ""}


def _mapping(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _names_text(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else _text(value)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _size_text(value: Any) -> str:
    """Sizes are shown exactly as declared: a byte count stays a byte count."""
    return _text(value)


def bound_fields(form: JobForm) -> dict[str, Any]:
    """Values and errors per field for the template: ``work.argv`` -> ``f.work_argv.value/.error``.

    An error on a sub-path (``work.argv[2]``, ``work.env.PATH``) shows on the field that holds it.
    """

    def error_for(path: str) -> str:
        return "; ".join(
            msg for key, msg in form.errors.items() if key == path or key.startswith((path + "[", path + "."))
        )

    fields = {
        key.replace(".", "_"): {"value": form.values.get(key, ""), "error": error_for(key)}
        for key in (*_SCALARS, *_FLAGS)
    }
    fields["rows"] = [
        {
            part: {"value": row.get(part, ""), "error": error_for(f"data[{i}].{part}")}
            for part in ("name", "uri", "bytes", "sha256")
        }
        | {"index": i, "error": form.errors.get(f"data[{i}]", "")}
        for i, row in enumerate(form.rows)
    ]
    fields["summary"] = [(field_label(path), message) for path, message in form.errors.items()]
    fields["data_error"] = form.errors.get("data", "")
    fields["team_error"] = form.errors.get("team", "")
    fields["file_error"] = form.errors.get("file", "")
    return fields


class JobListFilterForm(forms.Form):
    """The job list's filters, read from the query string; days are whole UTC days, both included."""

    name = forms.CharField(required=False, max_length=selectors.NAME_SEARCH_MAX, label="Name contains")
    state = forms.ChoiceField(
        required=False, choices=[("", "all"), *((s, s) for s in selectors.STATE_CHOICES)]
    )
    ended = forms.ChoiceField(
        required=False,
        label="Ended",
        choices=[("", "any way"), *((r, r.replace("_", " ")) for r in selectors.ENDED_CHOICES)],
    )
    since = forms.DateField(required=False, label="Submitted from")
    until = forms.DateField(required=False, label="to")
    array = forms.IntegerField(required=False, min_value=1, max_value=2**31 - 1, widget=forms.HiddenInput)

    def clean_until(self) -> date | None:
        until = self.cleaned_data["until"]
        if until == date.max:  # the range ends at the next day's start, past what a date holds
            raise forms.ValidationError(f"Pick a day before {date.max.isoformat()}.")
        return until

    def filters(self) -> selectors.JobFilters:
        data = self.cleaned_data
        return selectors.JobFilters(
            state=data["state"],
            ended=data["ended"],
            name=data["name"].strip(),
            since=_day_start(data["since"]),
            until=_day_start(data["until"] + timedelta(days=1)) if data["until"] else None,
            array=data["array"],
            # An array is one row (its first task's), unless it is the one asked for or a state is: then
            # each task in that state is listed, so no task hides behind a first task in another state.
            arrays_folded=data["array"] is None and not data["state"] and not data["ended"],
        )

    def query_string(self) -> str:
        """The filters as typed, for the pager's links (so paging keeps them)."""
        return urlencode({k: v for k in self.fields if (v := self.data.get(k, ""))})


def _day_start(day: date | None) -> datetime | None:
    return datetime.combine(day, time.min, tzinfo=UTC) if day else None

"""Forms of the public pages, partner intake and the operators' problem editor.

Every field has a size limit: the public forms take text from anyone, and the page shows it back.
"""

from datetime import date

from django import forms
from django.contrib.auth import get_user_model, password_validation
from django.utils import timezone
from django.utils.text import slugify

from accounts.forms import AddressField
from jobs.units import parse_size
from public import selectors, services
from public.models import Problem

# A field no person sees or fills: a bot that fills every input reveals itself here.
HONEYPOT = "website"
MAX_OPEN_QUESTIONS = 12


def _text(max_length: int, *, rows: int = 0, required: bool = True, **kwargs) -> forms.CharField:
    widget = forms.Textarea(attrs={"rows": rows, "maxlength": max_length}) if rows else None
    return forms.CharField(max_length=max_length, required=required, widget=widget, **kwargs)


class SizeField(forms.CharField):
    """A size as people write it ("40 TB", "800 GiB"), cleaned to a byte count."""

    max_chars = 40

    def __init__(self, **kwargs) -> None:
        # No max_length: its validator would run on the cleaned int; the length is checked here instead.
        super().__init__(**kwargs)
        self.widget.attrs["maxlength"] = str(self.max_chars)

    def to_python(self, value: str) -> int | None:
        text = super().to_python(value)
        if not text:
            return None
        if len(text) > self.max_chars:
            raise forms.ValidationError(f"at most {self.max_chars} characters")
        try:
            return parse_size(text)
        except ValueError as exc:
            raise forms.ValidationError("write a size such as 40 TB, 800 GiB or 1.5 PB") from exc


# --- Public: waitlist and application -----------------------------------------------------------


class WaitlistForm(forms.Form):
    email = forms.EmailField(max_length=150)
    note = _text(500, rows=3, required=False, help_text="Optional: what you would run, in a line or two.")


class ApplicationForm(forms.Form):
    team_name = _text(80, label="Team")
    contact_name = _text(120, label="Contact name")
    email = AddressField(max_length=150, help_text="We write to this address and it becomes your sign-in.")
    work = _text(2000, rows=4, label="Work — what the job runs")
    data_bytes = SizeField(label="Data — its size")
    data_location = _text(500, label="Data — where it lives now")
    compute_request = _text(1000, rows=3, label="Request — GPUs and time")
    output = _text(1000, rows=3, label="Output — what it produces")
    output_bytes = SizeField(label="Output — its size")
    problems = forms.ModelMultipleChoiceField(
        queryset=Problem.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Which unsolved problems matter to your team",
    )
    can_run_when = _text(300, label="When it could run")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Only problems still open can be chosen; evaluated per form so a new problem shows at once.
        self.fields["problems"].queryset = Problem.objects.open()

    def clean_team_name(self) -> str:
        name = self.cleaned_data["team_name"].strip()
        if not slugify(name):  # the rule accepting it applies (selectors.team_name_problem), said now
            raise forms.ValidationError(selectors.TEAM_NAME_NEEDS)
        return name


# --- Operators: problems --------------------------------------------------------------------------


class ProblemForm(forms.Form):
    title = _text(120)
    summary = _text(600, rows=3, help_text="Two or three sentences: the problem as a reader first meets it.")
    why_hard = _text(4000, rows=6, label="Why it is hard")
    open_questions = _text(
        4000, rows=5, required=False, help_text=f"One question per line, at most {MAX_OPEN_QUESTIONS}."
    )
    measurement_keys = _text(
        400,
        required=False,
        label="Measurements shown beside it",
        help_text="Measurement keys, separated by spaces or commas (e.g. scheduler.simulation).",
    )
    note = _text(
        300, required=False, label="What changed and why", help_text="Shown in the problem's history."
    )

    def clean_open_questions(self) -> list[str]:
        lines = [line.strip() for line in self.cleaned_data["open_questions"].splitlines() if line.strip()]
        if len(lines) > MAX_OPEN_QUESTIONS:
            raise forms.ValidationError(f"at most {MAX_OPEN_QUESTIONS} questions")
        if any(len(line) > 300 for line in lines):
            raise forms.ValidationError("each question at most 300 characters")
        return lines

    def clean_measurement_keys(self) -> list[str]:
        keys = list(dict.fromkeys(self.cleaned_data["measurement_keys"].replace(",", " ").split()))
        bad = [key for key in keys if not services.MEASUREMENT_KEY.match(key)]
        if bad:
            raise forms.ValidationError(f"not a measurement key: {', '.join(bad[:3])}")
        return keys

    @classmethod
    def for_problem(cls, problem: Problem) -> "ProblemForm":
        return cls(
            initial={
                "title": problem.title,
                "summary": problem.summary,
                "why_hard": problem.why_hard,
                "open_questions": "\n".join(problem.open_questions),
                "measurement_keys": " ".join(problem.measurement_keys),
            }
        )


class SolveForm(forms.Form):
    solution = _text(
        4000, rows=6, label="How it was solved", help_text="Shown on the page in place of the open questions."
    )
    solved_on = forms.DateField(label="Solved on", widget=forms.DateInput(attrs={"type": "date"}))
    note = _text(300, required=False, label="Note for the history")

    def clean_solved_on(self) -> date:
        solved_on = self.cleaned_data["solved_on"]
        if solved_on > timezone.now().date():
            raise forms.ValidationError("a problem cannot be solved in the future")
        return solved_on


# --- Operators: review --------------------------------------------------------------------------


class AcceptForm(forms.Form):
    team_name = _text(80, label="Team name", help_text="The team is created under this name.")

    def clean_team_name(self) -> str:
        name = self.cleaned_data["team_name"].strip()
        if problem := selectors.team_name_problem(name):
            raise forms.ValidationError(problem)
        return name


class DeclineForm(forms.Form):
    note = _text(1000, rows=3, label="Note to the applicant", help_text="Sent to the applicant by email.")


# --- Invitation -----------------------------------------------------------------------------------


class SetPasswordForm(forms.Form):
    password1 = forms.CharField(label="Password", max_length=128, strip=False, widget=forms.PasswordInput)
    password2 = forms.CharField(
        label="Password again", max_length=128, strip=False, widget=forms.PasswordInput
    )

    def __init__(self, *args, email: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.email = email

    def clean(self) -> dict:
        cleaned = super().clean()
        first, second = cleaned.get("password1"), cleaned.get("password2")
        if first and second and first != second:
            self.add_error("password2", "the two passwords differ")
        elif first:
            probe = get_user_model()(username=self.email, email=self.email)
            try:
                password_validation.validate_password(first, user=probe)
            except forms.ValidationError as exc:
                self.add_error("password1", exc)
        return cleaned

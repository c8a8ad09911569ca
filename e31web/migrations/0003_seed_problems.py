"""The four open problems E31 Network started its public list with, each with its 'added' revision."""

from django.db import migrations
from django.utils import timezone

PROBLEMS = [
    {
        "slug": "large-datasets",
        "title": "Getting large datasets to the compute",
        "summary": (
            "A job's inputs have to be in place before any GPU is held, so staging happens off the meter. "
            "When the inputs run to terabytes, staging can take longer than the job itself, and there is "
            "no settled way to do it yet."
        ),
        "why_hard": (
            "Moving a big dataset is slow enough that it must be planned ahead of the run, not started at "
            "the last minute. The bytes also have to wait somewhere before they are read, and keeping them "
            "costs something; where that cost should fall is undecided.\n\n"
            "A scheduler can only start a job whose inputs have arrived. A job with a long transfer still "
            "ahead of it is hard to place beside jobs that could start now, and how long a transfer will "
            "take is itself hard to predict.\n\n"
            "The same trouble returns in the other direction when a job writes results as large as what it "
            "read. Declaring only the data a job really reads makes the problem smaller; it does not make "
            "it go away."
        ),
        "open_questions": [
            "How should data reach the pool, and who starts the transfer?",
            "How long may staging take compared with the job that follows it?",
            "Should data read by a series of related jobs stay staged between them, and for how long?",
            "How does the cost of moving data relate to the cost of the compute that reads it?",
            "How should very large outputs travel back to the team?",
        ],
        "measurement_keys": ["staging.throughput", "staging.cache"],
    },
    {
        "slug": "fair-scheduling",
        "title": "Scheduling mixed job sizes fairly",
        "summary": (
            "The pool will receive jobs of very different shapes: wide jobs that need many GPUs for hours, "
            "short ones that need a little for minutes, and jobs that run until a backlog is empty. How to "
            "share the pool among them fairly is not settled."
        ),
        "why_hard": (
            "Packing the pool as full as possible can leave some shapes waiting indefinitely: small jobs "
            "stuck behind a wide one, or a wide job that never finds enough GPUs free at the same moment. "
            "Treating every job the same way wastes capacity instead.\n\n"
            "Which of those costs is acceptable depends on the teams whose work sits in the queue. We would "
            "rather learn that from them than choose it on our own."
        ),
        "open_questions": [
            "How long may a short job wait behind a wide one before the wait is unfair?",
            "How can a wide job gather enough GPUs without leaving them idle while it waits?",
            "Should preemptible or elastic jobs fill the gaps, and what do they get in return?",
            "What does fair mean between teams that submit very different amounts of work?",
        ],
        "measurement_keys": ["scheduler.simulation"],
    },
    {
        "slug": "capacity",
        "title": "Where the capacity comes from",
        "summary": (
            "This site does not describe where the GPUs in the pool come from, because that has not been "
            "decided. When it has, this entry will say so in plain words."
        ),
        "why_hard": (
            "The answer shapes much of the rest: what hardware the scheduler sees, how much of it there is, "
            "and how far data has to travel to reach it. Describing a supply arrangement or a location "
            "before it is settled would be a promise we cannot keep yet, so the question stays open here."
        ),
        "open_questions": [
            "What kind of supply would the teams using the network be able to rely on?",
            "What should a team be told about the hardware its job ran on?",
        ],
        "measurement_keys": [],
    },
    {
        "slug": "job-declaration",
        "title": "What a job must declare to be scheduled well",
        "summary": (
            "A job is described by its work, its data, its request and its output. That is enough to run "
            "it, but perhaps not enough to schedule it well, and which further facts are worth asking for "
            "is still open."
        ),
        "why_hard": (
            "A scheduler that knows only that a job wants some GPUs for some hours has little to work with. "
            "It can do better knowing whether the job can be paused and resumed, whether it can run on fewer "
            "or more GPUs than it asked for, and how its needs change while it runs.\n\n"
            "Every extra field, though, makes describing a job more work, and a field that people fill in "
            "carelessly helps nobody. Finding the right set is a balance we expect to strike with design "
            "partners rather than alone."
        ),
        "open_questions": [
            "Which facts change the scheduler's decisions enough to be worth requiring?",
            "Can teams say reliably whether a job may be paused, checkpointed or given fewer GPUs?",
            "What should happen when a job's estimate of its own run time turns out wrong?",
            "What should every job be asked, and what should stay optional?",
        ],
        "measurement_keys": ["scheduler.declarations"],
    },
]


def seed(apps, schema_editor, *, app_label: str = "e31web") -> None:
    """Adds the problems not there yet. Tests re-seed through the models' current home (``public``)."""
    Problem = apps.get_model(app_label, "Problem")
    ProblemRevision = apps.get_model(app_label, "ProblemRevision")
    now = timezone.now()
    for position, fields in enumerate(PROBLEMS, start=1):
        if Problem.objects.filter(slug=fields["slug"]).exists():
            continue
        problem = Problem.objects.create(**fields, position=position, added_at=now, reviewed_at=now)
        ProblemRevision.objects.create(
            problem=problem,
            kind="added",
            at=now,
            author="E31 Network",
            note="On the first published list of open problems.",
            status="open",
            **{k: fields[k] for k in ("title", "summary", "why_hard", "open_questions", "measurement_keys")},
        )


class Migration(migrations.Migration):
    dependencies = [("e31web", "0002_append_only_triggers")]

    # Forward only: the published list is never taken back, so there is nothing to undo.
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]

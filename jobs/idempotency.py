"""Submissions with an ``Idempotency-Key``: the same key and body within 24 h give back the first job.

The (user, key) unique constraint decides between concurrent retries: the second insert waits for
the first transaction and fails, its job rolls back with it, and it answers with the winner's job.
"""

import hashlib
import json
import re
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction

from jobs import declaration, services
from jobs.models import Job, SubmissionKey

KEY_LIFETIME = timedelta(hours=24)
# Printable ASCII, no spaces, like the IETF draft's examples; with fullmatch ("$" lets a trailing newline by).
VALID_KEY = re.compile(r"[\x21-\x7e]{1,255}")


class KeyReused(Exception):
    """The key was already used by this user, within its lifetime, for a different body."""


def body_sha256(body: dict) -> str:
    """A digest of the submission as parsed, so key order and spacing do not make two bodies differ."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def earlier_job(*, user, key: str, body_sha256: str, now: datetime) -> Job | None:
    """The job this key already made, or None; a key older than 24 h is forgotten and may be used again."""
    row = SubmissionKey.objects.filter(user=user, key=key).select_related("job").first()
    if row is None:
        return None
    if row.created_at <= now - KEY_LIFETIME:
        SubmissionKey.objects.filter(id=row.id, created_at=row.created_at).delete()
        return None
    if row.body_sha256 != body_sha256:
        raise KeyReused(f"Idempotency-Key {key[:60]!r} was used for job {row.job_id} with a different body.")
    return row.job


def submit_once(
    *, team, user, spec: declaration.Declaration, key: str, body_sha256: str, now: datetime,
    rerun_of: Job | None = None,
) -> tuple[Job, bool]:  # fmt: skip
    """Submits the job and records its key in one transaction; (job, True) if new, (first job, False) if not."""
    try:
        with transaction.atomic():
            job = services.submit_job(team=team, user=user, spec=spec, now=now, rerun_of=rerun_of)
            SubmissionKey.objects.create(user=user, key=key, body_sha256=body_sha256, job=job, created_at=now)
    except IntegrityError:
        first = earlier_job(user=user, key=key, body_sha256=body_sha256, now=now)
        if first is None:
            raise
        return first, False
    return job, True

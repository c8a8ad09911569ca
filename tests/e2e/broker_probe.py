"""A task for the broker tests only (the worker loads it with --include): it leaves a file behind."""

from pathlib import Path

from celery import shared_task


@shared_task(name="tests.broker_probe.touch")
def touch(path: str) -> None:
    Path(path).write_text("delivered")

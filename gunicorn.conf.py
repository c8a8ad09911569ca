"""gunicorn reads this file from the directory it starts in, the checkout (README: "Deploying on several
machines"): the web processes' start-up check, as Celery's workers and beat have theirs (``common.schema``)."""

import os


def on_starting(server) -> None:
    """The master refuses to start, before any worker forks, where this code and the database's migrations
    disagree: its pages would read and write rows shaped for another schema."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
    import django

    django.setup()
    from django.db import connection

    from common import schema

    try:
        schema.refuse_to_start("web", connection)
    finally:
        connection.close()  # the workers fork from this process: none may inherit its socket

"""gunicorn reads this file from the directory it starts in, the checkout (README: "A multi-node
deployment"): the web processes' start-up checks, as Celery's workers and beat have theirs (``common.schema``)."""

import os


def on_starting(server) -> None:
    """The master refuses to start, before any worker forks, where this code and the database's migrations
    disagree (its pages would read and write rows shaped for another schema), or where requests held long could
    take every thread of a worker."""
    _set_up_django()
    refuse_held_threads(server)
    from django.db import connection

    from common import schema

    try:
        schema.refuse_to_start("web", connection)
    finally:
        connection.close()  # the workers fork from this process: none may inherit its socket


def refuse_held_threads(server) -> None:
    """Exits where held requests could take every thread; Django is set up first (``_set_up_django``)."""
    from common import web_threads

    if why := web_threads.refusal(server.cfg.threads):
        raise SystemExit(f"web not started: {why}")


def _set_up_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e31web.settings")
    import django

    django.setup()

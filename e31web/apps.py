from django.apps import AppConfig


class E31WebConfig(AppConfig):
    """The project package: settings, URLs, Celery, the API root, WSGI.

    It stays an installed app only for its migrations: they created the public pages' tables before
    those models moved to ``public`` (which reuses the tables), and a fresh database still runs them.
    """

    name = "e31web"
    label = "e31web"
    verbose_name = "Project configuration"

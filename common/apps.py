from django.apps import AppConfig


class CommonConfig(AppConfig):
    """Shared building blocks; an app only so that its migration creates the shared cache's table."""

    name = "common"
    label = "common"
    verbose_name = "Shared building blocks"

from django.apps import AppConfig


class E31WebConfig(AppConfig):
    name = "e31web"
    label = "e31web"
    verbose_name = "Public pages and design-partner intake"

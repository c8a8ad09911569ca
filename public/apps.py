from django.apps import AppConfig


class PublicConfig(AppConfig):
    name = "public"
    label = "public"
    verbose_name = "Public pages: unsolved problems, design-partner intake, invitations"

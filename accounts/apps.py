from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import pre_save

from accounts import usernames


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Teams and API tokens"

    def ready(self) -> None:
        # auth's User is not ours to change: the check that one name makes one account hangs on its saves.
        pre_save.connect(
            usernames.refuse_twin, sender=settings.AUTH_USER_MODEL, dispatch_uid="accounts.usernames"
        )

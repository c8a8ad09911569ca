"""Django's ``createsuperuser``, audited: the new account's superuser and operator rights are told to the audit log
in the transaction that creates it, as ``set_operator`` tells a grant. It replaces auth's command of the same name
(accounts comes before django.contrib.auth in INSTALLED_APPS)."""

from django.contrib.auth.management.commands import createsuperuser
from django.db import transaction
from django.db.models.signals import post_save
from django.utils import timezone

from accounts import services
from accounts.management import audited


class Command(createsuperuser.Command):
    help = createsuperuser.Command.help + " The new account's rights are audited."

    def handle(self, *args, **options) -> None:
        actor = audited.shell_actor("createsuperuser")

        def announce(sender, instance, created: bool, **kwargs) -> None:
            if created:
                services.announce_new_account(user_id=instance.pk, actor=actor, now=timezone.now())

        # Django's command saves the account in the middle of its handle and hands nothing back: the save's
        # post_save, heard only while this command runs, writes the entry before "created" is said, and the one
        # transaction (open from the first prompt's lookup, holding no lock) keeps no account without its entry.
        post_save.connect(announce, sender=self.UserModel, dispatch_uid="accounts.createsuperuser")
        try:
            with transaction.atomic(using=options["database"]):
                super().handle(*args, **options)
        finally:
            post_save.disconnect(sender=self.UserModel, dispatch_uid="accounts.createsuperuser")

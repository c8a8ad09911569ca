"""Two accounts never differ only by letter case or surrounding spaces: a unique index on lower(trim(username)).

auth_user is django.contrib.auth's table and this project has no user model of its own, so the index is raw SQL
here (the same statement on PostgreSQL and SQLite) and Django's model state is unchanged. Accounts that already
collide stop the migration, named, before anything changes: an operator renames all but one of each group (the
admin's user page), or moves their teams onto one and deactivates the others, and runs migrate again.
"""

from django.core.management import CommandError
from django.db import migrations
from django.db.models import Count
from django.db.models.functions import Lower, Trim

INDEX = "auth_user_username_unique_whatever_its_case"


def refuse_existing_twins(apps, schema_editor):
    users = apps.get_model("auth", "User").objects.using(schema_editor.connection.alias)
    keyed = users.annotate(name_key=Lower(Trim("username")))
    shared = keyed.values("name_key").annotate(n=Count("id")).filter(n__gt=1).values("name_key")
    twins = list(
        keyed.filter(name_key__in=shared).order_by("name_key", "username").values_list("username", flat=True)
    )
    if twins:
        raise CommandError(
            "accounts whose usernames differ only by letter case or surrounding spaces: "
            f"{', '.join(map(repr, twins))}. Rename all but one of each, then migrate again."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0004_team_invitations"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunPython(refuse_existing_twins, migrations.RunPython.noop),
        migrations.RunSQL(
            f"CREATE UNIQUE INDEX {INDEX} ON auth_user (lower(trim(username)))",
            reverse_sql=f"DROP INDEX IF EXISTS {INDEX}",
        ),
    ]

"""Tables the whole console shares."""

from django.db import models


class RateCount(models.Model):
    """One rate-limit window's count (``common.ratelimit``): bumped by one atomic upsert per event."""

    key = models.CharField(max_length=255, primary_key=True)
    count = models.BigIntegerField()
    # Seconds since the epoch: the window the first event opened ends here; the next event opens a new one.
    expires_at = models.FloatField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.count}"

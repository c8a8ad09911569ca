"""What metering tells other apps without importing them.

Operations listens (its receiver is connected in ``OperationsConfig.ready``): it imports metering,
so metering cannot import it back to write the audit log, and the arrows point one way.
"""

from django.dispatch import Signal

# Sent inside the transaction that sets a team's monthly budget, with ``team``, ``before`` and
# ``after`` ({"monthly_budget_gpu_hours", "budget_enforced"}), ``operator`` and ``now``. A receiver's
# error rolls the change back: the audit log holds exactly the budget changes that took effect.
budget_set = Signal()

# Sent inside the transaction that books an adjustment, with ``team``, ``allocation`` (its id), ``job`` (id),
# ``gpu_micros`` (signed: a credit is negative), ``reason``, ``operator`` and ``now``: the audit log holds every
# change of billed hours, beside the rows that carry their author.
ledger_adjusted = Signal()

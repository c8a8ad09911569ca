"""What a web process's requests held long may take of the threads gunicorn gives it.

Exports and downloads hold a thread while their client reads (at its pace, or never), log followers while they
long-poll; each kind has its own per-process limit (``common.export``, ``jobs.logs``). Together they must leave a
thread: with E31_EXPORTS_PER_PROCESS and E31_LOG_WAITERS_PER_PROCESS at 2 each under 4 threads, one member of two
teams held every thread and /healthz timed out while they stayed open.
"""

from django.conf import settings


def refusal(threads: int) -> str:
    """Why a web process with ``threads`` threads must not start with these limits; "" when it may. One thread is
    gunicorn's sync worker, which a held request holds whole whatever the limits: the README's deployment runs
    threads, and this check does not refuse what it cannot protect."""
    exports, waiters = settings.E31_EXPORTS_PER_PROCESS, settings.E31_LOG_WAITERS_PER_PROCESS
    if threads <= 1 or exports + waiters < threads:
        return ""
    return (
        f"E31_EXPORTS_PER_PROCESS ({exports}) and E31_LOG_WAITERS_PER_PROCESS ({waiters}) may hold all of this "
        f"process's {threads} threads at once, and pages, the API and health checks would wait behind them: "
        "lower them, or raise gunicorn's --threads above their sum"
    )

"""Replays a trace (jobs.scheduling.simulate) and stores the figures for the console's pages.

    python manage.py record_simulation --trace ../shared/traces/itp-2021/cluster04.csv --load 0.9
    python manage.py record_simulation --declarations --trace FILE [--trace FILE ...] --load 0.9 --limit 5000

The simulator stays pure; this edge stores its JSON as the "scheduler.simulation" measurement,
which the public unsolved-problems page and the operator queue page show beside the scheduler.
With ``--declarations`` it replays each trace under each declaration (jobs.scheduling.declarations)
and stores the table as "scheduler.declarations", shown beside "what a job must declare".
"""

import json
import shlex

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from jobs.scheduling import declarations, simulate
from public import services


class Command(BaseCommand):
    help = (
        "Replays a workload trace through the scheduling policies (or declarations) and records the result."
    )

    def add_arguments(self, parser):
        parser.add_argument("--trace", action="append", required=True)
        parser.add_argument("--load", default="0.9")
        parser.add_argument("--policies", default="default,easy-nodes,easy,sjf-easy,fcfs")
        parser.add_argument("--limit", default="")
        parser.add_argument(
            "--declarations", action="store_true", help="replay under each declaration instead of each policy"
        )

    def handle(self, *args, trace: list[str], load: str, policies: str, limit: str, **options):
        if options["declarations"]:
            return self._declarations(trace, load=load, limit=limit)
        if len(trace) != 1:
            raise CommandError("one --trace per policy comparison")
        argv = [
            "--trace",
            trace[0],
            "--load",
            load,
            "--policies",
            policies,
            *(["--limit", limit] if limit else []),
        ]
        result = simulate.main(argv)
        services.record_measurement(
            key="scheduler.simulation",
            title=f"Trace replay of {result['trace']} ({result['jobs']} jobs, {result['pool_gpus']} GPUs)",
            figures=result,
            command="python manage.py record_simulation " + shlex.join(argv),
            now=timezone.now(),
        )
        self.stdout.write(json.dumps(result))

    def _declarations(self, trace: list[str], *, load: str, limit: str) -> None:
        argv = [
            *(a for path in trace for a in ("--trace", path)),
            "--load",
            load,
            *(["--limit", limit] if limit else []),
        ]
        result = declarations.main(argv)
        names = ", ".join(t["trace"] for t in result["traces"])
        services.record_measurement(
            key="scheduler.declarations",
            title=f"What each declaration buys: {names} replayed under each",
            figures=result,
            command="python manage.py record_simulation --declarations " + shlex.join(argv),
            now=timezone.now(),
        )
        self.stdout.write(json.dumps(result))

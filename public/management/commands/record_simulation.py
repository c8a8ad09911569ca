"""Replays a trace (jobs.scheduling.simulate) and stores the figures for the console's pages.

    python manage.py record_simulation --trace ../shared/traces/itp-2021/cluster04.csv --load 0.9

The simulator stays pure; this edge stores its JSON as the "scheduler.simulation" measurement,
which the public unsolved-problems page and the operator queue page show beside the scheduler.
"""

import json
import shlex

from django.core.management.base import BaseCommand
from django.utils import timezone

from jobs.scheduling import simulate
from public import services


class Command(BaseCommand):
    help = "Replays a workload trace through the scheduling policies and records the result."

    def add_arguments(self, parser):
        parser.add_argument("--trace", required=True)
        parser.add_argument("--load", default="0.9")
        parser.add_argument("--policies", default="default,easy-nodes,easy,sjf-easy,fcfs")
        parser.add_argument("--limit", default="")

    def handle(self, *args, trace: str, load: str, policies: str, limit: str, **options):
        argv = [
            "--trace",
            trace,
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

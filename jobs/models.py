"""Jobs, their inputs and events, and the pool they run on (nodes, allocations, GPU holds)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from accounts.models import Team
from jobs.lifecycle import AFTER_ANY, AFTER_OK, BEFORE_RENT, RAN_TO_ITS_END, EndReason, State


class JobArray(models.Model):
    """One declaration submitted as many tasks (``array = "0-99%8"``): each task is a job of its own, with
    its index; at most ``max_running`` of them hold GPUs at once (null: no limit).

    A task requeued or re-run on its own is a one-task array of its index; ``limit_of`` names the array it
    came from, whose limit it counts against (with that array's ``max_running`` copied beside it)."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="job_arrays")
    name = models.CharField(max_length=120)
    spec = models.CharField(max_length=200)  # as declared, "0-99%8"
    size = models.PositiveIntegerField()
    max_running = models.PositiveIntegerField(null=True, blank=True)
    first_index = models.PositiveIntegerField()  # the task the job list shows the array's row at
    submitted_at = models.DateTimeField()
    limit_of = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running__isnull=True) | Q(max_running__gte=1), name="array_limit_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"array {self.pk} {self.name} [{self.spec}]"


# Job.slot_wait of a job in the line for a transfer slot: parked off the stagers' threads, or a try going for one.
SLOT_LINE = ("parked", "trying")


class Job(models.Model):
    PARKED, TRYING = SLOT_LINE

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    name = models.CharField(max_length=120)
    state = models.CharField(
        max_length=12, choices=[(s.value, s.value) for s in State], default=State.SUBMITTED
    )
    end_reason = models.CharField(max_length=20, choices=[(r.value, r.value) for r in EndReason], blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    end_detail = models.CharField(max_length=500, blank=True)
    submitted_at = models.DateTimeField(db_index=True)
    state_changed_at = models.DateTimeField()
    # Bumped on every requeue: an attempt's allocations, log and exit belong to it alone.
    attempt = models.PositiveIntegerField(default=0)
    # Attempts that ended by a node loss, or a node's refusal, and went back to the queue: what E31_MAX_ATTEMPTS
    # bounds. Preemptions (the scheduler's choice, not the job's luck) are attempts too, but never counted here.
    lost_attempts = models.PositiveIntegerField(default=0)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    preempt_requested_at = models.DateTimeField(null=True, blank=True)
    # Last sign of the worker handling this job (staging, agent, delivery); the reconciler re-drives stale ones.
    worker_seen_at = models.DateTimeField(null=True, blank=True)
    # Its place in the line for a transfer slot while it stages (``cache_fill.in_line``): PARKED while it waits
    # off the stagers' threads, refused one; TRYING while the try that took its claim goes for one; "" once it
    # holds one, waits to share another job's copy (which takes none), or was never refused one. Read only while
    # the job stages (every reader filters on STAGING): a job that leaves STAGING keeps what it had.
    slot_wait = models.CharField(max_length=8, blank=True)

    # work
    argv = models.JSONField()
    env = models.JSONField(default=dict, blank=True)
    image = models.CharField(max_length=200, blank=True)
    # Names of team secrets the job receives as environment variables; the values live only in TeamSecret.
    secrets = models.JSONField(default=list, blank=True)
    workdir = models.CharField(max_length=200, blank=True)
    # request
    gpus = models.PositiveIntegerField()
    gpu_model = models.CharField(max_length=60, blank=True)
    hours = models.FloatField()
    min_gpus = models.PositiveIntegerField(null=True, blank=True)
    # Elastic: may start this wide on GPUs nothing else waits for (the job reads E31_NUM_GPUS).
    max_gpus = models.PositiveIntegerField(null=True, blank=True)
    preemptible = models.BooleanField(default=False)
    requeue = models.BooleanField(default=False)
    # Pausable: warned with this signal (USR1, …; "" when it does not checkpoint), it has the grace to save
    # into its checkpoint directory, bounded by checkpoint_bytes, which the next attempt is handed.
    checkpoint_signal = models.CharField(max_length=4, blank=True)
    checkpoint_grace_s = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_bytes = models.BigIntegerField(null=True, blank=True)
    # What its last attempt left in it, as its node measured it ("paused (checkpoint 1.2 GB)").
    checkpoint_held_bytes = models.BigIntegerField(null=True, blank=True)
    # For the whole job, split across its nodes by GPUs; null: the node's share for its GPUs.
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    cpus = models.FloatField(null=True, blank=True)
    # output
    output_uri = models.CharField(max_length=2000)
    output_bytes = models.BigIntegerField()
    # The sealed manifest of the current attempt lives in OutputFile rows; these are its summary.
    sealed_files = models.PositiveIntegerField(default=0)
    sealed_bytes = models.BigIntegerField(default=0)
    delivery_state = models.CharField(max_length=12, blank=True)  # "", delivering, delivered, failed
    delivery_detail = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    # What the scheduler last said about a queued job, shown to its team.
    estimated_start = models.DateTimeField(null=True, blank=True)
    pending_reason = models.CharField(max_length=300, blank=True)
    priority = models.FloatField(null=True, blank=True)
    priority_detail = models.JSONField(default=dict, blank=True)
    log_tail = models.TextField(blank=True)
    # When retention removed its log (E31_LOG_KEEP_DAYS after it ended): pages say so instead of showing none.
    log_removed_at = models.DateTimeField(null=True, blank=True)
    # The job this one was cloned from (a re-run); always a job of the same team.
    rerun_of = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="reruns"
    )
    # The copy an operator's requeue put in this waiting job's place: the jobs that waited for this one wait for it.
    replaced_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # A task of an array: E31_ARRAY_INDEX is its index.
    array = models.ForeignKey(JobArray, on_delete=models.PROTECT, null=True, blank=True, related_name="tasks")
    array_index = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["team", "-submitted_at"]),
            models.Index(fields=["state", "state_changed_at"]),
            # Counting a team's list (arrays folded to their first task) from the index alone: with
            # the array columns read from the table, a team of 5,000 jobs visited 2,949 pages (25 ms
            # against 4.5 ms).
            models.Index(fields=["team"], include=["array", "array_index"], name="job_team_array_count"),
            # A team's last released jobs that ran to their end, newest first: what its run times are learned
            # from, on every scheduler pass and job page. Without it a team of 5,000 jobs took 18.8 ms (every one
            # of its jobs joined to its allocation and sorted), with it 0.7 ms, whatever the team's history.
            models.Index(
                models.F("team"),
                models.F("state_changed_at").desc(),
                models.F("id").desc(),
                name="job_team_ran_to_its_end",
                condition=Q(state=State.RELEASED, end_reason__in=RAN_TO_ITS_END),
            ),
            # The line for a transfer slot, first come first: each try that would take a slot counts the jobs
            # ahead of it here, and a freed slot's doorbell reads the first: never the other staging jobs nor the
            # pool's history.
            models.Index(
                fields=["submitted_at", "id"],
                name="job_slot_line",
                condition=Q(state=State.STAGING, slot_wait__in=SLOT_LINE),
            ),
            # The ended jobs whose log is still kept, by end: the hourly pruner reads only these, never the
            # years of jobs whose logs are gone already.
            models.Index(
                fields=["state_changed_at"],
                name="job_log_kept",
                condition=Q(state__in=[State.RELEASED, State.ENDED], log_removed_at__isnull=True),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="job_gpus_positive"),
            models.CheckConstraint(condition=Q(hours__gt=0), name="job_hours_positive"),
            models.CheckConstraint(
                condition=Q(min_gpus__isnull=True) | Q(min_gpus__gte=1, min_gpus__lte=models.F("gpus")),
                name="job_min_gpus_in_range",
            ),
            models.CheckConstraint(
                condition=Q(max_gpus__isnull=True) | Q(max_gpus__gte=models.F("gpus")),
                name="job_max_gpus_at_least_gpus",
            ),
            models.CheckConstraint(
                condition=Q(memory_bytes__isnull=True) | Q(memory_bytes__gt=0), name="job_memory_positive"
            ),
            models.CheckConstraint(  # declaring a checkpoint makes a job preemptible
                condition=Q(checkpoint_signal="")
                | Q(preemptible=True, checkpoint_grace_s__gte=1, checkpoint_bytes__gte=1),
                name="job_checkpoint_is_preemptible",
            ),
            models.CheckConstraint(condition=Q(cpus__isnull=True) | Q(cpus__gt=0), name="job_cpus_positive"),
            models.CheckConstraint(
                condition=Q(state__in=[State.RELEASED, State.ENDED]) | Q(end_reason=""),
                name="job_end_reason_only_when_terminal",
            ),
            models.CheckConstraint(
                condition=Q(array__isnull=True, array_index__isnull=True)
                | Q(array__isnull=False, array_index__isnull=False),
                name="job_array_task_has_an_index",
            ),
            models.UniqueConstraint(fields=["array", "array_index"], name="job_array_index_once"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def checkpoints(self) -> bool:
        return bool(self.checkpoint_signal)

    @property
    def is_alive(self) -> bool:
        return self.state not in (State.RELEASED, State.ENDED)

    @property
    def is_waiting(self) -> bool:
        """Not holding GPUs yet: submitted (its prerequisites, if any), staging or queued."""
        return self.state in BEFORE_RENT

    @property
    def cancellable(self) -> bool:
        """Alive, and its process not already ended: in OUTPUT it is sealing what it wrote, and ends in moments;
        a cancel there would be said to stop what nothing is left to stop."""
        return self.is_alive and self.state != State.OUTPUT

    @property
    def delivery_uri(self) -> str:
        """The attempt's own folder under the declared destination: no two attempts deliver to the same place."""
        return f"{self.output_uri.rstrip('/')}/{self.id}-{self.attempt}/"

    def outputs_pending(self) -> bool:
        """Sealed files that still have to reach the declared destination."""
        return self.sealed_files > 0 and not self.delivered_at


class Dependency(models.Model):
    """``job`` runs only after ``prerequisite`` ends: successfully (``after_ok``), or in any way (``after_any``).

    A prerequisite is always an older job of the same team, named at intake: the check constraint
    (prerequisite id below the job's) is what makes a cycle impossible, whatever a writer does.
    """

    AFTER_OK, AFTER_ANY = AFTER_OK, AFTER_ANY

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="prerequisites")
    prerequisite = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="dependents")
    kind = models.CharField(max_length=9, choices=[(AFTER_OK, AFTER_OK), (AFTER_ANY, AFTER_ANY)])

    class Meta:
        ordering = ["job_id", "prerequisite_id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "prerequisite"], name="dependency_once_per_pair"),
            models.CheckConstraint(
                condition=Q(prerequisite__lt=models.F("job")), name="dependency_on_an_older_job"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} {self.prerequisite_id}"


class OutputFile(models.Model):
    """One file an attempt sealed: the manifest its delivery is checked against, a row per file."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="output_files")
    attempt = models.PositiveIntegerField()
    path = models.CharField(max_length=1024)
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)

    class Meta:
        ordering = ["job", "attempt", "path"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "path"], name="output_file_once_per_attempt"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt}: {self.path}"


class DataInput(models.Model):
    """A dataset the job reads, and its staging progress."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="inputs")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=64)
    uri = models.CharField(max_length=2000)
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    # staging progress
    stage_state = models.CharField(max_length=12, blank=True)  # "", staging, staged, cached, failed
    bytes_done = models.BigIntegerField(default=0)
    rate_bytes_s = models.FloatField(default=0)
    stage_started_at = models.DateTimeField(null=True, blank=True)
    stage_finished_at = models.DateTimeField(null=True, blank=True)
    stage_detail = models.CharField(max_length=500, blank=True)
    # While it waits (for a transfer slot, or to share another job's copy): the cache entry's key its last try
    # found, so the next try asks its source nothing until that entry is filled, gone or stale.
    waiting_key = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="input_name_unique_per_job")]

    def __str__(self) -> str:
        return f"{self.name} <- {self.uri}"


class JobEvent(models.Model):
    """One row per transition: the job's history, in order."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12)
    at = models.DateTimeField()
    reason = models.CharField(max_length=300, blank=True)
    actor = models.CharField(
        max_length=150, blank=True
    )  # a username, "scheduler", "agent:<node>", "reconciler"
    attempt = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"])]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state} -> {self.to_state}"


class Node(models.Model):
    class NodeState(models.TextChoices):
        UP = "up"
        DRAINING = "draining"
        DRAINED = "drained"
        DOWN = "down"

    name = models.CharField(max_length=63, unique=True)
    gpus = models.PositiveIntegerField()
    gpu_model = models.CharField(max_length=60, blank=True)
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.UP)
    address = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    sandbox = models.CharField(max_length=20, blank=True)  # "bubblewrap", or "none" when allowed unsandboxed
    # What the agent advertised for jobs (0: not advertised, placement then ignores it) and the
    # cgroup controllers that bound each attempt there ("memory v1, cpu v1, pids v1").
    memory_bytes = models.BigIntegerField(default=0)
    cpus = models.FloatField(default=0)
    limits = models.CharField(max_length=200, blank=True)
    # Why the node takes no part of a job spanning nodes (it cannot isolate their network); empty: it can.
    multi_node_refusal = models.CharField(max_length=300, blank=True)
    # Which /24 of E31_JOB_SUBNET the node gives its parts of spanning jobs: the lowest free at its first
    # registration, never its id (sequences only grow, past the subnet's slices when nodes come and go).
    network_slot = models.PositiveIntegerField(null=True, blank=True, unique=True)
    # Where the agent found its GPUs: "nvml", "nvidia-smi", or "virtual" (made up by --virtual-gpus).
    gpu_source = models.CharField(max_length=20, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # The machine whose agent serves the node (its machine-id): only its beats count, and another machine may take
    # the name only once they stopped ("": registered before agents said it).
    host_id = models.CharField(max_length=64, blank=True)
    # The operator who marked the node down: it stays down, whatever its agent says, until resumed.
    held_down_by = models.CharField(max_length=150, blank=True)
    # The operator who drained the node: if it goes silent meanwhile (a reboot for maintenance), it comes
    # back drained, not up, when its agent registers again; a resume clears it.
    drained_by = models.CharField(max_length=150, blank=True)
    # Its disk could not hold an attempt's space: the scheduler places nothing here until then (E31_NO_ROOM_HOLD_S).
    no_room_until = models.DateTimeField(null=True, blank=True)
    # What its disk could still give attempt spaces when its agent last measured it (nodes that bound them).
    disk_free_bytes = models.BigIntegerField(null=True, blank=True)
    disk_free_at = models.DateTimeField(null=True, blank=True)
    # What that disk holds in all, said at registration: a larger space never fits there. 0: not said.
    disk_bytes = models.BigIntegerField(default=0)
    registered_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    # The operator who took the machine out of service for good, and when: down and holding nothing, it leaves the
    # pool page's list, the metrics and every count, and its /24 is freed (``jobs.nodes.retire_node``). Its rows
    # stay for the jobs and the ledger that name it; its agent registering again puts the machine back.
    retired_at = models.DateTimeField(null=True, blank=True)
    retired_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # Every read that counts or places on nodes "not down" leaves retired ones out by this alone.
            models.CheckConstraint(
                condition=Q(retired_at__isnull=True) | Q(state="down"), name="retired_node_is_down"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class NodeGpu(models.Model):
    """One GPU a node's agent registered, by device minor (/dev/nvidia<index>), and its latest reading.

    A GPU that an agent no longer finds stays listed, not present: the scheduler places nothing on it.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_devices")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, blank=True)
    model = models.CharField(max_length=60, blank=True)
    memory_bytes = models.BigIntegerField(default=0)
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=20, blank=True)
    virtual = models.BooleanField(default=False)
    present = models.BooleanField(default=True)
    changed_at = models.DateTimeField()  # registered, or found missing
    utilisation = models.FloatField(null=True, blank=True)
    memory_used_bytes = models.BigIntegerField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    sampled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="one_gpu_row_per_index")]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.index}"


class Allocation(models.Model):
    """GPUs of one node held by one attempt of a job: RENT opens it, RELEASE closes it."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="allocations")
    attempt = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    rank = models.PositiveSmallIntegerField(default=0)  # this node's rank in a multi-node job
    # The network this part had, as its node agent wired it (offline, its job's parts, the internet).
    network = models.CharField(max_length=300, blank=True)
    gpu_indices = models.JSONField()
    rented_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    sealed_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, blank=True)
    # Set when this part's log met its team's log budget: nothing past that note is stored (``jobs.logs``).
    log_cut_at = models.DateTimeField(null=True, blank=True)
    # Set on node loss: the last sign of life, so an operator can credit the gap.
    last_heartbeat_at_release = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["rented_at", "rank"]
        indexes = [models.Index(fields=["released_at"]), models.Index(fields=["node", "released_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "node"], name="one_allocation_per_node_per_attempt"
            ),
            models.CheckConstraint(
                condition=Q(released_at__isnull=True) | Q(released_at__gte=models.F("rented_at")),
                name="allocation_released_after_rented",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} on {self.node_id} {self.gpu_indices}"

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_indices)


class GpuHold(models.Model):
    """One GPU of one node held by one allocation. The database refuses a GPU held twice."""

    allocation = models.ForeignKey(Allocation, on_delete=models.PROTECT, related_name="holds")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="holds")
    gpu_index = models.PositiveSmallIntegerField()
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "gpu_index"], condition=Q(active=True), name="gpu_held_at_most_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.gpu_index} ({'held' if self.active else 'freed'})"


class GpuMinute(models.Model):
    """What one allocated GPU did over one UTC minute, summarised by its node agent from its samples."""

    allocation = models.ForeignKey(Allocation, on_delete=models.PROTECT, related_name="gpu_minutes")
    gpu_index = models.PositiveSmallIntegerField()
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField()
    utilisation_avg = models.FloatField()
    utilisation_max = models.FloatField()
    memory_used_max_bytes = models.BigIntegerField()
    power_avg_w = models.FloatField(null=True, blank=True)
    temperature_max_c = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["allocation", "minute", "gpu_index"]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "gpu_index", "minute"], name="one_gpu_minute"),
            models.CheckConstraint(
                condition=Q(samples__gt=0, utilisation_avg__gte=0, utilisation_avg__lte=100),
                name="gpu_minute_utilisation_is_a_percentage",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.allocation_id}:{self.gpu_index}@{self.minute:%H:%M}"


class GpuUseSummary(models.Model):
    """An allocation's GPU minutes older than E31_GPU_MINUTES_KEEP_DAYS, folded into one row before they are
    deleted, so its job page and the ledger show the same GPU use after the per-minute detail is gone."""

    allocation = models.OneToOneField(
        Allocation, on_delete=models.PROTECT, primary_key=True, related_name="+"
    )
    minutes = models.PositiveIntegerField()  # GPU minutes folded in
    through = models.DateTimeField()  # the latest minute folded in
    samples = models.PositiveIntegerField()
    utilisation_weighted = models.FloatField()  # the sum of each minute's average times its samples
    utilisation_max = models.FloatField()
    memory_used_max_bytes = models.BigIntegerField()
    power_sum_w = models.FloatField(default=0)  # over the minutes that measured power
    power_minutes = models.PositiveIntegerField(default=0)
    temperature_max_c = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.allocation_id}: {self.minutes} GPU minutes through {self.through:%Y-%m-%d %H:%M}"


class SchedulerState(models.Model):
    """A single row: the coalescing doorbell for scheduler passes and the last pass's figures."""

    pass_requested = models.BooleanField(default=False)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_ms = models.FloatField(null=True, blank=True)
    last_pass_started = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"scheduler (last pass {self.last_pass_at})"


class TeamUsage(models.Model):
    """A team's GPU-seconds, decayed with the fair-share half-life, as of ``as_of``."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="usage")
    gpu_seconds = models.FloatField(default=0)
    as_of = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.team_id}: {self.gpu_seconds:.0f} GPU-s as of {self.as_of}"

    def decayed(self, now) -> float:
        elapsed = max(0.0, (now - self.as_of).total_seconds())
        return self.gpu_seconds * 0.5 ** (elapsed / settings.E31_FAIRSHARE_HALF_LIFE_S)

    @classmethod
    def add(cls, *, team_id: int, gpu_seconds: float, now) -> None:
        """Folds a released allocation's GPU-seconds into the team's decayed usage, at ``now`` or the last fold if
        later: a release dated earlier (a node lost long before it was found) never winds the decay back."""
        row, _ = cls.objects.select_for_update().get_or_create(team_id=team_id, defaults={"as_of": now})
        now = max(now, row.as_of)
        row.gpu_seconds = row.decayed(now) + gpu_seconds
        row.as_of = now
        row.save(update_fields=["gpu_seconds", "as_of"])


class CacheEntry(models.Model):
    """What the dataset and image caches keep of each entry: its key, the fill that holds it, its use.

    A fill claims the entry by writing its token in ``filler`` and keeps ``updated_at`` fresh while it
    copies; ``last_used_at`` orders eviction. Abstract: each cache keeps its own table.
    """

    FILLING, READY = "filling", "ready"

    key = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=8, default="filling")  # filling, ready
    # The transfer filling it; a filler silent past E31_RECONCILE_AFTER_S loses it to the next.
    filler = models.CharField(max_length=32, blank=True)
    hits = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    last_used_at = models.DateTimeField(db_index=True)

    class Meta:
        abstract = True
        ordering = ["-last_used_at"]


class DatasetCacheEntry(CacheEntry):
    """A dataset kept in the pool's staging cache (E31_STAGING_ROOT/cache/<key>), shared by the jobs that read it.

    The key names one source object as one team reads it: the team, the URI, its size and validator
    (ETag, Last-Modified, inode and mtime) and the declared sha256. A declared sha256 alone never
    reaches another source's bytes. Each job's data dir holds hard links to the
    entry's file; a job not yet released or ended pins the entries its inputs link to.
    """

    uri = models.CharField(max_length=2000)
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    validator = models.CharField(max_length=300, blank=True)
    filling_input = models.ForeignKey(
        DataInput, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    inputs = models.ManyToManyField(DataInput, related_name="cache_entries", blank=True)

    def __str__(self) -> str:
        return f"{self.key[:12]} {self.uri} ({self.state})"


class OutputTransfer(models.Model):
    """Delivery of one allocation's sealed outputs after RELEASE, off the meter: progress and its lease."""

    WAITING, DELIVERING, DELIVERED, FAILED = "waiting", "delivering", "delivered", "failed"

    allocation = models.OneToOneField(Allocation, on_delete=models.CASCADE, related_name="output_transfer")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="output_transfers")
    state = models.CharField(max_length=12, default="waiting")  # waiting, delivering, delivered, failed
    files_total = models.PositiveIntegerField(default=0)
    files_done = models.PositiveIntegerField(default=0)
    bytes_total = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    rate_bytes_s = models.FloatField(default=0)
    retries = models.PositiveIntegerField(default=0)
    # The task delivering it; one silent past E31_RECONCILE_AFTER_S loses it to a re-driven task.
    token = models.CharField(max_length=32, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["allocation_id"]
        indexes = [models.Index(fields=["state", "updated_at"])]

    def __str__(self) -> str:
        return f"delivery of allocation {self.allocation_id}: {self.state}"


class SubmissionKey(models.Model):
    """An ``Idempotency-Key`` sent with a submission: a retry with the same key gets the same job back.

    Scoped to the user; the unique constraint is what stops two concurrent retries from making two jobs.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    body_sha256 = models.CharField(max_length=64)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="submission_key_once_per_user")]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key} -> job {self.job_id}"


class LogChunk(models.Model):
    """A piece of one part's log as the agent shipped it: bytes at an offset of attempt ``attempt``, rank ``rank``.

    Kept in the database, so every web process reads the whole log (up to E31_LOG_CAP_BYTES) long after
    the node's attempt directory is gone; a resent piece hits the unique constraint and is ignored.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    attempt = models.PositiveIntegerField()
    rank = models.PositiveSmallIntegerField(default=0)
    offset = models.BigIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["job", "attempt", "rank", "offset"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "rank", "offset"], name="log_chunk_once_per_offset"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} rank {self.rank} @{self.offset}"


class TeamLogBytes(models.Model):
    """The bytes of log a team holds in the database, every job's every part together (``jobs.logs``).

    Kept by the writers as they store and remove chunks, under the team's row lock, so parts appending
    at once never pass E31_TEAM_LOG_BYTES together; what retention removes comes back.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, primary_key=True, related_name="+")
    bytes = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(bytes__gte=0), name="team_log_bytes_not_negative")]

    def __str__(self) -> str:
        return f"team {self.team_id}: {self.bytes} bytes of log"


class DataShare(models.Model):
    """A dataset folder under a data root that an operator lets named teams read besides their own prefix.

    A team's file:// inputs lie under ``<data root>/<team-slug>/``; a folder shared here is the one
    exception, and only for the teams listed.
    """

    path = models.CharField(max_length=1000, unique=True, help_text="Absolute, real path under a data root.")
    teams = models.ManyToManyField(Team, related_name="data_shares")
    note = models.CharField(max_length=200, blank=True)
    shared_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["path"]

    def __str__(self) -> str:
        return self.path


class ImageCacheEntry(CacheEntry):
    """An image in the pool's staging cache (E31_STAGING_ROOT/images/<key>/: its OCI layout and unpacked root).

    Keyed by the team and the manifest digest: the same content for the same team is pulled once, and
    another team never runs an image its own registry access did not resolve. A job not yet released
    or ended pins the entry its pull links to; the rest are evicted as dataset entries are.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    reference = models.CharField(max_length=300)  # by digest: registry/name@sha256:…
    digest = models.CharField(max_length=71)
    bytes = models.BigIntegerField(default=0)  # on the staging storage: layout and root filesystem
    config = models.JSONField(default=dict, blank=True)  # Env, Entrypoint, Cmd, WorkingDir

    def __str__(self) -> str:
        return f"{self.key[:12]} {self.reference} ({self.state})"


class ImagePull(models.Model):
    """A job's image and its staging progress, shown beside its inputs'; ``digest`` is the image it runs."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="image_pull")
    reference = models.CharField(max_length=200)  # as declared
    digest = models.CharField(max_length=71, blank=True)  # what the reference resolved to at staging
    entry = models.ForeignKey(
        ImageCacheEntry, on_delete=models.SET_NULL, null=True, blank=True, related_name="pulls"
    )
    bytes = models.BigIntegerField(default=0)  # what the pull moves (config and compressed layers)
    stage_state = models.CharField(max_length=12, blank=True)  # "", staging, staged, cached, failed, ...
    bytes_done = models.BigIntegerField(default=0)
    rate_bytes_s = models.FloatField(default=0)
    stage_started_at = models.DateTimeField(null=True, blank=True)
    stage_finished_at = models.DateTimeField(null=True, blank=True)
    stage_detail = models.CharField(max_length=500, blank=True)

    def __str__(self) -> str:
        return f"{self.job_id}: {self.reference} {self.digest[:19]}"

    @property
    def name(self) -> str:
        return "image"

    @property
    def uri(self) -> str:
        return self.reference

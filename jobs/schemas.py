"""The API's shapes for jobs. Types are checked here; the rules live in jobs.declaration."""

from datetime import datetime
from typing import Annotated, Any

from ninja import Field, Schema
from ninja.schema import DjangoGetter
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictFloat,
    StrictInt,
    WithJsonSchema,
    model_validator,
)

# Checked by jobs.declaration, as the form and the job file are, so every channel names the same
# field with the same message (a union here would answer "request.cpus.float" instead).
_Size = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]})]
_Number = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "null"}]})]
_Checkpoint = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "signal": {"type": "string", "enum": ["USR1", "USR2", "TERM", "INT", "HUP"]},
                        "grace_s": {"type": "integer", "minimum": 1, "maximum": 3600},
                        "bytes": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                    },
                    "required": ["signal"],
                },
                {"type": "null"},
            ]
        }
    ),
]
# Strict numbers: true is not 1 here, as it is not in the form or a job file.
_JobIds = Annotated[
    Any, WithJsonSchema({"anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]})
]


class NullIsAbsent(Schema):
    """An explicit ``null`` for an optional field means "not given": clients generated from the
    OpenAPI schema send it for every field left unset. A required field's null is still refused.
    A field no part has is refused, not dropped: a typo would otherwise submit the job without it."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        # ninja hands a before-validator its DjangoGetter around the body's dict.
        raw = data._obj if isinstance(data, DjangoGetter) else data
        if not isinstance(raw, dict):
            return data
        optional = {name for name, f in cls.model_fields.items() if not f.is_required()}
        kept = {key: value for key, value in raw.items() if value is not None or key not in optional}
        if isinstance(data, DjangoGetter):
            data._obj = kept
            return data
        return kept


class WorkIn(NullIsAbsent):
    argv: list[str] = Field(
        default_factory=list,
        description="The program and its arguments, never a shell string; with an image, empty runs its Cmd.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Non-secret variables; E31_* are reserved.")
    image: str = Field("", description="An OCI image: registry/name:tag or registry/name@sha256:<digest>.")
    secrets: list[str] = Field(
        default_factory=list,
        description="Names of the team's secrets the job receives as environment variables (values are never shown).",
    )
    workdir: str = ""


class DataIn(NullIsAbsent):
    name: str = Field(..., description="Mounted under $E31_DATA_DIR/<name>.")
    uri: str = Field(
        ...,
        description="file:// (under <data root>/<team-slug>/ or a folder shared with the team), http(s)://, "
        "or s3:// (under <S3 root>/<team-slug>/ of E31_S3_ROOTS)",
    )
    bytes: StrictInt = Field(..., description="Declared size in bytes; staging refuses a larger source.")
    sha256: str = ""


class RequestIn(NullIsAbsent):
    gpus: StrictInt
    hours: StrictFloat = Field(
        ..., description="Time limit in hours, at least one second; the scheduler plans with it."
    )
    min_gpus: StrictInt | None = Field(None, description="Elastic: may start with as few as this.")
    max_gpus: StrictInt | None = Field(
        None,
        description="Elastic: may start this wide on GPUs nothing else waits for (the job reads E31_NUM_GPUS).",
    )
    gpu_model: str = Field(
        "",
        description='Runs only on nodes whose GPU model names it ("H100" names "NVIDIA H100 80GB HBM3"); '
        "refused when no node of the pool has it. Empty: any node.",
    )
    preemptible: StrictBool = False
    requeue: StrictBool = Field(False, description="Requeue as a new attempt after a node loss (at most 3).")
    checkpoint: _Checkpoint = Field(
        None,
        description="Pausable (and so preemptible): before the platform stops the job it sends `signal` (USR1, USR2, "
        "TERM, INT or HUP), waits `grace_s` (1-3600, default 120), and hands what the job saved in $E31_CHECKPOINT_DIR "
        "(at most `bytes`, default 1 GiB) to its next attempt, which starts with E31_RESUMED=1.",
    )
    memory: _Size = Field(
        None,
        description="Memory for the whole job: bytes or a size such as '512 MB' (split across nodes by GPUs). "
        "Unset: the node's share for the job's GPUs. Going over it ends the job out_of_memory.",
    )
    cpus: _Number = Field(
        None, description="CPUs for the whole job, fractions allowed; unset: the node's share for its GPUs."
    )


class OutputIn(NullIsAbsent):
    uri: str = Field(
        "",
        description="file:// (under <output root>/<team-slug>/) or s3:// (under <S3 root>/<team-slug>/ of "
        "E31_S3_ROOTS); each attempt is delivered into "
        "<uri>/<job id>-<attempt>/. Left out: the team's default destination, <first output root>/<team-slug>/.",
    )
    bytes: StrictInt


class JobIn(NullIsAbsent):
    name: str
    team: str = Field("", description="Team slug; needed only by members of several teams.")
    work: WorkIn
    data: list[DataIn] = Field(default_factory=list)
    request: RequestIn
    output: OutputIn
    after_ok: _JobIds = Field(
        None, description="Ids of the team's older jobs this one runs after, once each has succeeded."
    )
    after_any: _JobIds = Field(
        None, description="Ids of the team's older jobs this one runs after, however they end."
    )
    array: Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "null"}]})] = Field(
        None,
        description='An array: "0-99%8" submits one task per index (each a job with E31_ARRAY_INDEX), at most 8 '
        "running at once; the answer is the first task, whose `array` names the rest.",
    )


class FieldError(Schema):
    field: str
    message: str


class ErrorOut(Schema):
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class BuiltOut(BaseModel):
    """An answer the API builds as plain dicts (``jobs.api.job_json``), checked by pydantic alone.
    ninja's ``Schema`` wraps every object it checks in a ``DjangoGetter`` so that it can read model
    attributes. Together with a related manager per job and relation (``selectors.with_details``), that
    was a third of a page of 100 jobs: 158.8 ms before both, 109.0 ms after."""


class EventOut(BuiltOut):
    state: str
    at: datetime
    reason: str


class DataOut(DataIn):
    stage_state: str
    bytes_done: int
    rate_bytes_s: float
    eta_s: float | None


class ImageOut(BuiltOut):
    reference: str = Field(..., description="The image as declared.")
    digest: str = Field(..., description="What the reference resolved to at staging: the image the job runs.")
    stage_state: str
    bytes: int = Field(..., description="What the pull moves: config and compressed layers.")
    bytes_done: int
    rate_bytes_s: float
    eta_s: float | None
    stage_detail: str


class AllocationOut(BuiltOut):
    attempt: int
    node: str
    gpu_indices: list[int]
    rented_at: datetime
    released_at: datetime | None
    end_reason: str
    network: str = Field(
        "", description="The network the part had: offline, its job's parts, or the internet."
    )


class OutputFileOut(Schema):
    path: str
    bytes: int
    sha256: str


class OutputsOut(BuiltOut):
    files: int = Field(..., description="Files the current attempt sealed.")
    bytes: int = Field(..., description="Their total size in bytes.")
    delivered_to: str = Field(..., description="The attempt's own folder under the destination.")
    files_url: str = Field(..., description="Every file, paged: ?offset=&limit= (at most 1000).")
    files_listed: bool = Field(
        True, description="False once the list of files was removed with the job's log (E31_LOG_KEEP_DAYS after "
        "the job ended): files_url then lists none; the files stay at delivered_to.",
    )  # fmt: skip


class ArrayRefOut(BuiltOut):
    id: int
    index: int
    size: int
    max_running: int | None
    spec: str
    limit_of: int | None = Field(
        None, description="A task run again on its own: the array whose max_running it counts against."
    )


class ArrayOut(Schema):
    id: int
    name: str
    team: str
    spec: str
    size: int
    max_running: int | None
    submitted_at: datetime
    states: dict[str, int] = Field(..., description="How many tasks are in each state.")
    tasks_url: str = Field(..., description="The tasks, as jobs: /api/v1/jobs?array=<id>.")


class JobOut(BuiltOut):
    id: int
    name: str
    team: str = Field(..., description="The team's name, as pages show it.")
    team_slug: str = Field(..., description="The team's slug: what team=, --team and the URLs take.")
    state: str
    end_reason: str
    exit_code: int | None
    end_detail: str
    submitted_at: datetime
    attempt: int
    work: WorkIn
    data: list[DataOut]
    image: ImageOut | None = Field(None, description="The job's image and its staging, once staging began.")
    request: RequestIn
    output: OutputIn
    events: list[EventOut]
    allocations: list[AllocationOut]
    outputs: OutputsOut
    delivery_state: str
    estimated_start: datetime | None
    pending_reason: str
    paused: str = Field(
        "", description='A pausable job between attempts: "paused (checkpoint 1.2 GB)"; else empty.'
    )
    after_ok: list[int] = Field(default_factory=list, description="Prerequisites that must succeed first.")
    after_any: list[int] = Field(default_factory=list, description="Prerequisites that must end first.")
    dependents: list[int] = Field(
        default_factory=list,
        description="Jobs that wait for this one: the first 100, by id (`dependents_total` counts them all).",
    )
    dependents_total: int = Field(0, description="How many jobs wait for this one.")
    rerun_of: int | None = Field(None, description="The job this one re-runs, if it is a re-run.")
    array: ArrayRefOut | None = Field(None, description="Set on a task of an array.")
    budget_note: str = Field(
        "", description="Set on submission when the job takes its team past a budget that only warns."
    )

"""The job declaration's rules, in one place.

The browser form, the TOML job file and the API all turn their input into the same plain
mapping and call ``validate``; every error names its field path (``data[1].uri``) so each
channel can show it where the user typed it. Nothing here touches the database: the pool's
limits and the allowed roots are passed in (the staging cache's size, where none is, read from the settings).
"""

import difflib
import itertools
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from django.conf import settings

from jobs import imageref
from jobs.scheduling.types import serves
from jobs.units import format_size, parse_size

MAX_JOB_FILE_BYTES = 256 * 1024
NOT_UTF8 = "a job file is UTF-8 text: save it as UTF-8 (this one is in another encoding, such as UTF-16)"
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
MAX_ENV = 128
# What the command and its environment may hold together (Linux takes 2 MB of both): every task of an array
# stores a copy, so its tasks share a bound of their own.
MAX_WORK_CHARS = 64 * 1024
MAX_ARRAY_WORK_CHARS = 8 * 10**6
MAX_INPUTS = 64
MAX_ARRAY_INPUTS = 10_000  # an array's tasks' inputs together, each a row of its own
MAX_SECRETS = 32
MAX_UNKNOWN_KEYS = 10
MAX_NESTING = 10  # a declaration nests four levels deep (data[0].bytes); ten leaves room, 1,500 is an attack
MAX_IMAGE = MAX_WORKDIR = 200  # the widths of the columns they are stored in
_IMAGE_TOO_LONG = f"an image reference of at most {MAX_IMAGE} characters, its tag included (:latest if none)"
MIN_HOURS = 1 / 3600  # a time limit under one second is a typo (1e-300), not a job
DATA_SCHEMES = ("file", "http", "https", "s3")
OUTPUT_SCHEMES = ("file", "s3")
RESERVED_ENV = re.compile(r"E31_.*|CUDA_VISIBLE_DEVICES")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
INPUT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")  # with fullmatch: "$" would let a trailing newline through
MIN_MEMORY = 16 * 2**20  # below this not even an interpreter starts
MIN_CPUS = 0.01  # the smallest CFS quota the kernel takes is 1 ms of every 100 ms
MAX_CPUS = 100_000
MAX_PREREQUISITES = 64
MAX_ARRAY_INDEX = 10_000_000
# Signals a job may ask to be warned with before it is stopped: ones a program can catch, nothing else.
CHECKPOINT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
CHECKPOINT_KEYS = ("signal", "grace_s", "bytes")
MIN_GRACE_S, MAX_GRACE_S, DEFAULT_GRACE_S = 1, 3600, 120
DEFAULT_CHECKPOINT_BYTES = 2**30
ARRAY_SPEC = re.compile(r"^\s*([0-9][0-9,\s-]*?)\s*(?:%\s*([0-9]+))?\s*$")


@dataclass(frozen=True)
class Limits:
    pool_gpus: int
    max_hours: float
    data_roots: Sequence[Path]
    output_roots: Sequence[Path]
    # What the pool's nodes advertise for jobs in all; 0 where none advertises (then unchecked).
    pool_memory: int = 0
    pool_cpus: float = 0
    max_output_bytes: int = 0  # E31_MAX_OUTPUT_BYTES; 0: unchecked
    # The submitting team: its file:// inputs and destinations lie under <root>/<team>/ (None: not chosen yet).
    team: str | None = None
    # Dataset folders an operator shared with that team, readable besides its own prefix.
    shared: Sequence[Path] = ()
    max_array: int = 1000  # E31_MAX_ARRAY: tasks in one array
    max_checkpoint_bytes: int = 2**40  # E31_MAX_CHECKPOINT_BYTES: one job's checkpoint directory
    # The names of the submitting team's secrets (None: not checked, as before a team is chosen).
    secrets: frozenset[str] | None = None
    # E31_S3_ROOTS: a team's s3:// inputs and destinations lie under <root>/<team>/; none: s3:// is refused.
    s3_roots: Sequence[str] = ()
    # The GPU models of the nodes not down (None: not checked, as for a draft's preview).
    gpu_models: frozenset[str] | None = None
    # (GPUs, memory bytes, CPUs) each node not down offers jobs, 0 where it does not say (empty: not checked).
    nodes: Sequence[tuple[int, int, float]] = ()
    # E31_STAGE_CACHE_BYTES: every input is staged into the pool's one cache, so no input, nor a job's inputs
    # together, may be larger than it (None: the configured value now).
    stage_cache_bytes: int | None = None
    # Shared folders the team's own folders are, lie in or hold, not shared with it (``sharing.withheld``):
    # its own folder does not make them readable.
    withheld: Sequence[Path] = ()


@dataclass(frozen=True)
class DataInput:
    name: str
    uri: str
    bytes: int
    sha256: str = ""


@dataclass(frozen=True)
class Checkpoint:
    """``checkpoint = { signal = "USR1", grace_s = 120, bytes = "2 GB" }``: warned with ``signal``, the job
    has ``grace_s`` to save into $E31_CHECKPOINT_DIR (at most ``bytes``) before it is stopped."""

    signal: str
    grace_s: int = DEFAULT_GRACE_S
    bytes: int = DEFAULT_CHECKPOINT_BYTES


@dataclass(frozen=True)
class Array:
    """``array = "0-99%8"``: one task per index, each a job of its own, at most ``limit`` running at once."""

    indices: tuple[int, ...]
    limit: int | None = None
    text: str = ""


@dataclass(frozen=True)
class Declaration:
    name: str
    argv: list[str]
    env: dict[str, str]
    image: str
    workdir: str
    data: list[DataInput]
    gpus: int
    gpu_model: str
    hours: float
    min_gpus: int | None
    preemptible: bool
    requeue: bool
    output_uri: str
    output_bytes: int
    memory_bytes: int | None = None  # None: the node's share for the job's GPUs
    max_gpus: int | None = None  # elastic: may start this wide on GPUs nothing else waits for
    cpus: float | None = None
    # Older jobs of the same team it runs after: once each has succeeded / once each has ended.
    after_ok: tuple[int, ...] = ()
    after_any: tuple[int, ...] = ()
    array: Array | None = None
    secrets: list[str] = field(default_factory=list)  # names of team secrets, received as variables
    checkpoint: Checkpoint | None = None  # pausable: declaring it makes the job preemptible


@dataclass
class DeclarationInvalid(Exception):
    errors: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(f"{path}: {message}" for path, message in self.errors)

    def as_dict(self) -> dict[str, str]:
        """First message per field path, for forms."""
        out: dict[str, str] = {}
        for path, message in self.errors:
            out.setdefault(path, message)
        return out


class _Collector:
    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append((path, message))


def parse_job_file(text: str) -> dict[str, Any]:
    """TOML text -> the declaration mapping; DeclarationInvalid with path ``file`` if it is not TOML."""
    text = text.removeprefix("\ufeff")  # "UTF-8 with BOM", as Windows editors save: TOML itself has no BOM
    if len(text.encode("utf-8", "replace")) > MAX_JOB_FILE_BYTES:
        raise DeclarationInvalid([("file", f"a job file is at most {MAX_JOB_FILE_BYTES // 1024} KB")])
    if _has_deep_dotted_key(text):
        raise DeclarationInvalid([("file", _too_deep())])
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeclarationInvalid([("file", f"not valid TOML: {exc}")]) from exc
    except RecursionError as exc:  # the parser recurses once per level: [[[[…]]]] exhausts the stack
        raise DeclarationInvalid([("file", _too_deep())]) from exc
    except ValueError as exc:  # an integer past Python's 4,300 digits: tomllib lets int()'s error through
        raise DeclarationInvalid([("file", _too_large())]) from exc
    if nesting_depth(raw) > MAX_NESTING:
        raise DeclarationInvalid([("file", _too_deep())])
    if any(isinstance(v, int) and abs(v) >= MAX_FILE_INTEGER for v in _scalars(raw)):
        # No field takes one, and a str() or json.dumps() of it on the way to a field's own check would raise.
        raise DeclarationInvalid([("file", _too_large())])
    return raw


# What a TOML document holds that is no key, and may hold dots: strings (multi-line ones first, so their quotes are
# not read as two empty strings; one may end in up to two quotes before its closing three) and comments. Each becomes one placeholder part, so "a"."b" still reads as two. A
# string left open runs to its line's end (to the file's, multi-line): every match succeeds once begun, so no text
# is read twice (a pattern that failed there was tried again from each quote inside: 230 s for a line of "\"\").
_NOT_KEYS = re.compile(
    r'"""(?:[^\\]|\\.?)*?(?:"{3,5}|\Z)'
    r"|'''.*?(?:'{3,5}|\Z)"
    r'|"(?:[^"\\\n]|\\[^\n]?)*+(?:"|(?=\n)|\Z)'
    r"|'[^'\n]*+(?:'|(?=\n)|\Z)"
    r"|#[^\n]*+",
    re.DOTALL,
)
# More parts than MAX_NESTING joined by dots: outside strings and comments only a key can be (no TOML value is).
# Tried only where a word starts, and possessive (never giving back what it took), so it reads each word once: a
# plain pattern retried inside a word as long as the file took 26 s.
_DEEP_DOTTED_KEY = re.compile(rf"(?<![\w-])[\w-]++(?:[ \t]*+\.[ \t]*+[\w-]++){{{MAX_NESTING},}}")


def _has_deep_dotted_key(text: str) -> bool:
    """Whether a key of the file has more parts than MAX_NESTING: it nests that deep once parsed, and is refused
    then, but tomllib keeps every prefix of a dotted key while it reads it, so its time and memory grow with the
    square of the key's length (64 KB of ``a.a.a`` took 11.8 s and 3.9 GB). Read on the text first, in linear time."""
    return _DEEP_DOTTED_KEY.search(_NOT_KEYS.sub("s", text)) is not None


# The largest integer a job file may hold anywhere: what str() and json.dumps() can still write (Python's 4,300
# digits). Below it each field names its own error (10**400 CPUs); past it, no field could say which.
MAX_FILE_DIGITS = 4300
MAX_FILE_INTEGER = 10**MAX_FILE_DIGITS


def _too_large() -> str:
    return f"a number in a job file has at most {MAX_FILE_DIGITS} digits (no field takes one that large)"


def _scalars(value: Any) -> Iterator[Any]:
    """Every value of a parsed document that is neither a list nor a table; iterative, like nesting_depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            yield item


def nesting_depth(value: Any) -> int:
    """How many lists and tables deep a parsed document goes; iterative, so any depth is safe to measure."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _too_deep() -> str:
    return f"nested too deeply: a job file nests lists and tables at most {MAX_NESTING} levels"


def validate(raw: Any, *, limits: Limits) -> Declaration:
    """Checks every rule of the four parts; raises DeclarationInvalid listing all that fail."""
    errs = _Collector()
    if not isinstance(raw, Mapping):
        raise DeclarationInvalid([("", "a job is an object with name, work, data, request and output")])
    name = _name(raw.get("name"), errs)
    work = _part(raw, "work", errs)
    request = _part(raw, "request", errs)
    output = _part(raw, "output", errs)
    _unknown_keys(raw, {"": raw, "work": work, "request": request, "output": output}, errs)
    image = _image(work.get("image"), errs)
    argv = _argv(work.get("argv"), errs, image=image)
    env = _env(work.get("env", {}), errs)
    secrets = _secrets(work.get("secrets", []), env, limits, errs)
    workdir = _workdir(work.get("workdir"), errs)
    data = _inputs(raw.get("data", []), limits, errs)
    gpus, min_gpus = _gpus(request, limits, errs)
    max_gpus = _max_gpus(request.get("max_gpus"), gpus, limits, errs)
    hours = _hours(request.get("hours"), limits, errs)
    output_uri = _output_uri(output.get("uri"), limits, errs)
    output_bytes = _output_bytes(output.get("bytes"), limits, errs)
    flags = {key: _flag(request.get(key), f"request.{key}", errs) for key in ("preemptible", "requeue")}
    checkpoint = _checkpoint(request.get("checkpoint"), limits, errs)
    gpu_model = _gpu_model(request.get("gpu_model"), limits, errs)
    memory = _memory(request.get("memory"), limits, errs)
    cpus = _cpus(request.get("cpus"), limits, errs)
    _check_one_node_room(min_gpus or gpus, memory, cpus, limits, errs)
    after_ok, after_any = _prerequisites(raw, errs)
    array = _array(raw.get("array"), limits, errs)
    _check_work_size(argv, env, data, array, errs)
    if not (after_ok or after_any):  # inputs a prerequisite will write are checked when they stage
        _check_own_files(data, limits, errs)
    if errs.errors:
        raise DeclarationInvalid(errs.errors)
    return Declaration(
        name=name, argv=argv, env=env, image=image, workdir=workdir, data=data,
        gpus=gpus, gpu_model=gpu_model,
        hours=hours, min_gpus=min_gpus, max_gpus=max_gpus,
        preemptible=flags["preemptible"] or checkpoint is not None, requeue=flags["requeue"], checkpoint=checkpoint,
        output_uri=output_uri, output_bytes=output_bytes, memory_bytes=memory, cpus=cpus,
        after_ok=after_ok, after_any=after_any, array=array, secrets=secrets,
    )  # fmt: skip


def as_mapping(spec: Declaration) -> dict[str, Any]:
    """The declaration as a job file writes it: ``validate`` reads it back to the same declaration (what a
    re-run submits again, or fills the form with). Parts left unset are left out."""
    request = {
        "gpus": spec.gpus, "hours": spec.hours, "min_gpus": spec.min_gpus, "max_gpus": spec.max_gpus,
        "gpu_model": spec.gpu_model, "preemptible": spec.preemptible, "requeue": spec.requeue,
        "memory": spec.memory_bytes, "cpus": spec.cpus,
        "checkpoint": asdict(spec.checkpoint) if spec.checkpoint else None,
    }  # fmt: skip
    work = {"argv": list(spec.argv), "env": dict(spec.env), "image": spec.image, "workdir": spec.workdir}
    if spec.secrets:  # names only: the job receives the team's values as they are when it starts
        work["secrets"] = list(spec.secrets)
    ordering = {"after_ok": list(spec.after_ok), "after_any": list(spec.after_any)}
    return {
        "name": spec.name,
        "work": work,
        "data": [asdict(d) for d in spec.data],
        "request": {k: v for k, v in request.items() if v is not None},
        "output": {"uri": spec.output_uri, "bytes": spec.output_bytes},
        **{k: v for k, v in ordering.items() if v},
        **({"array": spec.array.text} if spec.array else {}),
    }


def _prerequisites(raw: Mapping, errs: _Collector) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``after_ok`` and ``after_any``: lists of job ids, each named once across both."""
    seen: set[int] = set()
    lists = []
    for key in ("after_ok", "after_any"):
        value = raw.get(key)
        if value in (None, ""):
            lists.append(())
            continue
        if not isinstance(value, list) or len(value) > MAX_PREREQUISITES:
            errs.add(key, f"a list of at most {MAX_PREREQUISITES} job ids, such as [812, 813]")
            lists.append(())
            continue
        ids = []
        for i, item in enumerate(value):
            if not _is_int(item) or item < 1:
                errs.add(f"{key}[{i}]", "a job id (a whole number)")
            elif item in seen:
                errs.add(f"{key}[{i}]", f"job {item} is already named")
            else:
                seen.add(item)
                ids.append(item)
        lists.append(tuple(ids))
    return lists[0], lists[1]


def _check_work_size(
    argv: list[str], env: dict[str, str], data: list[DataInput], array: Array | None, errs: _Collector
) -> None:
    chars = sum(map(len, argv)) + sum(len(name) + len(value) for name, value in env.items())
    if chars > MAX_WORK_CHARS:
        errs.add("work", f"the command and its environment hold {chars:,} characters; at most {MAX_WORK_CHARS // 1024} KB together "
                         "(pass longer input as a data file)")  # fmt: skip
    elif array:
        _check_array_copies(chars, data, len(array.indices), errs)


def _check_array_copies(work_chars: int, data: list[DataInput], tasks: int, errs: _Collector) -> None:
    """Each task stores its own copy of the command, its environment and its inputs (a row each), and a cancel
    frees the waiting cap at once: 1,000 tasks of 64 inputs with 2,000-character addresses stored 146 MB from
    a 130 KB request, again and again. An array's copies are bounded together."""
    rows = tasks * len(data)
    each = work_chars + sum(len(d.name) + len(d.uri) + len(d.sha256) for d in data)
    if rows > MAX_ARRAY_INPUTS:
        errs.add("array", f"{tasks} tasks of {len(data)} inputs hold {rows:,} inputs; an array's tasks hold at most "
                          f"{MAX_ARRAY_INPUTS:,} together: have each task read what its E31_ARRAY_INDEX needs from "
                          "fewer inputs they share")  # fmt: skip
    elif each * tasks > MAX_ARRAY_WORK_CHARS:
        errs.add("array", f"{tasks} tasks, each a copy of a {format_size(each)} command, environment and inputs, "
                          f"hold {format_size(each * tasks)}; an array's tasks hold at most "
                          f"{format_size(MAX_ARRAY_WORK_CHARS)} together: shorten the command or the inputs' "
                          "addresses, or have each task read its parameters from a data file by its "
                          "E31_ARRAY_INDEX")  # fmt: skip


def _array(value: Any, limits: Limits, errs: _Collector) -> Array | None:
    """``"0-99%8"``: indices as ranges and single numbers separated by commas, then ``%`` and how many
    may run at once (Slurm's --array syntax)."""
    if value in (None, ""):
        return None
    match = ARRAY_SPEC.match(value) if isinstance(value, str) and len(value) <= 200 else None
    if match is None:
        errs.add("array", 'indices such as "0-99", "1,3,5-7", optionally "%8" to run at most 8 at once')
        return None
    indices: set[int] = set()
    for part in filter(None, (p.strip() for p in match.group(1).split(","))):
        low, _, high = part.partition("-")
        if not low.strip().isdecimal() or (high and not high.strip().isdecimal()):
            errs.add("array", f"{part!r} is not an index or a range such as 0-99")
            return None
        first, last = int(low), int(high or low)
        if last < first or last > MAX_ARRAY_INDEX:
            errs.add("array", f"{part!r}: a range goes up, from 0 to at most {MAX_ARRAY_INDEX}")
            return None
        if last - first + 1 + len(indices) > limits.max_array:
            errs.add("array", f"at most {limits.max_array} tasks in one array (E31_MAX_ARRAY)")
            return None
        indices.update(range(first, last + 1))
    limit = int(match.group(2)) if match.group(2) else None
    if not indices or limit == 0:
        errs.add("array", "at least one index, and at least 1 task running at once")
        return None
    limit = None if limit is None or limit >= len(indices) else limit  # a limit past the size limits nothing
    return Array(indices=tuple(sorted(indices)), limit=limit, text=value.strip())


# Every key a part may hold: any other is refused by name, for a typo ("memroy", "preemptable") would otherwise
# submit the job without the setting, and nothing would say so.
KNOWN_KEYS = {
    "": ("name", "team", "work", "data", "request", "output", "after_ok", "after_any", "array"),
    "work": ("argv", "env", "image", "secrets", "workdir"),
    "request": (
        "gpus", "hours", "min_gpus", "max_gpus", "gpu_model", "preemptible", "requeue", "checkpoint", "memory", "cpus",
    ),
    "output": ("uri", "bytes"),
    "data": ("name", "uri", "bytes", "sha256"),
}  # fmt: skip


def unknown_key(part: str, key: str) -> str:
    """Why ``key`` is refused in ``part`` ("" for the job itself, "data" for an input), with the key it may
    have meant to be."""
    close = difflib.get_close_matches(key, KNOWN_KEYS[part], n=1)
    hint = f"did you mean {close[0]}?" if close else f"one of {', '.join(KNOWN_KEYS[part])}"
    return f"not a field of {f'the {part} part' if part else 'a job'}: {hint}"


def unknown_keys(raw: Mapping) -> list[tuple[str, str]]:
    """(path, why) of the first few keys of a job file no part knows: what filling a form from it would drop."""
    parts = {
        "": raw,
        **{key: raw[key] for key in ("work", "request", "output") if isinstance(raw.get(key), Mapping)},
    }
    errs = _Collector()
    _unknown_keys(raw, parts, errs)
    return errs.errors


def _unknown_keys(raw: Mapping, parts: Mapping[str, Mapping], errs: _Collector) -> None:
    """The first few keys no part knows (a hostile job of thousands of them is not answered thousands of times)."""
    inputs = raw.get("data")
    items = (
        [(f"data[{i}]", "data", d) for i, d in enumerate(inputs[:MAX_INPUTS])]
        if isinstance(inputs, list)
        else []
    )
    unknown = (
        (f"{path}.{str(key)[:40]}".lstrip("."), unknown_key(part, str(key)))
        for path, part, value in [*((p, p, v) for p, v in parts.items()), *items]
        if isinstance(value, Mapping)
        for key in value
        if key not in KNOWN_KEYS[part]
    )
    for path, message in itertools.islice(unknown, MAX_UNKNOWN_KEYS):
        errs.add(path, message)


def _part(raw: Mapping, key: str, errs: _Collector) -> Mapping:
    value = raw.get(key)
    if isinstance(value, Mapping):
        return value
    errs.add(key, f"the {key} part is missing" if value is None else f"{key} must be an object")
    return {}


def _name(value: Any, errs: _Collector) -> str:
    if not isinstance(value, str) or not value.strip():
        errs.add("name", "give the job a name")
        return ""
    value = value.strip()
    if len(value) > 120:
        errs.add("name", "a name is at most 120 characters")
    elif not value.isprintable():
        errs.add("name", "a name cannot hold control characters")
    return value


def _argv(value: Any, errs: _Collector, *, image: str) -> list[str]:
    if image and value in (None, []):
        return []  # the image's own Entrypoint and Cmd run
    if isinstance(value, str):
        errs.add("work.argv", "argv is a list of arguments, never a shell string")
        return []
    if not isinstance(value, list) or not value:
        errs.add("work.argv", "argv needs at least the program to run (or name an image whose Cmd runs)")
        return []
    if len(value) > MAX_ARGS:
        errs.add("work.argv", f"at most {MAX_ARGS} arguments")
        return []
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            errs.add(f"work.argv[{i}]", "every argument is a string")
        elif "\x00" in arg or len(arg) > MAX_ARG_CHARS or not _is_utf8(arg):
            errs.add(
                f"work.argv[{i}]",
                f"an argument is UTF-8 text with no NUL byte (nor a lone surrogate) and at most {MAX_ARG_CHARS} characters",
            )
    if isinstance(value[0], str) and not value[0].strip():
        errs.add("work.argv[0]", "the program to run cannot be empty")
    # With an image, argv may be its Entrypoint's arguments (sh -c's script): only a program is checked.
    elif isinstance(value[0], str) and not image and any(c.isspace() for c in value[0].strip()):
        errs.add(
            "work.argv[0]",
            "this looks like a shell command line: give the program and each argument separately",
        )
    return [str(a) for a in value]


def _env(value: Any, errs: _Collector) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errs.add("work.env", "env maps names to values")
        return {}
    if len(value) > MAX_ENV:  # one error says it all: naming each of thousands of variables would not
        errs.add("work.env", f"at most {MAX_ENV} variables")
        return {}
    for key, val in value.items():
        path = f"work.env.{str(key)[:40]}"
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            errs.add(path, "a variable name is letters, digits and _, not starting with a digit")
        elif RESERVED_ENV.fullmatch(key):
            errs.add(path, f"{key} is set by the platform and cannot be declared")
        if not isinstance(val, str) or "\x00" in val or len(val) > MAX_ARG_CHARS or not _is_utf8(val):
            errs.add(
                path,
                f"a value is UTF-8 text (no NUL byte, no lone surrogate) of at most {MAX_ARG_CHARS} characters",
            )
    return {str(k): str(v) for k, v in value.items()}


def _is_utf8(text: str) -> bool:
    """Whether text can be stored: JSON's "\\ud800" decodes to a lone surrogate, which no UTF-8 (so neither
    PostgreSQL's JSON nor a process's argv) can hold. Tabs and newlines pass: an argument may be a script."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _image(value: Any, errs: _Collector) -> str:
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or len(value.strip()) > MAX_IMAGE:
        errs.add("work.image", _IMAGE_TOO_LONG)
        return ""
    try:
        image = str(imageref.parse(value.strip()))
    except imageref.BadReference as exc:
        errs.add("work.image", str(exc))
        return ""
    if len(image) > MAX_IMAGE:  # measured again as stored: parse adds ":latest" to a reference without a tag
        errs.add("work.image", _IMAGE_TOO_LONG)
        return ""
    return image


def _secrets(value: Any, env: Mapping[str, str], limits: Limits, errs: _Collector) -> list[str]:
    """Names of the team's secrets the job receives as variables; the values never pass through here."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_SECRETS:
        errs.add("work.secrets", f"secrets is a list of at most {MAX_SECRETS} names of your team's secrets")
        return []
    names: list[str] = []
    for i, name in enumerate(value):
        path = f"work.secrets[{i}]"
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or RESERVED_ENV.fullmatch(name):
            errs.add(path, "a secret's name is letters, digits and _, not E31_* or CUDA_VISIBLE_DEVICES")
        elif name in env or name in names:
            errs.add(path, f"{name} is declared twice (in env or secrets)")
        elif limits.secrets is not None and name not in limits.secrets:
            errs.add(path, f"your team has no secret named {name}: add it on the team's secrets page first")
        else:
            names.append(name)
    return names


def _workdir(value: Any, errs: _Collector) -> str:
    if value in (None, ""):
        return ""
    if (
        not isinstance(value, str)
        or len(value) > MAX_WORKDIR
        or not value.isprintable()
        or value.startswith("/")
        or ".." in Path(value).parts
    ):
        errs.add(
            "work.workdir",
            f"a relative directory inside the job's own directory, at most {MAX_WORKDIR} printable characters",
        )
        return ""
    return value


def _gpu_model(value: Any, limits: Limits, errs: _Collector) -> str:
    """A model asked for ("H100" names "NVIDIA H100 80GB HBM3") must be one a node of the pool has: the job runs
    only on nodes of that model (a job whose model's nodes all go later waits, told so)."""
    model = _short_text(value, "request.gpu_model", 60, errs)
    models = limits.gpu_models
    if model and models is not None and not any(serves(m, model) for m in models):
        have = ", ".join(sorted(models)) or "no nodes yet"
        errs.add(
            "request.gpu_model",
            f"no node of this pool has {model} GPUs; its nodes have {have}: name one of those, or leave it empty "
            "to run on any of them",
        )
        return ""
    return model


def _short_text(value: Any, path: str, limit: int, errs: _Collector) -> str:
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        errs.add(path, f"text of at most {limit} printable characters")
        return ""
    return value.strip()


def _inputs(value: Any, limits: Limits, errs: _Collector) -> list[DataInput]:
    if not isinstance(value, list):
        errs.add("data", "data is a list of inputs")
        return []
    if len(value) > MAX_INPUTS:
        errs.add("data", f"at most {MAX_INPUTS} inputs")
        return []
    seen: set[str] = set()
    inputs = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            errs.add(f"data[{i}]", "each input has name, uri and bytes")
            continue
        name = item.get("name")
        if not isinstance(name, str) or not INPUT_NAME.fullmatch(name):
            errs.add(f"data[{i}].name", "a name of letters, digits, '.', '_' or '-' (at most 64)")
        elif name in seen:
            errs.add(f"data[{i}].name", f"another input is already named {name!r}")
        else:
            seen.add(name)
        uri = _data_uri(item.get("uri"), f"data[{i}].uri", limits, errs)
        size = _size(item.get("bytes"), f"data[{i}].bytes", errs)
        sha = item.get("sha256") or ""
        if not isinstance(sha, str) or (sha and not SHA256.fullmatch(sha.lower())):
            errs.add(f"data[{i}].sha256", "a sha256 is 64 hexadecimal characters")
            sha = ""
        inputs.append(DataInput(name=str(name), uri=uri, bytes=size, sha256=sha.lower()))
    _check_cache_room(inputs, limits, errs)
    return inputs


def _check_cache_room(inputs: list[DataInput], limits: Limits, errs: _Collector) -> None:
    """Every input lands in the pool's one staging cache, and a job holds all of its inputs there until it is
    released: an input, or a job's inputs together, larger than the cache could only fill the disk other teams'
    jobs stage into. Staging holds each fill to the room left (``staging.claim_slot``); this says it at submit."""
    cache = settings.E31_STAGE_CACHE_BYTES if limits.stage_cache_bytes is None else limits.stage_cache_bytes
    capacity = int(cache * settings.E31_STAGE_TEAM_SHARE)
    limit = (
        f"{format_size(capacity)} ({capacity:,} bytes), a team's share of this pool's staging cache "
        "(E31_STAGE_TEAM_SHARE of E31_STAGE_CACHE_BYTES)"
    )
    for i, item in enumerate(inputs):
        if item.bytes > capacity:
            errs.add(f"data[{i}].bytes", f"an input is at most {limit}")
    total = sum(item.bytes for item in inputs)
    if total > capacity and all(item.bytes <= capacity for item in inputs):
        errs.add("data", f"a job's inputs together are at most {limit}; these are {total:,} bytes")


def _check_own_files(inputs: list[DataInput], limits: Limits, errs: _Collector) -> None:
    """Each file:// input under the team's own folder is there now, a regular file of its declared
    size: what staging would refuse, refused at submit with the reason (a shared folder's are left to it)."""
    if limits.team is None or any(path.startswith("data") for path, _ in errs.errors):
        return  # the team is not chosen yet, or the inputs do not line up with their rows
    own = team_prefixes(limits.data_roots, limits.team)
    for i, item in enumerate(inputs):
        parts = urlsplit(item.uri)
        path = resolve_under_roots(unquote(parts.path), own) if parts.scheme == "file" else None
        if path is None or resolve_under_roots(str(path), limits.withheld) is not None:
            continue  # not the team's own (a withheld folder's files are not stat'ed for it either)
        try:
            found = path.stat()
        except FileNotFoundError:
            errs.add(
                f"data[{i}].uri",
                f"no such file: {path} (if another job writes it, name that job in after_ok)",
            )
            continue
        except OSError as exc:
            errs.add(f"data[{i}].uri", f"cannot be read: {exc.strerror or exc}")
            continue
        if not stat.S_ISREG(found.st_mode):
            errs.add(f"data[{i}].uri", f"not a regular file: {path}")
        elif found.st_size != item.bytes:
            errs.add(
                f"data[{i}].bytes",
                f"the file holds {found.st_size:,} bytes ({format_size(found.st_size)}); "
                f"{item.bytes:,} were declared",
            )


def _size(value: Any, path: str, errs: _Collector) -> int:
    if value is None or value == "":
        errs.add(path, "declare the size in bytes (units such as 20 GB are accepted)")
        return 0
    try:
        return parse_size(value)
    except ValueError as exc:
        errs.add(path, str(exc))
        return 0


def _output_bytes(value: Any, limits: Limits, errs: _Collector) -> int:
    size = _size(value, "output.bytes", errs)
    if limits.max_output_bytes and size > limits.max_output_bytes:
        errs.add(
            "output.bytes", f"at most {format_size(limits.max_output_bytes)} of output (E31_MAX_OUTPUT_BYTES)"
        )
    return size


def _data_uri(value: Any, path: str, limits: Limits, errs: _Collector) -> str:
    before = len(errs.errors)
    uri = _uri(value, path, DATA_SCHEMES, limits.data_roots, "E31_DATA_ROOTS", errs)
    if len(errs.errors) == before:
        _check_team_prefix(uri, path, limits.data_roots, limits, errs, shared=limits.shared)
    return uri


def _output_uri(value: Any, limits: Limits, errs: _Collector) -> str:
    if value is None or value == "":
        if default := default_destination(limits.output_roots, limits.team):
            return default
    before = len(errs.errors)
    uri = _uri(value, "output.uri", OUTPUT_SCHEMES, limits.output_roots, "E31_OUTPUT_ROOTS", errs)
    if len(errs.errors) == before:
        _check_team_prefix(uri, "output.uri", limits.output_roots, limits, errs)
    return uri


def default_destination(roots: Sequence[Path], team: str | None) -> str:
    """Where a job that names no destination delivers: its team's folder of the first output root
    (each attempt into ``<job id>-<attempt>/`` under it). Empty until the team is known."""
    if team is None or not roots:
        return ""
    return (Path(roots[0]) / team).as_uri() + "/"


def team_prefixes(roots: Sequence[Path], team: str) -> list[Path]:
    """Each root's folder of one team (``<root>/<team-slug>``): the only place its file:// URIs may point."""
    return [Path(os.path.realpath(root / team)) for root in roots]


def s3_team_prefixes(roots: Sequence[str], team: str) -> list[str]:
    """Each S3 root's prefix of one team (``s3://bucket/prefix/<team-slug>/``): the only place its s3:// URIs may point."""
    return [f"{root.rstrip('/')}/{team}/" for root in roots]


def under_s3_prefixes(uri: str, prefixes: Sequence[str]) -> bool:
    """A declared s3:// URI that starts with one of ``prefixes`` (each ends in ``/``, so a longer slug is
    another prefix) and is a plain key: no ``.``, ``..`` or empty segment (nor an encoded one), no query or
    fragment (s3fs reads ``?versionId=``) - only a plain key is where its prefix says."""
    parts = urlsplit(uri)
    segments = unquote(parts.path).split("/")[1:]
    if parts.scheme != "s3" or "?" in uri or "#" in uri:
        return False
    if any(s in (".", "..") for s in segments) or "" in segments[:-1]:
        return False
    return any(uri.startswith(prefix) for prefix in prefixes)


class OutsideTeamPrefix(ValueError):
    """An s3:// URI or object the team may not reach with the pool's credentials."""


def check_s3_under(uri: str, prefixes: Sequence[str]) -> str:
    """``uri`` when ``under_s3_prefixes``; else OutsideTeamPrefix saying where the team's objects lie."""
    if not under_s3_prefixes(uri, prefixes):
        where = " or ".join(prefixes) or "none (E31_S3_ROOTS is empty)"
        raise OutsideTeamPrefix(f"{uri} is not under the team's prefix of an S3 root: {where}")
    return uri


def s3_object(folder: str, key: str, prefixes: Sequence[str]) -> str:
    """The object ``key`` (a manifest path) under ``folder``: the folder checked by ``check_s3_under``, the
    key taken literally, as S3 does, so refused only for an empty, ``.`` or ``..`` segment."""
    check_s3_under(folder, prefixes)
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        raise OutsideTeamPrefix(f"{key!r} is not a plain object key (an empty, '.' or '..' part)")
    return folder.rstrip("/") + "/" + key


def _check_s3_prefix(uri: str, path: str, limits: Limits, errs: _Collector) -> None:
    """s3:// is read and written with the pool's own credentials: a team's URIs lie under its prefix of an
    operator's S3 root, as its file:// ones under its folder of a root."""
    if not limits.s3_roots:
        errs.add(path, "s3:// is not enabled on this pool (an operator lists S3 roots in E31_S3_ROOTS)")
    elif limits.team is not None:
        prefixes = s3_team_prefixes(limits.s3_roots, limits.team)
        if not under_s3_prefixes(uri, prefixes):
            errs.add(path, f"not under your team's prefix: an s3 URI lies under {' or '.join(prefixes)}")


def _check_team_prefix(
    uri: str, path: str, roots: Sequence[Path], limits: Limits, errs: _Collector, *, shared=()
) -> None:
    """A file:// or s3:// URI of another team's folder (or of no team's) is refused, even under an allowed root."""
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        _check_s3_prefix(uri, path, limits, errs)
        return
    if limits.team is None or parts.scheme != "file":
        return  # the team is not chosen yet (the form says so), or not a file
    withheld = limits.withheld if path.startswith("data") else ()  # shares are of data, not destinations
    own = [
        folder
        for folder in team_prefixes(roots, limits.team)
        if resolve_under_roots(str(folder), withheld) is None
    ]
    real = resolve_under_roots(unquote(parts.path), [*own, *shared])
    if real is not None and resolve_under_roots(str(real), shared) is None:
        if resolve_under_roots(str(real), withheld) is not None:
            errs.add(path, "in a folder an operator shared with other teams, not with yours")
            return
    if real is None:
        where = " or ".join(f"{root}/{limits.team}/" for root in roots)
        extra = " or a folder an operator shared with your team" if path.startswith("data") else ""
        errs.add(path, f"not under your team's folder: a file URI lies under {where}{extra}")


def _uri(
    value: Any, path: str, schemes: tuple, roots: Sequence[Path], roots_name: str, errs: _Collector
) -> str:
    parts = _split_uri(value, path, errs)
    if parts is None:
        return ""
    if parts.scheme not in schemes:
        errs.add(path, f"scheme must be one of {', '.join(schemes)}")
        return ""
    if parts.scheme == "file":
        problem = _file_uri_problem(parts, roots, roots_name) or file_uri_suffix_problem(value)
    else:
        problem = _host_problem(parts)
    if problem:
        errs.add(path, problem)
    return value.strip()


def _split_uri(value: Any, path: str, errs: _Collector) -> SplitResult | None:
    """The URI's parts, its port read too: urlsplit accepts ":99999" and a broken "[" host, and either
    would fail only later, when the input is staged."""
    if not isinstance(value, str) or not value.strip():
        errs.add(path, "a URI is required")
        return None
    if len(value) > 2000 or not value.isprintable():
        errs.add(path, "a URI is at most 2000 printable characters")
        return None
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - read for its check alone
    except ValueError as exc:
        errs.add(path, f"not a valid URI: {exc}")
        return None
    return parts


def _file_uri_problem(parts: SplitResult, roots: Sequence[Path], roots_name: str) -> str:
    local = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not local.startswith("/"):
        return "a file URI is file:///absolute/path"
    if "\x00" in local:  # said plainly, not as "not under an allowed root"
        return "a file URI cannot hold a NUL byte (%00)"
    if resolve_under_roots(local, roots) is None:
        return f"not under an allowed root ({roots_name}): {', '.join(map(str, roots)) or 'none set'}"
    return ""


def file_uri_suffix_problem(value: str) -> str:
    """A file URI is a path alone. Staging would read the path and drop a query without a word, and a
    destination's attempt folder, appended to the text, would land in the query: every job would deliver into
    the same folder, each replacing the files of the one before. Even a bare "?" or "#" is refused."""
    if "?" in value or "#" in value:
        return 'a file URI is a path alone, with no "?" or "#" (write them in a name as %3F and %23)'
    return ""


def _host_problem(parts: SplitResult) -> str:
    if not parts.netloc:
        return f"a {parts.scheme} URI names a host or bucket"
    if parts.username is not None:  # stored as typed, it would be shown to the whole team
        return (
            "a URI cannot hold a user name or password: the whole team would see it and staging never sends "
            "it; keep a token in a team secret (work.secrets) and fetch with it from the job"
        )
    if not _resolvable_host(parts.hostname or ""):
        return "not a host name a resolver takes: each part between dots is 1 to 63 characters, 253 in all"
    return ""


def _resolvable_host(host: str) -> bool:
    """Refused here, not when staged: the resolver raises on such a name instead of answering."""
    try:
        encoded = host.encode("idna")  # as getaddrinfo encodes it: a non-ASCII label counts as punycode
    except UnicodeError:
        return False
    labels = encoded.removesuffix(b".").split(b".")  # one final dot (an absolute name) is allowed
    return len(encoded) <= 253 and all(1 <= len(label) <= 63 for label in labels)


def resolve_under_roots(raw_path: str, roots: Sequence[Path]) -> Path | None:
    """The real path (``..`` and symlinks resolved) if it lies under one of the roots, else None."""
    if "\x00" in raw_path:  # a path no file has, that os.path.realpath refuses with a ValueError
        return None
    real = Path(os.path.realpath(raw_path))
    for root in roots:
        if real == root or real.is_relative_to(root):
            return real
    return None


def _gpus(request: Mapping, limits: Limits, errs: _Collector) -> tuple[int, int | None]:
    gpus = request.get("gpus")
    if not _is_int(gpus) or gpus < 1:
        errs.add("request.gpus", "at least 1 GPU")
        return 0, None
    if not limits.pool_gpus:
        errs.add(
            "request.gpus", "no node is up yet: the pool has no GPUs to place a job on (try again shortly)"
        )
    elif gpus > limits.pool_gpus:
        errs.add("request.gpus", f"the pool can place at most {limits.pool_gpus} GPUs for one job")
    min_gpus = request.get("min_gpus")
    if min_gpus in (None, ""):
        return gpus, None
    if not _is_int(min_gpus) or not 1 <= min_gpus <= gpus:
        errs.add("request.min_gpus", f"an elastic minimum is between 1 and the {gpus} GPUs requested")
        return gpus, None
    return gpus, (None if min_gpus == gpus else min_gpus)


def _max_gpus(value: Any, gpus: int, limits: Limits, errs: _Collector) -> int | None:
    """Elastic growth: at least the GPUs requested, at most what the pool can place for one job."""
    if value in (None, "") or not gpus:
        return None
    top = limits.pool_gpus or gpus
    if not _is_int(value) or not gpus <= value <= top:
        errs.add("request.max_gpus", f"an elastic maximum is between the {gpus} GPUs requested and {top}")
        return None
    return None if value == gpus else value


def _checkpoint(value: Any, limits: Limits, errs: _Collector) -> Checkpoint | None:
    """Optional: a table of a signal from a safe few, a grace in seconds and a size bound."""
    if value in (None, "", {}):
        return None
    if not isinstance(value, Mapping) or set(value) - set(CHECKPOINT_KEYS):
        errs.add("request.checkpoint", 'a table such as { signal = "USR1", grace_s = 120, bytes = "2 GB" }')
        return None
    signal = value.get("signal")
    name = signal.strip().upper().removeprefix("SIG") if isinstance(signal, str) else ""
    if name not in CHECKPOINT_SIGNALS:
        errs.add(
            "request.checkpoint.signal",
            f"the signal to checkpoint on: one of {', '.join(CHECKPOINT_SIGNALS)}",
        )
    grace = DEFAULT_GRACE_S if value.get("grace_s") in (None, "") else value.get("grace_s")
    if not _is_int(grace) or not MIN_GRACE_S <= grace <= MAX_GRACE_S:
        errs.add("request.checkpoint.grace_s", f"whole seconds from {MIN_GRACE_S} to {MAX_GRACE_S}")
    size = _checkpoint_bytes(value.get("bytes"), limits, errs)
    return Checkpoint(name, grace, size) if name in CHECKPOINT_SIGNALS and _is_int(grace) else None


def _checkpoint_bytes(value: Any, limits: Limits, errs: _Collector) -> int:
    if value in (None, ""):
        return DEFAULT_CHECKPOINT_BYTES
    try:
        size = parse_size(value)
    except ValueError as exc:
        errs.add("request.checkpoint.bytes", str(exc))
        return 0
    if not 1 <= size <= limits.max_checkpoint_bytes:
        errs.add(
            "request.checkpoint.bytes",
            f"from 1 byte to {format_size(limits.max_checkpoint_bytes)} (E31_MAX_CHECKPOINT_BYTES)",
        )
    return size


def _hours(value: Any, limits: Limits, errs: _Collector) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (
            isinstance(value, float) and not math.isfinite(value)
        )  # an int is finite; a float() of 10**400 is not
        or value < MIN_HOURS
    ):
        errs.add("request.hours", "a time limit in hours, at least one second (1/3600 of an hour)")
        return 0.0
    if value > limits.max_hours:  # compared before any float(), as for CPUs
        errs.add("request.hours", f"at most {limits.max_hours:g} hours on this pool")
        return 0.0
    return float(value)


def _memory(value: Any, limits: Limits, errs: _Collector) -> int | None:
    """Optional: bytes or a size such as "512 MB", written as data sizes are."""
    if value is None or value == "":
        return None
    try:
        size = parse_size(value)
    except ValueError as exc:
        errs.add("request.memory", str(exc))
        return None
    if size < MIN_MEMORY:
        errs.add("request.memory", f"at least {format_size(MIN_MEMORY)} (a size such as 512 MB or 64 GiB)")
    elif limits.pool_memory and size > limits.pool_memory:
        errs.add("request.memory", f"the pool offers at most {format_size(limits.pool_memory)} for one job")
    return size


def _cpus(value: Any, limits: Limits, errs: _Collector) -> float | None:
    """Optional: a number of CPUs, fractions allowed (0.5 is half of one CPU's time)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        errs.add("request.cpus", "a number of CPUs, such as 4 or 0.5")
        return None
    if not MIN_CPUS <= value <= MAX_CPUS:  # compared before any float(): 10**400 is an int, not a float
        errs.add("request.cpus", f"between {MIN_CPUS:g} and {MAX_CPUS} CPUs")
        return None
    if limits.pool_cpus and value > limits.pool_cpus:
        errs.add("request.cpus", f"the pool offers at most {limits.pool_cpus:g} CPUs for one job")
    return float(value)


def _check_one_node_room(
    gpus: int, memory: int | None, cpus: float | None, limits: Limits, errs: _Collector
) -> None:
    """A job that fits one node runs on one node: its memory and CPUs must fit one that has its GPUs, not
    only the pool's sum (checked above), or it would wait for ever. Spanning jobs split them by GPUs."""
    able = [node for node in limits.nodes if node[0] >= gpus]
    if not able or (memory is None and cpus is None) or errs.errors:
        return
    fits = {
        "memory": [not size or memory is None or memory <= size for _, size, _ in able],
        "cpus": [not count or cpus is None or cpus <= count for _, _, count in able],
    }
    if any(m and c for m, c in zip(fits["memory"], fits["cpus"], strict=True)):
        return
    most_memory, most_cpus = max(size for _, size, _ in able), max(count for _, _, count in able)
    offers = f"a node of {gpus} GPU{'s' if gpus != 1 else ''} or more offers at most"
    if not any(fits["memory"]):
        errs.add(
            "request.memory", f"a job that fits one node runs on one: {offers} {format_size(most_memory)}"
        )
    elif not any(fits["cpus"]):
        errs.add("request.cpus", f"a job that fits one node runs on one: {offers} {most_cpus:g} CPUs")
    else:
        errs.add("request.memory", f"no node with {gpus} GPUs or more offers both this memory and these CPUs")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31


def _flag(value: Any, path: str, errs: _Collector) -> bool:
    if value is not None and not isinstance(value, bool):  # 1 == True: `requeue = 1` was taken for false
        errs.add(path, "true or false")
    return value is True

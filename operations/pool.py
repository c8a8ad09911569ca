"""The pool page's read model: every node, its GPUs as cells coloured by the holding team.

A fixed number of queries whatever the pool's size: the nodes, the teams, the held allocations,
the active GPU holds, and the latest utilisation sample (for reserved GPUs); the whole page adds the retired
nodes, left out of everything else here. The node rows are built here as markup, every text escaped: at a
thousand nodes and eight thousand GPU cells a template loop is what made the page slow (~180 ms against ~40 ms built here, bench/operator_pages.py).
"""

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from html import escape  # the stdlib's: Django's lazy wrapper costs more than the escaping here
from urllib.parse import quote

from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from accounts.models import Team
from common import schema
from jobs import limits, nodes, sandbox, units
from jobs.models import Allocation, GpuHold, Node, NodeGpu
from operations import charts, selectors, utilisation

NODE_FIELDS = (
    "id", "name", "gpus", "gpu_model", "state", "agent_version", "sandbox", "multi_node_refusal", "last_heartbeat",
    "memory_bytes", "cpus", "limits", "held_down_by", "gpu_source", "no_room_until", "disk_free_bytes",
    "disk_bytes", "drained_by",
)  # fmt: skip
VIRTUAL = "virtual"  # a node's gpu_source when its agent serves made-up GPUs (--virtual-gpus)
LIVE_FOR_S = 60  # a GPU's latest sample older than this is not shown as its utilisation now
GPU_FIELDS = ("node_id", "index", "uuid", "present", "virtual", "changed_at", "utilisation", "memory_used_bytes",
              "power_w", "temperature_c", "sampled_at")  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: int
    name: str
    gpus: int
    gpu_model: str
    state: str
    agent_version: str
    sandbox: str
    multi_node_refusal: str
    last_heartbeat: datetime | None
    memory_bytes: int  # offered to jobs; 0 when the agent did not say
    cpus: float
    limits: str  # the cgroup controllers that bound each attempt, or "none: why"
    held_down_by: str  # the operator who marked it down; it waits for a resume
    gpu_source: str  # "nvml", "nvidia-smi", "virtual"; empty: registered before GPUs were listed
    no_room_until: (
        datetime | None
    )  # an attempt could not start here (no disk room, a GPU busy): no new work until then
    # What its disk could still give attempt spaces, last measured; None: not measured.
    disk_free_bytes: int | None
    disk_bytes: int  # what that disk holds in all; 0: not said
    drained_by: str  # the operator who drained it; down meanwhile, it comes back drained


@dataclass(frozen=True, slots=True)
class GpuInfo:
    node_id: int
    index: int
    uuid: str
    present: bool
    virtual: bool
    changed_at: datetime
    utilisation: float | None  # the latest sample's, with the others below
    memory_used_bytes: int | None
    power_w: float | None
    temperature_c: float | None
    sampled_at: datetime | None


@dataclass(frozen=True)
class PoolPage:
    rows: SafeString  # the table body: one <tr> per node shown
    shown: int
    teams: list[tuple[Team, str]]  # teams holding GPUs now, with their colour class
    states: list[tuple[str, int]]  # (state, nodes), in the states' order
    total_gpus: int
    busy_gpus: int
    reserved_gpus: int
    stale_nodes: int
    unsandboxed_nodes: int
    code_version: (
        str  # this console's (its migrations'): a node whose agent registered another runs other code
    )
    other_code_nodes: int  # live nodes whose agent runs other code


@dataclass(frozen=True)
class _Context:
    """What every row needs: held GPUs' cells, reservations, the action URL pattern, the time."""

    held: dict[tuple[int, int], str]  # (node id, GPU index) -> its cell, for held GPUs
    holders: set[int]  # team ids holding GPUs
    holding: set[int]  # node ids with an open allocation or an active GPU hold: not to be retired
    reserved: dict[tuple[str, int], str]
    gpus: dict[int, list[GpuInfo]]  # node id -> its registered GPUs by index (none: 0..gpus-1, unlisted)
    action_href: str
    now: datetime
    version: str  # this console's code version


def pool_page(*, now: datetime, state: str = "") -> PoolPage:
    in_service = Node.objects.filter(retired_at__isnull=True).order_by("name")
    nodes = [NodeInfo(*row) for row in in_service.values_list(*NODE_FIELDS)]
    teams = {t.id: t for t in Team.objects.only("id", "name", "slug")}
    # One reverse() per page, not per node or GPU: thousands of them would dominate the page.
    job_href = reverse("jobs:detail", args=[999999999]).replace("999999999", "{}")
    held, holders, holding = _held_cells(teams, job_href)
    ctx = _Context(
        held=held,
        holders=holders,
        holding=holding,
        reserved=_reserved(),
        gpus=_gpus(),
        action_href=reverse("operations:node-action", args=["NODE", "ACTION"]).replace(
            "NODE/ACTION", "{}/{}"
        ),
        now=now,
        version=schema.code().version,
    )
    shown = [n for n in nodes if not state or n.state == state]
    live = [n for n in nodes if n.state != Node.NodeState.DOWN]
    live_names = {n.name for n in live}
    held_names = {(n.name, i) for n in live for i in _indices(n, ctx) if (n.id, i) in held}
    return PoolPage(
        rows=mark_safe("".join(_row(n, ctx) for n in shown)),  # safe: _row escapes every text
        shown=len(shown),
        teams=[(teams[t], charts.team_css(t)) for t in sorted(holders) if t in teams],
        states=_count_states(nodes),
        total_gpus=sum(n.gpus for n in live),
        busy_gpus=len(held_names),
        reserved_gpus=sum(1 for key in ctx.reserved if key[0] in live_names and key not in held_names),
        stale_nodes=sum(1 for n in nodes if _stale(n, now)),
        unsandboxed_nodes=sum(1 for n in live if n.sandbox == "none"),
        code_version=ctx.version,
        other_code_nodes=sum(1 for n in live if n.agent_version != ctx.version),
    )


def retired_nodes() -> QuerySet:
    """The retired nodes, latest first: read only where the page shows them (not by its polling fragment)."""
    retired = Node.objects.filter(retired_at__isnull=False).order_by("-retired_at", "name")
    return retired.values("name", "retired_at", "retired_by", "gpus", "gpu_model")


def _count_states(nodes: list[NodeInfo]) -> list[tuple[str, int]]:
    counts = Counter(n.state for n in nodes)
    return [(s, counts[s]) for s in Node.NodeState.values if counts[s]]


def _held_cells(
    teams: dict[int, Team], job_href: str
) -> tuple[dict[tuple[int, int], str], set[int], set[int]]:
    """Each held GPU's cell (team colour, link to the job, hover text), the teams holding any, and the nodes
    holding anything (as jobs.nodes.retire_node asks: an open allocation or an active hold).

    Two plain reads rather than one join: each allocation's job, team and time are read and
    formatted once, not once per GPU (measured cheaper at thousands of GPUs).
    """
    about: dict[int, tuple[str, str]] = {}
    holders, holding = set(), set()
    allocations = Allocation.objects.filter(released_at__isnull=True).values_list(
        "id", "job_id", "job__name", "job__team_id", "rented_at", "node_id"
    )
    for allocation, job, name, team_id, rented_at, node in allocations:
        holding.add(node)
        team = teams[team_id].name if team_id in teams else f"team {team_id}"
        about[allocation] = (
            f'class="gpu {charts.team_css(team_id)}" href="{job_href.format(job)}"',
            escape(f"{team} · job #{job} {name} · since {rented_at:%Y-%m-%d %H:%M} UTC"),
        )
        holders.add(team_id)
    cells = {}
    holds = GpuHold.objects.filter(active=True).values_list("node_id", "gpu_index", "allocation_id")
    for node, index, allocation in holds:
        holding.add(node)
        # A hold whose allocation was released between the two reads is drawn free: it just was.
        if allocation in about:
            link, text = about[allocation]
            cells[(node, index)] = f'<a {link} title="GPU {index} · {text}"></a>'
    return cells, holders, holding


def _gpus() -> dict[int, list[GpuInfo]]:
    by_node: dict[int, list[GpuInfo]] = {}
    for row in NodeGpu.objects.order_by("node_id", "index").values_list(*GPU_FIELDS):
        by_node.setdefault(row[0], []).append(GpuInfo(*row))
    return by_node


def _indices(node: NodeInfo, ctx: _Context) -> list[int]:
    """The GPUs the node offers now (a missing one is drawn, not counted)."""
    listed = ctx.gpus.get(node.id)
    return [g.index for g in listed if g.present] if listed is not None else list(range(node.gpus))


def _reserved() -> dict[tuple[str, int], str]:
    """(node name, GPU index) -> "reserved for job #N from <time>", from the latest utilisation sample."""
    sample = utilisation.latest()
    if sample is None:
        return {}
    out = {}
    for job_id, r in sample.reservations.items():
        when = r["start_at"][:16].replace("T", " ")
        for node, indices in r["gpus_by_node"].items():
            for i in indices:
                out[(node, i)] = f"reserved for job #{job_id} from {when} UTC"
    return out


def _age(node: NodeInfo, now: datetime) -> float | None:
    return None if node.last_heartbeat is None else (now - node.last_heartbeat).total_seconds()


def _stale(node: NodeInfo, now: datetime) -> bool:
    """A live node whose agent has been silent past the reaper's timeout (the reaper will act)."""
    age = _age(node, now)
    return node.state != Node.NodeState.DOWN and (age is None or age > settings.E31_NODE_TIMEOUT_S)


def _row(node: NodeInfo, ctx: _Context) -> str:
    listed = ctx.gpus.get(node.id) or [None] * node.gpus
    cells = "".join(_cell(node, gpu.index if gpu else i, ctx, gpu) for i, gpu in enumerate(listed))
    busy = sum(1 for i in _indices(node, ctx) if (node.id, i) in ctx.held)
    age = _age(node, ctx.now)
    name, state = escape(node.name), escape(node.state)
    heartbeat = "never" if age is None else f"{age:.0f} s ago"
    heartbeat_td = f'<td class="bad">{heartbeat}</td>' if _stale(node, ctx.now) else f"<td>{heartbeat}</td>"
    return (
        f'<tr id="node-{node.id}-row"><td><strong>{name}</strong><br>'
        f'<small class="muted">{node.gpus} &times; {escape(node.gpu_model or "GPU")}{_offered(node)}</small>'
        f"{_gpu_line(node, ctx)}</td>"
        f'<td><span class="badge node-{state}">{state}</span>{_no_room(node, ctx.now)}{_upgrade(node)}</td>'
        f'<td><div class="gpu-grid" role="group" aria-label="{busy} of {node.gpus} GPUs busy">{cells}</div></td>'
        f"{heartbeat_td}{_version(node, ctx)}<td>{_sandbox(node)}</td>"
        f'<td class="actions">{_actions(node, ctx)}</td></tr>'
    )


def _no_room(node: NodeInfo, now: datetime) -> str:
    if not node.no_room_until or node.no_room_until <= now:
        return ""
    return (
        '<br><strong class="badge loud">NO ROOM</strong> <small>its disk could not hold an attempt\'s space, or a '
        "GPU was still in use by a process that would not stop (the agent's log says which): "
        f"no new work until {node.no_room_until:%H:%M} UTC</small>"
    )


def _upgrade(node: NodeInfo) -> str:
    """Its agent found the database's schema no longer matches its code: no new work until it is upgraded."""
    if not node.drained_by.startswith(nodes.UPGRADE_DRAIN):
        return ""
    why = node.drained_by.removeprefix(nodes.UPGRADE_DRAIN)
    return f'<br><strong class="badge loud">UPGRADE</strong> <small class="bad">{escape(why)}</small>'


def _version(node: NodeInfo, ctx: _Context) -> str:
    """The agent's code version; one other than the console's is marked (it predates or follows an upgrade, and
    the scheduler places nothing on its node)."""
    if node.agent_version == ctx.version:
        return f"<td>{escape(node.agent_version)}</td>"
    return (
        f'<td class="bad">{escape(node.agent_version or "—")}<br><strong class="badge loud">OTHER CODE</strong> '
        f"<small>the console runs {escape(ctx.version)}: no work placed here</small></td>"
    )


def _sandbox(node: NodeInfo) -> str:
    mode = (
        '<strong class="badge loud">UNSANDBOXED</strong>'
        if node.sandbox == "none"
        else escape(node.sandbox or "—")
    )
    if sandbox.SHARED_UID in node.limits:  # no uid of its own per attempt: jobs can reach each other's files
        mode += '<br><strong class="badge loud">SHARED UID</strong>'
    if node.multi_node_refusal:  # the scheduler gives it no part of a job spanning nodes
        mode += f'<br><small class="bad">one-node jobs only: {escape(node.multi_node_refusal)}</small>'
    return mode + _limits(node)


def _offered(node: NodeInfo) -> str:
    """Memory and CPUs the agent offers to jobs (what placement and each attempt's limits divide), and what
    its disk can still give attempt spaces (which steers placement)."""
    offered = (
        f" · {units.format_size(node.memory_bytes)} · {node.cpus:g} CPUs"
        if node.memory_bytes or node.cpus
        else ""
    )
    if node.disk_free_bytes is not None:
        of_all = f" of {units.format_size(node.disk_bytes)}" if node.disk_bytes else ""
        offered += f" · {units.format_size(node.disk_free_bytes)}{of_all} disk free for attempts"
    return offered


def _limits(node: NodeInfo) -> str:
    if node.limits.startswith(limits.NONE):
        return f'<br><strong class="badge loud">NO LIMITS</strong> <small>{escape(node.limits)}</small>'
    return f'<br><small class="muted">limits: {escape(node.limits)}</small>' if node.limits else ""


def _actions(node: NodeInfo, ctx: _Context) -> str:
    actions = selectors.actions_for(node.state, node.held_down_by, holding=node.id in ctx.holding)
    said = ""
    if node.state == Node.NodeState.DOWN and not node.held_down_by:
        back = f", then stays drained (drained by {escape(node.drained_by)})" if node.drained_by else ""
        said = f'<span class="muted">waits for its agent{back}</span><br>'
    elif node.held_down_by:
        said = f'<small class="muted">marked down by {escape(node.held_down_by)}</small><br>'
    if "retire" in actions:
        said += '<small class="muted">retire: decommissioned, off the pool until its agent registers again</small><br>'
    href, name = quote(node.name), escape(node.name)
    # Named with its node: a screen reader lists the page's links out of their rows ("drain", "drain", …).
    return said + " ".join(
        f'<a class="button small" href="{ctx.action_href.format(href, a)}" aria-label="{a} {name}">{a}</a>'
        for a in actions
    )


def _gpu_line(node: NodeInfo, ctx: _Context) -> str:
    """Virtual GPUs say so; real ones show each GPU's latest utilisation, and which went missing."""
    if node.gpu_source == VIRTUAL:
        return '<br><span class="badge">virtual</span> <small class="muted">no metrics (virtual)</small>'
    listed = ctx.gpus.get(node.id)
    if not listed:
        return ""
    live = " · ".join(f"{g.index}: {_live(g, ctx.now)}" for g in listed if g.present)
    missing = "".join(
        f'<br><small class="bad">GPU {g.index} missing since {g.changed_at:%Y-%m-%d %H:%M} UTC</small>'
        for g in listed
        if not g.present
    )
    return f'<br><small class="muted">utilisation {live} (from {escape(node.gpu_source)})</small>{missing}'


def _live(gpu: GpuInfo, now: datetime) -> str:
    fresh = gpu.sampled_at and (now - gpu.sampled_at).total_seconds() <= LIVE_FOR_S
    return f"{gpu.utilisation:.0f} %" if fresh and gpu.utilisation is not None else "—"


def _about(gpu: GpuInfo | None, now: datetime) -> str:
    """The cell's hover text: its UUID and latest sample, for a real GPU."""
    if gpu is None or gpu.virtual:
        return ""
    text = f" · {gpu.uuid}" if gpu.uuid else ""
    if _live(gpu, now) != "—":
        text += f" · {gpu.utilisation:.0f} % busy"
        text += (
            f" · {units.format_size(gpu.memory_used_bytes)} used" if gpu.memory_used_bytes is not None else ""
        )
        text += f" · {gpu.power_w:.0f} W" if gpu.power_w is not None else ""
        text += f" · {gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else ""
    return escape(text)


def gpu_state(*, present: bool, held: bool, node_state: str, reserved: bool) -> str:
    """One GPU's state: missing (its agent no longer finds it), else held, else offline (its node is down),
    else reserved for a waiting job, else idle. The page's cells and /metrics' e31_node_gpus both read it."""
    if not present:
        return "missing"
    if held:
        return "held"  # before the node's state: a job holds it until its allocation is released
    if node_state == Node.NodeState.DOWN:
        return "offline"
    return "reserved" if reserved else "idle"


def _cell(node: NodeInfo, index: int, ctx: _Context, gpu: GpuInfo | None = None) -> str:
    about = _about(gpu, ctx.now)
    state = gpu_state(
        present=gpu is None or gpu.present, held=(node.id, index) in ctx.held, node_state=node.state,
        reserved=(node.name, index) in ctx.reserved,
    )  # fmt: skip
    if state == "missing":
        return f'<span class="gpu off" title="GPU {index} · missing{about}"></span>'
    if state == "held":
        return ctx.held[(node.id, index)].replace(f'title="GPU {index} ', f'title="GPU {index}{about} ', 1)
    if state == "offline":
        return f'<span class="gpu off" title="GPU {index} · node down"></span>'
    if state == "reserved":
        reserved = ctx.reserved[(node.name, index)]
        return f'<span class="gpu reserved" title="GPU {index}{about} · {escape(reserved)}"></span>'
    return f'<span class="gpu free" title="GPU {index}{about} · free"></span>'

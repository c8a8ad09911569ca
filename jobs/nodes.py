"""Node registration, heartbeats, the reaper that declares silent nodes down, and the operators' node actions."""

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Now

from jobs import dispatch, network, rental
from jobs.models import Allocation, GpuHold, Node, NodeGpu

log = logging.getLogger(__name__)
GPU_FIELDS = ("uuid", "model", "memory_bytes", "driver_version", "cuda_version", "virtual")
LIVE_STATES = (Node.NodeState.UP, Node.NodeState.DRAINING, Node.NodeState.DRAINED)
LIMITS_CHARS = Node._meta.get_field("limits").max_length
# drained_by of a node whose agent found the database's schema changed under it (no username holds ": ").
UPGRADE_DRAIN = "its agent: "
DRAINED_BY_CHARS = Node._meta.get_field("drained_by").max_length


class NodeNameTaken(Exception):
    """Another machine's agent serves a node of this name and still beats."""


@transaction.atomic
def register_node(
    *, name: str, gpus: int, gpu_model: str, address: str, agent_version: str, sandbox: str, now: datetime,
    memory_bytes: int = 0, cpus: float = 0, limits: str = "", multi_node_refusal: str = "", disk_bytes: int = 0,
    gpu_list: Sequence[Mapping] = (), gpu_source: str = "", host_id: str = "",
) -> Node:  # fmt: skip
    """An agent (re)starting: the node is up (or as an operator left it: drained, or held down), and any
    attempt it held before is lost with the old process.

    ``gpu_list``: each GPU the agent found (index, uuid, model, memory_bytes, driver_version,
    cuda_version, virtual); a GPU registered before and absent now is kept as not present. ``host_id``: the
    machine the agent runs on; NodeNameTaken while another machine's agent serves the name and beats.
    """
    if gpu_list and len(gpu_list) != gpus:
        raise ValueError(f"{name} registers {gpus} GPUs but lists {len(gpu_list)}")
    offered = {"memory_bytes": memory_bytes, "cpus": cpus, "limits": limits[:LIMITS_CHARS],
               "multi_node_refusal": multi_node_refusal[:300], "gpu_source": gpu_source, "disk_bytes": disk_bytes}  # fmt: skip
    # last_heartbeat is the database's time, as in heartbeat(): the node's clock is not trusted
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={
            "gpus": gpus, "gpu_model": gpu_model, "address": address, "agent_version": agent_version,
            "sandbox": sandbox, "registered_at": now, "state_changed_at": now, "last_heartbeat": Now(),
            "host_id": host_id, **offered,
        },
    )  # fmt: skip
    if created:
        node.refresh_from_db(fields=["last_heartbeat"])  # it holds the Now() expression until read back
    else:
        _check_name_free(node, host_id, now)
        _note_return(node)
        rental.lose_node_allocations(node=node, now=now, detail=f"the agent on {name} restarted")
        state = _state_after_restart(node)
        Node.objects.filter(id=node.id).update(
            gpus=gpus, gpu_model=gpu_model, address=address, agent_version=agent_version, sandbox=sandbox,
            host_id=host_id, last_heartbeat=Now(), registered_at=now, state=state, no_room_until=None, **offered,  # its disk is looked at anew
            retired_at=None, retired_by="",  # a retired machine put back into service (it takes a /24 below)
            disk_free_bytes=None, disk_free_at=None,  # measured at its first beat, if this agent bounds spaces
            state_changed_at=now if state != node.state else node.state_changed_at,
        )  # fmt: skip
        node.refresh_from_db()
    if gpu_list:
        _record_gpus(node=node, gpu_list=gpu_list, now=now)
    if node.network_slot is None:
        node.network_slot = _claim_network_slot(node.id)
    if not node.multi_node_refusal and (
        refused := network.slice_refusal(settings.E31_JOB_SUBNET, node.network_slot)
    ):
        Node.objects.filter(id=node.id).update(multi_node_refusal=refused[:300])  # the scheduler skips it
        node.multi_node_refusal = refused[:300]
    dispatch.request_scheduler_pass()
    return node


def _check_name_free(node: Node, host_id: str, now: datetime) -> None:
    """NodeNameTaken when another machine's agent beat for ``node`` within E31_NODE_TIMEOUT_S: a second machine
    given the same name (a copied configuration) would otherwise take the node over, losing the first machine's
    running jobs, and both would serve its queue. The same machine restarting its agent is a restart."""
    if not (node.host_id and host_id and node.host_id != host_id and node.last_heartbeat):
        return
    silent_s = (now - node.last_heartbeat).total_seconds()
    if silent_s < settings.E31_NODE_TIMEOUT_S:
        raise NodeNameTaken(
            f"node {node.name} is served by another machine ({node.address or node.host_id}), whose agent beat "
            f"{max(silent_s, 0):.0f} s ago: stop that agent or give this one another --name; the name is free "
            f"once that agent has been silent {settings.E31_NODE_TIMEOUT_S:.0f} s"
        )


def _note_return(node: Node) -> None:
    """A retired node's agent registering: the machine is back in service, as its operator may not expect."""
    if node.retired_at is not None:
        log.warning(
            "node %s, retired by %s on %s UTC, registered again: back in service",
            node.name, node.retired_by or "an operator", f"{node.retired_at:%Y-%m-%d %H:%M}",
        )  # fmt: skip


def _state_after_restart(node: Node) -> str:
    """A node down for silence comes back up, or drained if an operator drained it (its attempts were just
    lost, so nothing is left to drain); an operator's mark-down outlives the agent's restarts."""
    if node.state != Node.NodeState.DOWN or node.held_down_by:
        return node.state
    return Node.NodeState.DRAINED if node.drained_by else Node.NodeState.UP


def _claim_network_slot(node_id: int, tries: int = 5) -> int | None:
    """The lowest /24 of E31_JOB_SUBNET no node holds, now this node's (None when every one is held).

    Two agents registering at once may pick the same slot: the unique constraint refuses the second,
    which picks again.
    """
    for _ in range(tries):
        taken = set(Node.objects.exclude(network_slot=None).values_list("network_slot", flat=True))
        slot = next((s for s in range(network.slice_count(settings.E31_JOB_SUBNET)) if s not in taken), None)
        if slot is None:
            return None
        try:
            with transaction.atomic():
                Node.objects.filter(id=node_id).update(network_slot=slot)
            return slot
        except IntegrityError:
            continue
    return None


@transaction.atomic
def update_node_gpus(*, name: str, gpu_list: Sequence[Mapping], now: datetime) -> list[int]:
    """A running agent found a different GPU set: record it; jobs holding a GPU now gone are lost.

    Returns the indices that went missing. The node row is locked as RENT locks it, so no
    placement lands on a GPU between its disappearance and this record.
    """
    node = Node.objects.select_for_update().filter(name=name).first()
    if node is None:
        return []
    missing = _record_gpus(node=node, gpu_list=gpu_list, now=now)
    Node.objects.filter(id=node.id).update(gpus=len(gpu_list))
    if missing:
        gone = ", ".join(map(str, missing))
        log.warning("node %s: GPU %s no longer found; jobs holding it are lost", name, gone)
        rental.lose_node_allocations(
            node=node, now=now, detail=f"GPU {gone} of {name} is gone", gpu_indices=missing
        )
    dispatch.request_scheduler_pass()
    return missing


def _record_gpus(*, node: Node, gpu_list: Sequence[Mapping], now: datetime) -> list[int]:
    """Upserts the found GPUs as present and marks the others not present; the newly missing indices."""
    found = {int(gpu["index"]): gpu for gpu in gpu_list}
    known = {row.index: row for row in NodeGpu.objects.filter(node=node)}
    for index, gpu in found.items():
        fields = {key: gpu[key] for key in GPU_FIELDS if key in gpu}
        row = known.get(index)
        if row is None:
            NodeGpu.objects.create(node=node, index=index, changed_at=now, **fields)
        elif not row.present or any(getattr(row, k) != v for k, v in fields.items()):
            NodeGpu.objects.filter(id=row.id).update(present=True, changed_at=now, **fields)
    missing = sorted(i for i, row in known.items() if row.present and i not in found)
    NodeGpu.objects.filter(node=node, index__in=missing).update(present=False, changed_at=now)
    return missing


def hold_for_room(*, node_id: int, now: datetime) -> None:
    """An attempt could not start here (its disk could not hold its space, or a GPU was still in use by a process
    that would not stop): no new work for E31_NO_ROOM_HOLD_S (its jobs end and free some; the process dies)."""
    until = now + timedelta(seconds=settings.E31_NO_ROOM_HOLD_S)
    Node.objects.filter(id=node_id).filter(Q(no_room_until__isnull=True) | Q(no_room_until__lt=until)).update(
        no_room_until=until
    )


def heartbeat(*, name: str, now: datetime, disk_free: int | None = None, host_id: str = "") -> bool:
    """Records a sign of life, and what the node's disk can still give attempt spaces (None: not measured, and
    then not counted, rather than an old figure kept); False if the node was declared down meanwhile (the agent
    must re-register).

    A node an operator marked down keeps beating without registering again: it stays down until resumed.
    The beat is stamped with the database's clock, not the agent's ``now``: a node's clock may lag (declared
    down while it beats) or run ahead (never seen silent), and the reaper compares on the platform's clock.
    Only the beats of the machine that registered the node count: once another machine took the name over,
    this one's are False, and its registering again is refused (NodeNameTaken).
    """
    beating = Q(state__in=LIVE_STATES) | Q(state=Node.NodeState.DOWN, held_down_by__gt="")
    ours = Q(host_id=host_id) | Q(host_id="")
    measured = {"disk_free_bytes": disk_free, "disk_free_at": None if disk_free is None else now}
    return bool(Node.objects.filter(beating, ours, name=name).update(last_heartbeat=Now(), **measured))


def reap_silent_nodes(*, now: datetime) -> list[str]:
    """Declares down every node silent past the timeout: its allocations are released, at this instant or, for
    a node silent longer (the reaper itself was not running), when it would have been declared down.

    ``now`` is the control worker's clock, which platform machines keep in time with the database's. A retired
    node is down (the database holds it so), so never silent here.
    """
    cutoff = rental.silent_since(now)
    silent = Node.objects.filter(state__in=LIVE_STATES, last_heartbeat__lt=cutoff).values_list(
        "id", flat=True
    )
    return [name for node_id in silent if (name := _declare_down(node_id=node_id, cutoff=cutoff, now=now))]


@transaction.atomic
def _declare_down(*, node_id: int, cutoff: datetime, now: datetime) -> str:
    moved = Node.objects.filter(id=node_id, state__in=LIVE_STATES, last_heartbeat__lt=cutoff).update(
        state=Node.NodeState.DOWN, state_changed_at=now
    )
    if not moved:
        return ""
    node = Node.objects.get(id=node_id)
    silent_s = (now - node.last_heartbeat).total_seconds()
    lost = rental.lose_node_allocations(node=node, now=now, detail=f"{node.name} silent for {silent_s:.0f} s")
    log.warning(
        "node %s declared down after %.0f s of silence; %d job(s) affected", node.name, silent_s, lost
    )
    return node.name


@transaction.atomic
def set_node_state(*, name: str, target: str, now: datetime, actor: str) -> bool:
    """Operator actions: drain (no new work), resume, mark down (a node loss, now)."""
    allowed_from = Q(state__in={
        Node.NodeState.DRAINING: (Node.NodeState.UP,),
        Node.NodeState.UP: (Node.NodeState.DRAINING, Node.NodeState.DRAINED),
        Node.NodeState.DOWN: LIVE_STATES,
    }[target])  # fmt: skip
    if target == Node.NodeState.UP:  # resume: also a node an operator marked down (not one gone silent)
        held_down = Q(state=Node.NodeState.DOWN, held_down_by__gt="")
        if _release_hold_of_silent_node(held_down & Q(name=name), now=now):
            return True
        allowed_from |= held_down
    if (
        target == Node.NodeState.DOWN
    ):  # a node down for silence is held down: its parts went when it went down
        silent_down = Q(name=name, state=Node.NodeState.DOWN, held_down_by="")
        if Node.objects.filter(silent_down).update(held_down_by=actor[:150]):
            return True
    moved = Node.objects.filter(allowed_from, name=name).update(
        state=target, state_changed_at=now, **_operator_marks(target=target, actor=actor[:150])
    )
    if moved and target == Node.NodeState.DOWN:
        rental.lose_node_allocations(
            node=Node.objects.get(name=name), now=now, detail=f"marked down by {actor}"
        )
    if moved:
        dispatch.request_scheduler_pass()
    return bool(moved)


def retire_node(*, name: str, now: datetime, actor: str) -> bool:
    """DOWN and holding nothing -> retired: out of the pool's lists and counts for good, its /24 free for another
    node. False when it is not down (its agent came back meanwhile), retired already, or still holds GPUs."""
    open_parts = Allocation.objects.filter(node=OuterRef("pk"), released_at__isnull=True)
    holds = GpuHold.objects.filter(node=OuterRef("pk"), active=True)
    retired = (
        Node.objects.filter(name=name, state=Node.NodeState.DOWN, retired_at__isnull=True)
        .exclude(Exists(open_parts))
        .exclude(Exists(holds))
        .update(retired_at=now, retired_by=actor[:150], network_slot=None)
    )
    return bool(retired)


def _release_hold_of_silent_node(held_down: Q, *, now: datetime) -> bool:
    """Resuming a node held down whose agent is silent (switched off for repair) lifts the hold but leaves it
    down: up at once, the next pass would rent jobs on a dead machine, meter on, for the reaper to lose them.
    Its agent's next registration brings it back (``_state_after_restart``)."""
    silent = Q(last_heartbeat__lt=rental.silent_since(now))
    return bool(Node.objects.filter(held_down, silent).update(held_down_by="", drained_by=""))


def _operator_marks(*, target: str, actor: str) -> dict[str, str]:
    """Who holds the node out of service, kept across silences: a mark-down holds it down (and keeps an
    earlier drain), a drain brings it back drained, a resume clears both."""
    if target == Node.NodeState.DOWN:
        return {"held_down_by": actor}
    return {"held_down_by": "", "drained_by": actor if target == Node.NodeState.DRAINING else ""}


def drain_for_upgrade(*, name: str, reason: str, now: datetime) -> bool:
    """UP -> DRAINING: the agent's code and the database's schema disagree, so it takes no new work, and its
    running jobs finish. An operator's drain or mark-down is left as it is; False when the node was not up."""
    moved = Node.objects.filter(name=name, state=Node.NodeState.UP).update(
        state=Node.NodeState.DRAINING,
        state_changed_at=now,
        drained_by=(UPGRADE_DRAIN + reason)[:DRAINED_BY_CHARS],
    )
    return bool(moved)


def resume_upgraded_node(*, name: str, now: datetime) -> bool:
    """DRAINING/DRAINED -> UP for a node drained by its own agent for an upgrade, once an agent whose code
    matches the schema registered it; a node an operator drained stays drained."""
    moved = Node.objects.filter(
        name=name,
        state__in=(Node.NodeState.DRAINING, Node.NodeState.DRAINED),
        drained_by__startswith=UPGRADE_DRAIN,
    ).update(state=Node.NodeState.UP, state_changed_at=now, drained_by="")
    if moved:
        dispatch.request_scheduler_pass()
    return bool(moved)


def settle_drains(*, now: datetime) -> None:
    """A draining node with nothing left running, and no output left on its disk to deliver, is drained: an
    operator reads drained as safe to power off, and delivery reads a released part's outputs from its node."""
    running = Q(released_at__isnull=True)
    delivering = Q(
        started_at__isnull=False, delivered_at__isnull=True, attempt=F("job__attempt"),
        job__delivery_state="delivering",
    )  # fmt: skip
    busy = Allocation.objects.filter(running | delivering).values("node_id")
    Node.objects.filter(state=Node.NodeState.DRAINING).exclude(id__in=busy).update(
        state=Node.NodeState.DRAINED, state_changed_at=now
    )

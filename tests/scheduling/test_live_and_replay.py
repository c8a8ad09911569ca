"""One policy, live and replayed: a snapshot planned the live scheduler's way and the replay's way
(a NodeList with kept totals and a kept free-GPU state, running jobs and queue in kept lists
with the facts the replay vouches for, decisions only, a release memo carried over from an earlier pass) gives the same starts,
preemptions and reservations."""

import dataclasses
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling import placement, simulate
from jobs.scheduling.types import (
    NodeList,
    NodeView,
    PendingJob,
    PendingList,
    PolicyConfig,
    RunningList,
    RunningView,
)

NOW = 1_000_000.0


@st.composite
def snapshots(draw):
    gpus = draw(st.sampled_from([1, 4, 8]))
    names = [f"n{i}" for i in range(draw(st.integers(1, 5)))]
    free = {n: list(range(gpus)) for n in names}
    running = []
    for jid in range(draw(st.integers(0, 6))):
        node = draw(st.sampled_from(names))
        k = draw(st.integers(0, len(free[node])))
        if k:
            taken, free[node] = free[node][:k], free[node][k:]
            end = NOW + draw(st.integers(60, 20_000))
            backlog = draw(
                st.sampled_from([(False, False), (True, False), (True, True)])
            )  # preemptible, checkpoints
            running.append(
                RunningView(
                    100 + jid,
                    draw(st.sampled_from("ab")),
                    {node: tuple(taken)},
                    NOW - 600,
                    end,
                    preemptible=backlog[0],
                    checkpoints=backlog[1],
                )
            )
    pending = [
        PendingJob(
            jid,
            draw(st.sampled_from("abc")),
            draw(st.integers(1, gpus * len(names))),
            draw(st.sampled_from([0.25, 1.0, 4.0, 24.0])),
            NOW - draw(st.integers(0, 4 * 86400)),
        )
        for jid in range(draw(st.integers(1, 10)))
    ]
    nodes = [NodeView(n, gpus, tuple(free[n])) for n in names]
    return nodes, sorted(running, key=lambda r: r.expected_end), pending


def _decisions(plan):
    return (
        [(s.job_id, s.gpus_by_node) for s in plan.starts],
        plan.preemptions,
        [(r.job_id, r.start_at) for r in plan.reservations],
    )


def _kept_state(nodes, first, then):
    """The replay's way: a state built when every GPU was idle, then told of the nodes going busy
    (in the order ``first``) and of their free GPUs now (in the order ``then``)."""
    idle = [dataclasses.replace(n, free=tuple(range(n.gpus))) for n in nodes]
    state = placement.PoolState(idle, kept=True)
    for i in first:
        state.set_free(nodes[i].name, [])
    for i in then:
        state.set_free(nodes[i].name, list(nodes[i].free))
    return state


@settings(max_examples=80, deadline=None)
@given(snapshots(), st.data())
def test_every_policy_decides_the_same_live_and_in_replay(snapshot, data):
    nodes, running, pending = snapshot
    if data.draw(st.booleans()):  # a queue in submit order: the replay says so and FCFS orders skip the sort
        pending = sorted(pending, key=lambda j: (j.submitted_at, j.job_id))
    queue = PendingList(pending)
    queue.by_submit = pending == sorted(pending, key=lambda j: (j.submitted_at, j.job_id))
    # What the replay vouches for (none staging or gated, none wider than this), true of every snapshot.
    queue.ready = queue.ungated = True
    queue.largest = max((j.gpus for j in pending), default=0)
    queue.teams = Counter(j.team for j in pending)
    kept_running = RunningList(running)  # the snapshot's running jobs are in expected-end order
    kept_running.preemptible = sum(r.preemptible for r in running)
    kept_running.teams = Counter(r.team for r in running)
    usage, shares = {"a": 3600.0 * 50, "b": 3600.0}, {"a": 1.0, "b": 2.0}
    listed = NodeList(nodes)
    listed.total_gpus = sum(n.gpus for n in nodes)
    listed.free_gpus = sum(len(n.free) for n in nodes)
    listed.with_free = {i: None for i, n in enumerate(nodes) if n.free}
    positions = range(len(nodes))
    listed.state = _kept_state(
        nodes, data.draw(st.permutations(positions)), data.draw(st.permutations(positions))
    )
    live_config = PolicyConfig()
    replay_config = dataclasses.replace(live_config, explain=False)
    for name, policy in simulate.POLICIES.items():
        live = policy(
            now=NOW,
            nodes=nodes,
            running=running,
            pending=pending,
            usage=usage,
            shares=shares,
            config=live_config,
        )
        memo: dict = {}
        policy(
            now=NOW - 60,
            nodes=listed,
            running=running,
            pending=pending[:1],
            usage=usage,
            shares=shares,
            config=replay_config,
            memo=memo,
        )  # an earlier pass fills the memo
        replayed = policy(
            now=NOW,
            nodes=listed,
            running=kept_running,
            pending=queue,
            usage=usage,
            shares=shares,
            config=replay_config,
            memo=memo,
        )
        assert _decisions(live) == _decisions(replayed), name

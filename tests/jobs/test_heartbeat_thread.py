"""The agent's heartbeat runs alone on its thread: slow clean-up never makes a live node look lost."""

import itertools
import os
import signal
import threading
import time

from jobs import agent, nodes
from jobs.management.commands import node_agent


def test_a_slow_sweep_of_old_attempts_never_delays_a_heartbeat(settings, monkeypatch):
    """The sweep used to run on the heartbeat thread: removing one large attempt (an rm of millions of files) held
    the beats past E31_NODE_TIMEOUT_S, and the node was declared lost with every job running on it."""
    settings.E31_HEARTBEAT_S = 0.05
    settings.E31_ATTEMPT_RETENTION_S = 0
    beats, sweeps = [], []
    monkeypatch.setattr(nodes, "heartbeat", lambda **_: beats.append(time.monotonic()) or True)
    monkeypatch.setattr(agent, "remove_expired_attempts", lambda **_: sweeps.append(time.sleep(1.0)))
    monkeypatch.setattr(agent, "remove_ended_checkpoints", lambda **_: [])
    stop = threading.Event()
    threads = [
        threading.Thread(target=node_agent._heartbeat, args=({"name": "n1", "host_id": "machine-a"}, stop)),
        threading.Thread(target=node_agent._sweep, args=("n1", stop)),
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
    assert sweeps and len(beats) >= 10 and max(gaps) < 0.5, (len(sweeps), len(beats), max(gaps, default=None))


def test_an_agent_whose_node_another_machine_took_over_stops(settings, monkeypatch):
    """Cut off long enough to be declared down, and the name registered by another machine meanwhile: the agent's
    beats no longer count, its registering again is refused, and it stops rather than serve the node's queue."""
    settings.E31_HEARTBEAT_S = 0.01
    signalled = []

    def taken(**_):
        raise nodes.NodeNameTaken("node n1 is served by another machine")

    monkeypatch.setattr(nodes, "heartbeat", lambda **_: False)
    monkeypatch.setattr(nodes, "register_node", taken)
    monkeypatch.setattr(node_agent.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    beating = threading.Thread(target=node_agent._heartbeat, args=({"name": "n1", "host_id": "machine-a"},))
    beating.start()
    beating.join(timeout=5)

    assert not beating.is_alive() and signalled == [(os.getpid(), signal.SIGTERM)]

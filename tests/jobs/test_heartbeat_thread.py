"""The agent's heartbeat runs alone on its thread: slow clean-up never makes a live node look lost."""

import itertools
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
        threading.Thread(target=node_agent._heartbeat, args=({"name": "n1"}, stop)),
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

"""Which nodes have the GPU model a job names: the model's name as whole words of the node's, case aside."""

from datetime import UTC, datetime

import pytest

from jobs.scheduling.policy import plan
from jobs.scheduling.types import NodeView, PendingJob, serves

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("node_model", "asked", "has_it"),
    [
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("NVIDIA H100 80GB HBM3", "h100 80gb", True),
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("NVIDIA A100-SXM4-80GB", "A10", False),  # a substring, not the model
        ("NVIDIA L40S", "L4", False),
        ("NVIDIA L40S", "L40S", True),
        ("NVIDIA GeForce RTX 4090", "4090", True),
    ],
)
def test_a_model_is_named_by_whole_words_of_the_nodes_model(node_model, asked, has_it):
    assert serves(node_model, asked) is has_it


def test_a_job_asking_for_an_a10_is_not_placed_on_an_a100():
    """ "A10" is in "NVIDIA A100-SXM4-80GB": matched as text, an A10 job started on the A100 node."""
    node = NodeView("a-01", 8, tuple(range(8)), gpu_model="NVIDIA A100-SXM4-80GB")
    result = plan(
        now=NOW, nodes=[node], running=[], pending=[PendingJob(1, "vision", 1, 1.0, NOW, gpu_model="A10")],
        usage={}, shares={},
    )  # fmt: skip
    assert result.starts == []
    estimate = result.estimates[1]
    assert estimate.start_at is None and "A10" in estimate.reason

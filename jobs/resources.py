"""How much memory and CPU one part of an attempt gets: pure arithmetic the agent, the scheduler's
snapshot and the pages share, so what is placed is what is enforced.

A job's ``request.memory`` and ``request.cpus`` are for the whole job, split across its nodes in
proportion to the GPUs it holds on each. Undeclared, a part gets its node's share for those GPUs
(half of a node's memory for half of its GPUs).
"""


def part_share(
    *, declared: float | None, job_gpus: int, node_total: float, node_gpus: int, gpus_here: int
) -> float:
    """The amount one part may use: declared (split by GPUs) or the node's share; 0 when neither is known."""
    if declared is not None:
        return declared * gpus_here / max(job_gpus, 1)
    return node_total * gpus_here / max(node_gpus, 1)

"""How a run's ranks start, one rule for every reader: the launch commands, the estimate, the
memory check and the driver's warm-start servers.

On nodes that share one host's cores a run of one rank per node (DDP, or an allreduce probe)
starts its ranks directly, without torchrun's agent (Horovod's start with horovodrun, the
parameter servers' with torchrun on every node, servers included); those ranks are forked from a warm-start
server per node (scalelab.run.warmstart) unless the ranks run in containers, under Slurm, or
warm start is off.
"""

from __future__ import annotations


def starts_directly(engine: str, procs_per_node: int, shared_host: bool) -> bool:
    """Whether commands.rank_commands starts a run's ranks without a launcher (direct_commands)."""
    return shared_host and procs_per_node == 1 and engine not in ("horovod", "ps")


def run_starts_directly(run, shared_host: bool) -> bool:
    """starts_directly for a planned run (an allreduce probe is a DDP program)."""
    engine = "ddp" if run.kind == "allreduce" else run.params["engine"]
    return starts_directly(engine, run.params["procs_per_node"], shared_host)


def forks_warm(shared_host: bool, launcher: str = "ssh", runtime: str = "host",
               warm_start: bool = True) -> bool:
    """Whether the ranks that start directly are forked from a warm-start server per node.

    The one rule the memory check, the estimate and the driver all read: nodes that share the
    host's cores, ranks on the host (a container starts its own interpreter), not under Slurm,
    and warm start not turned off.

    >>> forks_warm(True), forks_warm(False), forks_warm(True, runtime="container")
    (True, False, False)
    >>> forks_warm(True, launcher="slurm"), forks_warm(True, warm_start=False)
    (False, False)
    """
    return shared_host and warm_start and runtime == "host" and launcher != "slurm"


def warm_servers(spec) -> bool:
    """Whether a sweep of this spec starts warm-start servers where its nodes share a host:
    forks_warm holds and some run of it starts directly (one rank per node, DDP or an
    allreduce probe)."""
    engines = {spec.engine} | ({"ddp"} if spec.allreduce_probe else set())
    return forks_warm(True, spec.launcher, spec.runtime, spec.warm_start) and any(
        starts_directly(e, ppn, True) for e in engines for ppn in spec.procs_per_node)

"""Ranks in containers (`invoke bench --runtime container`): the `docker run` line a rank
command becomes, and how a launch's containers are found again.

Every container runs the training image (scalelab.cluster.image) on the host's network, so tc's
shaping applies to it as to host ranks; the host's IPC namespace, so gloo and NCCL use the
node's shared memory; the paths a run reads (an emulated device's profile, a data set) bound
in read-only at the same place; GPUs passed through where the run trains on them, and the
RDMA devices where its fabric is InfiniBand.

A container carries its launch's token twice: as the label org.scalelab.launch, by which a
reaper removes it (scalelab.run.reap.reap_line), and as SCALELAB_LAUNCH in its environment, like
every host rank. Its name is sl-<token>-<node>-<index>, unique per launch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LABEL = "org.scalelab.launch"
# the flags whose value is a path on the node that a rank reads
PATH_FLAGS = ("--profile", "--data")


@dataclass(frozen=True)
class Spec:
    """How a run's ranks are put into containers."""

    image: str  # tag, as loaded on every node
    image_id: str  # sha256:<hex>, what the run records
    gpus: bool = False
    rdma: bool = False
    workdir: str = "/opt/scalelab"  # the image's own (scalelab.cluster.image.PREFIX)


def binds(args: list[str]) -> list[str]:
    """The absolute paths a rank's arguments name after PATH_FLAGS, each once.

    >>> binds(["--model", "resnet50", "--profile", "/opt/p/v100.json", "--data", "synthetic"])
    ['/opt/p/v100.json']
    """
    out: list[str] = []
    for flag, value in zip(args, args[1:], strict=False):
        if flag in PATH_FLAGS and value.startswith("/") and value not in out:
            out.append(value)
    return out


def name(mark: str, index: int) -> str:
    """The container's name from the launch's token mark on its node.

    >>> name("ab12@lab-n1", 0)
    'sl-ab12-lab-n1-0'
    """
    return f"sl-{mark.replace('@', '-')}-{index}"


def docker_argv(spec: Spec, argv: list[str], env_names: list[str], mark: str,
                index: int, workdir: str) -> list[str]:
    """`docker run` for one rank command; its environment is passed by name (-e NAME), the
    values coming from the docker client's own environment, which the launch line sets.

    >>> s = Spec("scalelab/train:k", "sha256:" + "0" * 64)
    >>> a = docker_argv(s, ["/opt/scalelab/venv/bin/python", "x.py", "--profile", "/p.json"],
    ...                 ["RANK"], "ab12@n1", 0, "/opt/scalelab")
    >>> " ".join(a)  # doctest: +NORMALIZE_WHITESPACE
    'docker run --rm --init --name sl-ab12-n1-0 --label org.scalelab.launch=ab12@n1
     --network host --ipc host -w /opt/scalelab -e SCALELAB_LAUNCH -e RANK
     -v /p.json:/p.json:ro scalelab/train:k /opt/scalelab/venv/bin/python x.py --profile /p.json'
    """
    if not re.fullmatch(r"[0-9a-f]{1,64}(@[A-Za-z0-9][A-Za-z0-9._-]{0,62})?", mark):
        raise ValueError(f"launch mark {mark!r} is not one scalelab makes")
    out = ["docker", "run", "--rm", "--init", "--name", name(mark, index), "--label",
           f"{LABEL}={mark}", "--network", "host", "--ipc", "host", "-w", workdir,
           "-e", "SCALELAB_LAUNCH"]
    for k in env_names:
        if k != "SCALELAB_LAUNCH":
            out += ["-e", k]
    if spec.gpus:
        out += ["--gpus", "all"]
    if spec.rdma:
        out += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK",
                "--ulimit", "memlock=-1:-1"]
    for path in binds(argv):
        out += ["-v", f"{path}:{path}:ro"]
    return [*out, spec.image, *argv]


def reap_clause(mark: str) -> str:
    """Shell that removes (kills first) every container of a launch on a node; nothing where
    the node has no engine.

    >>> "label=org.scalelab.launch=ab12@n1" in reap_clause("ab12@n1")
    True
    """
    return ("if command -v docker >/dev/null 2>&1 && [ -S /var/run/docker.sock ]; then "
            f"ids=$(docker ps -aq --filter label={LABEL}={mark} 2>/dev/null); "
            "[ -z \"$ids\" ] || docker rm -f $ids >/dev/null 2>&1; fi; ")

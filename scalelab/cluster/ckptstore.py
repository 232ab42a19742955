"""An NFS server a node runs for a sweep's checkpoints (--checkpoint-to nfs@NODE).

The ranks of an emulated node mount no NFS (the host's kernel has no NFS client there), so
a node of the cluster serves the checkpoints instead: NFS-Ganesha exporting a directory of
its own over NFSv3 and v4, read-write to the cluster's nodes only, with a portmapper
(rpcbind) beside it, since NFSv3 finds the server's ports through one. The ranks write to it
with libnfs (bench/workloads/nfsfs.py), so a checkpoint crosses the writer's link and the
server's, shaped as the cluster's are.

Only on nodes scalelab made and destroys (Capabilities.ephemeral), and only where no
portmapper or NFS server listens already: a host scalelab did not create keeps its own NFS
services untouched (mount a share there and give its path). The cluster record keeps the
server before it starts, so that the sweep's end, or the next sweep after a killed one,
ends both processes by their pid (checked to be ours: that program, in the node's own
network namespace), unmounts the export's tmpfs and removes its files; invoke destroy ends
them with the nodes.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from typing import Any

from scalelab.cluster import ssh, targets
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.errors import ClusterError, InputError
from scalelab.core.state import save_cluster

log = logging.getLogger(__name__)

KIND = "ckpt-nfs"  # its entry in the cluster record's servers
NFS_PORT, MNT_PORT, PORTMAP_PORT = 2049, 20048, 111
TMPFS_SIZE = "8g"  # an upper bound: a tmpfs holds only what is written to it
_AS_ROOT = 'S=; [ "$(id -u)" = 0 ] || S="sudo -n"; '

_CONF = """\
# scalelab: checkpoints of a sweep, NFSv3 and v4 over TCP on {address} only
NFS_CORE_PARAM {{ Bind_Addr = {address}; NFS_Port = {nfs}; MNT_Port = {mnt};
  Protocols = 3, 4; Enable_UDP = false; Enable_NLM = false; Enable_RQUOTA = false; }}
NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {recovery}; }}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{ Export_Id = 1; Path = {path}; Pseudo = {path}; Protocols = 3, 4; Transports = TCP;
  SecType = sys; Squash = No_Root_Squash; Access_Type = None; FSAL {{ Name = VFS; }}
  CLIENT {{ Clients = {clients}; Access_Type = RW; }} }}
"""


# the server's programs are there
_PROGRAMS = (
    "for b in /usr/bin/ganesha.nfsd /usr/sbin/rpcbind; do test -x $b || "
    "{ echo \"no $b: install nfs-ganesha, nfs-ganesha-vfs and rpcbind there\" >&2; exit 3; }; "
    "done; ")
# and its ports free (no NFS service of the node's own)
_PORTS = (
    f"for p in {PORTMAP_PORT} {NFS_PORT} {MNT_PORT}; do "
    "$S ss -Hltn \"sport = :$p\" | grep -q . && { echo \"port $p is in use there: an NFS "
    "service of the node's own\" >&2; exit 3; }; done; ")
WAIT_LOOP_S = 60  # the start line's own bound on waiting for the server to listen


@dataclass(frozen=True)
class Store:
    """A started server: its node, its cluster address and the directory it exports."""

    node: str
    address: str
    export: str


def files(workdir: str) -> dict[str, str]:
    """The server's files on its node, by what they are.

    >>> files("/opt/scalelab")["export"]
    '/opt/scalelab/ckpt-nfs'
    """
    base = f"{workdir}/tmp/{KIND}"
    return {"export": f"{workdir}/{KIND}", "conf": f"{base}.conf", "pid": f"{base}.pid",
            "log": f"{base}.log", "recovery": f"{base}-recovery",
            "rpcbind": f"{base}-rpcbind.pid"}


def check(rec: dict[str, Any], cluster: str, name: str) -> Node:
    """The node that can serve checkpoints for a sweep: InputError naming the fix otherwise."""
    nodes = nodes_of(rec)
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        raise InputError(f"--checkpoint-to nfs@{name}: cluster {cluster} has no node {name} "
                         f"(it has {', '.join(n.name for n in nodes)})")
    if not targets.capabilities(rec).ephemeral:
        raise InputError(f"--checkpoint-to nfs@{name}: scalelab runs an NFS server only on "
                         "nodes it made; on these hosts mount a share on every node and give "
                         "its path (--checkpoint-to /mnt/nfs/ckpt)")
    taken = [set_name for set_name, e in (rec.get("staged") or {}).items()
             if e.get("served") == "nfs" and name in e.get("nodes", [])]
    if taken:
        raise InputError(f"--checkpoint-to nfs@{name}: {name} already serves data set "
                         f"{taken[0]} over NFS; give another node, or remove the set (invoke "
                         f"stage --cluster {cluster} --name {taken[0]} --remove)")
    return node


def preflight(rec: dict[str, Any], server: Node, nodes: list[Node],
              workdir: str) -> tuple[str, str] | None:
    """(node, why) where the server could not start or a node's ranks could not load libnfs
    (the node's own bench/workloads/nfsfs.py tries); None if all is there. Starts nothing.
    A server a killed sweep left there (recorded) holds the ports: the sweep ends it first."""
    def said(proc: Any) -> str:
        lines = [x for x in (proc.stdout + proc.stderr).strip().splitlines() if x.strip()]
        return lines[-1][:200] if lines else f"exit {proc.returncode}"

    left = any(s.get("kind") == KIND and s["node"] == server.name
               for s in rec.get("servers") or [])
    proc = ssh.run(server, rec["known_hosts"],
                   f"{_AS_ROOT}{_PROGRAMS}{'' if left else _PORTS}true", timeout=60,
                   check=False)
    if proc.returncode != 0:
        return server.name, said(proc)
    probe = (f"import sys; sys.path.insert(0, {f'{workdir}/bench/workloads'!r}); import nfsfs\n"
             "try:\n    nfsfs.lib()\nexcept OSError as e:\n    print(e.strerror); sys.exit(3)")

    def one(node: Node) -> str:
        python = (node.facts or {}).get("python") or "python3"
        got = ssh.run(node, rec["known_hosts"],
                      f"{shlex.quote(python)} -c {shlex.quote(probe)}", timeout=60, check=False)
        return "" if got.returncode == 0 else said(got)

    return ssh.first_problem(nodes, one)


def start(cluster: str, rec: dict[str, Any], node: Node, workdir: str) -> Store:
    """Start the server on node; recorded in the cluster record before it starts, with its
    pids once it listens."""
    kh = rec["known_hosts"]
    f = files(workdir)
    entry = {"node": node.name, "port": NFS_PORT, "kind": KIND, "pid": 0, "rpcbind_pid": 0,
             "dir": f["export"], "tmpfs": not targets.capabilities(rec).exportable_root}
    rec.setdefault("servers", []).append(entry)
    save_cluster(cluster, rec)
    clients = ", ".join(n.private_address for n in nodes_of(rec))
    conf = _CONF.format(address=node.private_address, nfs=NFS_PORT, mnt=MNT_PORT,
                        recovery=f["recovery"], path=f["export"], clients=clients)
    q = {k: shlex.quote(v) for k, v in f.items()}
    mount = (f"mountpoint -q {q['export']} || $S mount -t tmpfs -o size={TMPFS_SIZE},mode=0755 "
             f"scalelab-ckpt {q['export']}; " if entry["tmpfs"] else "")
    line = (
        f"{_AS_ROOT}{_PROGRAMS}{_PORTS}"
        f"$S mkdir -p {q['export']} {q['recovery']} && {mount}"
        f"printf %s {shlex.quote(conf)} | $S tee {q['conf']} >/dev/null && "
        f"{{ setsid $S /usr/sbin/rpcbind -f </dev/null >/dev/null 2>&1 & echo $! | "
        f"$S tee {q['rpcbind']} >/dev/null; }} && "
        f"for i in $(seq 1 100); do $S ss -Hltn 'sport = :{PORTMAP_PORT}' | grep -q . && "
        f"break; sleep 0.1; done; "
        f"{{ setsid $S /usr/bin/ganesha.nfsd -F -f {q['conf']} -L {q['log']} -p {q['pid']} "
        f"-N NIV_EVENT </dev/null >/dev/null 2>&1 & }}; "
        f"end=$(($(date +%s) + {WAIT_LOOP_S})); while [ $(date +%s) -lt $end ]; do "
        f"p=$(cat {q['pid']} 2>/dev/null); "
        f"[ -n \"$p\" ] && $S ss -Hltnp 'sport = :{NFS_PORT}' | grep -q \"pid=$p,\" && "
        f"$S ss -Hltnp 'sport = :{MNT_PORT}' | grep -q \"pid=$p,\" && "
        f"{{ echo \"$p $(cat {q['rpcbind']})\"; exit 0; }}; sleep 0.1; done; "
        f"grep -v DBUS {q['log']} | tail -n 1 >&2; exit 1")
    try:
        proc = ssh.run(node, kh, line, timeout=WAIT_LOOP_S + 60, check=False)
        if proc.returncode != 0:
            lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
            why = lines[-1][:200] if lines else f"exit {proc.returncode}"
            raise ClusterError(f"--checkpoint-to nfs@{node.name}: its NFS server did not "
                               f"start ({why})")
        pid, rpcbind = (int(x) for x in proc.stdout.split()[-2:])
    except BaseException:
        try:  # whatever of it started (found by its pid files), and the record's entry
            stop_recorded(cluster, rec, entry)
        except Exception as exc:  # the start's own error, raised on, matters more
            log.warning("%s: could not end the checkpoint server on %s: %s", cluster,
                        node.name, exc)
        raise
    entry.update(pid=pid, rpcbind_pid=rpcbind)
    save_cluster(cluster, rec)
    return Store(node.name, node.private_address, f["export"])


def stop(node: Node, known_hosts: str, server: dict[str, Any], workdir: str) -> None:
    """End the server and its portmapper by their pids (read from its pid files where the
    record has none), each only if it still is ours; unmount the export, remove its files."""
    f = files(workdir)
    q = {k: shlex.quote(v) for k, v in f.items()}
    pid, rpcbind = int(server.get("pid") or 0), int(server.get("rpcbind_pid") or 0)
    ours = f"ganesha.nfsd -F -f {f['conf']} "

    def end(var: str, recorded: int, pidfile: str, match: str) -> str:
        return (f"{var}={recorded}; [ ${var} -gt 0 ] || {var}=$(cat {pidfile} 2>/dev/null || "
                f"echo 0); case ${var} in ''|*[!0-9]*) {var}=0;; esac; "
                f"if [ ${var} -gt 0 ] && [ \"$($S readlink /proc/${var}/ns/net)\" = "
                f"\"$(readlink /proc/$$/ns/net)\" ] && tr '\\0' ' ' < /proc/${var}/cmdline "
                f"2>/dev/null | grep -qF -- {shlex.quote(match)}; then $S kill ${var}; for i in $(seq 1 100); do "
                f"$S kill -0 ${var} 2>/dev/null || break; sleep 0.1; done; "
                f"$S kill -0 ${var} 2>/dev/null && $S kill -9 ${var}; fi; ")

    unmount = (f"! mountpoint -q {q['export']} || $S umount {q['export']}; "
               if server.get("tmpfs") else "")
    line = (f"{_AS_ROOT}" + end("g", pid, q["pid"], ours)
            + end("r", rpcbind, q["rpcbind"], "/usr/sbin/rpcbind -f")
            + f"{unmount}$S rm -rf -- {q['export']} {q['conf']} {q['pid']} {q['log']} "
            f"{q['recovery']} {q['rpcbind']}")
    proc = ssh.run(node, known_hosts, line, timeout=60, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"{node.name}: the checkpoint server could not be ended "
                           f"({(proc.stderr.strip().splitlines() or ['?'])[-1][:200]})")


def stop_recorded(cluster: str, rec: dict[str, Any], server: dict[str, Any]) -> str:
    """End a recorded server and take it out of the record (saved); what was done."""
    nodes = {n.name: n for n in nodes_of(rec)}
    node = nodes.get(server["node"])
    if node is not None:
        workdir = (node.facts or {}).get("workdir") or server["dir"].rsplit("/", 1)[0]
        stop(node, rec.get("known_hosts") or "", server, workdir)
    rec["servers"] = [s for s in rec.get("servers") or [] if s is not server]
    if not rec["servers"]:
        rec.pop("servers")
    save_cluster(cluster, rec)
    return f"checkpoint NFS server on {server['node']} ended"


def serve(cluster: str, rec: dict[str, Any], places: dict[str, str],
          workdir: str) -> dict[str, Store]:
    """Start the server of each nfs@NODE place (place: its node's name) before a sweep's
    first run; ClusterError, one line, if one does not start (those started are ended)."""
    stores: dict[str, Store] = {}
    # a sweep holds the cluster's lock: a server already recorded is a killed sweep's
    for old in [s for s in rec.get("servers") or [] if s.get("kind") == KIND]:
        stop_recorded(cluster, rec, old)
    try:
        for place, name in places.items():
            if place not in stores:
                stores[place] = start(cluster, rec, check(rec, cluster, name), workdir)
    except BaseException:
        end(cluster, rec, stores)
        raise
    return stores


def end(cluster: str, rec: dict[str, Any], stores: dict[str, Store]) -> None:
    """End the servers serve() started, after the sweep. A failure is logged, not raised:
    the record still holds the server, and invoke destroy ends it."""
    for store in stores.values():
        entry = next((e for e in rec.get("servers") or []
                      if e.get("kind") == KIND and e["node"] == store.node), None)
        try:
            if entry is not None:
                stop_recorded(cluster, rec, entry)
        except Exception as exc:  # the sweep's own outcome matters more
            log.warning("checkpoint NFS server on %s left running (invoke destroy ends it): "
                        "%s", store.node, exc)
    stores.clear()

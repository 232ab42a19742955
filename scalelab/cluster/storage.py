"""Data staged on a cluster's nodes, and the storage servers that serve it (invoke stage).

A staged set is tar shards in WebDataset's layout (bench/workloads/make_dataset.py writes a
synthetic one, ImageNet-like with --like imagenet; --from-dir copies a user's own shards
unchanged), in one place per set:

* ``http``: one node's disk, served by a web server on that node (Python's http.server,
  started detached with a pid file) at ``http://<its cluster address>:<port>/<name>/``; the
  ranks read it with curl as WebDataset reads web servers;
* ``nodes``: a copy on every node's own disk at ``<workdir>/data/<name>``;
* ``nfs``: the cluster's NFS share (``/srv/scalelab/data/<name>`` on the head, exported by the
  nfs_server role), read by path where the nodes mount it, else with nfs-cat.

The cluster record keeps every set (``staged``) and every server (``servers``) before it
exists, so that destroy, or invoke stage --remove, ends the server by its pid (checked to be
that server) and removes the data, on hosts scalelab made and on hosts it did not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scalelab.cluster import ckptstore, ssh, targets
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core import lock, shardurl
from scalelab.core.errors import ClusterError, InputError
from scalelab.core.state import load_cluster, save_cluster

log = logging.getLogger(__name__)

PLACES = ("http", "nodes", "nfs")
FORMATS = ("shards", "folders")  # tar shards (webdataset's layout) or class folders of JPEGs
GROUP_VARS = Path(__file__).resolve().parents[2] / "playbooks" / "group_vars" / "all.yml"
SHARE_MARKER = ".scalelab-share"  # the nfs_server role's, in the exported directory
DEFAULT_PORT = 8610
NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
GENERATE_TIMEOUT_S = 3600.0
SERVER_WAIT_S = 10.0
NFS_PORT = 2049  # a storage node's own NFS-Ganesha (stage --to nfs --node): NFSv4's port
NFS_WAIT_S = 60.0  # NFS-Ganesha takes seconds to listen


@dataclass(frozen=True)
class Request:
    """What invoke stage was asked for, checked."""

    name: str
    to: str
    images: int
    classes: int
    shard_size: int
    like: str  # "imagenet" or "" (small images)
    node: str | None  # the storage node for http (default: the cluster's last node)
    port: int
    from_dir: Path | None
    fmt: str = "shards"


def check_request(name: str, to: str, images: int | str, classes: int | str,
                  shard_size: int | str, like: str, node: str, port: int | str,
                  from_dir: str, fmt: str = "shards") -> Request:
    """InputError with the fix for the first bad value."""
    if not NAME.fullmatch(name):
        raise InputError(f"--name {name!r}: a data set's name is 1-32 of a-z, 0-9 and -, "
                         "starting with a letter, e.g. imagenet-like")
    if to not in PLACES:
        raise InputError(f"--to {to!r}: choose http (a web server on one node), nodes (a "
                         "copy on every node's own disk) or nfs (the cluster's NFS share)")
    nums = {}
    for flag, value, low in (("--images", images, 1), ("--classes", classes, 1),
                             ("--shard-size", shard_size, 1), ("--port", port, 1024)):
        try:
            nums[flag] = int(value)
        except (TypeError, ValueError):
            raise InputError(f"{flag} {value!r}: give a whole number") from None
        if nums[flag] < low:
            raise InputError(f"{flag} {value!r}: give {low} or more")
    if nums["--port"] > 65535:
        raise InputError(f"--port {port}: give a TCP port up to 65535")
    if like not in ("", "imagenet"):
        raise InputError(f"--like {like!r}: imagenet (photo-sized, about 112 KB each, the "
                         "default) or small (96-pixel images)")
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: choose shards (tar shards, the default) or folders "
                         "(class folders of JPEGs)")
    if fmt == "folders" and (to == "http" or from_dir or (to == "nfs" and node)):
        raise InputError("--format folders: a web server and a node's own NFS server serve tar "
                         "shards and --from-dir copies shards; stage class folders --to nodes "
                         "(or --to nfs, the head's share, where the nodes mount it)")
    src = None
    if from_dir:
        src = Path(from_dir).expanduser()
        if not src.is_dir() or not any(src.glob("*.tar")):
            raise InputError(f"--from-dir {from_dir}: not a directory of .tar shards; give the "
                             "directory that holds your set's shard-NNNNNN.tar files")
    return Request(name, to, nums["--images"], nums["--classes"], nums["--shard-size"], like,
                   node or None, nums["--port"], src, fmt)


def _facts(node: Node) -> tuple[str, str]:
    f = node.facts or {}
    if not f.get("python") or not f.get("workdir"):
        raise ClusterError(f"node {node.name} has no training stack recorded; run invoke "
                           "configure first")
    return f["python"], f["workdir"]


def workdir_of(node: Node) -> str:
    """scalelab's workdir on a configured node."""
    return _facts(node)[1]


def shared_dir() -> str:
    """The directory the nfs roles export and mount (group_vars' scalelab_shared_dir)."""
    return str(yaml.safe_load(GROUP_VARS.read_text())["scalelab_shared_dir"])


def set_dir(node: Node, name: str, to: str = "http") -> str:
    return f"{shared_dir() if to == 'nfs' else _facts(node)[1]}/data/{name}"


def _run(node: Node, known_hosts: str, line: str, timeout: float = 60.0) -> str:
    return ssh.run(node, known_hosts, line, timeout=timeout).stdout


def _last_line(proc: subprocess.CompletedProcess, default: str) -> str:
    """What a failed command said last on stderr (its first 200 characters), or default."""
    return (proc.stderr.strip().splitlines() or [default])[-1][:200]


def _make_dir(node: Node, known_hosts: str, path: str) -> None:
    """The set's directory, the login user's own: where the place above it (/opt/scalelab,
    the NFS share) is root's, made through sudo and handed to the user (that set only)."""
    q = shlex.quote(path)
    _run(node, known_hosts, f"mkdir -p {q} 2>/dev/null || {{ sudo -n mkdir -p {q} && "
         f"sudo -n chown \"$(id -u):$(id -g)\" {q}; }}")


def _generate(node: Node, known_hosts: str, req: Request, out: str) -> dict[str, Any]:
    """The synthetic set written on the node by the workloads' make_dataset.py."""
    python, workdir = _facts(node)
    _make_dir(node, known_hosts, out)
    per_class = max(1, req.images // req.classes)
    argv = [python, f"{workdir}/bench/workloads/make_dataset.py", "--out", out, "--classes",
            str(req.classes), "--images-per-class", str(per_class), "--layout", req.fmt,
            "--shard-size", str(req.shard_size)] + (["--like", req.like] if req.like else [])
    text = _run(node, known_hosts, " ".join(shlex.quote(a) for a in argv), GENERATE_TIMEOUT_S)
    for line in text.splitlines():
        if line.startswith("SCALELAB_RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise ClusterError(f"{node.name}: make_dataset.py printed no result")


def _copy(node: Node, known_hosts: str, src: Path, dest: str) -> dict[str, Any]:
    """A user's own shards, copied unchanged into dest/shards on the node."""
    shards = sorted(src.glob("*.tar"))
    _make_dir(node, known_hosts, dest)
    _run(node, known_hosts, f"mkdir -p {shlex.quote(dest + '/shards')}")
    for shard in shards:
        with open(shard, "rb") as fh:
            proc = subprocess.run(ssh.ssh_args(node, known_hosts) + [
                "--", f"cat > {shlex.quote(dest + '/shards/' + shard.name)}"], stdin=fh,
                capture_output=True, timeout=GENERATE_TIMEOUT_S)
        if proc.returncode != 0:
            raise ClusterError(f"{node.name}: could not copy {shard.name}: "
                               f"{proc.stderr.decode(errors='replace').strip()[-300:]}")
    return {"num_shards": len(shards), "num_images": None, "from": str(src)}


def _range(shards: list[str]) -> str:
    """shard-{000000..000063}.tar for make_dataset's names; the one name for a single shard."""
    if len(shards) == 1:
        return shards[0]
    stems = [re.fullmatch(r"(.*?)(\d+)\.tar", s) for s in shards]
    if not all(stems) or len({m[1] for m in stems}) != 1 or len({len(m[2]) for m in stems}) != 1:
        raise ClusterError("the shards are not named PREFIX-NNNNNN.tar with one prefix; rename "
                           "them so that one {low..high} range names them all")
    nums = sorted(int(m[2]) for m in stems)
    width = len(stems[0][2])
    if nums != list(range(nums[0], nums[0] + len(nums))):
        raise ClusterError("the shards' numbers have gaps; one {low..high} range must name all")
    return f"{stems[0][1]}{{{nums[0]:0{width}d}..{nums[-1]:0{width}d}}}.tar"


def _start_server(node: Node, known_hosts: str, port: int) -> int:
    """http.server on the node's cluster address, serving <workdir>/data; its pid."""
    python, workdir = _facts(node)
    pidfile = f"{workdir}/tmp/http-{port}.pid"
    log_file = f"{workdir}/tmp/http-{port}.log"
    argv = [python, "-m", "http.server", str(port), "--bind", node.private_address,
            "--directory", f"{workdir}/data"]
    line = (f"mkdir -p {shlex.quote(workdir + '/tmp')}; "
            f"setsid {' '.join(shlex.quote(a) for a in argv)} "
            f"</dev/null >{shlex.quote(log_file)} 2>&1 & echo $! > {shlex.quote(pidfile)}; "
            f"cat {shlex.quote(pidfile)}")
    pid = int(_run(node, known_hosts, line).strip().splitlines()[-1])
    # up when it answers on its port (bounded: SERVER_WAIT_S)
    # its own socket (another process on the port would answer too), then an answer
    check = (f"for i in $(seq 1 {int(SERVER_WAIT_S * 10)}); do "
             f"kill -0 {pid} 2>/dev/null || break; "
             f"ss -Hltnp 'sport = :{port}' | grep -q 'pid={pid},' && "
             f"curl -sf -o /dev/null {shlex.quote(f'http://{node.private_address}:{port}/')} "
             "&& exit 0; "
             f"sleep 0.1; done; tail -n 1 {shlex.quote(log_file)} >&2; exit 1")
    proc = ssh.run(node, known_hosts, check, timeout=SERVER_WAIT_S + 30, check=False)
    if proc.returncode != 0:
        _stop_server(node, known_hosts, {"kind": "http", "pid": pid, "port": port})
        why = _last_line(proc, "it exited")
        raise ClusterError(f"{node.name}: the web server did not answer on port {port} "
                           f"({why}); give another --port")
    return pid


# root's commands where the login user is not root (static hosts): through sudo -n
_AS_ROOT = 'S=; [ "$(id -u)" = 0 ] || S="sudo -n"; '

_GANESHA_CONF = """\
# scalelab: NFSv4 over TCP on {address} only, one read-only export for the cluster's nodes
NFS_CORE_PARAM {{ Bind_Addr = {address}; NFS_Port = {port}; Protocols = 4;
  Enable_NLM = false; Enable_RQUOTA = false; }}
NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {recovery}; }}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{ Export_Id = 1; Path = {path}; Pseudo = {path}; Protocols = 4; Transports = TCP;
  SecType = sys; Squash = No_Root_Squash; Access_Type = None; FSAL {{ Name = VFS; }}
  CLIENT {{ Clients = {clients}; Access_Type = RO; }} }}
"""


def _nfs_files(workdir: str) -> dict[str, str]:
    base = f"{workdir}/tmp/nfs-{NFS_PORT}"
    return {"conf": f"{base}.conf", "pid": f"{base}.pid", "log": f"{base}.log",
            "recovery": f"{base}-recovery"}


def _start_nfs(node: Node, known_hosts: str, path: str, clients: list[str]) -> int:
    """NFS-Ganesha on the node's cluster address, exporting path read-only to clients; its
    pid (read from its pid file once its own socket listens)."""
    workdir = _facts(node)[1]
    f = _nfs_files(workdir)
    conf = _GANESHA_CONF.format(address=node.private_address, port=NFS_PORT,
                                recovery=f["recovery"], path=path, clients=", ".join(clients))
    q = {k: shlex.quote(v) for k, v in f.items()}
    line = (f"test -x /usr/bin/ganesha.nfsd || {{ echo 'no NFS-Ganesha (/usr/bin/ganesha.nfsd)"
            f"' >&2; exit 3; }}; {_AS_ROOT}mkdir -p {q['recovery']} && "
            f"printf %s {shlex.quote(conf)} > {q['conf']} && "
            f"{{ setsid $S /usr/bin/ganesha.nfsd -F -f {q['conf']} -L {q['log']} "
            f"-p {q['pid']} -N NIV_EVENT </dev/null >/dev/null 2>&1 & }}; "
            f"for i in $(seq 1 {int(NFS_WAIT_S * 10)}); do "
            f"p=$(cat {q['pid']} 2>/dev/null); "
            f"[ -n \"$p\" ] && $S ss -Hltnp 'sport = :{NFS_PORT}' | grep -q \"pid=$p,\" && "
            f"{{ echo \"$p\"; exit 0; }}; sleep 0.1; done; "
            f"tail -n 1 {q['log']} >&2; exit 1")
    proc = ssh.run(node, known_hosts, line, timeout=NFS_WAIT_S + 30, check=False)
    if proc.returncode != 0:
        with contextlib.suppress(Exception):
            pid = int(_run(node, known_hosts, f"cat {q['pid']} 2>/dev/null || echo 0"))
            _stop_server(node, known_hosts, {"kind": "nfs", "pid": pid, "port": NFS_PORT})
        why = _last_line(proc, "it exited")
        raise ClusterError(f"{node.name}: the NFS server did not listen on port {NFS_PORT} "
                           f"({why}); install nfs-ganesha and nfs-ganesha-vfs there, or free "
                           "the port")
    return int(proc.stdout.split()[-1])


def _stop_server(node: Node, known_hosts: str, server: dict[str, Any]) -> None:
    """End a server by its pid, only if that pid is still our server (http.server on its
    port, or NFS-Ganesha with our configuration); then its files go."""
    workdir = _facts(node)[1]
    pid, port = int(server["pid"]), int(server["port"])
    if server.get("kind") == "nfs":
        f = _nfs_files(workdir)
        ours = f"ganesha.nfsd -F -f {f['conf']} "
        files = " ".join(shlex.quote(x) for x in f.values())
    else:
        ours = f"http.server {port} "
        files = " ".join(shlex.quote(f"{workdir}/tmp/http-{port}.{x}") for x in ("pid", "log"))
    line = (f"{_AS_ROOT}if [ {pid} -gt 0 ] && tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null | "
            f"grep -qF -- {shlex.quote(ours)}; then $S kill {pid}; "
            f"for i in $(seq 1 100); do $S kill -0 {pid} 2>/dev/null || break; sleep 0.1; "
            f"done; $S kill -0 {pid} 2>/dev/null && $S kill -9 {pid}; fi; $S rm -rf -- {files}")
    _run(node, known_hosts, line, 30)


def stage(cluster: str, req: Request) -> dict[str, Any]:
    """Write (or copy) the set to its place, start its server; the staged entry, recorded."""
    with lock.hold(cluster):
        rec = load_cluster(cluster)
        nodes = nodes_of(rec)
        if req.name in (rec.get("staged") or {}):
            raise InputError(f"cluster {cluster} already has a data set {req.name!r}; give "
                             f"another --name or remove it: invoke stage --cluster {cluster} "
                             f"--name {req.name} --remove")
        if req.node and req.node not in [n.name for n in nodes]:
            raise InputError(f"--node {req.node}: cluster {cluster} has "
                             f"{', '.join(n.name for n in nodes)}")
        chosen = next((n for n in nodes if n.name == req.node), None)
        if req.to == "http":
            where = [chosen or nodes[-1]]
        elif req.to == "nfs" and chosen:  # the storage node's own NFS server (one set each)
            where = [chosen]
            taken = [name for name, e in (rec.get("staged") or {}).items()
                     if e.get("served") == "nfs" and e["nodes"] == [req.node]]
            if taken:
                raise InputError(f"--to nfs --node {req.node}: that node already serves data "
                                 f"set {taken[0]} over NFS; remove it first (invoke stage "
                                 f"--cluster {cluster} --name {taken[0]} --remove) or give "
                                 "another --node")
        elif req.to == "nfs":  # the head exports the share
            where = [next((n for n in nodes if n.role == "head"), nodes[0])]
            marker = f"{shared_dir()}/{SHARE_MARKER}"
            if ssh.run(where[0], rec["known_hosts"], f"test -e {shlex.quote(marker)}",
                       timeout=30, check=False).returncode != 0:
                raise InputError(f"--to nfs: cluster {cluster} exports no NFS share (no "
                                 f"{marker} on {where[0].name}); set it up with invoke "
                                 f"configure --cluster {cluster} --tags nfs")
        else:
            where = nodes
        if req.fmt == "folders" and req.to == "nfs" and not targets.capabilities(rec).kernel_nfs:
            raise InputError(f"--format folders --to nfs: the nodes of cluster {cluster} mount "
                             "no NFS share (the ranks read it with libnfs, shard by shard); "
                             "stage tar shards there, or class folders --to nodes")
        for n in where:
            _facts(n)
        served = ("http" if req.to == "http" else "nfs" if req.to == "nfs" and chosen
                  else None)
        entry: dict[str, Any] = {"to": req.to, "nodes": [n.name for n in where],
                                 "dir": set_dir(where[0], req.name, "http" if served else
                                                req.to)}
        if served:
            entry["served"] = served
            entry["port"] = req.port if served == "http" else NFS_PORT
        # where the root file system gives out no NFS file handles (an overlay), the set
        # lives on a tmpfs of its own
        if served == "nfs" and not targets.capabilities(rec).exportable_root:
            # room for the set: the user's shards as they are, or the synthetic photos
            held = (sum(p.stat().st_size for p in req.from_dir.glob("*.tar")) / 1e6
                    if req.from_dir else req.images * 0.15)
            entry["tmpfs_mb"] = int(held * 1.1) + 64
        staged = dict(rec.get("staged") or {})
        staged[req.name] = entry  # before anything is written: destroy removes what follows
        rec["staged"] = staged
        save_cluster(cluster, rec)
        try:
            return _stage(cluster, rec, req, entry, where)
        except BaseException:
            # undone: the set, and a server nothing else needs (the record as before); a
            # failure of the undoing is logged, the first error is the one said
            try:
                remove(cluster, rec, [req.name])
            except Exception as exc:  # the stage's own error, re-raised below, matters more
                log.warning("%s: could not take back data set %s: %s", cluster, req.name, exc)
            finally:
                save_cluster(cluster, rec)
            raise


def _stage(cluster: str, rec: dict[str, Any], req: Request, entry: dict[str, Any],
           where: list[Node]) -> dict[str, Any]:
    kh = rec["known_hosts"]
    desc = {}
    if entry.get("tmpfs_mb"):
        q = shlex.quote(entry["dir"])
        _run(where[0], kh, f"mkdir -p {q} && mount -t tmpfs -o size={int(entry['tmpfs_mb'])}m"
             f",mode=0755 scalelab-data {q}")
    for n in where:
        out = entry["dir"]
        desc = (_copy(n, kh, req.from_dir, out) if req.from_dir
                else _generate(n, kh, req, out))
    if req.fmt == "folders":
        entry.update({"format": "folders", "num_shards": None,
                      "num_images": desc.get("num_images"), "mean_bytes": desc.get("mean_bytes"),
                      "classes": desc.get("classes"), "data": f"{entry['dir']}/folders"})
        rec["staged"][req.name] = entry
        save_cluster(cluster, rec)
        return entry
    shards = sorted(Path(x).name for x in _run(
        where[0], kh, f"ls {shlex.quote(entry['dir'] + '/shards')}").split())
    entry.update({"num_shards": len(shards), "num_images": desc.get("num_images"),
                  "mean_bytes": desc.get("mean_bytes"), "classes": desc.get("classes")})
    if req.to == "http":
        server = _server_of(rec, where[0], req.port)
        if server is None:
            pid = _start_server(where[0], kh, req.port)
            rec.setdefault("servers", []).append({"node": where[0].name, "port": req.port,
                                                 "pid": pid, "kind": "http"})
        entry["data"] = f"http://{where[0].private_address}:{req.port}/{req.name}/shards/" \
                        f"{_range(shards)}"
    elif entry.get("served") == "nfs":  # its own server: stage refused a node serving one
        pid = _start_nfs(where[0], kh, entry["dir"], [n.private_address for n in nodes_of(rec)])
        rec.setdefault("servers", []).append({"node": where[0].name, "port": NFS_PORT,
                                             "pid": pid, "kind": "nfs"})
        entry["data"] = f"nfs://{where[0].private_address}{entry['dir']}/shards/{_range(shards)}"
    elif req.to == "nfs" and not targets.capabilities(rec).kernel_nfs:
        # no kernel client mounts the share here: the ranks read it with libnfs
        entry["data"] = f"nfs://{where[0].private_address}{entry['dir']}/shards/{_range(shards)}"
    else:  # a copy on every node, or the share every node mounts at the same path
        entry["data"] = f"{entry['dir']}/shards"
    rec["staged"][req.name] = entry
    save_cluster(cluster, rec)
    return entry


def _server_of(rec: dict[str, Any], node: Node, port: int) -> dict[str, Any] | None:
    for s in rec.get("servers") or []:
        if s["node"] == node.name and s["port"] == port:
            return s
    return None


def remove(cluster: str, rec: dict[str, Any], names: list[str] | None = None,
           keep_data: bool = False) -> list[str]:
    """End the servers no remaining set needs and remove the named sets (all: None) from their
    nodes (keep_data: the sets' files stay where they are); the record saved without them.
    What was done, one line each."""
    staged = dict(rec.get("staged") or {})
    nodes = {n.name: n for n in nodes_of(rec)}
    kh = rec.get("known_hosts") or ""
    said = []
    removed = [(name, staged.pop(name)) for name in (list(staged) if names is None else names)]
    # the servers no remaining set needs end first (an NFS server holds its set's tmpfs)
    needed = {(n, e["port"]) for e in staged.values() if "port" in e for n in e["nodes"]}
    servers = []
    for s in rec.get("servers") or []:
        # a sweep's checkpoint server is the sweep's to end (scalelab.cluster.ckptstore)
        if (s["node"], s["port"]) in needed or s["node"] not in nodes or \
                s.get("kind") == ckptstore.KIND:
            servers.append(s)
            continue
        _stop_server(nodes[s["node"]], kh, s)
        said.append(f"{'NFS' if s.get('kind') == 'nfs' else 'web'} server on "
                    f"{s['node']}:{s['port']} ended")
    for name, entry in removed:
        if keep_data:
            said.append(f"data set {name} kept at {entry['dir']} on {', '.join(entry['nodes'])}")
            continue
        for node_name in entry["nodes"]:
            if node_name in nodes:
                parent = shlex.quote(str(Path(entry["dir"]).parent))
                q = shlex.quote(entry["dir"])  # made through sudo where root owns above it
                unmount = (f"{_AS_ROOT}! mountpoint -q {q} || $S umount {q}; "
                           if entry.get("tmpfs_mb") else "")
                _run(nodes[node_name], kh, f"{unmount}{{ rm -rf -- {q} 2>/dev/null || sudo -n "
                     f"rm -rf -- {q}; }} && {{ rmdir --ignore-fail-on-non-empty -- {parent} "
                     f"2>/dev/null || sudo -n rmdir --ignore-fail-on-non-empty -- {parent} "
                     "2>/dev/null; true; }", 300)
        said.append(f"data set {name} removed from {', '.join(entry['nodes'])}")
    rec["staged"], rec["servers"] = staged, servers
    if not staged:
        rec.pop("staged")
    if not servers:
        rec.pop("servers")
    return said


def remove_named(cluster: str, name: str) -> list[str]:
    """invoke stage --remove: one set and the server no other set needs."""
    with lock.hold(cluster):
        rec = load_cluster(cluster)
        if name not in (rec.get("staged") or {}):
            have = ", ".join(rec.get("staged") or {}) or "none"
            raise InputError(f"cluster {cluster} has no data set {name!r} (it has: {have})")
        said = remove(cluster, rec, [name])
        save_cluster(cluster, rec)
        return said


def serving_node(nodes: list[Node], source: str | None) -> Node | None:
    """The node whose cluster address a shard URL names (its storage node), if any.

    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local"),
    ...       Node("c-n1", "192.0.2.11", "10.0.0.11", "worker", "local")]
    >>> serving_node(ns, "http://10.0.0.11:8610/in/shards/shard-{000000..000009}.tar").name
    'c-n1'
    >>> serving_node(ns, "/data/in") is None
    True
    """
    at = shardurl.host(source)
    return next((n for n in nodes if at and n.private_address == at), None)


@dataclass(frozen=True)
class Seen:
    """What a node sees of a data source: its shard count (None: class folders), or why not."""

    shards: int | None
    error: str = ""
    fix: str = ""


_PATH_KIND = r'''p={path}
if [ -f "$p" ]; then case "$p" in *.tar) echo shards 1;; *) echo notset;; esac
elif [ -d "$p" ]; then
  n=$(find "$p" -maxdepth 1 -type f -name '*.tar' | wc -l)
  if [ "$n" -gt 0 ]; then echo shards "$n"
  elif find "$p" -mindepth 2 -maxdepth 2 \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' \) | head -n 1 | grep -q .; then echo folders
  else echo notset; fi
else echo missing; fi'''


def shards_seen(node: Node, known_hosts: str, source: str) -> Seen:
    """Ask the node: a path is a shard set or class folders; a URL's first and last shards
    answer (curl, nfs-cat)."""
    if "://" not in source:
        proc = ssh.run(node, known_hosts, _PATH_KIND.format(path=shlex.quote(source)),
                       timeout=60, check=False)
        if proc.returncode != 0:
            why = _last_line(proc, f"exit {proc.returncode}")
            return Seen(None, f"it did not answer: {why}", "check that it answers: invoke "
                        "check --cluster NAME")
        out = proc.stdout.split()
        if out[:1] == ["shards"]:
            return Seen(int(out[1]))
        if out[:1] == ["folders"]:
            return Seen(None)
        if out[:1] == ["missing"]:
            return Seen(None, "no such file or directory", "stage a set there (invoke stage "
                        "--to nodes) or give the path the nodes mount it at")
        return Seen(None, "not a data set: no .tar shards and no class folders of images",
                    "give the directory holding shard-NNNNNN.tar files or class folders")
    first, last, count = shardurl.shard_range(source)
    for url in dict.fromkeys((first, last)):
        q = shlex.quote(url)
        line = (f"curl -sS -f -r 0-0 --connect-timeout 5 --max-time 20 -o /dev/null {q}"
                if url.startswith("http") else
                f"timeout 20 nfs-cat {shlex.quote(url + '?version=4')} | head -c 1 | wc -c "
                "| grep -qx 1")
        proc = ssh.run(node, known_hosts, line, timeout=40, check=False)
        if proc.returncode != 0:
            why = _last_line(proc, f"exit {proc.returncode}")
            return Seen(None, f"{url.rsplit('/', 1)[-1]}: {why}",
                        "check the server runs (invoke stage prints the URL it serves)")
    return Seen(count)

"""The table of bad inputs, one test each: every task, every kind of value (ranges, sizes,
rates, names, paths, sweep files, var-files, sweep ids). Each ends with exactly one line on
stderr naming the problem, a non-zero exit, and nothing written anywhere scalelab writes
(state, inventories, reports; and for the local target no namespace or link).

Tasks run as a user runs them (`python -m invoke ...`), against a fresh state, inventory
and reports directory per case. Cases that need a cluster get a *recorded* one whose nodes
are 127.0.0.1 on a closed port: if a bad input were ever let through, the worst it could do
is fail to connect to the loopback.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, unique_name
from faults.faultlib import ledger
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalelab.core.errors import InputError

FAKE = unique_name("f")  # the recorded cluster's name; no real cluster by that name exists

# sweep files, by name: written into the case's own directory (outside what is watched)
SWEEP_FILES = {
    "notyaml.yml": "nodes: [1\n",
    "list.yml": "- 1\n- 2\n",
    "empty.yml": "",
    "dup.yml": "nodes: 1\nnodes: 2\nbatch_size: 16\n",
    "typo.yml": "nodes: 1\nbatchsize: 16\n",
    "noaxes.yml": "model: resnet20\n",
    "model.yml": "nodes: 1\nbatch_size: 16\nmodel: resnet9\n",
    "engine.yml": "nodes: 1\nbatch_size: 16\nengine: mpi\n",
    "data.yml": "nodes: 1\nbatch_size: 16\ndata: rel/path\n",
    "realdata.yml": "nodes: 1\nbatch_size: 16\ndata: /srv/imagenet\n",
    "timeout.yml": "nodes: 1\nbatch_size: 16\ntimeout_s: -1\n",
    "nan.yml": "nodes: 1\nbatch_size: 16\ntimeout_s: .nan\n",
    "sizes.yml": "nodes: 1\nbatch_size: 16\nallreduce_sizes: [0]\n",
    "sizes2.yml": "nodes: 1\nbatch_size: 16\nallreduce_sizes: [4Q]\n",
    "iters.yml": "nodes: 1\nbatch_size: 16\nallreduce_iters: 0\n",
    "image.yml": "nodes: 1\nbatch_size: 16\nimage_size: 4\n",
    "boolint.yml": "nodes: 1\nbatch_size: 16\nrepeats: true\n",
    "flag.yml": "nodes: 1\nbatch_size: 16\nnetprobe: maybe\n",
    "emptylist.yml": "nodes: 1\nbatch_size: 16\nbandwidth: []\n",
    "huge.yml": "nodes: 1-100000000\nbatch_size: 16\n",
    "nested.yml": "nodes: [[1, 2]]\nbatch_size: 16\n",
    "mapping.yml": "nodes: {a: 1}\nbatch_size: 16\n",
    "pyobj.yml": "nodes: !!python/object/apply:os.system [\"true\"]\nbatch_size: 1\n",
    "bomb.yml": ("nodes: 1\nbatch_size: 16\ndescription: [&a [x, x, x, x, x, x, x, x, x], "
                 + ", ".join(f"&{b} [{', '.join([f'*{a}'] * 9)}]"
                             for a, b in zip("abcdefghi", "bcdefghij", strict=True)) + "]\n"),
    "binary.yml": b"\xff\xfe\x00\x01 not text",
    "secretkey.yml": "ghp_notasweepfile:SECRETVALUE12345 and more: 1\n",
    "varfile.tfvars.json": '{"region": "us-east-1", "nodes": 2',  # truncated JSON
    # device profiles: one for another model (resnet20's layer names), one cut short
    "r20.json": ('{"schema": 1, "model": "resnet50", "device": "x", "precision": "fp32", '
                 '"batch_size": 32, "image_size": 224, "source": "measured", "provenance": "t", '
                 '"optimizer_s": 0.001, "layers": [{"name": "conv1", "params": ["conv1.weight"], '
                 '"fwd_s": 0.01, "bwd_s": 0.01}, {"name": "layer3.2.bn2", "params": '
                 '["layer3.2.bn2.weight"], "fwd_s": 0.01, "bwd_s": 0.01}]}'),
    "cut.json": '{"schema": 1, "model": "resnet50", "layers": [{"name": "conv1"',
    "nolayers.json": ('{"schema": 1, "model": "resnet50", "device": "x", "precision": "fp32", '
                      '"batch_size": 32, "image_size": 224, "source": "measured", '
                      '"provenance": "t", "optimizer_s": 0.001, "layers": []}'),
    "varfile2.tfvars.json": '{"region": "us-east-1", "no_such_variable": 1}',
    "varfile3.tfvars": 'region = "us-east-1"\nnodes = [\n',
    # var-file values that would become ssh options or shell words (scalelab.core.validate);
    # the key file does not exist: the value is refused before anything looks for it
    "static-user.tfvars.json": json.dumps({
        "ssh_user": "ubuntu", "ssh_private_key_file": "id_ed25519",
        "hosts": [{"address": "127.0.0.1", "role": "head"},
                  {"address": "127.0.0.2", "ssh_user": "-oProxyCommand=false"}]}),
    "static-topuser.tfvars.json": json.dumps({
        "ssh_user": "-oProxyCommand=false", "ssh_private_key_file": "id_ed25519",
        "hosts": [{"address": "127.0.0.1", "role": "head"}]}),
    "static-addr.tfvars.json": json.dumps({
        "ssh_user": "ubuntu", "ssh_private_key_file": "id_ed25519",
        "hosts": [{"address": "127.0.0.1;false", "role": "head"}]}),
    "static-name.tfvars.json": json.dumps({
        "ssh_user": "ubuntu", "ssh_private_key_file": "id_ed25519",
        "hosts": [{"address": "127.0.0.1", "role": "head", "name": "$(false)"}]}),
    "static-bastion.tfvars.json": json.dumps({
        "ssh_user": "ubuntu", "ssh_private_key_file": "id_ed25519",
        "bastion_ip": "-oProxyCommand=false", "hosts": [{"address": "127.0.0.1", "role": "head"}]}),
    "aws-user.tfvars.json": json.dumps({"region": "us-east-1", "operator_cidr": "203.0.113.7/32",
                                        "ssh_user": "ubuntu@evil"}),
    "openstack-user.tfvars.json": json.dumps({
        "operator_cidr": "203.0.113.7/32", "external_network_name": "public",
        "image_name": "ubuntu-22.04", "flavor_name": "g1", "gpus_per_node": 1,
        "ssh_user": "-oProxyCommand=false"}),
    # an offline bundle of no package at all (its manifest and apt index in place)
    "emptybundle/manifest.json": ('{"format": 1, "created_at": "2026-11-27T00:00:00Z", '
                                  '"python_tag": "cp311", "debs": [], "wheels": []}'),
    "emptybundle/debs/Packages": "",
}

# (case id, setup, task arguments, what the one line must contain)
#   setup: none | local (a recorded local cluster FAKE) | static (a recorded static cluster)
#          | sweep (a finished sweep s1, reports/latest) | failed | norun | damaged | badmeta
#   "{dir}" in an argument is the case's own directory (sweep files live there)
CASES = [
    # ---- provision: counts, CPU shares, rates, subnets, names, targets, var-files
    ("prov-nodes-zero", "none", ["provision", "--nodes", "0"], "nodes: 0 must be 1 or more"),
    ("prov-nodes-neg", "none", ["provision", "--nodes", "-3"], "must be 1 or more"),
    ("prov-nodes-frac", "none", ["provision", "--nodes", "1.5"], "is not a whole number"),
    ("prov-nodes-text", "none", ["provision", "--nodes", "four"], "is not a whole number"),
    ("prov-nodes-empty", "none", ["provision", "--nodes="], "is not a whole number"),
    ("prov-nodes-over", "none", ["provision", "--nodes", "65"], "limit of 64"),
    ("prov-cpus-zero", "none", ["provision", "--cpus-per-node", "0"], "must be above 0"),
    ("prov-cpus-neg", "none", ["provision", "--cpus-per-node", "-1"], "must be above 0"),
    ("prov-cpus-text", "none", ["provision", "--cpus-per-node", "abc"], "is not a number"),
    ("prov-cpus-nan", "none", ["provision", "--cpus-per-node", "nan"], "cpus-per-node"),
    ("prov-cpus-inf", "none", ["provision", "--cpus-per-node", "inf"], "cpus-per-node"),
    ("prov-rate-word", "none", ["provision", "--bandwidth", "fast"], "is not a rate"),
    ("prov-rate-zero", "none", ["provision", "--bandwidth", "0mbit"], "is zero"),
    ("prov-rate-neg", "none", ["provision", "--bandwidth", "-5mbit"], "is not a rate"),
    ("prov-rate-unit", "none", ["provision", "--bandwidth", "10furlongs"], "is not a rate"),
    ("prov-rate-huge", "none", ["provision", "--bandwidth", "1e999gbit"], "is not a rate"),
    ("prov-subnet-public", "none", ["provision", "--subnet", "8.8.8.0/24"], "not a private range"),
    ("prov-subnet-wide", "none", ["provision", "--subnet", "10.0.0.0/8"], "prefix of /16 to /26"),
    ("prov-subnet-narrow", "none", ["provision", "--subnet", "10.213.7.0/30"], "/16 to /26"),
    ("prov-subnet-text", "none", ["provision", "--subnet", "abc"], "is not an IPv4 network"),
    ("prov-subnet-host", "none", ["provision", "--subnet", "10.213.7.1/24"], "host bits set"),
    ("prov-subnet-v6", "none", ["provision", "--subnet", "fd00::/64"], "must be IPv4"),
    ("prov-subnet-33", "none", ["provision", "--subnet", "10.0.0.0/33"], "subnet"),
    ("prov-name-upper", "none", ["provision", "--cluster", "Bad_Name"], "is not a valid name"),
    ("prov-name-empty", "none", ["provision", "--cluster="], "is not a valid name"),
    ("prov-name-long", "none", ["provision", "--cluster", "a" * 40], "is not a valid name"),
    ("prov-name-path", "none", ["provision", "--cluster", "../evil"], "is not a valid name"),
    ("prov-name-dash", "none", ["provision", "--cluster", "-x"], "is not a valid name"),
    ("prov-name-shell", "none", ["provision", "--cluster", "a;rm -rf x"], "is not a valid name"),
    ("prov-target", "none", ["provision", "--target", "moon"], "target: 'moon' is unknown"),
    ("prov-varfile-missing", "none", ["provision", "--target", "aws", "--var-file",
                                      "{dir}/nope.tfvars.json"], "does not exist"),
    ("prov-varfile-json", "none", ["provision", "--target", "aws", "--var-file",
                                   "{dir}/varfile.tfvars.json"], "cannot be parsed"),
    ("prov-varfile-hcl", "none", ["provision", "--target", "openstack", "--var-file",
                                  "{dir}/varfile3.tfvars"], "cannot be parsed"),
    ("prov-varfile-unknown", "none", ["provision", "--target", "aws", "--var-file",
                                      "{dir}/varfile2.tfvars.json"], "no_such_variable"),
    ("prov-aws-novars", "none", ["provision", "--target", "aws"], "needs variable 'region'"),
    ("prov-static-novars", "none", ["provision", "--target", "static"], "needs variable"),
    ("prov-static-user-option", "none", ["provision", "--target", "static", "--var-file",
                                         "{dir}/static-user.tfvars.json"],
     ("hosts entry 2: ssh_user '-oProxyCommand=false' is not a user name (it starts with '-', "
      "so ssh would read it as an option)", "give the login user")),
    ("prov-static-topuser-option", "none", ["provision", "--target", "static", "--var-file",
                                            "{dir}/static-topuser.tfvars.json"],
     ("static-topuser.tfvars.json: ssh_user '-oProxyCommand=false' is not a user name",)),
    ("prov-static-address-shell", "none", ["provision", "--target", "static", "--var-file",
                                           "{dir}/static-addr.tfvars.json"],
     "hosts entry 1: address '127.0.0.1;false' is not a host name or address (it holds ';')"),
    ("prov-static-name-shell", "none", ["provision", "--target", "static", "--var-file",
                                        "{dir}/static-name.tfvars.json"],
     "hosts entry 1: name '$(false)' is not a host name (it starts with '$')"),
    ("prov-static-bastion-option", "none", ["provision", "--target", "static", "--var-file",
                                            "{dir}/static-bastion.tfvars.json"],
     "bastion_ip '-oProxyCommand=false' is not a host name or address"),
    ("prov-aws-user", "none", ["provision", "--target", "aws", "--var-file",
                               "{dir}/aws-user.tfvars.json"],
     ("aws: var-file ", "ssh_user 'ubuntu@evil' is not a user name (it holds '@')")),
    ("prov-openstack-user", "none", ["provision", "--target", "openstack", "--var-file",
                                     "{dir}/openstack-user.tfvars.json"],
     ("openstack: var-file ", "ssh_user '-oProxyCommand=false' is not a user name")),
    # ---- destroy / status / check: names and unknown clusters
    ("destroy-unknown", "none", ["destroy", "--cluster", "nosuch"], "cluster 'nosuch' not found"),
    ("destroy-name", "none", ["destroy", "--cluster", "Bad_Name"], "is not a valid name"),
    ("destroy-path", "none", ["destroy", "--cluster", "../x"], "is not a valid name"),
    ("status-unknown", "local", ["status", "--cluster", "nosuch"], "not found (known: " + FAKE),
    ("status-name", "none", ["status", "--cluster", "Bad_Name"], "is not a valid name"),
    ("check-unknown", "none", ["check", "--cluster", "nosuch"], "not found"),
    ("check-name", "none", ["check", "--cluster", "a/b"], "is not a valid name"),
    # a cluster record edited on disk to hold an ssh option or a shell word: every command
    # that reads it refuses it, naming the record, the node and the field
    ("check-record-user", "static+evil-user", ["check"],
     (f"clusters/{FAKE}/cluster.json: node '{FAKE}-n1': ssh_user '-oProxyCommand=false' is "
      "not a user name", "put back what the var-file or the target gave")),
    ("status-record-address", "static+evil-address", ["status", "--cluster", FAKE],
     f"node '{FAKE}-n1': address '127.0.0.1 -oProxyCommand=false' is not a host name"),
    ("bench-record-bastion", "local+evil-bastion", ["bench", "--nodes", "1", "--batch-size",
                                                    "16"],
     f"node '{FAKE}-n1': bastion '-oProxyCommand=false' is not a host name or address"),
    ("status-record-port", "local+evil-port", ["status", "--cluster", FAKE],
     "ssh_port '22 -oProxyCommand=false' is not a port"),
    # ---- shape: rates, clusters, targets that cannot shape
    # invoke stage: its values are checked before any node is asked
    ("stage-name", "local", ["stage", "--cluster", FAKE, "--name", "Big_Set"],
     "--name 'Big_Set': a data set's name is 1-32 of a-z, 0-9 and -"),
    ("stage-to", "local", ["stage", "--cluster", FAKE, "--to", "s3"],
     "--to 's3': choose http (a web server on one node), nodes"),
    ("stage-images", "local", ["stage", "--cluster", FAKE, "--images", "0"],
     "--images '0': give 1 or more"),
    ("stage-port", "local", ["stage", "--cluster", FAKE, "--port", "80"],
     "--port '80': give 1024 or more"),
    ("stage-like", "local", ["stage", "--cluster", FAKE, "--like", "cifar"],
     "--like 'cifar': imagenet"),
    ("stage-from", "local", ["stage", "--cluster", FAKE, "--from-dir", "{dir}"],
     "not a directory of .tar shards"),
    ("stage-format", "local", ["stage", "--cluster", FAKE, "--format", "lmdb"],
     "--format 'lmdb': choose shards"),
    ("stage-folders-http", "local", ["stage", "--cluster", FAKE, "--format", "folders"],
     "--format folders: a web server and a node's own NFS server serve tar shards"),
    ("stage-folders-nfs-node", "local", ["stage", "--cluster", FAKE, "--format", "folders",
                                         "--to", "nfs", "--node", "n1"],
     "--format folders: a web server and a node's own NFS server serve tar shards"),
    ("stage-node", "local", ["stage", "--cluster", FAKE, "--node", "elsewhere"],
     "--node elsewhere: cluster"),
    ("stage-remove-unknown", "local", ["stage", "--cluster", FAKE, "--name", "none-here",
                                       "--remove"], "has no data set 'none-here'"),
    ("shape-unknown", "none", ["shape", "--cluster", "nosuch", "--bandwidth", "1gbit"],
     "not found"),
    ("shape-word", "local", ["shape", "--cluster", FAKE, "--bandwidth", "fast"], "is not a rate"),
    ("shape-zero", "local", ["shape", "--cluster", FAKE, "--bandwidth", "0mbit"], "is zero"),
    ("shape-neg", "local", ["shape", "--cluster", FAKE, "--bandwidth", "-1gbit"], "is not a rate"),
    ("shape-static", "static", ["shape", "--cluster", FAKE, "--bandwidth", "1gbit"],
     "is a static cluster"),
    # ---- bench: options
    ("profile-model", "none", ["profile", "--model", "resnet9"], "unknown model 'resnet9'"),
    ("profile-batch", "none", ["profile", "--batch-size", "0"], "--batch-size '0': give a whole"),
    ("profile-out", "none", ["profile", "--output", "/nonexistent/dir/p.json"],
     "directory /nonexistent/dir does not exist"),
    ("bench-accel-unknown", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                      "--accelerator", "v101"], "unknown accelerator 'v101'"),
    ("bench-accel-model", "local", ["bench", "--nodes", "1-2", "--batch-size", "32", "--model",
                                    "resnet20", "--accelerator", "v100"],
     "no v100 profile for resnet20 fp32"),
    ("bench-accel-other-model", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                          "--model", "resnet20", "--accelerator", "{dir}/r20.json"],
     "is for model resnet50, the sweep's is resnet20"),
    ("bench-accel-malformed", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                        "--accelerator", "{dir}/cut.json"], "not a JSON profile"),
    ("bench-accel-nolayers", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                       "--accelerator", "{dir}/nolayers.json"],
     "layers must be a non-empty list"),
    ("bench-accel-layout", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                     "--model", "resnet50", "--precision", "amp",
                                     "--accelerator", "h100"],
     "was timed in channels_last, the sweep's layout is contiguous: add --memory-format "
     "channels_last"),
    ("bench-accel-missing", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                      "--accelerator", "{dir}/none.json"], "no such profile"),
    ("bench-dilation-low", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                     "--accelerator", "v100", "--dilation", "0.5"],
     "is not a dilation factor; give a number >= 1"),
    ("bench-dilation-word", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                      "--accelerator", "v100", "--dilation", "fast"],
     "is not a dilation factor"),
    # emulated devices read real data too, from a set the nodes can read
    ("bench-accel-data", "local", ["bench", "--nodes", "1-2", "--batch-size", "32",
                                   "--accelerator", "v100", "--sweep", "{dir}/realdata.yml"],
     "--data /srv/imagenet: "),
    ("bench-unknown-cluster", "none", ["bench", "--cluster", "nosuch", "--nodes", "1",
                                       "--batch-size", "16"], "not found"),
    ("bench-cluster-name", "none", ["bench", "--cluster", "Bad_Name", "--nodes", "1",
                                    "--batch-size", "16"], "is not a valid name"),
    ("bench-nodes-beyond", "local", ["bench", "--nodes", "1-10", "--batch-size", "16"],
     "provision more"),
    ("bench-nodes-back", "local", ["bench", "--nodes", "3-1", "--batch-size", "16"],
     "runs backwards"),
    ("bench-nodes-zero", "local", ["bench", "--nodes", "0", "--batch-size", "16"],
     "below the minimum of 1"),
    ("bench-nodes-step0", "local", ["bench", "--nodes", "1-3:0", "--batch-size", "16"], "step"),
    ("bench-nodes-gap", "local", ["bench", "--nodes", "1,,2", "--batch-size", "16"],
     "is not a number or range"),
    ("bench-nodes-huge", "local", ["bench", "--nodes", "1-100000000", "--batch-size", "16"],
     "too many values"),
    ("bench-batch-zero", "local", ["bench", "--nodes", "1", "--batch-size", "0"], "batch"),
    ("bench-batch-neg", "local", ["bench", "--nodes", "1", "--batch-size", "-3"], "batch"),
    ("bench-batch-text", "local", ["bench", "--nodes", "1", "--batch-size", "abc"], "batch"),
    ("bench-steps-zero", "local", ["bench", "--nodes", "1", "--batch-size", "16", "--steps",
                                   "0"], "--steps: 0 is below the minimum of 1"),
    ("bench-steps-text", "local", ["bench", "--nodes", "1", "--batch-size", "16", "--steps",
                                   "abc"], "is not a whole number"),
    ("bench-repeats-zero", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                     "--repeats", "0"], "--repeats"),
    ("bench-ppn-zero", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                 "--procs-per-node", "0"], "--procs-per-node"),
    ("bench-model", "local", ["bench", "--nodes", "1", "--batch-size", "16", "--model",
                              "resnet9000"], "resnet9000"),
    ("bench-engine", "local", ["bench", "--nodes", "1", "--batch-size", "16", "--engine",
                               "mpi4ever"], "mpi4ever"),
    ("bench-precision", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                  "--precision", "fp64"], "unknown 'fp64'"),
    ("bench-amp-cpu", "local", ["bench", "--nodes", "1", "--batch-size", "16", "--precision",
                                "amp"], "needs GPUs"),
    ("bench-rate-word", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                  "--bandwidth", "native,fast"], "'fast' is not a rate"),
    ("bench-rate-mbps", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                  "--bandwidth", "100Mbps"], "write 100mbit"),
    ("bench-batch-huge", "local", ["bench", "--nodes", "1-2", "--batch-size", "32,100000",
                                   "--model", "resnet50"],
     "--batch-size 100000: resnet50 needs about"),
    ("bench-rate-zero", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                  "--bandwidth", "0mbit"], "is zero"),
    ("bench-data-relative", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                      "--data", "imagenet"],
     "--data: 'imagenet' must be synthetic, an absolute path on the nodes (e.g. /data/imagenet) or a shard URL"),
    # a fabric profile stands for a network on emulated links, never for real NICs
    ("bench-profile-on-real-hosts", "static+facts",
     ["bench", "--nodes", "1", "--batch-size", "16", "--fabric-profile", "ethernet-tcp"],
     ("--fabric-profile ethernet-tcp", "use --fabric-profile ideal")),
    # the path between a node's GPUs: a known name or a rate, for emulated GPUs that share a
    # node whose loopback is its own
    ("bench-intra-word", "local", ["bench", "--nodes", "1", "--batch-size", "32", "--accelerator",
                                   "v100", "--procs-per-node", "2", "--intra-link", "pcie9"],
     "--intra-link: 'pcie9' is neither a path scalelab knows (pcie3, pcie4, nvlink-v100)"),
    ("bench-intra-real", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                   "--procs-per-node", "2", "--intra-link", "pcie3"],
     "is emulated for emulated GPUs only; add --accelerator"),
    ("bench-intra-ppn1", "local", ["bench", "--nodes", "1", "--batch-size", "32", "--accelerator",
                                   "v100", "--intra-link", "pcie3"],
     "with one rank per node no two ranks share a node; add --procs-per-node 2"),
    ("bench-intra-one-node", "local+one",
     ["bench", "--nodes", "1", "--batch-size", "32", "--accelerator", "v100",
      "--procs-per-node", "2", "--intra-link", "pcie3"],
     "is measured between two nodes and cluster "),
    ("bench-intra-real-hosts", "static+facts",
     ["bench", "--nodes", "1", "--batch-size", "32", "--accelerator", "v100",
      "--procs-per-node", "2", "--intra-link", "pcie3"],
     "nodes share a loopback with their host, which scalelab does not shape"),
    # parameter servers: dedicated ones take nodes of their own; a setting without the engine
    ("bench-ps-too-few-nodes", "local", ["bench", "--engine", "ps", "--nodes", "1-2",
                                         "--batch-size", "16", "--ps-servers", "1"],
     f"--ps-servers 1: dedicated servers take nodes of their own after a run's, so --nodes 1,2 "
     f"needs 3 and cluster {FAKE} has 2; provision more with invoke provision --target local "
     f"--cluster {FAKE} --nodes 3 or use --nodes 1"),
    ("bench-ps-slurm-two-workers-a-node", "local+wide",
     ["bench", "--engine", "ps", "--nodes", "1", "--batch-size", "16", "--launcher", "slurm",
      "--ps-servers", "1", "--procs-per-node", "2"],
     "--engine ps --launcher slurm: a job step starts as many tasks on every node, and a server "
     "node runs one server, so runs with dedicated servers take --procs-per-node 1"),
    ("bench-ps-setting-without-ps", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                              "--ps-servers", "2"],
     "--ps-servers is a setting of --engine ps; this sweep's engine is ddp"),
    ("bench-checkpoint-ps", "local", ["bench", "--engine", "ps", "--nodes", "1", "--batch-size",
                                      "16", "--checkpoint-every", "2"],
     "--checkpoint-every is a setting of --engine ddp or horovod; this sweep's engine is ps"),
    ("bench-checkpoint-slurm-login-only", "slurm", ["bench", "--nodes", "1", "--batch-size",
                                                    "16", "--checkpoint-every", "2"],
     f"--checkpoint-to nodes: cluster {FAKE} is reached only through its Slurm login host, "
     "which removes a run's checkpoints and reaches no node's own disk or server; give "
     "--checkpoint-to a directory of the shared file system the login host and the nodes see"),
    ("bench-checkpoint-to-relative", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                               "--checkpoint-every", "2", "--checkpoint-to",
                                               "ckpt"],
     "--checkpoint-to: 'ckpt' must be nodes (each node's own disk), an absolute path"),
    ("bench-checkpoint-served-kept", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                               "--checkpoint-every", "2", "--checkpoint-to",
                                               "nfs@n1", "--keep-checkpoints"],
     "--keep-checkpoints: the NFS server of --checkpoint-to nfs@n1 ends with the sweep"),
    ("bench-checkpoint-mode-alone", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                              "--checkpoint-mode", "async"],
     "--checkpoint-mode applies to runs that save checkpoints; add --checkpoint-every N"),
    ("bench-failure-ps", "local", ["bench", "--engine", "ps", "--nodes", "2",
                                   "--batch-size", "16", "--inject-failure", "5"],
     "--inject-failure is a setting of --engine ddp or horovod; this sweep's engine is ps"),
    ("bench-failure-horovod-one-node", "local", ["bench", "--engine", "horovod", "--nodes",
                                                 "1-2", "--batch-size", "16",
                                                 "--inject-failure", "5"],
     "--inject-failure 5: Horovod's elastic driver brings a run back with its other nodes and "
     "needs 2 or more, and the sweep has a 1-node run; start --nodes at 2, or use --engine ddp"),
    ("bench-checkpoint-served-slurm-login-only", "slurm",
     ["bench", "--nodes", "1", "--batch-size", "16", "--checkpoint-every", "2",
      "--checkpoint-to", "nfs@n1"],
     f"--checkpoint-to nfs@n1: cluster {FAKE} is reached only through its Slurm login host"),
    ("bench-failure-container", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                          "--runtime", "container", "--inject-failure", "5"],
     "--inject-failure: scalelab kills a node's ranks by their pids on the host, and ranks in "
     "containers are not restarted yet; use --runtime host"),
    ("bench-failure-past-the-end", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                             "--steps", "10", "--inject-failure", "off,10"],
     "--inject-failure 10: the runs have 10 timed steps, and a failure needs steps after it "
     "to recover into; choose a step below 10, or raise --steps"),
    ("bench-failure-no-such-node", "local", ["bench", "--nodes", "1-2", "--batch-size", "16",
                                             "--inject-failure", "5@1"],
     "--inject-failure 5@1: node 1 is past the 1 node(s) of the smallest run (0 is the "
     "first); choose a node below 1, or leave @1 out (a node at random)"),
    ("bench-failure-word", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                     "--inject-failure", "soon"],
     "--inject-failure: 'soon' must be off, a timed step (e.g. 12: one node's ranks killed "
     "after step 12, the node at random), a period in seconds (e.g. 30s"),
    ("bench-failure-period-word", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                            "--inject-failure", "30m"],
     "--inject-failure: '30m' must be off, a timed step"),
    ("bench-ps-placement-word", "local", ["bench", "--engine", "ps", "--nodes", "1",
                                          "--batch-size", "16", "--ps-placement", "nearby"],
     "nearby"),
    ("bench-unconfigured", "static", ["bench", "--nodes", "1", "--batch-size", "16",
                                      "--bandwidth", "1gbit"],
     "has not been configured (no facts recorded for node "),
    ("configure-no-bundle", "static", ["configure", "--cluster", FAKE, "--bundle",
                                       "{dir}/no-such-bundle"],
     "bundle"),
    # refused before any host is touched: this cluster's hosts are a closed port, so a probe
    # first would fail on them instead
    ("configure-bundle-lacks", "static", ["configure", "--cluster", FAKE, "--bundle",
                                          "{dir}/emptybundle"],
     ("emptybundle lacks a deb for ", "rebuild it with invoke bundle")),
    ("bundle-no-wheel-dir", "none", ["bundle", "--out", "{dir}/b", "--wheel-dir",
                                     "{dir}/no-such-dir"], "does not exist; build Horovod first"),
    ("check-links-seconds", "static", ["check", "--links", "--seconds", "0"], "seconds"),
    # ---- bench: sweep files and sweep ids
    ("sweep-missing", "local", ["bench", "--sweep", "no-such-sweep"], "not found"),
    ("sweep-dir", "local", ["bench", "--sweep", "{dir}"], "not found"),
    *[(f"sweep-{name.split('.')[0]}", "local", ["bench", "--sweep", f"{{dir}}/{name}"], msg)
      for name, msg in [
          ("notyaml.yml", "not valid YAML"), ("list.yml", "must be a mapping"),
          ("empty.yml", "must be a mapping"), ("dup.yml", "key 'nodes' given twice"),
          ("typo.yml", "did you mean 'batch_size'?"), ("noaxes.yml", "gives no nodes"),
          ("model.yml", "unknown 'resnet9'"), ("engine.yml", "unknown 'mpi'"),
          ("data.yml", "an absolute path on the nodes"), ("timeout.yml", "positive number of seconds"),
          ("nan.yml", "positive number of seconds"), ("sizes.yml", "1 byte or more"),
          ("sizes2.yml", "allreduce_sizes"), ("iters.yml", "allreduce_iters"),
          ("image.yml", "below the minimum of 8"), ("boolint.yml", "is not a whole number"),
          ("flag.yml", "is not true or false"), ("emptylist.yml", "empty list"),
          ("huge.yml", "too many values"), ("nested.yml", "not a nested structure"),
          ("mapping.yml", "not a nested structure"), ("pyobj.yml", "not valid YAML"),
          ("bomb.yml", "not a nested structure"), ("binary.yml", "not a UTF-8 text file"),
          ("secretkey.yml", "unknown key (not shown")]],
    ("resume-missing", "none", ["bench", "--resume", "20990101-000000-dead"], "not found"),
    ("resume-path", "none", ["bench", "--resume", "../x"], "is not valid"),
    ("resume-hidden", "none", ["bench", "--resume", ".hidden"], "is not valid"),
    ("resume-none", "none", ["bench", "--resume", "latest"], "no latest sweep"),
    ("resume-damaged", "damaged", ["bench", "--resume", "s1"], "runs.jsonl:2: not a run record"),
    ("resume-badmeta", "badmeta", ["bench", "--resume", "s1"], "cannot read the manifest"),
    # ---- report
    ("report-unknown", "none", ["report", "--sweep", "nosuch"], "not found"),
    ("report-path", "none", ["report", "--sweep", "../etc"], "is not a sweep directory"),
    ("report-latest-none", "none", ["report", "--sweep", "latest"], "no latest sweep"),
    ("report-compare-one", "sweep", ["report", "--compare", "s1"], "two or more sweeps"),
    ("report-compare-twice", "sweep", ["report", "--compare", "s1,s1"], "the same sweep twice"),
    ("report-compare-unknown", "sweep", ["report", "--compare", "s1,nosuch"], "not found"),
    ("report-out-file", "sweep", ["report", "--sweep", "s1", "--out", "/etc/hostname"],
     "cannot write the report to /etc/hostname"),
    ("report-out-proc", "sweep", ["report", "--sweep", "s1", "--out", "/proc/nope"],
     "cannot write the report to /proc/nope"),
    ("report-all-failed", "failed", ["report", "--sweep", "s1"], "training runs of sweep 's1' failed"),
    ("report-no-runs", "norun", ["report", "--sweep", "s1"], "has no runs recorded yet"),
    ("report-mtbf-word", "sweep", ["report", "--sweep", "s1", "--node-mtbf-hours", "often"],
     "--node-mtbf-hours 'often' must be a number of hours above 0, e.g. 5000"),
    ("report-mtbf-zero", "sweep", ["report", "--sweep", "s1", "--node-mtbf-hours", "0"],
     "--node-mtbf-hours '0' must be a number of hours above 0"),
    ("report-damaged", "damaged", ["report", "--sweep", "s1"], "not a run record"),
    ("report-badmeta", "badmeta", ["report", "--sweep", "s1"], "sweep.json"),
    # ---- configure (checked once the task is wired into tasks.py)
    ("configure-unknown", "none", ["configure", "--cluster", "nosuch"], "not found"),
    ("configure-name", "none", ["configure", "--cluster", "Bad_Name"], "is not a valid name"),
    ("bench-price-neg", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                  "--price-per-node-hour", "-2"], "must be a number above 0"),
    ("bench-price-word", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                   "--price-per-node-hour", "cheap"], "must be a number above 0"),
    # ---- the training image and ranks in containers
    ("image-no-wheel-dir", "none", ["image", "--wheel-dir", "{dir}/no-such-wheels"],
     "does not exist"),
    ("configure-no-image", "static", ["configure", "--cluster", FAKE, "--image",
                                      "{dir}/no-such-image.tar"],
     "does not exist; build one with invoke image"),
    ("bench-runtime-word", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                     "--runtime", "docker"], "runtime"),
    ("bench-container-noimage", "local", ["bench", "--nodes", "1", "--batch-size", "16",
                                          "--runtime", "container"],
     "has no training image; build one with invoke image"),
    ("bench-container-nohorovod", "local+image", ["bench", "--nodes", "1", "--batch-size", "16",
                                                  "--engine", "horovod", "--runtime",
                                                  "container"],
     "lacks horovod, which these runs need"),
    ("bench-container-nodocker", "local+image", ["bench", "--nodes", "1", "--batch-size", "16",
                                                 "--runtime", "container"],
     "has no Docker engine that root can use"),
    ("bench-container-slurm", "local+image", ["bench", "--nodes", "1", "--batch-size", "16",
                                              "--runtime", "container", "--launcher", "slurm"],
     "Slurm has no container support (no oci.conf beside slurm.conf)"),
    ("bench-container-notorch", "local+notorch", ["bench", "--nodes", "1", "--batch-size", "16",
                                                  "--runtime", "container"],
     "lacks torch, which these runs need"),
    # an image of other workloads than the checkout's; a node whose Docker lacks the image
    ("bench-container-oldworkloads", "local+oldworkloads",
     ["bench", "--nodes", "1", "--batch-size", "16", "--runtime", "container"],
     "holds other workloads than this checkout's bench/workloads"),
    ("bench-container-notheld", "local+notheld",
     ["bench", "--nodes", "1", "--batch-size", "16", "--runtime", "container"],
     (f"node {FAKE}-n0 does not hold image scalelab/train:0123456789abcdef",
      f"invoke configure --cluster {FAKE} --image")),
    # a GPU run on nodes whose Docker holds the image but has no nvidia runtime
    ("bench-container-nonvidia", "local+gpu", ["bench", "--nodes", "1", "--batch-size", "16",
                                               "--device", "cuda", "--runtime", "container"],
     (f"node {FAKE}-n0's Docker has no nvidia runtime", "NVIDIA container toolkit")),
    # ---- demo: what fails before anything is provisioned
    ("demo-sweep", "none", ["demo", "--sweep", "no-such-sweep"], "not found"),
    ("demo-sweep-file", "none", ["demo", "--sweep", "{dir}/dup.yml"], "given twice"),
    ("demo-nodes", "none", ["demo", "--nodes", "0"], "nodes: 0 must be 1 or more"),
]

NEEDS_CLUSTER_OPTION = ("bench", "check", "shape")


def _fake_cluster(state: Path, target: str) -> None:
    """A cluster record of the given target (local+image: a local one whose record names a
    training image without Horovod, on nodes without a Docker engine; local+notorch: an image
    without torch; local+wide: nodes of two CPUs; local+gpu: GPU nodes whose Docker holds a
    complete image but has only runc as its runtime; local+oldworkloads: an image of other
    workloads; local+notheld: nodes whose Docker does not hold the image; local+one: a local
    one of one node; static+facts: a configured static one; slurm: one reached only through
    its Slurm login host)."""
    target, _, extra = target.partition("+")
    cdir = state / "clusters" / FAKE
    cdir.mkdir(parents=True, mode=0o700)
    nodes = [{"name": f"{FAKE}-n{i}", "address": "127.0.0.1", "private_address": "127.0.0.1",
              "role": "head" if i == 0 else "worker", "target": target, "ssh_user": "root",
              "ssh_port": 9, "ssh_key": str(cdir / "id_ed25519"), "cpus": 1.0, "gpus": 0,
              "iface": "eth0" if target == "local" else None, "extra": {}}
             for i in range(1 if extra == "one" else 2)]
    if extra == "wide":  # nodes of two CPUs
        for n in nodes:
            n["cpus"] = 2.0
    rec = {"name": FAKE, "target": target, "nodes": nodes, "pids": {},
           "known_hosts": str(cdir / "known_hosts"), "ssh_key": str(cdir / "id_ed25519"),
           "subnet": "10.213.250.0/24", "bandwidth_mbit": None, "cpus_per_node": 1.0}
    if target == "slurm":  # reached only through its login host (sinfo gave its facts)
        rec["login"] = {**nodes[0], "name": f"{FAKE}-login", "role": "login"}
        rec["partition"] = "batch"
        for n in nodes:
            n["facts"] = {"cores": 1, "memory_mb": 4096, "gpus": 0, "gpu_model": "",
                          "python": "/opt/venv/bin/python", "workdir": "/shared/scalelab",
                          "torch": "2.13.0+cpu", "source": "sinfo"}
    if target == "local" or extra == "facts":
        from scalelab.cluster.targets.local import local_facts

        for n in nodes:
            n["facts"] = local_facts(n)
    if extra and extra not in ("facts", "one", "wide") and not extra.startswith("evil-"):
        contents = {"image": {"torch": "2.13.0+cpu", "horovod": None},
                    "notorch": {"torch": None, "horovod": "0.28.1"},
                    "gpu": {"torch": "2.13.0+cu128", "horovod": "0.28.1"},
                    "oldworkloads": {"torch": "2.13.0+cpu", "horovod": "0.28.1"},
                    "notheld": {"torch": "2.13.0+cpu", "horovod": "0.28.1"}}[extra]
        rec["image"] = {"id": "sha256:" + "1" * 64, "tag": "scalelab/train:0123456789abcdef",
                        "contents": contents}
    if extra.startswith("evil-"):  # the second node's record, edited on disk
        nodes[1].update({"evil-user": {"ssh_user": "-oProxyCommand=false"},
                         "evil-address": {"address": "127.0.0.1 -oProxyCommand=false"},
                         "evil-bastion": {"bastion": "root@-oProxyCommand=false"},
                         "evil-port": {"ssh_port": "22 -oProxyCommand=false"}}[extra])
    if extra == "oldworkloads":
        rec["image"]["workloads"] = "0" * 16  # not this checkout's
    if extra == "notheld":
        for n in nodes:
            n["facts"].update({"docker": "20.10.24", "images": {}})
    if extra == "gpu":
        for n in nodes:
            n["gpus"] = 1
            n["facts"].update({"gpus": 1, "gpu_model": "NVIDIA H100", "gpu_memory_mb": 81559,
                               "docker": "20.10.24", "docker_runtimes": ["io.containerd.runc.v2",
                                                                         "runc"],
                               "images": {rec["image"]["tag"]: rec["image"]["id"]}})
    (cdir / "cluster.json").write_text(json.dumps(rec))


def _sweep(reports: Path, setup: str) -> None:
    from scalelab.results import synthetic

    kw = {"repeats": 1, "batch_sizes": (16,), "bandwidths": (1000.0,)}
    if setup == "failed":
        synthetic.synthetic_sweep(reports, "s1", nodes=(1,), failed=["boom"], **kw)
        return
    d = synthetic.synthetic_sweep(reports, "s1", nodes=(1, 2), **kw)
    os.symlink("s1", reports / "latest")
    runs = d / "runs.jsonl"
    if setup == "norun":
        runs.write_text("")
    elif setup == "damaged":
        lines = runs.read_text().splitlines()
        lines[1] = '{"run_id": "torn'
        runs.write_text("\n".join(lines) + "\n")
    elif setup == "badmeta":
        (d / "sweep.json").write_text("{not json")


@functools.cache
def _tasks() -> frozenset[str]:
    listing = subprocess.run([sys.executable, "-m", "invoke", "--list", "--list-format", "json"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return frozenset(t["name"] for t in json.loads(listing.stdout)["tasks"])


def _tree(base: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(base)), p.lstat().st_size, p.lstat().st_mtime_ns)
                  for p in base.rglob("*"))


def _params():
    from conftest import needs_root

    for c in CASES:
        # the subnet is checked against the host's routes, after the root check
        marks = [needs_root] if c[0].startswith("prov-subnet") else []
        yield pytest.param(*c, id=c[0], marks=marks)


@pytest.mark.parametrize("case, setup, args, message", list(_params()))
def test_bad_input(case, setup, args, message, tmp_path):
    assert args[0] in _tasks(), f"no {args[0]} task in tasks.py"
    files = tmp_path / "files"
    files.mkdir()
    for name, text in SWEEP_FILES.items():
        (files / name).parent.mkdir(parents=True, exist_ok=True)
        (files / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    base = tmp_path / "w"
    state, inv, reports = base / "state", base / "inv", base / "reports"
    for d in (state, inv, reports):
        d.mkdir(parents=True)
    if setup.partition("+")[0] in ("local", "static", "slurm"):
        _fake_cluster(state, setup)
    elif setup != "none":
        _sweep(reports, setup)
    argv = [a.replace("{dir}", str(files)) for a in args]
    task = argv[0]
    name = None
    if task == "provision" and not any(a.startswith("--cluster") for a in argv):
        name = unique_name("f")  # never "demo" or anyone's real cluster
        argv += ["--cluster", name]
    elif task in NEEDS_CLUSTER_OPTION and "--cluster" not in argv and \
            setup.partition("+")[0] in ("local", "static", "slurm"):
        argv += ["--cluster", FAKE]
    env = {**os.environ, "SCALELAB_HOME": str(state), "SCALELAB_INVENTORIES": str(inv),
           "SCALELAB_REPORTS": str(reports), "SCALELAB_LOG": "WARNING"}
    before = _tree(base)
    try:
        proc = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=90)
    finally:
        _undo_if_created(state, env)
    err = proc.stderr.strip()
    assert proc.returncode != 0, f"accepted: {argv}\n{proc.stdout[-500:]}"
    assert "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    for part in message if isinstance(message, tuple) else (message,):
        assert part in err, err
    assert _tree(base) == before, "something was written"
    if name is not None:
        from scalelab.cluster.targets.localhost import leftovers

        left = leftovers(name)
        assert left["netns"] == [] and left["links"] == [] and left["cgroups"] == []
    ledger("bad_input", case)


def _undo_if_created(state: Path, env: dict) -> None:
    """A safety net: if a case ever provisioned a cluster, destroy it (by its record)."""
    clusters = state / "clusters"
    if not clusters.is_dir():
        return
    for c in clusters.iterdir():
        if c.name != FAKE and (c / "cluster.json").exists():
            subprocess.run([sys.executable, "-m", "invoke", "destroy", "--cluster", c.name],
                           cwd=ROOT, env=env, capture_output=True, timeout=120)


def test_every_task_has_bad_input_cases():
    covered = {c[2][0] for c in CASES}
    # lint and test take no values to get wrong
    wanted = _tasks() - {"lint", "test"}
    assert wanted <= covered, f"tasks without a bad-input case: {sorted(wanted - covered)}"


# ------------------------------------------------------------------ sweep files, any bytes

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300),
                 st.builds(lambda k, v: f"{k}: {v}\n", st.sampled_from(
                     ["nodes", "batch_size", "bandwidth", "model", "steps", "timeout_s",
                      "allreduce_sizes", "data", "description", "repeats"]),
                     st.text(max_size=40))))
def test_any_sweep_file_is_a_spec_or_one_input_error(tmp_path_factory, content):
    from scalelab.sweep import sweepfile

    path = tmp_path_factory.mktemp("anyfile") / "s.yml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    try:
        sweepfile.load_sweep_file(path)
    except InputError as exc:  # anything else (a traceback for the user) fails the test
        assert "\n" not in str(exc), str(exc)
        ledger("bad_input_generated", "sweep-file")


@pytest.mark.parametrize(("change", "says"), [
    ({"engine": "horovod"}, "runs DDP only"),
    ({"procs_per_node": 2}, "starts one task a node in each step"),
    ({"device": "cuda"}, "carries no NVIDIA hook yet"),
    ({"data": "/data/imagenet"}, "reads synthetic data only"),
    ({"user": "ubuntu"}, "Slurm starts runc as the job's user, ubuntu"),
    ({"twins": True}, "two nodes share the hostname gpu"),
    ({"no_oci": True}, "Slurm has no container support"),
    ({}, "has no OCI bundle of image"),
])
def test_what_slurms_containers_cannot_run_is_refused(change, says):
    """--runtime container --launcher slurm: Slurm's OCI support (22.05) runs one task a node
    as the job's user, no horovodrun, no GPUs or data in scalelab's bundle; each node needs
    Slurm's oci.conf, the bundle, and a hostname of its own (a rank finds its place by it)."""
    from types import SimpleNamespace as R

    from scalelab.cluster.nodes import Node
    from scalelab.core.errors import InputError
    from scalelab.run.admission import check_slurm_containers

    img = {"id": "sha256:" + "ab" * 32, "tag": "scalelab/train:k", "archive": "/i.tar"}
    def node(i: int) -> Node:
        return Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "head", "static",
                    facts={"slurm_oci": not change.get("no_oci"),
                           "oci_bundles": ["/opt/scalelab/oci/other"],
                           "user": change.get("user", "root"),
                           "hostname": "gpu.lab" if change.get("twins") else f"gpu{i}.lab"})

    params = {"engine": "ddp", "procs_per_node": 1, "data": "synthetic",
              **{k: v for k, v in change.items() if k in ("engine", "procs_per_node", "data")}}
    with pytest.raises(InputError, match=says):
        check_slurm_containers("c", img, [R(kind="train", params=params)], [node(0), node(1)],
                               cuda=change.get("device") == "cuda")


def test_containers_under_slurm_on_a_cluster_scalelab_does_not_configure_name_the_real_gap():
    """Before the image check, whose fix (invoke configure --image) such a cluster refuses."""
    from types import SimpleNamespace as R

    from scalelab.core.errors import InputError
    from scalelab.run.admission import check_container_runtime

    runs = [R(kind="train", params={"engine": "ddp", "procs_per_node": 1, "nodes": 1})]
    with pytest.raises(InputError, match="is not configured by scalelab; use --runtime host"):
        check_container_runtime("hpc", {"target": "slurm", "nodes": []},
                                R(launcher="slurm"), runs, [])

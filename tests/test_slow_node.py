"""A slow node, for real: three emulated nodes, one given a smaller CPU share than the others,
a sweep run on them as a user would, and the report naming that node as the slow one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import invoke, needs_root, needs_sshd

from scalelab.cluster.targets import localhost
from scalelab.cluster.targets.localhost import CpuCgroup

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]


def test_the_report_names_the_node_with_less_cpu(local_cluster, tmp_path):
    # 3 x 0.6 cores fit the 2-core host; node 2 then gets 0.4: its ranks compute ~1.5x longer
    lc = local_cluster(3, cpus_per_node=0.6)
    slow = localhost.node_name(lc.name, 2)
    CpuCgroup.for_node(lc.name, slow).set_quota(0.4)
    # and a slow NIC on the same node, found by check --links before the sweep (which exits
    # 1 for it) and kept with the sweep
    lc._shape_node(2, 100.0)
    proc = invoke("check", "--cluster", lc.name, "--links", timeout=300)
    assert proc.returncode == 1 and "2 of 3 pairs are slow" in proc.stderr, proc.stderr
    # 4 repeats: 9 run-to-run differences per layout, enough (stragglers.MIN_SAMPLES) to take
    # the noise from the runs, where the slow rank's steady excess cancels out; with 3 the
    # noise falls back to the spread over all ranks, which a loaded host can widen past 50 %
    sweep = tmp_path / "slow.yml"
    sweep.write_text("model: resnet20\nengine: ddp\nnodes: [3]\nbatch_size: [16]\n"
                     "bandwidth: native\nrepeats: 4\nsteps: 10\nwarmup: 2\n"
                     "allreduce_probe: false\nnetprobe: false\ntimeout_s: 300\n")
    proc = invoke("bench", "--cluster", lc.name, "--sweep", str(sweep), timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page_path = next(Path(line.split("report: ", 1)[1]) for line in proc.stdout.splitlines()
                     if line.startswith("report: "))
    page = page_path.read_text()
    section = page.split('id="slow-ranks"', 1)[1].split("<h2", 1)[0]
    named = set(re.findall(rf"<td>({re.escape(lc.name)}-n\d+)</td>", section))
    assert named == {slow}, (named, re.sub(r"<[^>]+>", " ", section)[:3000])
    assert f"Node {slow} was slow in" in page
    # every pair's rate on the same page, the slow node's pairs flagged and no other
    table = section.split('id="link-pairs"', 1)[1]
    rows = re.findall(r"<tr><td>([^<]+)</td>.*?</tr>", table)
    flagged = re.findall(r"<tr><td>([^<]+)</td>(?:<td[^>]*>[^<]*</td>)*<td>SLOW</td></tr>",
                         table)
    assert len(rows) == 3, table[:2000]
    assert sorted(flagged) == sorted(r for r in rows if slow in r) and len(flagged) == 2, \
        table[:2000]
    assert os.environ.get("SCALELAB_REPORTS") and str(page_path).startswith(
        os.environ["SCALELAB_REPORTS"])

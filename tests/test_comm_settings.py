"""Communication settings as a sweep axis, for real: two DDP bucket sizes at two link rates on
two emulated nodes, and the report naming, per rate, the bucket size that trained faster."""

from __future__ import annotations

import csv
import html
import re
from pathlib import Path

import pytest
from conftest import invoke, needs_root, needs_sshd

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]


def test_the_report_names_the_faster_bucket_size_per_rate(local_cluster, tmp_path):
    lc = local_cluster(2, cpus_per_node=0.9)
    sweep = tmp_path / "buckets.yml"
    sweep.write_text("model: resnet20\nengine: ddp\nnodes: [1, 2]\nbatch_size: [16]\n"
                     "bandwidth: [100mbit, 1gbit]\nbucket_cap_mb: [1, 25]\nrepeats: 1\n"
                     "steps: 10\nwarmup: 2\nallreduce_probe: false\nnetprobe: false\n"
                     "timeout_s: 300\n")
    proc = invoke("bench", "--cluster", lc.name, "--sweep", str(sweep), timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = next(Path(line.split("results: ", 1)[1]) for line in proc.stdout.splitlines()
                   if line.startswith("results: "))
    with open(results) as fh:
        rows = [r for r in csv.DictReader(fh) if r["nodes"] == "2"]
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), rows
    # the settings reached the ranks: two run ids per rate, by bucket size
    assert {r["run_id"].split("-")[-2] for r in rows} == {"bk1", "bk25"}
    page = (results.parent / "index.html").read_text()
    named = re.findall(r'<li class="best-setting">(.*?)</li>', page)
    assert len(named) == 2, named  # one per rate, at 2 ranks
    for rate, mbit in (("100mbit", "100"), ("1gbit", "1000")):
        line = html.unescape(next(n for n in named if n.startswith(rate)))
        faster = max((r for r in rows if float(r["bandwidth_mbit"]) == float(mbit)),
                      key=lambda r: float(r["images_per_sec"]))
        size = faster["run_id"].split("-")[-2][2:]
        assert f"best measured setting bucket {size} MB" in line, (line, faster["run_id"])
    # and the two settings are two series, never averaged together: per rate, a row of the
    # scaling table at 2 ranks for each, its own images/s
    table = page.split('<table class="scaling">', 1)[1].split("</table>", 1)[0]
    head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table.split("</thead>")[0])]
    cells = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in
              re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
             for tr in re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1], re.S)]
    at2 = [dict(zip(head, c, strict=True)) for c in cells]
    at2 = [r for r in at2 if r["world size"] == "2"]
    assert sorted((r["link"], r["settings"]) for r in at2) == [
        ("100mbit", ""), ("100mbit", "bucket 1 MB"), ("1gbit", ""), ("1gbit", "bucket 1 MB")]

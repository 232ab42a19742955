"""The HTML report: built from a generated sweep, then opened in real headless Chromium.

Chromium is driven over the DevTools protocol on --remote-debugging-pipe (file descriptors 3
and 4, NUL-terminated JSON), which needs nothing beyond the standard library: no chromedriver,
no websocket client, no port on the network.
"""

from __future__ import annotations

import base64
import csv
import html
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from scalelab import report
from scalelab.core.errors import ScalelabError
from scalelab.results import synthetic

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium; bootstrap.sh does)")
XSS = "RuntimeError: rank 3 lost <script>alert(1)</script> & gave up"


# ------------------------------------------------------------------------------ a tiny CDP client


class Chromium:
    """Headless Chromium under our control, spoken to over the DevTools pipe."""

    def __init__(self, workdir: Path, width: int = 1280, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()

        def wire() -> None:  # runs in the child before exec: put the pipe ends on fds 3 and 4
            a, b = os.dup(to_child), os.dup(from_child)  # os.pipe() may have returned 3 or 4
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.stderr = open(workdir / "chromium-stderr.log", "wb")  # noqa: SIM115
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--disable-dev-shm-usage", f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe", f"--window-size={width},{height}"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.stderr,
                                     stderr=self.stderr, preexec_fn=wire, close_fds=False)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._id += 1
        msg: dict = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = 60.0) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method and ev.get("sessionId") == session:
                return self.events.pop(i)
        end = time.monotonic() + timeout
        while True:
            ev = self._read(max(end - time.monotonic(), 0.01))
            if ev.get("method") == method and ev.get("sessionId") == session:
                return ev
            self.events.append(ev)

    def _read(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer over the DevTools pipe")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe; see chromium-stderr.log")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, path: Path, screenshot: Path | None = None) -> dict:
        """Load a page; return its images, script count, text and every console error."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sess = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        sess = sess["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(method, session=sess)
        self.send("Page.navigate", {"url": path.resolve().as_uri()}, session=sess)
        self.wait_event("Page.loadEventFired", sess)
        expr = ("JSON.stringify({images: Array.from(document.images).map("
                "i => ({complete: i.complete, width: i.naturalWidth, alt: i.alt})),"
                " scripts: document.scripts.length, text: document.body.innerText,"
                " resources: performance.getEntriesByType('resource').map(r => r.name),"
                " width: document.documentElement.scrollWidth, viewport: window.innerWidth,"
                " tables: Array.from(document.querySelectorAll('table')).map(t => ({"
                "cls: t.className, width: t.scrollWidth, box: t.parentElement.clientWidth}))})")
        got = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                        session=sess)
        info = json.loads(got["result"]["value"])
        if screenshot is not None:
            size = self.send("Page.getLayoutMetrics", session=sess)["cssContentSize"]
            shot = self.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size["width"],
                         "height": min(size["height"], 16000), "scale": 1}}, session=sess)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors = []
        for ev in [e for e in self.events if e.get("sessionId") == sess]:
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append(f"{d.get('text', '')} {d.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(json.dumps(p.get("args")))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text", "error"))
        self.events = [e for e in self.events if e.get("sessionId") != sess]
        self.send("Target.closeTarget", {"targetId": target})
        info["errors"] = errors
        return info

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # only the browser this fixture started, by its own handle
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        self.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium not installed (apt-get install chromium; bootstrap.sh does)")
    b = Chromium(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


# ------------------------------------------------------------------------------ fixture sweeps


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    """A reports root with realistic synthetic sweeps: nodes 1-4, 3 batch sizes, 2 links,
    3 repeats, one failed run whose error holds a script tag, two planned runs missing."""
    root = tmp_path_factory.mktemp("reports")
    synthetic.synthetic_sweep(root, "20261120-0900-lab", bandwidths=(1000.0, 10000.0),
                            batch_sizes=(16, 32, 64), nodes=(1, 2, 3, 4), repeats=3,
                            failed=[XSS], missing=2)
    synthetic.synthetic_sweep(root, "20261121-0900-fast", bandwidths=(10000.0,), seed=4,
                            target="aws", cluster="lab-b")
    os.symlink("20261120-0900-lab", root / "latest")
    return root


@pytest.fixture(scope="module")
def built(reports) -> Path:
    return report.build("latest", root=reports)[0]


def test_report_is_one_self_contained_page(built, reports):
    assert built == reports / "20261120-0900-lab" / "index.html"
    page = built.read_text()
    assert "<script" not in page.lower()  # the page has no script at all ...
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; gave up" in page  # ... the error is text
    assert "default-src 'none'" in page  # and the CSP forbids any that slipped in
    # nothing external: every src is a data: image, no stylesheet or font links
    assert re.findall(r'src="(?!data:image/png;base64,)', page) == []
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert len(re.findall(r"<img ", page)) == 6
    assert (reports / "20261120-0900-lab" / "results.csv").exists()


def test_report_says_what_it_shows(built):
    page = built.read_text()
    for text in ("SYNTHETIC DATA", "Partial sweep", "2 of 78 planned runs have no record",
                 "train-n04-p1-b064-bw10000-r1", "Total throughput vs world size",
                 "Scaling efficiency vs world size", "Throughput per worker",
                 "Step time split into compute and communication",
                 "Allreduce bus bandwidth vs message size",
                 "Measured vs predicted scaling efficiency", "network-bound", "Failed runs",
                 "All training runs", "link rates measured", "Software manifest",
                 "Sweep parameters", "95% confidence interval"):
        assert text in page, text


@needs_chromium
def test_report_renders_in_chromium_without_errors(built, browser):
    shot = ARTIFACTS / "report.png"
    info = browser.open(built, screenshot=shot)
    assert info["errors"] == []
    assert len(info["images"]) == 6
    assert all(img["complete"] and img["width"] > 0 for img in info["images"]), info["images"]
    assert info["scripts"] == 0
    assert info["resources"] == []  # nothing fetched beyond the page itself
    assert XSS in info["text"]  # shown as text, literally
    assert shot.stat().st_size > 50_000


@needs_chromium
def test_the_browser_check_catches_a_broken_page(tmp_path, browser):
    # the negative control: without it an always-empty error list would prove nothing
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="missing.png">'
                   "<script>throw new Error('boom')</script></body></html>")
    info = browser.open(bad)
    assert info["images"][0]["width"] == 0
    assert any("boom" in e for e in info["errors"])


@needs_chromium
def test_comparison_puts_sweeps_on_shared_axes(reports, browser, tmp_path):
    out = report.build(["20261120-0900-lab", "20261121-0900-fast"], tmp_path / "cmp",
                       compare=True, root=reports)[0]
    page = out.read_text()
    assert "scalelab comparison: 20261120-0900-lab vs 20261121-0900-fast" in page
    assert page.count("<img ") == 6 and "<script" not in page.lower()
    assert "../" in page  # links to each sweep's results.csv, relative
    info = browser.open(out, screenshot=ARTIFACTS / "compare.png")
    assert info["errors"] == []
    assert all(img["width"] > 0 for img in info["images"])


def test_comparison_needs_two_distinct_sweeps(reports):
    with pytest.raises(ScalelabError, match="two or more"):
        report.build(["latest"], compare=True, root=reports)
    with pytest.raises(ScalelabError, match="same sweep twice"):
        report.build(["latest", "20261120-0900-lab"], compare=True, root=reports)


def test_unknown_sweep_names_the_known_ones(reports):
    with pytest.raises(ScalelabError) as err:
        report.build(["nosuch"], root=reports)
    msg = str(err.value)
    assert "'nosuch' not found" in msg
    assert "20261120-0900-lab" in msg and "20261121-0900-fast" in msg


def test_prefix_and_reports_root_from_the_environment(reports, monkeypatch):
    monkeypatch.setenv("SCALELAB_REPORTS", str(reports))
    assert report.resolve_sweep("20261121") == (reports / "20261121-0900-fast").resolve()
    with pytest.raises(ScalelabError, match="ambiguous"):
        report.resolve_sweep("2026112")


def test_latest_without_a_symlink_is_a_clear_error(tmp_path):
    synthetic.synthetic_sweep(tmp_path, "only", nodes=(1, 2), repeats=1)
    with pytest.raises(ScalelabError, match="no latest sweep.*known: only"):
        report.build("latest", root=tmp_path)


def test_empty_sweep_is_a_clear_error(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "sweep.json").write_text(json.dumps({"sweep_id": "empty", "planned_runs": ["a"]}))
    with pytest.raises(ScalelabError, match="'empty' has no runs recorded yet"):
        report.build("empty", root=tmp_path)


def test_all_failed_sweep_is_a_clear_error_with_the_first_error(tmp_path):
    d = synthetic.synthetic_sweep(tmp_path, "bad", nodes=(1,), batch_sizes=(32,), repeats=1,
                                bandwidths=(1000.0,), allreduce=False,
                                failed=["torch.distributed: connection refused"])
    with pytest.raises(ScalelabError, match=r"all 1 training runs .*connection refused"):
        report.build(str(d), root=tmp_path)


def test_truncated_store_still_reports(reports, tmp_path):
    src = reports / "20261121-0900-fast"
    d = tmp_path / "crashed"
    shutil.copytree(src, d)
    with (d / "runs.jsonl").open("a") as fh:
        fh.write('{"sweep_id": "20261121-0900-fast", "run_id": "train-n09')
    path = report.build_report(d)
    assert path == d / "index.html" and "Total throughput" in path.read_text()


def test_single_repeat_sweep_has_no_error_bars_but_renders(tmp_path):
    synthetic.synthetic_sweep(tmp_path, "one", nodes=(1, 2), batch_sizes=(32,),
                            bandwidths=(None,), repeats=1, allreduce=False)
    page = report.build("one", root=tmp_path)[0].read_text()
    assert page.count("<img ") == 5  # no allreduce probes: no busbw figure
    assert "native" in page


def _edit_runs(sweep_dir: Path, which, edit=None, **fields) -> None:
    """Set fields on the records of a synthetic sweep whose params `which` picks (and, with
    edit, change each such record in place)."""
    path = sweep_dir / "runs.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in recs:
        if which(rec["params"]):
            rec.update(fields)
            if edit:
                edit(rec)
    path.write_text("".join(json.dumps(rec) + "\n" for rec in recs))


def test_the_page_names_the_slurm_jobs_and_the_image_the_ranks_ran_in(tmp_path):
    """README: the summary says how the runs started and, for Slurm jobs, their ids; and
    whether the ranks ran in containers, and of which image (its digest)."""
    d = synthetic.synthetic_sweep(tmp_path, "jobs", nodes=(1, 2, 3), batch_sizes=(32,),
                                  bandwidths=(1000.0,), repeats=1, allreduce=False)
    digest = "sha256:" + "ab" * 32
    job_ids = itertools.count(40)

    def by_slurm_in_a_container(rec: dict) -> None:
        rec["env"] = {**(rec.get("env") or {}), "launcher": "slurm", "image": {"id": digest}}
        rec["slurm"] = {"job_id": next(job_ids), "state": "COMPLETED"}
        rec["params"]["runtime"] = "container"

    _edit_runs(d, lambda p: True, by_slurm_in_a_container)
    page = report.build("jobs", root=tmp_path)[0].read_text()
    assert "slurm: 3 jobs (ids 40-42)" in page
    assert f"in containers of image {digest} (3 runs)" in page


def test_a_failed_baseline_empties_efficiency_and_says_so(tmp_path):
    """Every 1-node run of batch 32 failed: batch 32 gets no efficiency (never 2 nodes = 100 %),
    the page says why in a banner, and results.csv names the baseline of every row."""
    d = synthetic.synthetic_sweep(tmp_path, "nobase", nodes=(1, 2, 3), batch_sizes=(32, 64),
                                bandwidths=(1000.0,), repeats=2, allreduce=False)
    _edit_runs(d, lambda p: p["nodes"] == 1 and p["batch_size"] == 32,
               status="failed", ranks=[], error="rank 0: connection reset by peer")
    page = report.build("nobase", root=tmp_path)[0].read_text()
    assert "No scaling efficiency for resnet18 ddp batch 32/worker at 1gbit, 1 per node (N0 = 1)" in page
    assert "invoke bench --resume nobase --retry-failed" in page
    assert "batch 64" not in page.split("No scaling efficiency")[1].split("</div>")[0]
    with open(d / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["baseline_world_size"] for r in rows} == {"1"}
    b32 = [r for r in rows if r["batch_size"] == "32" and r["status"] == "ok"]
    b64 = [r for r in rows if r["batch_size"] == "64" and r["status"] == "ok"]
    assert len(b32) == 4 and all(r["scaling_efficiency"] == "" for r in b32)
    assert len(b64) == 6 and all(0 < float(r["scaling_efficiency"]) < 1.2 for r in b64)


def _rows(page: str, cls: str) -> list[dict[str, str]]:
    """The rows of the page's table of class ``cls``, as header -> cell text (tags stripped,
    entities decoded), read from the HTML the way a person reads the table."""
    start = page.index(f'<table class="{cls}">')
    table = page[start:page.index("</table>", start)]
    head, body = table.split("</thead>")
    names = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", head)]
    return [dict(zip(names, [html.unescape(re.sub(r"<[^>]+>", "", c))
                             for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)], strict=True))
            for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_a_weak_and_a_strong_series_of_the_same_batch_stay_apart_everywhere(tmp_path):
    """Batch 16 per worker beside a global batch of 16 in one sweep: two series in the scaling
    table, the figure's numbers and the cost table, each labelled as what it is."""
    d = synthetic.synthetic_sweep(tmp_path, "both", nodes=(1, 2), batch_sizes=(16,),
                                  bandwidths=(1000.0,), repeats=1, allreduce=False)
    meta = json.loads((d / "sweep.json").read_text())
    meta["plan"]["price_per_node_hour"] = 2.0
    (d / "sweep.json").write_text(json.dumps(meta))
    lines = (d / "runs.jsonl").read_text().splitlines()
    for line in list(lines):  # each run again as a strong-scaling run: 16 split over its ranks
        rec = json.loads(line)
        ws = rec["params"]["world_size"]
        rec["run_id"] = rec["run_id"].replace("-b016-", "-g0016-")
        rec["params"].update(batch_size=16 // ws, global_batch_size=16)
        for rank in rec["ranks"]:
            rank["images_per_sec"] = rank["images_per_sec"] / ws
        lines.append(json.dumps(rec))
    (d / "runs.jsonl").write_text("\n".join(lines) + "\n")
    page = report.build("both", root=tmp_path)[0].read_text()
    for cls in ("scaling", "figdata", "cost"):
        labels = sorted({r["batch"] for r in _rows(page, cls)})
        assert labels == ["16 global", "16/worker"], (cls, labels)
    scaling = _rows(page, "scaling")
    assert len(scaling) == 4  # 2 series x 2 world sizes, none merged


def _bottleneck_rows(page: str) -> dict[str, str]:
    """Series text -> the bottleneck the report names for it, read from its table."""
    return {r["series"].split(",")[1].strip(): r["bottleneck"] for r in _rows(page, "bottlenecks")}


def test_the_bottleneck_follows_the_data(tmp_path):
    """A slow link with a large gradient is named network-bound, a fast one with heavy compute
    compute-bound: the verdict comes from the figures, not from fixed text."""
    synthetic.synthetic_sweep(tmp_path, "verdict", bandwidths=(100.0, 10000.0), batch_sizes=(64,),
                              nodes=(1, 2, 4), repeats=2, compute_s_per_image=0.05,
                              allreduce=False)
    page = report.build("verdict", root=tmp_path)[0].read_text()
    assert _bottleneck_rows(page) == {"link 100mbit": "network-bound",
                                      "link 10gbit": "compute-bound"}


def test_step_split_shows_hidden_and_exposed_communication(built):
    page = built.read_text()
    assert "comm in flight (ms)" in page and "comm exposed (ms)" in page
    assert "comm hidden" in page
    assert "the stack is the measured step (black tick) less input time" in page
    assert "exceeds the measured step" not in page


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?%?")


def test_no_table_cell_writes_a_number_a_person_cannot_read(built, demo_page):
    """Every number in every table cell is plain: no exponent (1.744e+04) and no time below
    10 ms written in seconds (0.0005521); times per step are in ms, as their headers say."""
    for page in (built.read_text(), demo_page):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c))
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", page, re.S)]
        numbers = [t for c in cells for t in c.split() if _NUMBER.fullmatch(t)]
        assert numbers
        assert not [t for t in numbers if re.search(r"\d[eE][-+]\d", t)]
        assert not [t for t in numbers if re.fullmatch(r"[-+]?0\.00\d*%?", t)]
        for cls, times in (("scaling", ("step (ms)", "comm in flight (ms)", "comm exposed (ms)")),
                           ("runs", ("step mean (ms)", "step p95 (ms)"))):
            header = _rows(page, cls)[0]
            assert all(t in header for t in times), header
            assert not [h for h in header if "(s)" in h and h != "duration (s)"], header
    emulated = _rows(demo_page, "emulation")
    assert "profile step (ms)" in emulated[0] and "emulated compute (ms)" in emulated[0]
    # the demo's 175 ms V100 step at batch 64, as a person reads it
    assert all(50 < _num(r["profile step (ms)"]) < 500 for r in emulated)


# ------------------------------------------------------------------------------ one model, one verdict

DEMO = Path(__file__).resolve().parents[1] / "reports" / "example"  # `invoke demo`'s sweep: 16 runs, as recorded (the README's example report)
DEMO_ID = json.loads((DEMO / "sweep.json").read_text())["sweep_id"]


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory) -> str:
    """The report of the stored demo sweep: ResNet-50 on emulated V100s (per-layer profiles),
    1-8 nodes, batch 64 and 96, 1 and 10 Gbit/s."""
    root = tmp_path_factory.mktemp("demo")
    shutil.copytree(DEMO, root / DEMO.name)
    return report.build(DEMO.name, root=root)[0].read_text()


def _pct(cell: str) -> float:
    return float(cell.rstrip("%"))


def test_the_verdict_the_table_and_the_figure_agree_for_every_point_of_the_demo(demo_page):
    scaling = {(r["link"], r["batch"], r["world size"]): r
               for r in _rows(demo_page, "scaling")}
    figure = {(r["link"], r["batch"], r["world size"]): r
              for r in _rows(demo_page, "figdata")}
    assert set(scaling) == set(figure) and len(scaling) == 16
    for point, row in scaling.items():
        plotted = figure[point]
        assert plotted["predicted by"] == "overlap", point  # every series has a per-layer profile
        assert plotted["predicted efficiency"] == row["model efficiency"], point
        assert plotted["measured efficiency"] == row["efficiency"], point
        if point[2] == "1":
            assert row["verdict"] == "baseline"
            continue
        # the overlap model explains every multi-node point (the ring model was 31-35 points
        # off); the demo of 2026-11-26 ran at a smaller dilation at 10 Gbit/s (3/5/10, against
        # 4/7/14 before, as the host's calibration came out) and measured up to 5.5 points below
        assert abs(_pct(row["efficiency"]) - _pct(row["model efficiency"])) < 6, point
        assert row["verdict"].split(",")[0] in ("network-bound", "compute-bound"), point
    # each series' bottleneck is its largest point's verdict, with that point's prediction
    for b in _rows(demo_page, "bottlenecks"):
        batch = b["series"].split(",")[0].removeprefix("batch ")
        link = b["series"].split(",")[1].strip().removeprefix("link ")
        row = scaling[(link, batch, b["at world size"])]
        assert b["model efficiency"] == row["model efficiency"]
        assert b["measured efficiency"] == row["efficiency"]
        assert row["verdict"].split(",")[0] == b["bottleneck"]
        assert (f"the overlap model predicts {b['model efficiency']} against "
                f"{b['measured efficiency']} measured") in b["why"]
    kinds = {tuple(b["series"].split(", ")[:2]): b["bottleneck"]
             for b in _rows(demo_page, "bottlenecks")}
    assert kinds == {("batch 64/worker", "link 1gbit"): "network-bound",
                     ("batch 96/worker", "link 1gbit"): "network-bound",
                     ("batch 64/worker", "link 10gbit"): "network-bound",  # was "undetermined"
                     ("batch 96/worker", "link 10gbit"): "compute-bound"}
    # no second prediction anywhere: no table shows the ring model beside the overlap model
    for cls in ("scaling", "bottlenecks", "emulation", "figdata"):
        assert not any("ring" in header for header in _rows(demo_page, cls)[0]), cls


def test_a_network_bound_verdict_carries_the_exposed_communication_time(demo_page):
    network = [b for b in _rows(demo_page, "bottlenecks") if b["bottleneck"] == "network-bound"]
    assert len(network) == 3  # both series at 1 Gbit/s, batch 64 at 10 Gbit/s
    for b in network:
        said = re.search(r"and ([\d,.]+) ms of that communication is exposed", b["why"])
        assert said, b["why"]
        assert said.group(1) == b["exposed comm (ms/step)"]  # the same number, the same rounding
    for row in _rows(demo_page, "scaling"):
        if row["verdict"].startswith("network-bound"):
            assert re.fullmatch(r"network-bound, [\d,.]+ ms exposed", row["verdict"]), row


def test_the_model_error_is_shown_once_as_a_number(demo_page):
    stated = re.findall(r"off by at most ([\d.]+) points of efficiency", demo_page)
    assert len(stated) == 1
    points = [r for r in _rows(demo_page, "figdata") if r["world size"] != "1"]
    worst = max(abs(_pct(r["measured efficiency"]) - _pct(r["predicted efficiency"]))
                for r in points)
    assert float(stated[0]) == pytest.approx(worst, abs=0.1)  # the table rounds to 0.1 points
    assert f"over the {len(points)} measured multi-node points" in demo_page
    # under 3 points the verdicts are plain statements, never hedged; from 3 on, each says
    # "likely" (the demo of 2026-11-26 is off by 5.5 at one 10 Gbit/s point)
    whys = [b["why"] for b in _rows(demo_page, "bottlenecks")]
    if float(stated[0]) < 3:
        assert "stated plainly" in demo_page and not any("likely" in w for w in whys)
    else:
        assert "3 points or more" in demo_page and all("likely" in w for w in whys), whys
    # the what-if table refers to it instead of repeating a number on every row
    assert all("error" not in header for header in _rows(demo_page, "whatif")[0])


def _texts_with(page: str, word: str) -> list[str]:
    """Every table row, list item or paragraph of the page that contains ``word``, as text."""
    pieces = re.findall(r"<(tr|li|p|figcaption)[^>]*>(.*?)</\1>", page, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", body)) for _, body in pieces if word in body]


def test_undetermined_never_appears_without_what_would_settle_it(tmp_path, built, demo_page):
    # no link rate (native, no probe) and one series measured at one size only
    synthetic.synthetic_sweep(tmp_path, "unsure", nodes=(1, 2), batch_sizes=(32,),
                              bandwidths=(None,), repeats=1, allreduce=False)
    page = report.build("unsure", root=tmp_path)[0].read_text()
    assert _bottleneck_rows(page) == {"link native": "undetermined"}
    for p in (page, built.read_text(), demo_page):
        texts = _texts_with(p, "undetermined")
        assert texts  # the method note names it, with the rule
        for text in texts:
            assert "would settle it" in text, text
    row = _rows(page, "scaling")[-1]
    assert row["verdict"].startswith("undetermined: Measuring the link")


def test_a_page_with_both_models_says_which_predicted_each_point(tmp_path, reports, demo_page):
    shutil.copytree(DEMO, tmp_path / DEMO.name)
    out = report.build([str(tmp_path / DEMO.name), str(reports / "20261121-0900-fast")],
                       tmp_path / "cmp", compare=True, root=reports)[0]
    page = out.read_text()
    by_sweep = {}
    for r in _rows(page, "figdata"):
        by_sweep.setdefault(r["sweep"], set()).add(r["predicted by"])
    assert by_sweep == {DEMO_ID: {"overlap"}, "20261121-0900-fast": {"ring"}}
    assert {r["predicted by"] for r in _rows(page, "scaling")} == {"overlap", "ring"}
    ring = sum(r["predicted by"] == "ring" for r in _rows(page, "figdata"))
    assert f"from the ring model (one whole-gradient ring allreduce, no bucket timeline) for " \
           f"{ring} points where it cannot be computed: no per-layer profile (the ranks " \
           "computed for real)" in page


# ------------------------------------------------------------------------------ the slow rank named


def _num(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def test_a_slow_node_is_named_with_the_wait_it_causes(tmp_path):
    """demo-n2's ranks compute 30 % longer (in the 3- and 4-node runs): the page names that
    node, flags nothing else, gives each run's wait as its compute minus the others' median
    (read back from runs.jsonl), and calls the point straggler-bound where the wait, not the
    10 Gbit/s link, explains the efficiency; at 100 Mbit/s the link still costs more."""
    d = synthetic.synthetic_sweep(tmp_path, "slow", nodes=(1, 2, 3, 4), batch_sizes=(64,),
                                  bandwidths=(100.0, 10000.0), repeats=3, allreduce=False,
                                  slow_nodes={"demo-n2": 1.3})
    page = report.build("slow", root=tmp_path)[0].read_text()
    rows = _rows(page, "slowranks")
    assert {r["node"] for r in rows} == {"demo-n2"}
    assert len(rows) == 2 * 2 * 3  # 3 and 4 nodes x 2 links x 3 repeats: every run it was in
    records = {json.loads(x)["run_id"]: json.loads(x) for x in (d / "runs.jsonl").open()}
    for r in rows:
        ranks = records[r["run"]]["ranks"]
        slow = next(x["compute_time_mean_s"] for x in ranks if x["host"] == "demo-n2")
        others = sorted(x["compute_time_mean_s"] for x in ranks if x["host"] != "demo-n2")
        median = (others[(len(others) - 1) // 2] + others[len(others) // 2]) / 2
        assert _num(r["its compute (ms/step)"]) == round(slow * 1000)
        assert _num(r["others' median (ms/step)"]) == round(median * 1000)
        assert abs(_num(r["others wait (ms/step)"]) - (slow - median) * 1000) <= 0.5, r
        assert 15 < _num(r["slower by"]) < 45, r
    said = _texts_with(page, "Node demo-n2 was slow in")
    assert said and "in 12 of the 12 runs it took part in" in said[0]
    assert re.search(r"the others waited [\d,]+ ms per step for it", said[0])
    # the verdict: the wait explains 10 Gbit/s (a 60 ms step of link against ~80 ms of wait)
    scaling = {(r["link"], r["world size"]): r["verdict"] for r in _rows(page, "scaling")}
    for n in ("3", "4"):
        label = re.fullmatch(r"straggler-bound, demo-n2, ([\d,]+) ms wait", scaling[("10gbit", n)])
        assert label, scaling[("10gbit", n)]
        waits = [_num(r["others wait (ms/step)"]) for r in rows
                 if r["link"] == "10gbit" and r["world size"] == n]
        assert abs(_num(label.group(1)) - sum(waits) / len(waits)) <= 1  # the mean over repeats
    assert scaling[("10gbit", "2")].startswith("network-bound")  # demo-n2 not in it
    assert scaling[("100mbit", "4")].startswith("network-bound")
    kinds = _bottleneck_rows(page)
    assert kinds == {"link 100mbit": "network-bound", "link 10gbit": "straggler-bound"}
    why = {r["series"].split(",")[1].strip(): r["why"] for r in _rows(page, "bottlenecks")}
    assert "node demo-n2 held a rank" in why["link 10gbit"]
    assert "without that wait and" in why["link 10gbit"]
    assert "Node demo-n2 held a rank" in why["link 100mbit"]  # named beside the link too
    # the method note and the figure name the verdict as the table does
    assert "straggler-bound (a rank flagged under Slow ranks" in page


def test_uniform_ranks_flag_nothing_and_say_the_threshold(tmp_path, demo_page):
    """Ranks within the generator's 3 % noise: nothing flagged, one sentence that says so and
    the threshold used; the same on the recorded demo, whose ranks agree to 0.3 % (the floor)."""
    synthetic.synthetic_sweep(tmp_path, "even", nodes=(1, 2, 3, 4), batch_sizes=(16, 64),
                              bandwidths=(100.0, 10000.0), repeats=3, allreduce=False)
    for page in (report.build("even", root=tmp_path)[0].read_text(), demo_page):
        assert '<table class="slowranks">' not in page
        assert "straggler-bound" not in page.split('id="method"')[0]
        assert not _texts_with(page, "was slow in")
        none = _texts_with(page, "No slow rank: in the ")
        assert len(none) == 1, none
        limit = re.search(r"more than ([\d.]+)% above the median of its run's other ranks",
                          none[0]).group(1)
        assert f"flagged when its compute time per step is more than {limit}% above" in page
        assert "Per-pair link rates: none kept with this sweep" in html.unescape(page)
    assert "more than 5.0% above" in demo_page and "the 5% floor if that is larger" in demo_page


def test_a_slow_node_is_found_without_repeats(tmp_path):
    """One repeat: the noise comes from the same rank over the sweep's other batch sizes and
    links, where a node slow in every run cancels out; it is still named."""
    synthetic.synthetic_sweep(tmp_path, "once", nodes=(1, 2, 3, 4), batch_sizes=(16, 64),
                              bandwidths=(1000.0, 10000.0), repeats=1, allreduce=False,
                              slow_nodes={"demo-n3": 1.3})
    page = report.build("once", root=tmp_path)[0].read_text()
    rows = _rows(page, "slowranks")
    assert {r["node"] for r in rows} == {"demo-n3"} and len(rows) == 4  # its 4-node runs


@needs_chromium
def test_the_demo_report_fits_a_1280_px_window(demo_page, browser, tmp_path):
    """At 1280 px the page never scrolls sideways, and the tables a reader compares across
    (scaling, bottlenecks, slow ranks, emulation) fit without scrolling in their own box."""
    page = tmp_path / "demo.html"
    page.write_text(demo_page)
    info = browser.open(page, screenshot=ARTIFACTS / "demo-1280.png")
    assert info["errors"] == []
    assert info["viewport"] == 1280 and info["width"] <= 1280, info["width"]
    wide = [t for t in info["tables"] if t["width"] > t["box"] + 1]
    assert not [t for t in wide if t["cls"] in ("scaling", "bottlenecks", "slowranks",
                                                 "emulation", "kv")], wide
    assert any(t["cls"] == "scaling" for t in info["tables"])


FULL_TABLES = ("scaling", "bottlenecks", "slowranks", "linkpairs", "cost", "comm-settings",
               "emulation", "whatif", "layout")


@needs_chromium
def test_every_table_of_a_full_page_fits_a_1280_px_window(browser, tmp_path):
    """The tables the demo page lacks (slow ranks, every pair's link rate, cost, communication
    settings) on one page of an emulated V100 sweep with a slow node, two bucket sizes (a
    comm-settings column in the scaling table too), a price per node-hour and a link check:
    at 1280 px each table's own width fits its box, so none needs scrolling sideways (the
    box's overflow-x:auto keeps the page width under the window whatever the table does)."""
    from scalelab.run import linkprobe

    d = _two_bucket_store(tmp_path, {1000.0: 50.0, 10000.0: 25.0}, accelerator="v100",
                          nodes=(1, 2, 3, 4), slow_nodes={"demo-n2": 1.3})
    meta = json.loads((d / "sweep.json").read_text())
    meta["plan"]["price_per_node_hour"] = 3.0
    names = [f"demo-n{i}" for i in range(4)]
    meta["link_pairs"] = linkprobe.links_doc(
        [linkprobe.Measurement(a, b, 410.0 if "demo-n2" in (a, b) else 958.0)
         for i, a in enumerate(names) for b in names[i + 1:]], 3.0, "2026-11-25T16:00:00Z")
    (d / "sweep.json").write_text(json.dumps(meta))
    path = report.build_report(d)
    page = path.read_text()
    for cls in FULL_TABLES:
        assert f'<table class="{cls}">' in page, cls
    assert {r["node"] for r in _rows(page, "slowranks")} == {"demo-n2"}
    assert any(r[""] == "SLOW" for r in _rows(page, "linkpairs"))
    info = browser.open(path, screenshot=ARTIFACTS / "full-1280.png")
    assert info["errors"] == []
    assert info["viewport"] == 1280 and info["width"] <= 1280, info["width"]
    shown = [t for t in info["tables"] if t["cls"] in FULL_TABLES]
    assert {t["cls"] for t in shown} == set(FULL_TABLES)
    wide = [t for t in shown if t["width"] > t["box"] + 1]
    assert not wide, wide


def test_the_layout_table_says_where_dedicated_servers_beat_the_ring(tmp_path):
    """An emulated sweep of the ring: the layout table predicts, per node count and link, the
    ring, colocated servers and dedicated servers, and on the slower link from 4 nodes on
    the dedicated servers (as many as the bytes say) are fastest."""
    d = _two_bucket_store(tmp_path, {1000.0: 50.0, 10000.0: 25.0}, accelerator="v100",
                          nodes=(1, 2, 3, 4))
    page = report.build_report(d).read_text()
    assert "Layout: ring allreduce or parameter servers" in page
    rows = _rows(page, "layout")
    assert {int(r["nodes"]) for r in rows} == {2, 4, 8, 16, 32}
    beats = {int(r["nodes"]): r["servers that beat the ring"] for r in rows}
    assert beats == {2: "never", 4: "3 or more", 8: "5 or more", 16: "9 or more",
                     32: "17 or more"}
    src = "from the measured series"
    slow = next(r[src] for r in rows if r[src].startswith("1gbit,"))  # on its own link
    links = sorted({r["link"] for r in rows if r[src] == slow},
                   key=lambda x: float(x.split()[0]) * (1000 if "Gbit" in x else 1))
    for r in rows:
        if r[src] == slow and r["link"] == links[0] and int(r["nodes"]) >= 4:
            assert "dedicated" in r["fastest"], r
            assert int(r["dedicated servers"]) >= int(r["servers that beat the ring"].split()[0])
            assert float(r["dedicated images/s"].replace(",", "")) > float(
                r["ring images/s"].replace(",", "")), r


def test_the_readme_example_report_is_current(tmp_path):
    """reports/example/index.html is what this code makes of the demo sweep stored beside it:
    when the report changes, `invoke report --example` must be run (this fails until it is)."""
    work = tmp_path / "example"
    shutil.copytree(report.EXAMPLE, work)
    page = report.build_example(work, screenshot=False).read_text()
    committed = (report.EXAMPLE / "index.html").read_text()
    assert report.comparable(committed) != committed  # the build line was there to take out
    assert report.comparable(page) == report.comparable(committed), (
        "reports/example is stale: regenerate it with invoke report --example")
    stale = committed.replace("What this sweep found", "What this sweep found once")
    assert report.comparable(page) != report.comparable(stale)  # the check sees a change


def test_a_price_per_node_hour_gives_the_cost_per_million_images(tmp_path):
    """With price_per_node_hour in the plan: one row per (link, batch, node count), the cost
    the measured throughput implies, the cheapest node count marked; without it, no table."""
    d = synthetic.synthetic_sweep(tmp_path, "cost", nodes=(1, 2, 4), batch_sizes=(64,),
                                  bandwidths=(100.0, 10000.0), repeats=2, allreduce=False)
    assert '<table class="cost">' not in report.build("cost", root=tmp_path)[0].read_text()
    meta = json.loads((d / "sweep.json").read_text())
    meta["plan"]["price_per_node_hour"] = 3.0
    (d / "sweep.json").write_text(json.dumps(meta))
    page = report.build("cost", root=tmp_path)[0].read_text()
    assert "At 3.00 per node-hour" in page
    rows = _rows(page, "cost")
    assert len(rows) == 2 * 3
    for r in rows:
        nodes, ips = _num(r["nodes"]), _num(r["images/s"])
        expected = 3.0 * nodes / (ips * 3600) * 1e6
        assert abs(_num(r["cost per million images"]) - expected) <= 0.01 * expected + 0.01, r
    for link in ("100mbit", "10gbit"):
        mine = [r for r in rows if r["link"] == link]
        best = min(mine, key=lambda r: _num(r["cost per million images"]))
        assert [r[""] for r in mine].count("cheapest") == 1 and best[""] == "cheapest"
    # scaling below 100 %: one node is the cheapest per image on the slow link
    assert next(r for r in rows if r["link"] == "100mbit" and r[""] == "cheapest")["nodes"] == "1"


def test_the_terraform_that_applied_the_cluster_is_on_the_page(tmp_path):
    """sweep.json's software carries the Terraform (or OpenTofu) of a Terraform target's
    cluster (sweepmeta.sweep_meta); the summary names it, and a sweep without it has no such row."""
    d = synthetic.synthetic_sweep(tmp_path, "tf", nodes=(1, 2), batch_sizes=(32,),
                                  bandwidths=(None,), repeats=1, allreduce=False,
                                  target="static")
    label = "Terraform that applied the cluster"
    assert label not in report.build("tf", root=tmp_path)[0].read_text()
    meta = json.loads((d / "sweep.json").read_text())
    meta["software"]["terraform"] = {"binary": "tofu", "version": "1.8.7"}
    (d / "sweep.json").write_text(json.dumps(meta))
    page = report.build("tf", root=tmp_path)[0].read_text()
    row = re.search(rf"<t[hd][^>]*>{label}</t[hd]>\s*<td[^>]*>([^<]*)</td>", page)
    assert row and row[1] == "tofu 1.8.7", page[page.find(label) - 200:page.find(label) + 200]
    assert "1.8.7" in page[page.find("Software manifest"):]  # and the manifest lists it


def _two_bucket_store(root, faster, accelerator="", **sweep):
    """A synthetic sweep at 1 and 10 Gbit/s, run again at bucket_cap_mb 50: faster[rate] names
    the bucket size (MB) whose multi-node runs are measured 10 % faster at that rate. With an
    accelerator (e.g. "v100") the runs are ResNet-50 on that emulated device, so the overlap
    model finds its per-layer profile, and every run measured its link at 95 % of the rate.
    ``sweep`` overrides synthetic_sweep's arguments (nodes, slow_nodes, ...)."""
    d = synthetic.synthetic_sweep(root, "buckets", **{
        "nodes": (1, 2), "batch_sizes": (64,), "bandwidths": (1000.0, 10000.0), "repeats": 2,
        "allreduce": False,
        **({"model": "resnet50", "gradient_bytes": 4 * 25_557_032} if accelerator else {}),
        **sweep})
    runs = d / "runs.jsonl"
    out = []
    for line in runs.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") != "train":
            out.append(rec)
            continue
        for mb in (25.0, 50.0):
            r = json.loads(json.dumps(rec))
            r["params"].update({"bucket_cap_mb": mb, "fusion_threshold_mb": None,
                                "cycle_time_ms": None, "compression": "none"})
            r["run_id"] = rec["run_id"].replace("-r", f"-bk{mb:g}-r")
            rate = r["params"]["bandwidth_mbit"]
            if accelerator:
                r["params"]["accelerator"] = accelerator
                r["link_mbit_measured"] = 0.95 * rate
            factor = 1.0 if r["params"]["nodes"] == 1 else (1.1 if faster[rate] == mb else 1.0)
            for rk in r["ranks"]:
                rk["images_per_sec"] *= factor
            out.append(r)
    runs.write_text("".join(json.dumps(r) + "\n" for r in out))
    meta = json.loads((d / "sweep.json").read_text())
    meta["planned_runs"] = [r["run_id"] for r in out]
    meta["plan"]["bucket_cap_mb"] = [25.0, 50.0]
    (d / "sweep.json").write_text(json.dumps(meta))
    return d


def test_comm_settings_name_the_setting_measured_faster_per_rate(tmp_path):
    d = _two_bucket_store(tmp_path, {1000.0: 50.0, 10000.0: 25.0})
    page = report.build_report(d).read_text()
    assert 'id="comm-settings"' in page
    best = [html.unescape(x) for x in re.findall(r'<li class="best-setting">(.*?)</li>', page)]
    assert len(best) == 2
    one = next(b for b in best if b.startswith("1gbit"))
    ten = next(b for b in best if b.startswith("10gbit"))
    assert "best measured setting bucket 50 MB" in one and "over the default" in one
    # 10 % more images/s than the default: 10 % of the default's efficiency, in points
    gain = float(re.search(r"([+-]\d+\.\d) points", one).group(1))
    eff = float(re.search(r"\((\d+\.\d)% efficiency", one).group(1))
    assert gain > 0 and abs(gain - (eff - eff / 1.1)) < 0.15
    assert "best measured setting bucket 25 MB" in ten and "the default" in ten
    rows = _rows(page, "comm-settings")
    marked = {(r["link"], r["setting"]) for r in rows if r[""].startswith("best")}
    assert marked == {("1gbit", "bucket 50 MB"), ("10gbit", "bucket 25 MB")}
    # settings not run appear as predictions, marked as such: 0.5x and 2x the measured sizes
    predicted = {r["setting"] for r in rows if r["row"].startswith("predicted only")}
    assert {"bucket 12.5 MB", "bucket 100 MB"} <= predicted
    # and the other way round, the other one is named
    d2 = _two_bucket_store(tmp_path / "b", {1000.0: 25.0, 10000.0: 50.0})
    page2 = report.build_report(d2).read_text()
    marked2 = {(r["link"], r["setting"]) for r in _rows(page2, "comm-settings")
               if r[""].startswith("best")}
    assert marked2 == {("1gbit", "bucket 25 MB"), ("10gbit", "bucket 50 MB")}


def test_comm_settings_predict_the_settings_not_run_from_the_profile(tmp_path):
    """On an emulated V100 the overlap model has a per-layer profile: every row, measured or
    predicted only, carries the efficiency predicted for its own bucket size, the one
    scalelab.model.bucket_model.predict_step_s gives for that setting (step of 1 rank / step of 2 over
    the measured link), and the bucket size changes it."""
    from scalelab.model import accel, analysis, bucket_model
    from scalelab.model.networks import MODELS

    d = _two_bucket_store(tmp_path, {1000.0: 50.0, 10000.0: 25.0}, accelerator="v100")
    page = report.build_report(d).read_text()
    assert f"alpha = {analysis.DEFAULT_ALPHA_S * 1e6:.1f} us" in page  # no probes: the default
    rows = _rows(page, "comm-settings")
    predicted = [r for r in rows if r["row"].startswith("predicted only")]
    assert {(r["link"], r["setting"]) for r in predicted} == {
        (link, f"bucket {mb} MB") for link in ("1gbit", "10gbit") for mb in ("12.5", "100")}
    doc = accel.resolve("v100", "resnet50", "fp32", 64, MODELS["resnet50"].image_size)
    one = bucket_model.predict_step_s(doc, "ddp", 1, float("inf"), "fp32", analysis.DEFAULT_ALPHA_S)
    rates = {"1gbit": 950.0, "10gbit": 9500.0}
    for r in rows:
        assert r["efficiency predicted"], r  # measured rows too
        mb = float(r["setting"].removeprefix("bucket ").removesuffix(" MB"))
        step = bucket_model.predict_step_s(doc, "ddp", int(r["world size"]), rates[r["link"]], "fp32",
                                      analysis.DEFAULT_ALPHA_S, mb, "none")
        assert r["efficiency predicted"] == f"{100 * one / step:.1f}%", r
    ten = {r["setting"]: _pct(r["efficiency predicted"]) for r in rows if r["link"] == "10gbit"}
    assert ten["bucket 12.5 MB"] > ten["bucket 100 MB"] + 10  # one 100 MB bucket hides nothing


def test_no_comm_settings_section_when_no_setting_varies(tmp_path):
    d = synthetic.synthetic_sweep(tmp_path, "plain", nodes=(1, 2), batch_sizes=(64,), repeats=1)
    assert 'id="comm-settings"' not in report.build_report(d).read_text()


def test_the_demo_report_names_its_fabric_profile_and_its_sources(demo_page):
    text = " ".join(re.sub(r"<[^>]+>", " ", demo_page).split())
    assert "Fabric profile: ethernet-tcp" in text
    # what each of its line rates carried and where the figure comes from
    assert "1 Gbit/s with 1 rank per node carried 94.1 %" in text
    assert "own ceiling at MTU 1500" in text and "nccl-tests issue 82" in text


def test_the_what_if_note_states_the_models_error_against_published_clusters(demo_page):
    from scalelab.model import published

    total, within, worst, missing = published.summary()
    text = " ".join(re.sub(r"<[^>]+>", " ", html.unescape(demo_page)).split())
    assert (f"within {published.AIM_POINTS:g} points at {within} of {total} points; its "
            f"largest miss is {worst:.1f} points") in text
    # at least three published tables, scored per point (issue 27's bar)
    assert len({p.table.split()[0] for p in published.POINTS}) >= 3 and total >= 3


def test_a_failed_link_measurement_is_shown_with_its_reason(tmp_path):
    """The links of one rate could not be measured: the report says so with iperf3's reason,
    and the other rate keeps its measured figure."""
    d = synthetic.synthetic_sweep(tmp_path, "nolink", nodes=(1, 2), batch_sizes=(32,),
                                  bandwidths=(1000.0, 10000.0), repeats=1, allreduce=False)
    _edit_runs(d, lambda p: p.get("bandwidth_mbit") == 1000.0,
               link_mbit_measured=None, link_error="iperf3: unable to connect to server")
    page = html.unescape(report.build("nolink", root=tmp_path)[0].read_text())
    assert "1gbit: measurement failed (iperf3: unable to connect to server)" in page
    assert "10gbit: measurement failed" not in page and re.search(r"10gbit: [\d,]+ Mbit/s", page)


def _checkpointed(tmp_path, name: str, edit) -> Path:
    """A synthetic sweep at 1 and 2 nodes whose training runs saved a 200 MB checkpoint every 5
    steps, each blocking edit(record) seconds (edit may change the record further)."""
    d = synthetic.synthetic_sweep(tmp_path, name, nodes=(1, 2), batch_sizes=(64,),
                                  bandwidths=(1000.0,), repeats=1, allreduce=False)
    runs = d / "runs.jsonl"
    out = []
    for line in runs.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            rec["params"].update({"checkpoint_every": 5, "checkpoint_mode": "sync",
                                  "checkpoint_to": "nodes", "keep_checkpoints": False})
            blocked = edit(rec)
            rec["checkpoint"] = {"every": 5, "mode": "sync", "place": "nodes",
                                 "bytes_per_checkpoint": 2e8, "blocked_s_mean": blocked,
                                 "background_s_mean": None, "write_mb_s": 200 / blocked,
                                 "saved": [], "dir": "/w/checkpoints/x", "kept": False,
                                 "removal_error": ""}
        out.append(rec)
    runs.write_text("".join(json.dumps(r) + "\n" for r in out))
    return d


def test_the_checkpoint_table_shows_what_each_checkpoint_cost(tmp_path):
    """A sweep whose runs saved checkpoints every 5 steps, the 2-node runs blocked twice as
    long: the Checkpoints table gives each point's size, blocked seconds, write rate and the
    share of training time the checkpoints blocked (blocked over five steps and itself)."""
    d = _checkpointed(tmp_path, "ck", lambda rec: 0.5 * rec["params"]["nodes"])
    page = report.build_report(d).read_text()
    assert '<h2 id="checkpoints">Checkpoints</h2>' in page
    rows = {int(r["nodes"]): r for r in _rows(page, "checkpoints")}
    assert set(rows) == {1, 2}
    with open(d / "results.csv") as fh:
        step = {int(r["nodes"]): float(r["step_time_mean_s"]) for r in csv.DictReader(fh)
                if r["run_id"].startswith("train")}
    for n, r in rows.items():
        assert float(r["MB"]) == pytest.approx(200.0)
        assert float(r["blocked s"]) == pytest.approx(0.5 * n, rel=0.01)
        lost = 0.5 * n / (5 * step[n] + 0.5 * n)
        assert float(r["training time blocked"].rstrip("%")) == pytest.approx(100 * lost, abs=0.1)


def test_the_failures_table_gives_recovery_and_goodput_at_the_stated_rate(tmp_path):
    """A sweep whose 2-node run had a node's ranks killed and came back 30 s later, its
    checkpoints blocking 2 s every 5 steps: the Failures table gives C, R, the steps redone,
    and the model's goodput at its interval on two nodes failing at Llama 3's rate (nothing in
    the page for the run without a failure)."""
    from scalelab.model import goodput

    def blocked(rec: dict) -> float:
        rec["params"]["inject_failure"] = "off"
        if rec["params"]["nodes"] == 2:
            rec["params"]["inject_failure"] = "12@1"
            rec["failure"] = {"asked": "12@1", "node": "x-n1", "after_step": 12,
                              "killed_step": 13, "killed_pids": [7], "killed_at": 1.0,
                              "error": "", "recovery": {
                                  "restart": 1, "from_step": 10, "back_s": 10.0,
                                  "joined_s": 20.0, "ready_s": 30.0, "load_s": 1.0,
                                  "recomputed_steps": 3}}
        return 2.0

    d = _checkpointed(tmp_path, "fl", blocked)
    page = report.build_report(d).read_text()
    assert '<h2 id="failures">Failures</h2>' in page
    rows = _rows(page, "failures")
    assert len(rows) == 1
    r = rows[0]
    assert r["killed"] == "x-n1" and r["steps redone"] == "3"
    assert float(r["C s"]) == pytest.approx(2.0) and float(r["R s"]) == pytest.approx(30.0)
    with open(d / "results.csv") as fh:
        step = [float(x["step_time_mean_s"]) for x in csv.DictReader(fh)
                if x["run_id"].startswith("train") and x["nodes"] == "2"][0]
    m = goodput.job_mtbf_s(goodput.LLAMA3_NODE_MTBF_H, 2)
    want = goodput.goodput(5 * step, 2.0, 30.0, m)
    assert float(r["goodput"].rstrip("%")) == pytest.approx(100 * want, abs=0.1)
    assert r["loses most"] == "the checkpoints"
    # a rate of the user's: nodes that fail every 2 hours (job MTBF 1 h on 2 nodes)
    page = report.build_report(d, node_mtbf_h=2.0).read_text()
    r = _rows(page, "failures")[0]
    assert float(r["job MTBF h"]) == pytest.approx(1.0)
    want = goodput.goodput(5 * step, 2.0, 30.0, 3600.0)
    assert float(r["goodput"].rstrip("%")) == pytest.approx(100 * want, abs=0.1)
    assert "once every 2 hours (as given)" in page


def test_a_run_killed_every_period_has_its_measured_goodput_beside_the_model_at_that_rate(
        tmp_path):
    """A 2-node run killed 4 times, once every 60 s, whose steps over all its attempts took
    1.5 times its last attempt's, and whose training took 3 times its last attempt's steps,
    the kills' clock running 320 s: the Failures table gives the kills, the model's goodput at
    the rate the run saw (an MTBF of 80 s, not the 60 s asked), and the goodput measured (its
    steps at their mean time over the training's wall time: a half)."""
    from scalelab.model import goodput

    def blocked(rec: dict) -> float:
        rec["params"]["inject_failure"] = "off"
        if rec["params"]["nodes"] == 2:
            rec["params"]["inject_failure"] = "60s"
            step = sum(x["step_time_mean_s"] for x in rec["ranks"]) / len(rec["ranks"])
            kill = {"node": "x-n1", "killed_step": 13, "killed_at": 1.0, "killed_pids": [7],
                    "resumed_s": 12.0}
            rec["failure"] = {"asked": "60s", "node": "x-n1", "after_step": None,
                              "every_s": 60.0, "killed_step": 13, "killed_pids": [7],
                              "killed_at": 1.0, "kills": [kill] * 4,
                              "trained_s": 3 * rec["params"]["steps"] * step,
                              "trained_steps": rec["params"]["steps"], "error": "",
                              "up_s": 320.0,
                              "step_s": 1.5 * step,
                              "recovery": {"restart": 4, "from_step": 10, "back_s": 5.0,
                                           "joined_s": 8.0, "ready_s": 10.0, "load_s": 1.0,
                                           "recomputed_steps": 3}}
        return 2.0

    d = _checkpointed(tmp_path, "fp", blocked)
    r = _rows(report.build_report(d).read_text(), "failures")[0]
    assert r["kills"] == "4"
    assert float(r["measured"].rstrip("%")) == pytest.approx(50.0, abs=0.1)
    with open(d / "results.csv") as fh:
        row = [x for x in csv.DictReader(fh) if x["run_id"].startswith("train")
               and x["nodes"] == "2"][0]
    assert row["failures_injected"] == "4" and float(row["failure_every_s"]) == 60.0
    assert float(row["trained_up_s"]) == 320.0
    want = goodput.goodput(5 * float(row["trained_step_s"]), 2.0, 10.0, 80.0)
    assert abs(want - goodput.goodput(5 * float(row["trained_step_s"]), 2.0, 10.0, 60.0)) > 0.01
    assert float(row["trained_step_s"]) == pytest.approx(1.5 * float(row["step_time_mean_s"]),
                                                         rel=1e-3)
    assert float(r["model at the rate it saw"].rstrip("%")) == pytest.approx(100 * want,
                                                                           abs=0.1)

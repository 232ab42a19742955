"""The HTML report: one self-contained index.html per sweep, or one comparing several sweeps.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no global
backend switch) and embedded as base64 PNG; styles are inline; the page carries a Content
Security Policy that forbids scripts and any load other than its own data: images, so it opens
offline and nothing taken from the results can run. Every text that comes from results is
HTML-escaped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalelab.core.errors import ReportError
from scalelab.core.state import PROJECT_ROOT, reports_dir, write_atomic
from scalelab.report.data import (
    SweepData,
    analyse,
    known_sweeps,
    load_sweep_data,
    resolve_sweep,
    software_fingerprint,
)
from scalelab.report.figures import draw_figures, layout
from scalelab.report.html import render
from scalelab.results import frames

log = logging.getLogger(__name__)

__all__ = ["ReportError", "SweepData", "analyse", "build", "build_comparison", "build_example",
           "build_report", "comparable",
           "draw_figures", "known_sweeps", "layout", "load_sweep_data", "resolve_sweep",
           "software_fingerprint"]


# ---------------------------------------------------------------------------- entry points

def build_report(sweep: str | Path, out_dir: Path | str | None = None, *,
                 alpha_s: float | None = None, overlap: bool = False,
                 root: Path | None = None, node_mtbf_h: float | None = None) -> Path:
    """Write index.html for one sweep (and its results.csv); returns the page's path.

    ``sweep``: an id under the reports root, ``latest`` or a sweep directory. ``out_dir``
    defaults to the sweep's own directory. ``alpha_s``: per-hop latency for the model (default:
    fitted to the allreduce probes, else analysis.DEFAULT_ALPHA_S). ``overlap``: model
    communication as fully overlapped with compute. ``node_mtbf_h``: the failure rate of the
    Failures table, a node's mean hours between failures (default: Llama 3's).
    """
    data = load_sweep_data(sweep, root)
    out = _out_dir(Path(out_dir) if out_dir else data.path)
    csv_path = data.path / frames.CSV_FILE
    write_atomic(csv_path, frames.frame_to_csv(data.runs), mode=0o644)
    a = dataclasses.replace(analyse([data], alpha_s, overlap), node_mtbf_h=node_mtbf_h)
    title = f"scalelab report: {data.sweep_id}" + (" (SYNTHETIC DATA)" if data.synthetic else "")
    page = render(a, title, False, [(frames.CSV_FILE, _rel(csv_path, out))])
    path = out / "index.html"
    write_atomic(path, page, mode=0o644)
    log.info("wrote %s", path)
    return path


def build_comparison(sweeps: Sequence[str | Path], out_dir: Path | str | None = None, *,
                     alpha_s: float | None = None, overlap: bool = False,
                     root: Path | None = None, node_mtbf_h: float | None = None) -> Path:
    """Write one index.html comparing several sweeps on shared axes; returns its path.

    ``out_dir`` defaults to <reports root>/compare-<id1>-vs-<id2>...
    """
    if len(sweeps) < 2:
        raise ReportError("comparison needs two or more sweeps, e.g. --compare lab-a,lab-b")
    datas = [load_sweep_data(s, root) for s in sweeps]
    ids = [d.sweep_id for d in datas]
    if len(set(ids)) < len(ids):
        raise ReportError(f"comparison lists the same sweep twice: {', '.join(ids)}")
    out = _out_dir(Path(out_dir) if out_dir else (Path(root) if root else reports_dir()) / (
        "compare-" + "-vs-".join(ids)))
    links = []
    for d in datas:
        csv_path = d.path / frames.CSV_FILE
        write_atomic(csv_path, frames.frame_to_csv(d.runs), mode=0o644)
        links.append((f"{d.sweep_id}/{frames.CSV_FILE}", _rel(csv_path, out)))
    a = dataclasses.replace(analyse(datas, alpha_s, overlap), node_mtbf_h=node_mtbf_h)
    title = "scalelab comparison: " + " vs ".join(ids)
    if any(d.synthetic for d in datas):
        title += " (SYNTHETIC DATA)"
    path = out / "index.html"
    write_atomic(path, render(a, title, True, links), mode=0o644)
    log.info("wrote %s", path)
    return path


def _out_dir(out: Path) -> Path:
    """The output directory, made if missing; a path that cannot be one is a ReportError
    before anything is written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror}; give --out a "
                          "directory you can write") from None
    return out


def build(sweeps: Sequence[str | Path] | str | Path, out_dir: Path | str | None = None,
          compare: bool = False, **kwargs: Any) -> list[Path]:
    """Build reports: one per sweep, or with ``compare`` one page for all of them.

    Without ``compare`` and with several sweeps, ``out_dir`` (if given) gets one folder per
    sweep id. Keyword arguments go to build_report / build_comparison (alpha_s, overlap, root).
    """
    if isinstance(sweeps, (str, Path)):
        sweeps = [sweeps]
    sweeps = list(sweeps)
    if not sweeps:
        raise ReportError("no sweep given; pass a sweep id, latest, or a sweep directory")
    if compare:
        return [build_comparison(sweeps, out_dir, **kwargs)]
    if len(sweeps) == 1:
        return [build_report(sweeps[0], out_dir, **kwargs)]
    paths = []
    for s in sweeps:
        sub = None
        if out_dir:
            sub = Path(out_dir) / resolve_sweep(s, kwargs.get("root")).name
        paths.append(build_report(s, sub, **kwargs))
    return paths


EXAMPLE = PROJECT_ROOT / "reports" / "example"  # the README's example: a real `invoke demo`
_GENERATED = re.compile(r'<p class="note">Generated [^<]*? by scalelab [^<]*?\. Results:')


def build_example(example_dir: Path = EXAMPLE, screenshot: bool = True) -> Path:
    """Regenerate the README's example report from the sweep stored in example_dir (its
    sweep.json and runs.jsonl, recorded by `invoke demo`): index.html and results.csv, and
    report.png, the page's top 2,400 px at 1280 px wide in headless Chromium."""
    path = build_report(example_dir, out_dir=example_dir)
    if screenshot:
        _screenshot(path, example_dir / "report.png")
    return path


def comparable(page: str) -> str:
    """A page without the line that changes at every build (when, and which scalelab commit):
    two builds of the same sweep by the same code are then equal."""
    return _GENERATED.sub('<p class="note">Generated by scalelab. Results:', page, count=1)


def _screenshot(page: Path, out: Path) -> None:
    import shutil
    import subprocess
    import tempfile

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise ReportError("the example's picture needs Chromium (apt-get install chromium, "
                          "as ./bootstrap.sh does)")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                               "--hide-scrollbars", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={profile}",
                               "--window-size=1280,2400", f"--screenshot={out}",
                               page.resolve().as_uri()], capture_output=True, text=True,
                              timeout=120)
    if proc.returncode != 0 or not out.is_file():
        raise ReportError(f"chromium could not take the example's picture: "
                          f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")


def _rel(target: Path, start: Path) -> str:
    try:
        return os.path.relpath(target, start)
    except ValueError:
        return target.as_uri()

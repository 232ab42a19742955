"""The README is a front door into docs/: short, every docs page linked from it, and every
relative link in it and in docs/ leads to a file that exists and, where it names a heading,
to a heading that exists (as GitHub spells anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks (a `#` there is a comment)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation but hyphens and
    underscores dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    """Relative link targets; a link written inside inline code is text, not a link, while a
    link whose text is code (`[`bench`](...)`) is one."""
    out = []
    for line in _prose(path):
        code = [m.span() for m in re.finditer(r"`[^`]*`", line)]
        for m in LINK.finditer(line):
            in_code = any(a < m.start() < b for a, b in code)
            if not in_code and not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1)):  # http:, mailto:
                out.append(m.group(1))
    return out


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    assert "./bootstrap.sh demo" in README.read_text() and "./bootstrap.sh test" in README.read_text()


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(README) if t.split("#")[0]}
    missing = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == [], f"link these pages from README.md's 'Where to read on': {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_the_anchor_rule_is_githubs():
    """The slugs this test checks against, on headings of the kinds the pages use."""
    assert _slug("Slurm: every run a job (`--launcher slurm`)") == \
        "slurm-every-run-a-job---launcher-slurm"
    assert _slug("`local` (default): a cluster emulated on this machine") == \
        "local-default-a-cluster-emulated-on-this-machine"
    assert _slug("[T1](x.md): Horovod's README, 4 x 4") == "t1-horovods-readme-4-x-4"
    assert _slug("Host keys: trust on first use, done carefully") == \
        "host-keys-trust-on-first-use-done-carefully"

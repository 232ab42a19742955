"""docs/ARCHITECTURE.md lists every module of scalelab/ and no module that is gone."""

from __future__ import annotations

import re

from conftest import ROOT


def test_the_architecture_map_matches_the_tree():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed: set[str] = set()
    for cell in re.findall(r"^\| ([^|]+) \|", text, re.MULTILINE):
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", cell):
            listed.add(name)
    # "static.py" etc. named in a row's text count for their own folder's row
    named = set(re.findall(r"`(\w+\.py)`", text))
    # a package's __init__ counts where it holds code (the report, the targets' router)
    modules = {str(p.relative_to(ROOT / "scalelab")) for p in (ROOT / "scalelab").rglob("*.py")
               if p.name != "__init__.py" or len(p.read_text().splitlines()) > 5}
    shown = {m for m in modules if m in listed
             or (m.startswith("cluster/targets/") and m.split("/")[-1] in named)
             or (m.startswith("report/") and "report/" in listed)}
    assert sorted(modules - shown) == [], "add these modules to docs/ARCHITECTURE.md"
    gone = {n for n in listed | named if n.endswith(".py") and n not in ("tasks.py",)
            and not any(m == n or m.endswith("/" + n) for m in modules)}
    assert sorted(gone) == [], "docs/ARCHITECTURE.md lists modules that do not exist"

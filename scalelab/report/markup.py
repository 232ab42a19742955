"""HTML building blocks for the report: escaping, numbers and rates as the page writes them,
tables, the stylesheet, the content security policy and the page around a body."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from scalelab.report import tables


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def readable(value: float, digits: int = 3) -> str:
    """A number as a person reads it: thousands separators, no exponent, `digits` significant
    figures below 1000.

    >>> readable(17440.4), readable(95970.0), readable(950.2), readable(12.345), readable(0.0005896)
    ('17,440', '95,970', '950', '12.3', '0.00059')
    >>> readable(float("nan")), readable(0.0), readable(-2.5)
    ('', '0', '-2.5')
    """
    if value is None or math.isnan(value):
        return ""
    if value == 0:
        return "0"
    size = abs(value)
    if size >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(size)))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def rate_label(mbit: float) -> str:
    """A link rate as a person reads it.

    >>> rate_label(9585.0), rate_label(958.5), rate_label(100000.0)
    ('9.59 Gbit/s', '958 Mbit/s', '100 Gbit/s')
    """
    return f"{readable(mbit / 1000)} Gbit/s" if mbit >= 1000 else f"{readable(mbit)} Mbit/s"


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return readable(float(value), digits)
    return str(value)


def col_text(series: pd.Series, kind: str) -> pd.Series:
    """Vectorised cell text for a column: escaped strings."""
    if kind == "pct":
        vals = series.astype(float)
        out = (vals * 100).map(lambda v: "" if math.isnan(v) else f"{v:.1f}%")
    elif kind == "num":
        out = series.astype(float).map(lambda v: readable(v, 4))
    elif kind == "ms":  # a time in seconds, shown in ms rounded as verdict.ms writes it
        out = series.astype(float).map(lambda v: readable(tables._ms_number(v), 4))
    elif kind == "int":
        out = series.map(lambda v: "" if pd.isna(v) else str(int(v)))
    else:
        out = series.astype(str).map(html.escape)
    return out


def batch_cells(frame: pd.DataFrame) -> pd.Series:
    """Cell text of a frame's batch_size as what it is: 64/worker (weak scaling) or 512 global
    (strong scaling: split over the ranks).

    >>> batch_cells(pd.DataFrame({"batch_size": [64, 512], "scaling": ["weak", "strong"]})).tolist()
    ['64/worker', '512 global']
    >>> batch_cells(pd.DataFrame({"batch_size": [32]})).tolist()  # a frame from before
    ['32/worker']
    """
    strong = (frame["scaling"] == "strong") if "scaling" in frame else pd.Series(
        False, index=frame.index)
    return pd.Series([("" if pd.isna(b) else f"{int(b)} global" if s else f"{int(b)}/worker")
                      for b, s in zip(frame["batch_size"], strong, strict=True)],
                     index=frame.index)


def table(frame: pd.DataFrame, columns: list[tuple[str, str, str]], cls: str = "") -> str:
    """An HTML table; columns are (frame column, header, kind: str|num|ms|int|pct|pre|wrap),
    ms a time in seconds shown in milliseconds (the header says ms), wrap being text that may
    wrap in a table whose cells otherwise do not."""
    head = "".join(f"<th>{esc(h)}</th>" for _, h, _ in columns)
    if frame.empty:
        return (f'<div class="fit"><table class="{cls}"><thead><tr>{head}</tr></thead>'
                "<tbody></tbody></table></div>")
    cells = []
    for col, _, kind in columns:
        if kind == "batch":  # the batch a series holds fixed: each worker's, or the global one
            text = batch_cells(frame)
        else:
            text = col_text(frame[col], "str" if kind in ("pre", "wrap") else kind)
        if kind == "pre":
            text = "<pre>" + text + "</pre>"
        tag = ('<td class="n">' if kind in ("num", "ms", "int", "pct", "batch") else
               '<td class="w">' if kind == "wrap" else "<td>")
        cells.append(tag + text + "</td>")
    rows = cells[0]
    for c in cells[1:]:
        rows = rows + c
    body = "<tr>" + rows + "</tr>"
    # in a box of the page's width: a table wider than the window scrolls in it, never the page
    return (f'<div class="fit"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(body.tolist()) + "</tbody></table></div>")


def kv(pairs: Sequence[tuple[str, Any]]) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{rows}</table>'


def jsonish(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else str(value)


def parse_time(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;
color:#1b1b1b;background:#fff;line-height:1.45}
main{max-width:1240px;margin:0 auto;padding:1rem 1.5rem 3rem}
h1{font-size:1.6rem;margin:.4rem 0}h2{font-size:1.25rem;margin-top:2rem;
border-bottom:2px solid #0072B2;padding-bottom:.2rem}h3{font-size:1.05rem}
.banner{padding:.6rem 1rem;border-radius:4px;margin:.6rem 0;font-weight:600}
.synthetic{background:#fff3cd;border:2px solid #E69F00}
.partial{background:#fde2e1;border:2px solid #D55E00}
.note{color:#444;font-size:.92rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.85rem}
th,td{border:1px solid #ccc;padding:.2rem .45rem;text-align:left;vertical-align:top}
thead th{background:#eef4fa;position:sticky;top:0}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.fit{max-width:100%;overflow-x:auto}
table.scaling{font-size:.8rem}
table.scaling th,table.scaling td{padding:.2rem .3rem}
th{font-weight:600}
table.runs td{white-space:nowrap}
table td.n{white-space:nowrap}
table td.w{white-space:normal;min-width:9rem}
.model-error{margin:.4rem 0}
table.kv th{background:#f6f6f6;font-weight:600;white-space:nowrap}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:60rem;font-size:.8rem}
figure{margin:1.2rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.88rem;color:#333;max-width:70rem}
.kind{font-weight:600;white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:1rem}
details summary{cursor:pointer;font-weight:600;margin:.4rem 0}
code{background:#f3f3f3;padding:0 .2rem}
"""


CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{body}</main></body></html>\n")

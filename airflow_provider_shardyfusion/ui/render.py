"""HTML of the snapshot history pages: server-rendered, inline SVG charts, nothing loaded from outside.

Pure functions of the JSON twins (``core.lifecycle.history`` models as dicts), so the HTML and the JSON of a
page always say the same thing. Every value is escaped; no page carries a credential because no
model holds one.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from airflow_provider_shardyfusion.core import layout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "CONTENT_SECURITY_POLICY", "ERROR_LINE_CHARS", "LEGEND", "PREFIX", "Num", "as_json", "bar_chart", "bytes_cell",
    "changes_page", "diff_page", "error_page", "esc", "external_link", "first_line", "fmt_age", "fmt_bytes", "key_link",
    "key_page", "link", "num", "page", "roots_page", "run_link", "run_page", "safe_href", "samples_html", "signed_num",
    "state", "table", "timeline_page", "value_html", "when",
]

PREFIX = "/shardyfusion"

# Airflow 3's look (its UI theme's fonts and colour tokens, as values: nothing is loaded from it),
# light and dark as the browser prefers. Run ids, headings and numbers never wrap; anything long
# (root URIs, values, errors) may break anywhere, so one long value cannot widen a table.
_STYLE = """
:root{color-scheme:light dark;--fg:#111827;--muted:oklch(0.45 0.055 251);--border:oklch(0.915 0.01 253);
--head:oklch(0.955 0.006 253);--bg:#fff;--panel:oklch(0.985 0.004 253);--link:#2563eb;--error:oklch(0.505 0.213 27.518);
--ok-bg:#dcfce7;--ok-fg:#116932;--bad-bg:oklch(0.936 0.032 17.717);--bad-fg:oklch(0.505 0.213 27.518);
--warn-bg:oklch(0.961 0.033 82.320);--warn-fg:oklch(0.47 0.12 58);--info-bg:#dbeafe;--info-fg:#173da6;
--grey-bg:oklch(0.915 0.01 253);--grey-fg:oklch(0.35 0.045 251);--ins:#116932;--upd:oklch(0.47 0.12 58);
--del:oklch(0.505 0.213 27.518);--mark:oklch(0.961 0.033 82.320);--bar:#3b82f6;--neg:#ea580c;--none:oklch(0.75 0.025 252)}
@media (prefers-color-scheme:dark){:root{--fg:oklch(0.985 0.004 253);--muted:oklch(0.75 0.025 252);
--border:oklch(0.28 0.035 251);--head:oklch(0.18 0.03 251);--bg:oklch(0.11 0.025 251);--panel:oklch(0.18 0.03 251);
--link:#a3cfff;--error:oklch(0.808 0.114 19.571);--ok-bg:#124a28;--ok-fg:#86efac;--bad-bg:oklch(0.396 0.141 25.723);
--bad-fg:oklch(0.885 0.062 18.334);--warn-bg:oklch(0.42 0.09 60);--warn-fg:oklch(0.918 0.065 79.975);--info-bg:#1a3478;
--info-fg:#bfdbfe;--grey-bg:oklch(0.35 0.045 251);--grey-fg:oklch(0.915 0.01 253);--ins:#86efac;
--upd:oklch(0.857 0.118 76.815);--del:oklch(0.808 0.114 19.571);--mark:oklch(0.42 0.09 60);--bar:#60a5fa;
--neg:#fb923c;--none:oklch(0.45 0.055 251)}}
body{font-family:Inter,-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;font-size:14px;
line-height:1.5;margin:1rem 1.25rem;color:var(--fg);background:var(--bg);max-width:100%}
h1{font-size:1.5rem;font-weight:600;margin:.5rem 0 1rem;overflow-wrap:anywhere}
h2{font-size:1.125rem;font-weight:600;margin:1.5rem 0 .5rem}
h3{font-size:1rem;font-weight:600;margin:1rem 0 .25rem}
a{color:var(--link);text-decoration:none}a:hover{text-decoration:underline}
code,pre{font-family:SFMono-Regular,Menlo,Monaco,Consolas,"Liberation Mono",monospace;font-size:.8125rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;max-width:100%}
th,td{padding:.375rem .5rem;border-bottom:1px solid var(--border);text-align:left;vertical-align:top}
th{background:var(--head);font-weight:600;white-space:nowrap}
td a,td code,td .problem,.anywhere{overflow-wrap:anywhere}td a.run,td a.nowrap,.nowrap,.num{white-space:nowrap}
span.error-line{display:block;min-width:8rem}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.state{display:inline-block;padding:0 .5rem;border-radius:.25rem;font-size:.75rem;font-weight:500;white-space:nowrap}
.live{background:var(--ok-bg);color:var(--ok-fg)}.failed,.unreadable,.missing{background:var(--bad-bg);color:var(--bad-fg)}
.staged,.running{background:var(--warn-bg);color:var(--warn-fg)}.base_of_live{background:var(--info-bg);color:var(--info-fg)}
.superseded,.rolled_back,.deleted{background:var(--grey-bg);color:var(--grey-fg)}
nav{margin-bottom:.5rem}nav a{margin-right:1rem}.muted{color:var(--muted)}.problem{color:var(--error)}
pre{background:var(--panel);border:1px solid var(--border);border-radius:.25rem;padding:.5rem;overflow-x:auto;max-width:100%}
pre.error{white-space:pre-wrap;overflow-wrap:anywhere;color:var(--error);margin:0}
details{margin:.5rem 0}summary{cursor:pointer;color:var(--muted)}figure{margin:.5rem 0}figcaption{color:var(--muted)}
svg{background:var(--panel);border:1px solid var(--border);border-radius:.25rem;max-width:100%;height:auto}
svg text{fill:var(--fg);font-family:inherit}svg .axis{stroke:var(--muted)}svg .pos{fill:var(--bar)}
svg .neg{fill:var(--neg)}svg .none{fill:var(--none)}svg .bad{fill:var(--error)}
input,button{font:inherit;color:inherit;background:var(--bg);border:1px solid var(--border);border-radius:.25rem;
padding:.125rem .5rem}button{cursor:pointer}
.ins{color:var(--ins)}.upd{color:var(--upd)}.del{color:var(--del)}mark{background:var(--mark);color:inherit}
"""


# The one inline style block is allowed by its hash; no script of any kind, nothing from elsewhere.
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
CONTENT_SECURITY_POLICY = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                           "base-uri 'none'; frame-ancestors 'self'")

# An absolute http(s) address, or a path of this server ("/x", never "//host" or "/\host", which
# browsers read as another host). Nothing before the scheme: browsers drop leading blanks and
# control characters, so " javascript:" would run.
_SAFE_HREF = re.compile(r"(?:https?://[^\s/\\?#@][^\s]*|/(?![/\\])[^\s]*)", re.IGNORECASE)


def safe_href(url: Any) -> str | None:
    """``url`` if a page may link it (see ``_SAFE_HREF``), else None: the page shows it as text."""
    text = str(url)
    return text if _SAFE_HREF.fullmatch(text) and not any(ord(c) < 32 or ord(c) == 127 for c in text) else None


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def link(path: str, text: Any, *, cls: str | None = None, **params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    attr = f'class="{esc(cls)}" ' if cls else ""
    return f'<a {attr}href="{esc(PREFIX + path + ("?" + query if query else ""))}">{esc(text)}</a>'


def run_link(root: str, run_id: str, text: str | None = None) -> str:
    """A run id linked to its run page; a run id never wraps."""
    return link("/run", run_id if text is None else text, cls="run", uri=root, run_id=run_id)


def key_link(root: str, key: Any) -> str:
    """A shown key (``encoding.key_to_show``) linked to its history page; bytes are looked up as hex."""
    if isinstance(key, dict):
        return link("/key", f"hex {key['hex']}", uri=root, key=key["hex"], key_type="hex")
    return link("/key", key, uri=root, key=key)


def page(title: str, body: str) -> str:
    """Every page, error pages included: the same layout, the one hashed style block, no script."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)} · Snapshots</title>"
            f"<style>{_STYLE}</style></head><body><nav>{link('/', 'Snapshot roots')}</nav>"
            f"<h1>{esc(title)}</h1>{body}</body></html>")


class Num(str):
    """A table cell's HTML that is a number: right-aligned, never wrapped."""

    __slots__ = ()


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Cells are HTML; a ``Num`` cell (and its column's heading, by the first row) is a number."""
    rows = [list(r) for r in rows]
    numeric = [bool(rows) and all(isinstance(r[i], Num) or r[i] == "" for r in rows) and any(isinstance(r[i], Num) for r in rows)
               for i in range(len(headers))]
    head = "".join(f"<th class='num'>{esc(h)}</th>" if n else f"<th>{esc(h)}</th>" for h, n in zip(headers, numeric, strict=True))
    body = "".join("<tr>" + "".join(f"<td class='num'>{cell}</td>" if isinstance(cell, Num) else f"<td>{cell}</td>"
                                    for cell in row) + "</tr>" for row in rows)
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""  # a table of facts has no headings
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def num(n: Any) -> str:
    """A count with thousands separators (``12,345``); empty for no value."""
    if n is None or n == "":
        return Num("")
    return Num(esc(f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else n))


def signed_num(n: int | None) -> str:
    """``+1,234``, ``−1,234`` (a real minus sign) or ``0``; empty for no value."""
    if n is None:
        return ""
    return f"+{n:,}" if n > 0 else f"\u2212{-n:,}" if n < 0 else "0"


def bytes_cell(n: int | None) -> str:
    return Num(esc(fmt_bytes(n)))


# Characters of an error's first line a table shows; the run page shows all of it.
ERROR_LINE_CHARS = 120


def first_line(text: str | None) -> str:
    """The first line of an error, cut to ``ERROR_LINE_CHARS`` characters: what a table shows of it."""
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= ERROR_LINE_CHARS else line[:ERROR_LINE_CHARS - 1] + "…"


def state(value: str) -> str:
    return f'<span class="state {esc(value)}">{esc(value.replace("_", " "))}</span>'


def when(ts: str | None) -> str:
    """A stored time as people read it (``2026-01-01 10:00 UTC, 3 h ago``), the exact one in a tooltip."""
    if not ts:
        return ""
    try:
        dt = layout.parse_ts(ts)
    except ValueError:
        return esc(ts)
    ago = round((layout.utc_now() - dt).total_seconds())
    rel = f"{fmt_age(ago)} ago" if ago >= 0 else f"in {fmt_age(-ago)}"
    # The date and the time never break inside; a narrow column puts them on lines of their own.
    return (f'<time datetime="{esc(ts)}" title="{esc(ts)}"><span class="nowrap">{esc(dt.strftime("%Y-%m-%d"))}</span> '
            f'<span class="nowrap">{esc(dt.strftime("%H:%M UTC"))}</span>, {esc(rel)}</time>')


def fmt_age(seconds: int | None) -> str:
    if seconds is None:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def as_json(value: Any) -> str:
    """A value or report as readable JSON (never a Python repr)."""
    return f"<pre>{esc(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>"


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float | int | None], *, x_axis: str, y_axis: str,
              width: int = 640, height: int = 220, missing: str | Sequence[str] = "no value",
              problem: bool | Sequence[bool] = True, tick: Callable[[float], str] | None = None) -> str:
    """Vertical bars, signed about a zero line, with labelled axes and a label per bar (every few
    bars when there are many). A ``None`` value is a mark on the zero line titled ``missing`` (one
    text, or one per bar): red where ``problem`` says so (one flag, or one per bar), else grey."""
    numbers = [v or 0 for v in values]
    notes = [missing] * len(values) if isinstance(missing, str) else list(missing)
    bad = [problem] * len(values) if isinstance(problem, bool) else list(problem)
    tick = tick or _short
    top, bottom = max(max(numbers, default=0), 0), min(min(numbers, default=0), 0)
    span = (top - bottom) or 1
    left, foot, head = 64, 54, 10
    plot_w, plot_h = width - left - 8, height - foot - head
    zero = head + plot_h * top / span
    n = max(len(numbers), 1)
    slot = plot_w / n
    # Every few bars, so that no label runs into the next (a label line is at most 9 characters).
    every = max(1, n // 12, math.ceil(_LABEL_PX / slot))
    parts = [f'<line class="axis" x1="{left}" y1="{head}" x2="{left}" y2="{head + plot_h}" stroke="#52606d"/>',
             f'<line class="axis" x1="{left}" y1="{zero:.1f}" x2="{left + plot_w}" y2="{zero:.1f}" stroke="#52606d"/>',
             f'<text x="{left - 4}" y="{zero + 4:.1f}" text-anchor="end" font-size="11">0</text>',
             f'<text x="13" y="{head + plot_h / 2:.0f}" font-size="12" text-anchor="middle" '
             f'transform="rotate(-90 13 {head + plot_h / 2:.0f})">{esc(y_axis)}</text>',
             f'<text x="{left + plot_w / 2:.0f}" y="{height - 4}" font-size="12" text-anchor="middle">{esc(x_axis)}</text>']
    if top > 0:  # a top of 0 is the zero line's own label
        parts.append(f'<text x="{left - 4}" y="{head + 11}" text-anchor="end" font-size="11">{esc(tick(top))}</text>')
    if bottom < 0:
        parts.append(f'<text x="{left - 4}" y="{head + plot_h}" text-anchor="end" font-size="11">{esc(tick(bottom))}</text>')
    for i, (label, value, raw) in enumerate(zip(labels, numbers, values, strict=True)):
        x = left + i * slot + slot * 0.1
        if raw is None:
            cls, fill = ("bad", "#e53e3e") if bad[i] else ("none", "#a0aec0")
            parts.append(f'<rect class="{cls}" x="{x:.1f}" y="{zero - 3:.1f}" width="{slot * 0.8:.1f}" height="6" '
                         f'fill="{fill}"><title>{esc(label)}: {esc(notes[i])}</title></rect>')
        else:
            h = plot_h * abs(value) / span
            y = zero - h if value >= 0 else zero
            cls, fill = ("pos", "#4c7bd9") if value >= 0 else ("neg", "#d9822b")
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
            parts.append(f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" height="{h:.1f}" '
                         f'fill="{fill}"><title>{esc(label)}: {esc(shown)}</title></rect>')
        if i % every == 0:
            cx = f"{x + slot * 0.4:.1f}"
            lines = "".join(f'<tspan x="{cx}" dy="{12 if j else 0}">{esc(line)}</tspan>'
                            for j, line in enumerate(_short_label(label)))
            parts.append(f'<text x="{cx}" y="{head + plot_h + 14}" font-size="11" text-anchor="middle">{lines}</text>')
    return (f'<figure><figcaption>{esc(title)}</figcaption>'
            f'<svg class="chart" role="img" aria-label="{esc(title)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg></figure>')


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:g}"


def _short_bytes(n: float) -> str:
    return ("\u2212" if n < 0 else "") + fmt_bytes(abs(int(n)))


# Room for one bar label: 9 characters at font-size 11 and a gap.
_LABEL_PX = 68


def _short_label(label: str) -> tuple[str, ...]:
    """A run id as two lines, date and time, then its suffix (``0101 1200``, ``…ab12``); anything
    else cut to 9 characters."""
    m = re.fullmatch(r"\d{4}(\d{4})T(\d{4})\d*Z-(.*)", label)
    return (f"{m[1]} {m[2]}", f"…{m[3][-4:]}") if m else (label[:9],)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(n)


def error_page(status: int, detail: str) -> str:
    """A 4xx/5xx answer in the pages' layout; ``?format=json`` gives ``{"detail": ...}`` instead."""
    what = {404: "Not found", 422: "Not understood", 502: "Storage answered with an error",
            504: "Storage did not answer"}
    return page(f"{status} {what.get(status, 'Error')}",
                f"<p class='problem'>{esc(detail)}</p><p>{link('/', 'Back to the snapshot roots')}</p>")


LEGEND = ("<p class='muted'>Changes: <span class='ins'>+inserted</span> <span class='upd'>~updated</span> "
          "<span class='del'>\u2212deleted</span> keys, as the writer counted them (stored in the manifest), and the net "
          "row change: against the base for a delta, against the run before for a full write. "
          "<b>base of live</b>: the live run still reads this run's files.</p>")


def roots_page(data: dict[str, Any]) -> str:
    rows = []
    for r in data["roots"]:
        uri = r["root"]
        live = r.get("live_run_id")
        failure = r.get("latest_failure")
        rows.append([
            link("/root", uri, uri=uri) + ("" if r.get("error") is None else
                                           " " + state("missing" if r.get("exists") is False else "unreadable")),
            run_link(uri, live) if live else "—",
            when(r.get("live_since")), num(r.get("rows")), bytes_cell(r.get("bytes")), num(r.get("chain_depth")),
            _validation_summary(r.get("last_validation")),
            (f"{run_link(uri, failure['run_id'])}<br>"
             f"{esc(failure.get('error_type'))} {when(failure.get('at'))}" if failure else ""),
            num(r.get("runs")), f"<span class='problem'>{esc(r.get('error') or '')}</span>"])
    note = "" if data["roots"] else "<p class='muted'>No snapshot roots yet: none emitted an asset event, and " \
                                     "[shardyfusion] history_roots is empty.</p>"
    return page("Snapshot roots", table(["root", "live run", "live since", "rows", "bytes", "chain depth",
                                         "last validation", "latest failure", "runs", "problem"], rows) + note)


def _validation_summary(last: dict[str, Any] | None) -> str:
    if not last:
        return "<span class='muted'>not validated</span>"
    return f"{'passed' if last.get('ok') else 'FAILED'} {when(last.get('validated_at'))}"


def _change_cell(r: dict[str, Any]) -> str:
    changes = r.get("changes")
    net = f"net {signed_num(r['rows_change'])}" if r.get("rows_change") is not None else ""
    if not changes:
        return esc(net)
    return (f"<span class='ins'>+{num(changes['inserted'])}</span> <span class='upd'>~{num(changes['updated'])}</span> "
            f"<span class='del'>\u2212{num(changes['deleted'])}</span>" + (f" ({esc(net)})" if net else ""))


def timeline_page(data: dict[str, Any]) -> str:
    runs, root = data["runs"], data["root"]
    live = data.get("live_run_id")
    written = [r for r in runs if r.get("manifest_ref") and r["state"] not in ("deleted", "unreadable")]
    rows = []
    for r in runs:
        older = next((o for o in written if (o.get("started_at") or "") < (r.get("started_at") or "")), None)
        diffs = []
        if r in written and older is not None:
            diffs.append(link("/diff", "vs previous", cls="nowrap", uri=root, a=older["run_id"], b=r["run_id"]))
        if r in written and live and r["run_id"] != live:
            diffs.append(link("/diff", "vs live", cls="nowrap", uri=root, a=live, b=r["run_id"]))
        label = state(r["state"])
        if r.get("replaced_by") and r["state"] in ("superseded", "rolled_back"):
            # The run id's suffix (the whole id in its tooltip): the state column stays narrow.
            by = r["replaced_by"]
            label += (f" <span class='muted'>by <a class='run' title='{esc(by)}' "
                      f"href='{esc(PREFIX + '/run?' + urlencode({'uri': root, 'run_id': by}))}'>"
                      f"…{esc(by.rsplit('-', 1)[-1])}</a></span>")
        error = first_line(r.get("error"))
        rows.append([run_link(root, r["run_id"]), label, esc(r.get("write_mode") or ""),
                     _change_cell(r), when(r.get("started_at")), when(r.get("published_at")), num(r.get("rows")),
                     bytes_cell(r.get("bytes")), Num(esc(f"{r['duration_s']:,} s")) if r.get("duration_s") is not None else "",
                     _validation_summary(r["validation"]) if r.get("validation") else "",
                     f"<span class='problem error-line'>{esc(error)}</span>" if error else "",
                     " · ".join(diffs)])
    labels = [r["run_id"] for r in runs]
    charts = ""
    if runs:
        wrote = [r.get("rows") is not None for r in runs]
        # A run that wrote but has nothing before it to compare with is no error: a grey mark.
        net_notes = ["wrote nothing" if not w else "first run: nothing before it to compare" for w in wrote]
        charts = ("<details open><summary>Charts: rows, net row change and bytes per run</summary>"
                  + bar_chart("rows per run (newest → oldest, as the table; red: a run that wrote nothing)", labels,
                              [r.get("rows") for r in runs], x_axis="run (newest first)", y_axis="rows",
                              missing="wrote nothing")
                  + bar_chart("net row change per run (grey: nothing to compare with)", labels,
                              [r.get("rows_change") for r in runs], x_axis="run (newest first)", y_axis="row change",
                              missing=net_notes, problem=[not w for w in wrote])
                  + bar_chart("bytes per run", labels, [r.get("bytes") for r in runs], x_axis="run (newest first)",
                              y_axis="bytes", missing="wrote nothing", tick=_short_bytes)
                  + "</details>")
    head = (f"<p>Live: {run_link(root, live) if live else 'nothing'}"
            f" {'since ' + when(data['live_since']) if data.get('live_since') else ''}</p>")
    if data.get("exists") is False:
        head += ("<p class='problem'>Nothing here: no run records and no _CURRENT under this root "
                 "(a wrong URI, or nothing written yet).</p>")
    if data.get("live_manifest_error"):
        head += f"<p class='problem'>The live run's manifest cannot be read: {esc(data['live_manifest_error'])}</p>"
    form = (f"<form action='{PREFIX}/key'><input type='hidden' name='uri' value='{esc(root)}'>"
            "Key look-up across runs: <input name='key'> <button>look up</button></form>")
    return page(root, head + form + LEGEND + table(
        ["run", "state", "mode", "changes", "started", "published", "rows", "bytes", "took", "validation",
         "error", "diff"], rows) + charts)


def run_page(data: dict[str, Any]) -> str:
    entry, shards, root = data["run"], data.get("shards") or [], data["root"]
    run_id = entry["run_id"]
    base = data.get("base_run_id")
    facts = table(["", ""], [[esc(k), str(v)] for k, v in (  # str: values left-aligned, as the rest
        ("state", state(entry["state"])), ("started", when(entry.get("started_at"))),
        ("finished", when(entry.get("finished_at"))), ("published", when(entry.get("published_at"))),
        ("rows", num(entry.get("rows"))), ("bytes", esc(fmt_bytes(entry.get("bytes")))),
        ("changes", _change_cell(entry)),
        ("shards", num(data.get("num_dbs"))), ("skew (largest / mean rows)", esc(data.get("skew"))),
        ("write mode", esc(data.get("write_mode"))),
        ("written on run", (run_link(root, base) + " · "
                            + link("/diff", "diff against base", uri=root, a=base, b=run_id)) if base else ""),
        ("chain depth", esc(data.get("chain_depth") if data.get("write_mode") not in (None, "full") else None)),
        ("replaced by", run_link(root, entry["replaced_by"]) if entry.get("replaced_by") else ""),
        # The whole error, a JVM trace included: tables show its first line only.
        ("error", f"<pre class='error'>{esc(entry['error'])}</pre>" if entry.get("error") else ""),
        ("Airflow task", esc(" / ".join(str(entry["airflow"].get(k)) for k in ("dag_id", "task_id", "run_id", "try_number")
                                        if entry.get("airflow")) or None)),
        ("Spark application", esc(data.get("spark_app_id"))),
    ) if v not in (None, "")])
    links = "".join(f"<li>{external_link(name, url)}</li>" for name, url in data.get("links", {}).items())
    charts = ""
    if shards:
        labels = [f"shard {s['db_id']}" for s in shards]
        charts = ("<details open><summary>Charts: rows and bytes per shard</summary>"
                  + bar_chart("rows per shard", labels, [s["rows"] for s in shards], x_axis="shard", y_axis="rows")
                  + bar_chart("bytes per shard", labels, [s["bytes"] for s in shards], x_axis="shard", y_axis="bytes",
                              tick=_short_bytes) + "</details>")
    validation = entry.get("validation")
    checks = ""
    if validation:
        checks = ("<h2>Validation</h2>" + table(["check", "ok", "figure", "limit"], [
            [esc(c["name"]), esc("skipped" if c.get("skipped") else "passed" if c["ok"] else "FAILED"),
             _figure(c.get("figure")), _figure(c.get("limit"))]
            for c in validation.get("checks", [])]) + "<details><summary>the report as JSON</summary>"
            + as_json(validation) + "</details>")
    shard_rows = [[num(s["db_id"]), num(s["rows"]), bytes_cell(s["bytes"]), num(s["files"]), _layers_text(s)]
                  for s in shards]
    samples = ""
    if data.get("samples") is not None and base:
        samples = "<h2>Changed keys (a sample, against the base)</h2>" + samples_html(root, data["samples"], base, run_id)
    schema = ""
    if "value_schema" in data:  # only a run whose manifest was read
        columns = data["value_schema"]
        schema = "<h2>Value schema</h2>" + (
            table(["column", "type", "nullable"], [[esc(c["name"]), f"<code>{esc(c['type'])}</code>",
                                                    esc("yes" if c["nullable"] else "no")] for c in columns])
            if columns is not None else f"<p class='muted'>{_NO_SCHEMA}</p>")
    return page(f"Run {run_id}", LEGEND + facts + (f"<ul>{links}</ul>" if links else "") + charts + schema + samples + checks
                + ("<h2>Shards</h2>" + table(["shard", "rows", "bytes", "files (all layers)", "layers (oldest first)"],
                                             shard_rows) if shards else ""))


def _figure(value: Any) -> str:
    """A validation figure or limit: a number with separators, JSON otherwise, a dash for none (never ``null``)."""
    if value is None:
        return "<span class='muted'>—</span>"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return num(value)
    return esc(json.dumps(value, ensure_ascii=False))


_NO_SCHEMA = "schema not recorded (the manifest was written before value schemas were recorded)"


def _schema_diff_html(diff: dict[str, Any] | None, a: str, b: str) -> str:
    """The schema changes from run ``a`` to ``b``, one row per column, or the line that says there are none."""
    if diff is None:
        return ""
    changes = diff.get("changes")
    if not changes:  # [] is "no schema change", None "not recorded"
        muted = "" if changes == [] else " class='muted'"
        return f"<h2>Value schema</h2><p{muted}>{esc(diff['summary'])}</p>"

    def shown(text: str | None, suffix: str = "") -> str:
        return f"<code>{esc(text)}{esc(suffix)}</code>" if text else "—"

    kinds = {"added": "ins", "changed": "upd", "removed": "del"}
    return "<h2>Value schema</h2>" + table(["column", "change", f"type in {a}", f"type in {b}"], [
        [esc(c["column"]), f"<span class='{kinds[c['kind']]}'>{esc(c['kind'])}</span>", shown(c["old"]),
         # An added column's nullability is not in its type text (a changed one's is).
         shown(c["new"], " not null" if c["kind"] == "added" and not c["nullable"] else "")]
        for c in changes])


def external_link(name: str, url: Any) -> str:
    """A link a manifest or the configuration gave: an anchor only for ``safe_href`` addresses."""
    href = safe_href(url)
    if href is None:
        return f"{esc(name)}: <code>{esc(url)}</code> (not linked: only http and https addresses are)"
    return f"<a href='{esc(href)}' rel='noopener noreferrer'>{esc(name)}</a>"


def _layers_text(shard: dict[str, Any]) -> str:
    """A chain shard's layers: the run that wrote each and what it did (empty for a full snapshot's shard)."""
    parts = []
    for x in shard.get("layers") or ():
        did = "full" if x["kind"] == "full" else f"+{x['inserted']:,} ~{x['updated']:,} \u2212{x['deleted']:,}"
        parts.append(f"{esc(x['run_id'])} ({esc(did)}, {esc(fmt_bytes(x['bytes']))})")
    return "<br>".join(parts)


_KIND_CLASS = {"inserted": "ins", "updated": "upd", "deleted": "del"}
_KIND_HEADING = {"inserted": "Inserted keys", "updated": "Updated keys", "deleted": "Deleted keys"}


def _kind_rows(root: str, kind: str, changes: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows of changed keys of one kind: shard, key (a link to its history), and the values that matter."""
    rows = []
    for c in changes:
        row = [num(c["db_id"]), key_link(root, c["key"])]
        if kind != "inserted":
            row.append(value_html(c["before"], c["fields"]))
        if kind != "deleted":
            row.append(value_html(c["after"], c["fields"]))
        rows.append(row)
    return rows


def _kind_headers(kind: str, run_a: str, run_b: str) -> list[str]:
    return ["shard", "key"] + ([f"before ({run_a})"] if kind != "inserted" else []) + (
        [f"after ({run_b})"] if kind != "deleted" else [])


def samples_html(root: str, samples: dict[str, Any], run_a: str, run_b: str) -> str:
    """Changed keys, one table per kind (inserted, updated, deleted), each key a link to its history;
    before → after with differing fields marked; a link to every key of a kind, page by page."""
    out = []
    if samples.get("stopped"):
        out.append(f"<p class='problem'>{esc(samples['stopped'])}</p>")
    sampled = samples.get("shards", [])
    out.append(f"<p class='muted'>Up to {esc(samples.get('kind_keys', ''))} keys of each kind, from {len(sampled)} of "
               f"{num(samples.get('changed_shards', len(sampled)))} changed shards spread over them, in key order "
               "within a shard.</p>")
    for kind in ("inserted", "updated", "deleted"):
        shown = samples.get("changes", {}).get(kind, [])
        total = samples.get("counts", {}).get(kind)
        count = f"{len(shown):,} of {total:,}" if total is not None else f"{len(shown):,} found"
        more = ""
        if samples.get("more", {}).get(kind):
            more = " · " + link("/changes", f"every {kind} key, page by page", uri=root, a=run_a, b=run_b, kind=kind)
        if total == 0:
            out.append(f"<h3 class='{_KIND_CLASS[kind]}'>{_KIND_HEADING[kind]}</h3><p class='muted'>none</p>")
            continue
        out.append(f"<h3 class='{_KIND_CLASS[kind]}'>{_KIND_HEADING[kind]} <span class='muted'>({esc(count)})</span></h3>"
                   + (f"<p>{more[3:]}</p>" if more else ""))
        if shown:
            out.append(table(_kind_headers(kind, run_a, run_b), _kind_rows(root, kind, shown)))
    if samples.get("fields"):
        out.append("<h3>Fields that differ, most often first (updated keys of the sample)</h3>" + table(
            ["field", "updated keys"], [[esc(f["field"]), num(f["keys"])] for f in samples["fields"]]))
    return "".join(out)


def changes_page(data: dict[str, Any]) -> str:
    """One page of the keys of one kind run ``b`` changed against run ``a``, shard by shard in key order."""
    root, a, b, kind = data["root"], data["run_a"], data["run_b"], data["kind"]
    keys = data.get("keys", [])
    total = data.get("count")
    head = (f"<p>{run_link(root, a)} → {run_link(root, b)} · {link('/diff', 'the diff', uri=root, a=a, b=b)}"
            + (f" · {num(total)} {esc(kind)} keys in all" if total is not None else "") + "</p>")
    where = f"from shard {esc(data['start'].split(':')[0])}" if data.get("start") else "from the first changed shard"
    head += f"<p class='muted'>{len(keys):,} keys {where}, in key order within a shard.</p>"
    if data.get("stopped"):
        head += f"<p class='problem'>{esc(data['stopped'])}</p>"
    nxt = ""
    if data.get("next"):
        nxt = "<p>" + link("/changes", f"next {data.get('page_keys', '')} {kind} keys", uri=root, a=a, b=b, kind=kind,
                           **{"from": data["next"]}) + "</p>"
    elif keys or data.get("start"):
        nxt = f"<p class='muted'>No more {esc(kind)} keys.</p>"
    body = table(_kind_headers(kind, a, b), _kind_rows(root, kind, keys)) if keys else ""
    return page(f"{_KIND_HEADING.get(kind, kind)}: {a} → {b}", head + body + nxt)


def value_html(value: Any, fields: Sequence[str]) -> str:
    """A JSON value; of an object, the fields in ``fields`` marked."""
    if value is None:
        return "<span class='muted'>—</span>"
    if isinstance(value, dict) and fields:
        items = [(f"<mark>{esc(json.dumps(k))}: {esc(json.dumps(v, ensure_ascii=False))}</mark>" if k in fields else
                  f"{esc(json.dumps(k))}: {esc(json.dumps(v, ensure_ascii=False))}") for k, v in value.items()]
        return "<code>{" + ", ".join(items) + "}</code>"
    text = f"<code>{esc(json.dumps(value, ensure_ascii=False))}</code>"
    return f"<mark>{text}</mark>" if fields else text


def diff_page(data: dict[str, Any]) -> str:
    root, a, b = data["root"], data["run_a"], data["run_b"]
    rows = [[num(s["db_id"]), num(s["rows_a"]), num(s["rows_b"]), Num(esc(signed_num(_delta(s["rows_a"], s["rows_b"])))),
             bytes_cell(s["bytes_a"]), bytes_cell(s["bytes_b"]), esc("same" if s["same_files"] else "changed"),
             _change_cell({"changes": s.get("changes")})]
            for s in data["shards"]]
    summary = (f"<p>{run_link(root, a)} → {run_link(root, b)}: "
               f"rows {num(data['rows_a'])} → {num(data['rows_b'])} ({esc(signed_num(_delta(data['rows_a'], data['rows_b'])))}),"
               f" bytes {esc(fmt_bytes(data['bytes_a']))} → {esc(fmt_bytes(data['bytes_b']))};"
               f" {'same routing' if data['same_routing'] else 'different routing: shards are not comparable one to one'}"
               "</p>")
    changes = data.get("changes")
    if changes is not None:
        summary += (f"<p>along the chain: {num(changes['inserted'])} inserted, {num(changes['updated'])} updated, "
                    f"{num(changes['deleted'])} deleted ({num(changes['deleted_absent'])} deletions of absent keys)</p>")
    chart = ("<details open><summary>Chart: row change per shard</summary>"
             + bar_chart("row change per shard (signed)", [f"shard {s['db_id']}" for s in data["shards"]],
                         [_delta(s["rows_a"], s["rows_b"]) for s in data["shards"]], x_axis="shard",
                         y_axis="row change", missing="in one run only") + "</details>")
    samples = ""
    if data.get("samples") is not None:
        samples = "<h2>Changed keys (a sample)</h2>" + samples_html(root, data["samples"], a, b)
    return page(f"Diff {a} → {b}", LEGEND + summary + _schema_diff_html(data.get("value_schema"), a, b) + table(
        ["shard", f"rows {a}", f"rows {b}", "change", "bytes a", "bytes b", "files", "along the chain"], rows)
        + chart + samples)


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


_FATE_TEXT = {"inserted": "inserted here", "updated": "updated here", "deleted": "deleted here",
              "unchanged": "unchanged", "absent": "absent", "unknown": "unknown (a look-up failed)"}


def key_page(data: dict[str, Any]) -> str:
    root = data["root"]
    rows = []
    for r in data["runs"]:
        fate = r.get("fate", "unknown")
        rows.append([run_link(root, r["run_id"]), state(r["state"]),
                     f"<span class='{ {'inserted': 'ins', 'updated': 'upd', 'deleted': 'del'}.get(fate, 'muted') }'>"
                     f"{esc(_FATE_TEXT.get(fate, fate))}</span>",
                     (value_html(r.get("before"), r["fields"]) + " → " if fate == "updated" else "")
                     + (value_html(r.get("value"), r.get("fields") or []) if r.get("found") else ""),
                     run_link(root, r["compared_with"]) if r.get("compared_with") else "",
                     f"<span class='problem'>{esc(r.get('error') or '')}</span>"])
    shown, retained = len(data["runs"]), data.get("retained_runs", len(data["runs"]))
    note = (f"<p>The newest {shown} of {retained} retained runs (add <code>&amp;limit=N</code> for more, up to "
            f"{esc(data.get('max_limit'))}).</p>" if shown < retained else f"<p>All {retained} retained runs.</p>")
    note += ("<p class='muted'>Each run against the retained run before it; in an updated value the fields that "
             "differ are marked.</p>")
    if data.get("stopped"):
        note += f"<p class='problem'>{esc(data['stopped'])}</p>"
    headers = ["run", "state", "this run", "value (JSON; before → after when updated)", "compared with", "problem"]
    return page(f"Key {data['key']!s} in {root}", note + table(headers, rows))

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
from airflow_provider_shardyfusion.core.lifecycle.history import signed

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "CONTENT_SECURITY_POLICY", "LEGEND", "PREFIX", "as_json", "bar_chart", "diff_page", "error_page", "esc", "external_link",
    "fmt_age", "fmt_bytes", "key_link", "key_page", "link", "page", "roots_page", "run_page", "safe_href", "samples_html",
    "state", "table", "timeline_page", "value_html", "when",
]

PREFIX = "/shardyfusion"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1rem;color:#1f2933;max-width:100%}
table{border-collapse:collapse;margin:1rem 0;max-width:100%}
th,td{padding:.25rem .45rem;border-bottom:1px solid #d9e2ec;text-align:left;vertical-align:top;overflow-wrap:break-word}
td a,td code,td .problem{overflow-wrap:anywhere}
th{background:#f0f4f8}.state{padding:.1rem .4rem;border-radius:.3rem;font-size:.85em;white-space:nowrap}
.live{background:#c6f6d5}.failed,.unreadable,.missing{background:#fed7d7}.staged,.running{background:#feebc8}
.base_of_live{background:#bee3f8}.superseded,.rolled_back,.deleted{background:#e2e8f0}
nav a{margin-right:1rem}.muted{color:#829ab1}.problem{color:#9b2c2c}
svg{background:#fafcfe;border:1px solid #d9e2ec;max-width:100%;height:auto}
pre{background:#f5f7fa;padding:.5rem;overflow-x:auto;max-width:100%}
.ins{color:#276749}.upd{color:#975a16}.del{color:#9b2c2c}mark{background:#fefcbf}
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


def link(path: str, text: Any, **params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f'<a href="{esc(PREFIX + path + ("?" + query if query else ""))}">{esc(text)}</a>'


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


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
    return f'<time datetime="{esc(ts)}" title="{esc(ts)}">{esc(dt.strftime("%Y-%m-%d %H:%M UTC"))}, {esc(rel)}</time>'


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
              width: int = 640, height: int = 200, missing: str = "no value") -> str:
    """Vertical bars, signed about a zero line, with labelled axes and a label per bar (every few
    bars when there are many); a ``None`` value is a red mark on the zero line titled ``missing``."""
    numbers = [v or 0 for v in values]
    top, bottom = max(max(numbers, default=0), 0), min(min(numbers, default=0), 0)
    span = (top - bottom) or 1
    left, foot, head = 56, 46, 8
    plot_w, plot_h = width - left - 8, height - foot - head
    zero = head + plot_h * top / span
    n = max(len(numbers), 1)
    slot = plot_w / n
    # Every few bars, so that no label runs into the next (a label line is at most 9 characters).
    every = max(1, n // 12, math.ceil(_LABEL_PX / slot))
    parts = [f'<line x1="{left}" y1="{head}" x2="{left}" y2="{head + plot_h}" stroke="#52606d"/>',
             f'<line x1="{left}" y1="{zero:.1f}" x2="{left + plot_w}" y2="{zero:.1f}" stroke="#52606d"/>',
             f'<text x="{left - 4}" y="{zero + 3:.1f}" text-anchor="end" font-size="10">0</text>',
             f'<text x="10" y="{head + plot_h / 2:.0f}" font-size="11" text-anchor="middle" '
             f'transform="rotate(-90 10 {head + plot_h / 2:.0f})">{esc(y_axis)}</text>',
             f'<text x="{left + plot_w / 2:.0f}" y="{height - 4}" font-size="11" text-anchor="middle">{esc(x_axis)}</text>']
    if top > 0:  # a top of 0 is the zero line's own label
        parts.append(f'<text x="{left - 4}" y="{head + 10}" text-anchor="end" font-size="10">{esc(_short(top))}</text>')
    if bottom < 0:
        parts.append(f'<text x="{left - 4}" y="{head + plot_h}" text-anchor="end" font-size="10">{esc(_short(bottom))}</text>')
    for i, (label, value, raw) in enumerate(zip(labels, numbers, values, strict=True)):
        x = left + i * slot + slot * 0.1
        if raw is None:
            parts.append(f'<rect x="{x:.1f}" y="{zero - 3:.1f}" width="{slot * 0.8:.1f}" height="6" fill="#e53e3e">'
                         f'<title>{esc(label)}: {esc(missing)}</title></rect>')
        else:
            h = plot_h * abs(value) / span
            y = zero - h if value >= 0 else zero
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" height="{h:.1f}" '
                         f'fill="{"#4c7bd9" if value >= 0 else "#d9822b"}"><title>{esc(label)}: {esc(value)}</title></rect>')
        if i % every == 0:
            cx = f"{x + slot * 0.4:.1f}"
            lines = "".join(f'<tspan x="{cx}" dy="{10 if j else 0}">{esc(line)}</tspan>'
                            for j, line in enumerate(_short_label(label)))
            parts.append(f'<text x="{cx}" y="{head + plot_h + 12}" font-size="9" text-anchor="middle">{lines}</text>')
    return (f'<figure><figcaption>{esc(title)}</figcaption>'
            f'<svg class="chart" role="img" aria-label="{esc(title)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg></figure>')


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:g}"


# Room for one bar label: 9 characters at font-size 9 and a gap.
_LABEL_PX = 58


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
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)



def error_page(status: int, detail: str) -> str:
    """A 4xx/5xx answer in the pages' layout; ``?format=json`` gives ``{"detail": ...}`` instead."""
    what = {404: "Not found", 502: "Storage answered with an error", 504: "Storage did not answer"}
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
            link("/run", live, uri=uri, run_id=live) if live else "—",
            when(r.get("live_since")), esc(r.get("rows")), esc(fmt_bytes(r.get("bytes"))), esc(r.get("chain_depth")),
            _validation_summary(r.get("last_validation")),
            (f"{link('/run', failure['run_id'], uri=uri, run_id=failure['run_id'])}<br>"
             f"{esc(failure.get('error_type'))} {when(failure.get('at'))}" if failure else ""),
            esc(r.get("runs", "")), f"<span class='problem'>{esc(r.get('error') or '')}</span>"])
    note = "" if data["roots"] else "<p class='muted'>No snapshot roots yet: none emitted an asset event, and " \
                                     "[shardyfusion] history_roots is empty.</p>"
    return page("Snapshot roots", table(["root", "live run", "live since", "rows", "bytes", "chain depth",
                                         "live run's last validation", "latest failure", "runs", "problem"], rows) + note)


def _validation_summary(last: dict[str, Any] | None) -> str:
    if not last:
        return "<span class='muted'>not validated</span>"
    return f"{'passed' if last.get('ok') else 'FAILED'} {when(last.get('validated_at'))}"


def _change_cell(r: dict[str, Any]) -> str:
    changes = r.get("changes")
    net = f"net {signed(r['rows_change'])}" if r.get("rows_change") is not None else ""
    if not changes:
        return esc(net)
    return (f"<span class='ins'>+{esc(changes['inserted'])}</span> <span class='upd'>~{esc(changes['updated'])}</span> "
            f"<span class='del'>\u2212{esc(changes['deleted'])}</span>" + (f" ({esc(net)})" if net else ""))


def timeline_page(data: dict[str, Any]) -> str:
    runs, root = data["runs"], data["root"]
    live = data.get("live_run_id")
    written = [r for r in runs if r.get("manifest_ref") and r["state"] not in ("deleted", "unreadable")]
    rows = []
    for r in runs:
        older = next((o for o in written if (o.get("started_at") or "") < (r.get("started_at") or "")), None)
        diffs = []
        if r in written and older is not None:
            diffs.append(link("/diff", "vs previous", uri=root, a=older["run_id"], b=r["run_id"]))
        if r in written and live and r["run_id"] != live:
            diffs.append(link("/diff", "vs live", uri=root, a=live, b=r["run_id"]))
        label = state(r["state"])
        if r.get("replaced_by") and r["state"] in ("superseded", "rolled_back"):
            label += f" <span class='muted'>by {link('/run', r['replaced_by'], uri=root, run_id=r['replaced_by'])}</span>"
        rows.append([link("/run", r["run_id"], uri=root, run_id=r["run_id"]), label, esc(r.get("write_mode") or ""),
                     _change_cell(r), when(r.get("started_at")), when(r.get("published_at")), esc(r.get("rows")),
                     esc(fmt_bytes(r.get("bytes"))), esc(r.get("duration_s")),
                     _validation_summary(r["validation"]) if r.get("validation") else "",
                     f"<span class='problem'>{esc(r.get('error') or '')}</span>", " · ".join(diffs)])
    labels = [r["run_id"] for r in runs]
    charts = ""
    if runs:
        charts = (bar_chart("rows per run (newest → oldest, as the table; red: a run that wrote nothing)", labels,
                            [r.get("rows") for r in runs], x_axis="run (newest first)", y_axis="rows",
                            missing="wrote nothing")
                  + bar_chart("net row change per run", labels, [r.get("rows_change") for r in runs],
                              x_axis="run (newest first)", y_axis="row change", missing="no change recorded")
                  + bar_chart("bytes per run", labels, [r.get("bytes") for r in runs], x_axis="run (newest first)",
                              y_axis="bytes", missing="wrote nothing"))
    head = (f"<p>Live: {link('/run', live, uri=root, run_id=live) if live else 'nothing'}"
            f" {'since ' + when(data['live_since']) if data.get('live_since') else ''}</p>")
    if data.get("exists") is False:
        head += ("<p class='problem'>Nothing here: no run records and no _CURRENT under this root "
                 "(a wrong URI, or nothing written yet).</p>")
    if data.get("live_manifest_error"):
        head += f"<p class='problem'>The live run's manifest cannot be read: {esc(data['live_manifest_error'])}</p>"
    form = (f"<form action='{PREFIX}/key'><input type='hidden' name='uri' value='{esc(root)}'>"
            "Key look-up across runs: <input name='key'> <button>look up</button></form>")
    return page(root, head + form + LEGEND + charts + table(
        ["run", "state", "write mode", "changes", "started", "published", "rows", "bytes", "duration s", "validation",
         "error", "diff"], rows))


def run_page(data: dict[str, Any]) -> str:
    entry, shards, root = data["run"], data.get("shards") or [], data["root"]
    run_id = entry["run_id"]
    base = data.get("base_run_id")
    facts = table(["", ""], [[esc(k), v] for k, v in (
        ("state", state(entry["state"])), ("started", when(entry.get("started_at"))),
        ("finished", when(entry.get("finished_at"))), ("published", when(entry.get("published_at"))),
        ("rows", esc(entry.get("rows"))), ("bytes", esc(fmt_bytes(entry.get("bytes")))),
        ("changes", _change_cell(entry)),
        ("shards", esc(data.get("num_dbs"))), ("skew (largest / mean rows)", esc(data.get("skew"))),
        ("write mode", esc(data.get("write_mode"))),
        ("written on run", (link("/run", base, uri=root, run_id=base) + " · "
                            + link("/diff", "diff against base", uri=root, a=base, b=run_id)) if base else ""),
        ("chain depth", esc(data.get("chain_depth") if data.get("write_mode") not in (None, "full") else None)),
        ("replaced by", link("/run", entry["replaced_by"], uri=root, run_id=entry["replaced_by"])
         if entry.get("replaced_by") else ""),
        ("error", esc(entry.get("error"))),
        ("Airflow task", esc(" / ".join(str(entry["airflow"].get(k)) for k in ("dag_id", "task_id", "run_id", "try_number")
                                        if entry.get("airflow")) or None)),
        ("Spark application", esc(data.get("spark_app_id"))),
    ) if v not in (None, "")])
    links = "".join(f"<li>{external_link(name, url)}</li>" for name, url in data.get("links", {}).items())
    charts = ""
    if shards:
        labels = [f"shard {s['db_id']}" for s in shards]
        charts = (bar_chart("rows per shard", labels, [s["rows"] for s in shards], x_axis="shard", y_axis="rows")
                  + bar_chart("bytes per shard", labels, [s["bytes"] for s in shards], x_axis="shard", y_axis="bytes"))
    validation = entry.get("validation")
    checks = ""
    if validation:
        checks = ("<h2>Validation</h2>" + table(["check", "ok", "figure", "limit"], [
            [esc(c["name"]), esc("skipped" if c.get("skipped") else "passed" if c["ok"] else "FAILED"),
             esc(json.dumps(c.get("figure"))), esc(json.dumps(c.get("limit")))]
            for c in validation.get("checks", [])]) + "<details><summary>the report as JSON</summary>"
            + as_json(validation) + "</details>")
    shard_rows = [[esc(s["db_id"]), esc(s["rows"]), esc(fmt_bytes(s["bytes"])), esc(s["files"]), _layers_text(s)]
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
        did = "full" if x["kind"] == "full" else f"+{x['inserted']} ~{x['updated']} \u2212{x['deleted']}"
        parts.append(f"{esc(x['run_id'])} ({esc(did)}, {esc(fmt_bytes(x['bytes']))})")
    return "<br>".join(parts)


def samples_html(root: str, samples: dict[str, Any], run_a: str, run_b: str) -> str:
    """Changed keys per shard, each a link to its history; before → after with differing fields marked."""
    out = []
    if samples.get("fields"):
        out.append("<h3>Fields that differ, most often first (updated keys of the sample)</h3>" + table(
            ["field", "updated keys"], [[esc(f["field"]), esc(f["keys"])] for f in samples["fields"]]))
    rows = []
    for shard in samples.get("shards", []):
        for c in shard["changes"]:
            rows.append([esc(shard["db_id"]), key_link(root, c["key"]),
                         f"<span class='{ {'inserted': 'ins', 'updated': 'upd', 'deleted': 'del'}[c['kind']] }'>"
                         f"{esc(c['kind'])}</span>", value_html(c["before"], c["fields"]),
                         value_html(c["after"], c["fields"])])
    shown = sum(len(s["changes"]) for s in samples.get("shards", []))
    partial = [s["db_id"] for s in samples.get("shards", []) if not s["complete"]]
    out.append(f"<p class='muted'>{shown} keys from {len(samples.get('shards', []))} shards, in key order"
               + (f"; shards {esc(partial)} have more (a sample stops at a few keys or after walking "
                  "20000 stored keys)" if partial else "") + ".</p>")
    if samples.get("stopped"):
        out.append(f"<p class='problem'>{esc(samples['stopped'])}</p>")
    out.append(table(["shard", "key", "change", f"before ({run_a})", f"after ({run_b})"], rows))
    return "".join(out)


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
    rows = [[esc(s["db_id"]), esc(s["rows_a"]), esc(s["rows_b"]), esc(_signed(_delta(s["rows_a"], s["rows_b"]))),
             esc(fmt_bytes(s["bytes_a"])), esc(fmt_bytes(s["bytes_b"])), esc("same" if s["same_files"] else "changed"),
             _change_cell({"changes": s.get("changes")})]
            for s in data["shards"]]
    summary = (f"<p>{link('/run', a, uri=root, run_id=a)} → {link('/run', b, uri=root, run_id=b)}: "
               f"rows {esc(data['rows_a'])} → {esc(data['rows_b'])} ({esc(_signed(_delta(data['rows_a'], data['rows_b'])))}),"
               f" bytes {esc(fmt_bytes(data['bytes_a']))} → {esc(fmt_bytes(data['bytes_b']))};"
               f" {'same routing' if data['same_routing'] else 'different routing: shards are not comparable one to one'}"
               "</p>")
    changes = data.get("changes")
    if changes is not None:
        summary += (f"<p>along the chain: {esc(changes['inserted'])} inserted, {esc(changes['updated'])} updated, "
                    f"{esc(changes['deleted'])} deleted ({esc(changes['deleted_absent'])} deletions of absent keys)</p>")
    chart = bar_chart("row change per shard (signed)", [f"shard {s['db_id']}" for s in data["shards"]],
                      [_delta(s["rows_a"], s["rows_b"]) for s in data["shards"]], x_axis="shard", y_axis="row change",
                      missing="in one run only")
    samples = ""
    if data.get("samples") is not None:
        samples = "<h2>Changed keys (a sample)</h2>" + samples_html(root, data["samples"], a, b)
    return page(f"Diff {a} → {b}", LEGEND + summary + _schema_diff_html(data.get("value_schema"), a, b) + chart + table(
        ["shard", f"rows {a}", f"rows {b}", "change", "bytes a", "bytes b", "files", "along the chain"], rows) + samples)


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


def _signed(n: int | None) -> str:
    return "" if n is None else signed(n)


_FATE_TEXT = {"inserted": "inserted here", "updated": "updated here", "deleted": "deleted here",
              "unchanged": "unchanged", "absent": "absent", "unknown": "unknown (a look-up failed)"}


def key_page(data: dict[str, Any]) -> str:
    root = data["root"]
    rows = []
    for r in data["runs"]:
        fate = r.get("fate", "unknown")
        rows.append([link("/run", r["run_id"], uri=root, run_id=r["run_id"]), state(r["state"]),
                     f"<span class='{ {'inserted': 'ins', 'updated': 'upd', 'deleted': 'del'}.get(fate, 'muted') }'>"
                     f"{esc(_FATE_TEXT.get(fate, fate))}</span>",
                     (value_html(r.get("before"), r["fields"]) + " → " if fate == "updated" else "")
                     + (value_html(r.get("value"), r.get("fields") or []) if r.get("found") else ""),
                     link("/run", r["compared_with"], uri=root, run_id=r["compared_with"]) if r.get("compared_with") else "",
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

"""HTML of the snapshot history pages: server-rendered, inline SVG charts, nothing loaded from outside.

Pure functions of the JSON twins (``core.history`` models as dicts), so the HTML and the JSON of a
page always say the same thing. Every value is escaped; no page carries a credential because no
model holds one.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

PREFIX = "/shardyfusion"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2933}
table{border-collapse:collapse;margin:1rem 0}th,td{padding:.3rem .6rem;border-bottom:1px solid #d9e2ec;text-align:left}
th{background:#f0f4f8}.state{padding:.1rem .4rem;border-radius:.3rem;font-size:.85em}
.live{background:#c6f6d5}.failed,.unreadable{background:#fed7d7}.staged,.running{background:#feebc8}
.superseded,.rolled_back,.deleted{background:#e2e8f0}nav a{margin-right:1rem}.muted{color:#829ab1}
svg{background:#fafcfe;border:1px solid #d9e2ec}
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


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)} · Snapshots</title>"
            f"<style>{_STYLE}</style></head><body><nav>{link('/', 'Snapshot roots')}</nav>"
            f"<h1>{esc(title)}</h1>{body}</body></html>")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def state(value: str) -> str:
    return f'<span class="state {esc(value)}">{esc(value.replace("_", " "))}</span>'


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float | int | None], *, width: int = 640,
              height: int = 160) -> str:
    """Vertical bars with the largest value labelled; ``None`` values leave a gap."""
    numbers = [v or 0 for v in values]
    top = max(numbers, default=0) or 1
    n = max(len(numbers), 1)
    slot = width / n
    bars = []
    for i, (label, value) in enumerate(zip(labels, numbers, strict=True)):
        h = (height - 20) * value / top
        bars.append(f'<rect x="{i * slot + slot * 0.1:.1f}" y="{height - h:.1f}" width="{slot * 0.8:.1f}" '
                    f'height="{h:.1f}" fill="#4c7bd9"><title>{esc(label)}: {esc(value)}</title></rect>')
    return (f'<figure><figcaption>{esc(title)} (max {esc(top)})</figcaption>'
            f'<svg class="chart" role="img" aria-label="{esc(title)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(bars)}</svg></figure>')


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def roots_page(data: dict[str, Any]) -> str:
    rows = [[link("/root", r["root"], uri=r["root"]), esc(r.get("live_run_id") or "—"), esc(r.get("live_since") or ""),
             esc(_fmt_age(r.get("age_s"))), esc(r.get("rows")), esc(fmt_bytes(r.get("bytes"))), esc(r.get("chain_depth")),
             esc(_validation_summary(r.get("last_validation"))), esc(r.get("runs", "")), esc(r.get("error") or "")]
            for r in data["roots"]]
    note = "" if data["roots"] else "<p class='muted'>No snapshot roots yet: none emitted an asset event, and " \
                                     "[shardyfusion] history_roots is empty.</p>"
    return page("Snapshot roots", table(["root", "live run", "live since", "age", "rows", "bytes", "chain depth",
                                         "last validation", "runs", "problem"], rows) + note)


def _fmt_age(seconds: int | None) -> str:
    if seconds is None:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _validation_summary(last: dict[str, Any] | None) -> str:
    if not last:
        return ""
    return f"{'passed' if last.get('ok') else 'failed'} ({last.get('run_id')})"


def timeline_page(data: dict[str, Any]) -> str:
    runs = data["runs"]
    rows = [[link("/run", r["run_id"], uri=data["root"], run_id=r["run_id"]), state(r["state"]),
             esc(r.get("started_at") or ""), esc(r.get("published_at") or ""), esc(r.get("rows")),
             esc(fmt_bytes(r.get("bytes"))), esc(r.get("duration_s")), esc(_validation_text(r.get("validation"))),
             esc(r.get("error") or "")] for r in runs]
    oldest_first = list(reversed([r for r in runs if r.get("rows") is not None]))
    charts = (bar_chart("rows per run (oldest → newest)", [r["run_id"] for r in oldest_first],
                        [r["rows"] for r in oldest_first])
              + bar_chart("bytes per run (oldest → newest)", [r["run_id"] for r in oldest_first],
                          [r.get("bytes") for r in oldest_first]))
    live = data.get("live_run_id")
    head = (f"<p>Live: {link('/run', live, uri=data['root'], run_id=live) if live else 'nothing'}"
            f" {esc('since ' + data['live_since']) if data.get('live_since') else ''}</p>")
    form = (f"<form action='{PREFIX}/key'><input type='hidden' name='uri' value='{esc(data['root'])}'>"
            "Key look-up across runs: <input name='key'> <button>look up</button></form>")
    return page(data["root"], head + form + charts + table(
        ["run", "state", "started", "published", "rows", "bytes", "duration s", "validation", "error"], rows))


def _validation_text(validation: dict[str, Any] | None) -> str:
    if not validation:
        return ""
    return ("passed" if validation.get("ok") else "FAILED") + f" at {validation.get('validated_at')}"


def run_page(data: dict[str, Any]) -> str:
    entry, shards = data["run"], data.get("shards") or []
    facts = table(["", ""], [[esc(k), esc(v)] for k, v in (
        ("state", entry["state"]), ("started", entry.get("started_at")), ("finished", entry.get("finished_at")),
        ("published", entry.get("published_at")), ("rows", entry.get("rows")), ("bytes", fmt_bytes(entry.get("bytes"))),
        ("shards", data.get("num_dbs")), ("skew (largest / mean rows)", data.get("skew")),
        ("write mode", data.get("write_mode")), ("written on run", data.get("base_run_id")),
        ("chain depth", data.get("chain_depth") if data.get("write_mode") not in (None, "full") else None),
        ("replaced by", entry.get("replaced_by")), ("error", entry.get("error")),
        ("Airflow task", " / ".join(str(entry["airflow"].get(k)) for k in ("dag_id", "task_id", "run_id", "try_number")
                                    if entry.get("airflow")) or None),
        ("Spark application", data.get("spark_app_id")),
    ) if v not in (None, "")])
    links = "".join(f"<li>{external_link(name, url)}</li>" for name, url in data.get("links", {}).items())
    charts = ""
    if shards:
        labels = [f"shard {s['db_id']}" for s in shards]
        charts = (bar_chart("rows per shard", labels, [s["rows"] for s in shards])
                  + bar_chart("bytes per shard", labels, [s["bytes"] for s in shards]))
    validation = entry.get("validation")
    checks = ""
    if validation:
        checks = "<h2>Validation</h2>" + table(["check", "ok", "figure", "limit"], [
            [esc(c["name"]), esc("skipped" if c.get("skipped") else c["ok"]), esc(c.get("figure")), esc(c.get("limit"))]
            for c in validation.get("checks", [])])
    shard_rows = [[esc(s["db_id"]), esc(s["rows"]), esc(fmt_bytes(s["bytes"])), esc(s["files"]), _layers_text(s)]
                  for s in shards]
    return page(f"Run {entry['run_id']}", facts + (f"<ul>{links}</ul>" if links else "") + charts + checks
                + ("<h2>Shards</h2>" + table(["shard", "rows", "bytes", "files", "layers (oldest first)"], shard_rows)
                   if shards else ""))


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
        did = "full" if x["kind"] == "full" else f"+{x['inserted']} ~{x['updated']} -{x['deleted']}"
        parts.append(f"{esc(x['run_id'])} ({esc(did)}, {esc(fmt_bytes(x['bytes']))})")
    return "<br>".join(parts)


def diff_page(data: dict[str, Any]) -> str:
    rows = [[esc(s["db_id"]), esc(s["rows_a"]), esc(s["rows_b"]), esc(_delta(s["rows_a"], s["rows_b"])),
             esc(fmt_bytes(s["bytes_a"])), esc(fmt_bytes(s["bytes_b"])), esc("same" if s["same_files"] else "changed")]
            for s in data["shards"]]
    summary = (f"<p>rows {esc(data['rows_a'])} → {esc(data['rows_b'])} ({esc(_delta(data['rows_a'], data['rows_b']))}),"
               f" bytes {esc(fmt_bytes(data['bytes_a']))} → {esc(fmt_bytes(data['bytes_b']))};"
               f" {'same routing' if data['same_routing'] else 'different routing: shards are not comparable one to one'}"
               "</p>")
    changes = data.get("changes")
    if changes is not None:
        summary += (f"<p>along the chain: {esc(changes['inserted'])} inserted, {esc(changes['updated'])} updated, "
                    f"{esc(changes['deleted'])} deleted ({esc(changes['deleted_absent'])} deletions of absent keys)</p>")
    chart = bar_chart("row change per shard", [f"shard {s['db_id']}" for s in data["shards"]],
                      [abs(_delta(s["rows_a"], s["rows_b"]) or 0) for s in data["shards"]])
    return page(f"Diff {data['run_a']} → {data['run_b']}", summary + chart + table(
        ["shard", f"rows {data['run_a']}", f"rows {data['run_b']}", "change", "bytes a", "bytes b", "files"], rows))


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


def key_page(data: dict[str, Any]) -> str:
    rows = [[esc(r["run_id"]), state(r["state"]), esc(r.get("found")), esc(r.get("value")), esc(r.get("error") or "")]
            for r in data["runs"]]
    shown, retained = len(data["runs"]), data.get("retained_runs", len(data["runs"]))
    note = (f"<p>The newest {shown} of {retained} retained runs (add <code>&amp;limit=N</code> for more, up to "
            f"{esc(data.get('max_limit'))}).</p>" if shown < retained else f"<p>All {retained} retained runs.</p>")
    if data.get("stopped"):
        note += f"<p class='problem'>{esc(data['stopped'])}</p>"
    return page(f"Key {data['key']!s} in {data['root']}",
                note + table(["run", "state", "found", "value", "problem"], rows))

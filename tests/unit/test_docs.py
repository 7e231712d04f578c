"""The documentation site (docs/, mkdocs.yml): it builds with warnings as errors, offline, and the
Python snippets of its pages and of the README run (or, where they need Spark or a store, at least
import), so the pages cannot drift from the code. `make docs` runs the same build."""

from __future__ import annotations

import ast
import html
import inspect
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# A marker line right above a ```python fence says how much of the snippet can run here:
#   <!-- snippet: signature -->            a call whose keywords and shown defaults are the class's own
#   <!-- snippet: imports-only (why) -->   compiled, and its imports run (it needs Spark or a store)
# Every other snippet is executed as it stands, in a fresh namespace.
SNIPPET = re.compile(r"(?:<!-- snippet: (?P<mode>[\w-]+)[^>]*-->\n)?```python\n(?P<code>.*?)```", re.S)
SIGNATURE_CLASSES = {
    "ValidateManifestOperator": "airflow_provider_shardyfusion.operators.validate",
    "PublishSnapshotOperator": "airflow_provider_shardyfusion.operators.publish",
    "DeferredCleanupOperator": "airflow_provider_shardyfusion.operators.cleanup",
}


def _snippets() -> list[tuple[str, str, str]]:
    found = []
    for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, m in enumerate(SNIPPET.finditer(page.read_text())):
            if m["code"].lstrip().startswith("--8<--"):
                continue  # an included file of the repository, run by its own tests
            found.append((f"{page.relative_to(REPO)}#{n}", m["mode"] or "run", m["code"]))
    return found


SNIPPETS = _snippets()


def test_the_pages_have_snippets_of_every_kind():
    assert {mode for _, mode, _ in SNIPPETS} == {"run", "signature", "imports-only"}, SNIPPETS


@pytest.mark.parametrize(("where", "mode", "code"), SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_python_snippet(where, mode, code, tmp_path, monkeypatch):
    tree = ast.parse(code, filename=where)
    if mode == "signature":
        _check_signature(where, tree)
        return
    imports = ast.Module(body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[])
    if mode == "imports-only":
        exec(compile(imports, where, "exec"), {})
        return
    assert mode == "run", f"{where}: unknown snippet mode {mode!r}"
    monkeypatch.chdir(tmp_path)
    exec(compile(tree, where, "exec"), {"__name__": "snippet"})


def _check_signature(where: str, tree: ast.Module) -> None:
    [statement] = tree.body
    assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call), where
    call = statement.value
    assert isinstance(call.func, ast.Name), where
    module = __import__(SIGNATURE_CLASSES[call.func.id], fromlist=[call.func.id])
    params = inspect.signature(getattr(module, call.func.id).__init__).parameters
    shown = [kw.arg for kw in call.keywords]
    missing = [name for name in params if name not in ("self", "kwargs", "args") and name not in shown]
    assert not missing, f"{where}: the signature shown lacks {missing}"
    for kw in call.keywords:
        if kw.arg == "task_id":
            continue  # BaseOperator's, through **kwargs
        assert kw.arg in params, f"{where}: {call.func.id} has no argument {kw.arg!r}"
        if isinstance(kw.value, ast.Constant) and kw.value.value is Ellipsis:
            continue  # required, no default to show
        shown_default = eval(compile(ast.Expression(kw.value), where, "eval"), {"timedelta": timedelta})
        assert shown_default == params[kw.arg].default, f"{where}: {kw.arg} defaults to {params[kw.arg].default!r}"


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    """The site, built once per module (``site`` and the browser test share the build)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def site(site_dir) -> dict[str, str]:
    """The built site's HTML pages by path (``guides/delta.html``)."""
    out = site_dir
    pages = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.html")}
    pages["search/search_index.js"] = (out / "search" / "search_index.js").read_text()
    return pages


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_the_site_builds_offline_with_warnings_as_errors(site):
    pages = site
    # Nothing fetched when a page is viewed either: no web fonts, no script from elsewhere.
    for name, page in pages.items():
        assert "fonts.googleapis" not in page and not re.search(r"<script[^>]+src=\"https?://", page), name
    # The example DAGs and the changelog are the real files, included at build time.
    quickstart = (REPO / "dags_example" / "quickstart.py").read_text()
    assert "build_quickstart_dag(DAG_ID, snapshot_uri(DAG_ID))" in quickstart
    assert "build_quickstart_dag</span>" in pages["guides/sharded-write.html"]
    assert "my_first_snapshot" in pages["getting-started.html"]
    first_release = re.search(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert first_release and first_release[1].split()[0].strip("[]") in pages["changelog.html"]
    # The API reference was generated from the docstrings (a :param: line's text is there).
    assert "max_chain_depth" in pages["api.html"] and "RunRecordTrigger" in pages["api.html"]


def test_the_api_reference_shows_default_values_not_the_expressions_behind_them(site):
    api = site["api.html"]
    assert "_D." not in _text(api), "a signature shows a default as `_D.name`"
    # The parameters tables: Name | Type | Description | Default.
    rows = re.findall(r'<tr class="doc-section-item">\s*<td>(.*?)</td>.*?<td>.*?</td>.*?<td>.*?</td>\s*<td>(.*?)</td>',
                      api, re.S)
    assert len(rows) > 100, "the parameters tables were not found"
    named = [(n, d) for n, d in ((_text(n).strip(), _text(d).strip()) for n, d in rows) if n == d]
    assert not named, f"a Default cell repeats its parameter's name: {named}"
    shown = {_text(n).strip(): _text(d).strip() for n, d in rows}
    assert shown["key_column"] == "'id'" and shown["batch_size"] == "50000", shown
    assert shown["aws_conn_id"] == "'aws_default'" and shown["poll_interval"] in ("30.0", "10.0"), shown


def test_every_code_block_fits_88_columns(site):
    wide = []
    for name, page in site.items():
        if not name.endswith(".html"):
            continue
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S):
            lines = _text(block).split("\n")
            wide += [f"{name}: {len(line)}: {line}" for line in lines if len(line) > 88]
    assert not wide, "\n".join(wide)


def test_the_site_opens_from_disk_with_search(site):
    # Links name files (``guides/delta.html``), not folders a server would complete with index.html.
    broken = []
    for name, page in site.items():
        if not name.endswith(".html") or name == "404.html":
            continue  # the 404 page is served from any depth, so its links are absolute
        for href in re.findall(r'href="([^"#?]+)[^"]*"', page):
            if re.match(r"[a-z]+:", href):
                continue  # http(s):, mailto:
            target = (Path(name).parent / href).as_posix()
            target = os.path.normpath(target)
            if href.endswith("/") or (target.endswith(".html") and target not in site):
                broken.append(f"{name} → {href}")
    assert not broken, broken
    # The search index as a script (fetch() of a file:// JSON is refused) and the worker shim, local.
    assert site["search/search_index.js"].startswith("var __index = ")
    assert "guides/delta.html" in site["search/search_index.js"]
    assert 'src="assets/javascripts/iframe-worker-shim.js"' in site["index.html"]


def test_no_shell_block_a_reader_pastes_closes_their_terminal(site):
    # `set -e` (or `exit`) in a pasted block ends the reader's interactive shell at the first error.
    for name, page in site.items():
        for block in re.findall(r'<div class="language-(?:bash|sh|shell|console)[^"]*"[^>]*>(.*?)</pre>', page, re.S):
            for line in _text(block).splitlines():
                assert not re.match(r"\s*(set\s+-\w*e|exit\b)", line), f"{name}: {line}"


# The plan every guide follows (issue 41): what it is for (the opening), then these sections, in
# this order, "How it works" last; "Using it" is split under headings of its own.
GUIDE_SECTIONS = ("prerequisites", "using-it", "example", "reference", "how-it-works")


def test_each_guide_shows_its_sections_in_the_page_table_of_contents(site):
    guides = sorted(name for name in site if name.startswith("guides/"))
    assert len(guides) >= 12, guides
    for name in guides:
        page = site[name]
        content = page[page.index("<article"):]
        h2 = re.findall(r'<h2 id="([^"]+)"', content)
        assert [next((s for s in GUIDE_SECTIONS if i.startswith(s)), i) for i in h2] == list(GUIDE_SECTIONS), \
            f"{name}: sections {h2}"
        using = content[content.index('id="using-it"'):content.index(f'id="{h2[2]}"')]
        h3 = re.findall(r'<h3 id="([^"]+)"', using)
        assert len(h3) >= 2, f"{name}: 'Using it' is not split under headings: {h3}"
        # The page's table of contents (the secondary nav) links every section and subsection.
        toc_start = page.index('class="md-nav md-nav--secondary"')
        toc = set(re.findall(r'<a href="#([^"]+)" class="md-nav__link"', page[toc_start:page.index("<article")]))
        assert set(h2 + h3) <= toc, f"{name}: not in the table of contents: {set(h2 + h3) - toc}"


def test_searching_the_site_opened_from_disk_finds_the_delta_guide_first(site_dir):
    """Material's own search (lunr in its worker, the iframe shim) in a real headless chromium,
    from file://: what a reader gets typing "delta"."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import headless_chromium

    browser = headless_chromium()
    try:
        browser.get((site_dir / "index.html").as_uri() + "?q=delta")  # Material opens search with ?q=
        first = "ol.md-search-result__list > li.md-search-result__item a"
        WebDriverWait(browser, 90).until(lambda b: b.find_elements(By.CSS_SELECTOR, first))
        hits = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, first)]
    finally:
        browser.quit()
    pages = [h.split("?")[0].split("#")[0].removeprefix(site_dir.as_uri() + "/") for h in hits]
    assert pages[0] == "guides/delta.html", pages[:5]

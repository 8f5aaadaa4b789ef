"""References from code and docs into the performance pages name a page that exists and, where they quote a
section, a heading on that page (``docs/performance/<page>.md, "Section"`` or ``{doc}`performance/<page>`, "Section"``;
``docs/performance.md`` is the overview).

The findings were one page until the forty-second session split them by area; a comment pointing at a section
that moved would otherwise rot silently (Sphinx checks the ``{doc}`` targets, not the quoted section names)."""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = REPO / "docs" / "performance"
SUFFIXES = {".py", ".sh", ".cu", ".cuh", ".md", ".toml"}
# a reference, then (optionally) the quoted section it names; quotes may run over a comment's line break
REF = re.compile(r'(?:\{doc\}`/?performance(?:/(?P<doc>[a-z_]+))?`|docs/performance(?:/(?P<path>[a-z_]+))?\.md)'
                 r'(?P<rest>`?[,;:]?\s*(?:(?://|#:?)\s*)?\(?\s*"(?P<q>[^"]{1,160})")?', re.S)
# a titled link, {doc}`Title <performance/page>`: the title names a section of that page
TITLED = re.compile(r'\{doc\}`(?P<q>[^`<]+?)\s*<\s*/?performance(?:/(?P<doc>[a-z_]+))?>`')
# the overview's index: "- {doc}`performance/page`: "Section"; "Section"; ..."
INDEX = re.compile(r'^- \{doc\}`performance/(?P<doc>[a-z_]+)`: (?P<names>.+)$', re.M)


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\n\s*(?://|#:?)?", " ", s)).strip().rstrip(".,;")


def _files() -> list[pathlib.Path]:
    skip = ("results", "_build", ".venv", ".git", ".nox")
    return [p for p in REPO.rglob("*") if p.suffix in SUFFIXES and p.is_file() and p != pathlib.Path(__file__).resolve()
            and not any(part in skip for part in p.relative_to(REPO).parts)]


def _page(page: str | None) -> pathlib.Path:
    """``None``: the overview, ``docs/performance.md``."""
    return PAGES.with_suffix(".md") if page is None else PAGES / f"{page}.md"


def _headings(page: str | None) -> list[str]:
    text = re.sub(r"^```.*?^```", "", _page(page).read_text(), flags=re.M | re.S)   # not the comments in code blocks
    return [m.group(1).strip() for m in re.finditer(r"^#{1,4} (.+)$", text, re.M)]


def _check(page: str | None, quote: str | None, where: str, bad: list[str]) -> None:
    if not _page(page).is_file():
        bad.append(f"{where}: no page {_page(page).relative_to(REPO)}")
    elif quote:
        q = _norm(quote).replace("`", "").casefold()      # a table's lower-case "section" column names them too
        if not any(h.replace("`", "").casefold().startswith(q) for h in _headings(page)):
            bad.append(f"{where}: no heading on {_page(page).name} starts with {q!r}")


def test_performance_references_resolve() -> None:
    counts, bad = {"plain": 0, "titled": 0, "index": 0}, []
    for f in _files():
        text = f.read_text(errors="replace")
        for m in REF.finditer(text):
            counts["plain"] += 1
            _check(m.group("doc") or m.group("path"), m.group("q"), f"{f.relative_to(REPO)}: {m.group(0)[:80]!r}", bad)
        for m in TITLED.finditer(text):
            counts["titled"] += 1
            _check(m.group("doc"), m.group("q"), f"{f.relative_to(REPO)}: {m.group(0)[:80]!r}", bad)
        for m in INDEX.finditer(text):
            for q in m.group("names").strip().removeprefix('"').removesuffix('"').split('"; "'):   # names may hold quotes
                counts["index"] += 1
                _check(m.group("doc"), q, f"{f.relative_to(REPO)}: index entry {q[:60]!r}", bad)
    print(f"references checked: {counts}")
    assert counts["plain"] > 50 and counts["titled"] > 20 and counts["index"] > 40, \
        f"the scan found too few references ({counts}): the patterns no longer match how they are written"
    assert not bad, "\n".join(bad)

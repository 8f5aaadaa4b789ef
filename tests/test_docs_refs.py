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
                 r'(?P<rest>`?[,;:]?\s*(?:#:?\s*)?\(?\s*"(?P<q>[^"]{1,160})")?', re.S)


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\n\s*(?://|#:?)?", " ", s)).strip().rstrip(".,;")


def _files() -> list[pathlib.Path]:
    skip = ("results", "_build", ".venv", ".git", ".nox")
    return [p for p in REPO.rglob("*") if p.suffix in SUFFIXES and p.is_file()
            and not any(part in skip for part in p.relative_to(REPO).parts)]


def _page(page: str | None) -> pathlib.Path:
    """``None``: the overview, ``docs/performance.md``."""
    return PAGES.with_suffix(".md") if page is None else PAGES / f"{page}.md"


def _headings(page: str | None) -> list[str]:
    text = _page(page).read_text()
    return [m.group(1).strip() for m in re.finditer(r"^#{1,4} (.+)$", text, re.M)]


def test_performance_references_resolve() -> None:
    refs, bad = 0, []
    for f in _files():
        for m in REF.finditer(f.read_text(errors="replace")):
            page = m.group("doc") or m.group("path")
            refs += 1
            where = f"{f.relative_to(REPO)}: {m.group(0)[:80]!r}"
            if not _page(page).is_file():
                bad.append(f"{where}: no page {_page(page).relative_to(REPO)}")
                continue
            if m.group("q"):
                q = _norm(m.group("q"))
                heads = _headings(page)
                if not any(h.startswith(q) or h.replace("`", "").startswith(q.replace("`", "")) for h in heads):
                    bad.append(f"{where}: no heading on {_page(page).name} starts with {q!r}")
    print(f"{refs} references checked")
    assert refs > 50, "the scan found too few references: the pattern no longer matches how they are written"
    assert not bad, "\n".join(bad)

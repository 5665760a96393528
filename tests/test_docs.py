"""The documentation holds together: every relative link and #anchor resolves (GitHub's
heading slugs), no table cell is a paragraph, and a measured figure lives in one file.

Why: the docs are split by reader and link to each other and to the one place a figure is
recorded; a renamed heading or a figure copied into a second file is how they drift.
Run as a script (``python tests/test_docs.py``) to list every problem at once."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from collections import defaultdict
from functools import cache
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parent.parent

MAX_CELL_WORDS = 40

# A figure with a unit: a number and what it measures. Dimensions ("8 x 4") and counts of
# things are not figures; a multiplier is written against its number ("3.1x").
FIGURE = re.compile(
    r"(?<![\w.,/-])[+-]?\d[\d,]*(?:\.\d+)?"
    r"(?:x(?![\w])|\s?(?:%|TB/s|GB/s|MHz|GiB|MiB|GB|MB|ms|us|µs|min|h|s|W)(?![\w/]))"
)
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[Path]:
    """Every markdown file the repository tracks (new ones too, before their first commit)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return sorted(REPO / name for name in listed if (REPO / name).is_file())


def figure_files() -> list[Path]:
    """The narrative docs: a figure is stated in one of them and linked from the others.
    The benchmark records (benchmarks/README.md, profiling/, fixtures) are where figures live."""
    docs = [REPO / "README.md", REPO / "ARCHITECTURE.md"]
    return docs + sorted((REPO / "docs").rglob("*.md"))


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped (not
    hyphens or underscores), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = "".join(
        c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN"
    )  # fmt: skip
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = defaultdict(int)
    found = set()
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        found.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text()))
    return frozenset(found)


def broken_links() -> list[str]:
    problems = []
    for path in markdown_files():
        for number, line in prose_lines(path.read_text()):
            for target in LINK.findall(INLINE_CODE.sub("", line)):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
                    continue
                file_part, _, anchor = target.partition("#")
                linked = (path.parent / unquote(file_part)).resolve() if file_part else path
                where = f"{path.relative_to(REPO)}:{number}: {target}"
                if not linked.exists():
                    problems.append(f"{where}: no such file")
                elif anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked):
                    problems.append(f"{where}: no such heading")
    return problems


def long_cells() -> list[str]:
    problems = []
    for path in markdown_files():
        for number, line in prose_lines(path.read_text()):
            if not line.lstrip().startswith("|"):
                continue
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            for cell in cells:
                words = len(cell.split())
                if words > MAX_CELL_WORDS:
                    where = f"{path.relative_to(REPO)}:{number}"
                    problems.append(f"{where}: a table cell of {words} words: {cell[:60]}...")
    return problems


def figures(path: Path) -> dict[str, int]:
    """Each figure with a unit in a file's prose (not in code), normalized, with its first line."""
    found: dict[str, int] = {}
    for number, line in prose_lines(path.read_text()):
        for match in FIGURE.finditer(INLINE_CODE.sub("", line)):
            figure = re.sub(r"\s", "", match.group(0)).replace(",", "")
            found.setdefault(figure, number)
    return found


def repeated_figures() -> list[str]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in figure_files():
        for figure, number in figures(path).items():
            where[figure].append(f"{path.relative_to(REPO)}:{number}")
    return [f"{figure} in {', '.join(files)}" for figure, files in sorted(where.items())
            if len(files) > 1]  # fmt: skip


def test_the_slug_rule_matches_githubs() -> None:
    heading = "Real Slurm: site-like (`benchmarks/x.py --trace dl|campus`, 2026-11-28)"
    assert github_slug(heading) == "real-slurm-site-like-benchmarksxpy---trace-dlcampus-2026-11-28"
    assert github_slug("Job -> class at submit time") == "job---class-at-submit-time"


def test_the_figure_rule_reads_units_not_dimensions() -> None:
    line = "8 hosts x 4 GPUs; p99 31 ms, 3.1x, 2.53 TB/s, +22.3 %, 1,181 h, 0.2 s; `45 s` in code"
    found = set(re.sub(r"\s", "", m.group(0)) for m in FIGURE.finditer(INLINE_CODE.sub("", line)))
    assert found == {"31ms", "3.1x", "2.53TB/s", "+22.3%", "1,181h", "0.2s"}


def test_every_relative_link_and_anchor_resolves() -> None:
    assert not broken_links(), "\n".join(broken_links())


def test_no_table_cell_is_a_paragraph() -> None:
    assert not long_cells(), "\n".join(long_cells())


def test_each_figure_is_stated_in_one_narrative_file() -> None:
    """README, ARCHITECTURE and docs/ state a measured figure once and link to it elsewhere."""
    assert not repeated_figures(), "\n".join(repeated_figures())


if __name__ == "__main__":
    problems = broken_links() + long_cells() + repeated_figures()
    print("\n".join(problems) or "docs: no problem found")
    sys.exit(1 if problems else 0)

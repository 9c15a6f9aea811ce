"""README.md and docs/*.md as a reader meets them: every relative link opens a file of the repository (and, where it
names a heading, that heading), the README stays a page for users (at most 300 lines), and it shows the two commands
as they really run: the app's, and the test command exactly as .ci/run runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
APP_COMMAND = "pip install -r requirements.txt && python app.py"

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text a renderer turns into links: fenced blocks and code spans removed."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", CODE_SPAN.sub(lambda m: m.group(0)[1:-1], heading).lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8")))}


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file does not exist, or whose #anchor names no heading of that file."""
    broken = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"(https?|mailto):", target) or target.startswith("#"):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve()
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: {linked.name} has no heading with the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_opens_a_file(path):
    assert not broken_links(path), f"{path.relative_to(ROOT)}: broken links: {broken_links(path)}"


def test_the_documents_link_to_something():
    """The checker reads links at all: the README links into docs/ and shows its screenshot."""
    targets = LINK.findall(prose((ROOT / "README.md").read_text(encoding="utf-8")))
    assert "assets/screenshot-attention.png" in targets
    assert {"docs/core.md", "docs/app.md", "docs/benchmarks.md", "docs/testing.md"} <= set(targets)


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n\ntext\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok too](there.md#a-heading) [web](https://example.com) [self](#x)\n"
                    "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n"
                    "[gone](missing.md) ![image](img/none.png) [no anchor](there.md#elsewhere)\n", encoding="utf-8")
    found = broken_links(page)
    assert len(found) == 3, found
    assert found[0].startswith("missing.md") and found[1].startswith("img/none.png")
    assert "#elsewhere" in found[2]


def test_the_readme_is_a_page_for_users():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move detail into docs/"


def test_the_readme_shows_the_commands_that_really_run():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip().startswith("bash scripts/setup_tests.sh")]
    assert len(ci) == 1, f".ci/run should run the README's test command once, found {ci}"
    assert ci[0] in readme, f"README.md should show the test command exactly as .ci/run runs it: {ci[0]!r}"
    assert APP_COMMAND in readme, f"README.md should show the app's command {APP_COMMAND!r}"

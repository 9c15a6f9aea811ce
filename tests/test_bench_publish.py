"""bench/common.py's publish: a section is replaced between its markers, headed by the command, the machine and the
run's load average, and the rest of the document is left as it was."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import common  # noqa: E402


def test_a_section_is_replaced_between_its_markers_and_headed_by_the_load(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "LOAD_AT_START", 0.25)
    monkeypatch.setattr(common, "load_average", lambda: 1.5)
    doc = tmp_path / "doc.md"
    doc.write_text("# T\n\nbefore\n\n<!-- bench:x start -->\nold figure 42\n<!-- bench:x end -->\n\nafter\n")
    common.publish("x", "| a | b |\n|---|---|\n| 1 | 2 |", doc=doc)
    text = doc.read_text()
    assert "old figure 42" not in text
    assert text.startswith("# T\n\nbefore\n\n<!-- bench:x start -->\n_Written by `")
    assert text.endswith("| 1 | 2 |\n<!-- bench:x end -->\n\nafter\n")
    head = text.splitlines()[5]
    assert head.endswith("; load average 0.25 → 1.50._"), head
    assert common.machine() in head


def test_a_new_section_is_appended_and_no_load_phrase_without_a_load_average(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "LOAD_AT_START", None)
    doc = tmp_path / "doc.md"
    doc.write_text("# T\n")
    common.publish("new-one", "body", doc=doc)
    text = doc.read_text()
    assert "## new-one\n\n<!-- bench:new-one start -->" in text and "load average" not in text
    with pytest.raises(ValueError, match="lower-case"):
        common.publish("Bad Name", "body", doc=doc)


def test_md_table_aligns_its_columns():
    assert common.md_table(["a", "b"], [[1, "x"]], ["---", "---:"]) == "| a | b |\n|---|---:|\n| 1 | x |"

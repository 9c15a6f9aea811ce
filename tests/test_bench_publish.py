"""bench/common.py's publish: a section is replaced between its markers, headed by the command, the machine and the
run's load average, and the rest of the document is left as it was."""
import subprocess
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


def test_a_saved_run_is_published_again_under_its_own_stamp(tmp_path, monkeypatch):
    """A section rendered from a saved run is headed by that run's command, date, machine and load, not by the
    process that renders it; without a saved run the head line is this run's stamp."""
    monkeypatch.setattr(common, "LOAD_AT_START", 0.25)
    monkeypatch.setattr(common, "load_average", lambda: 1.5)
    run = {"command": "python bench/x.py --publish", "date": "2026-01-02", "machine": "Some CPU, 8 cores",
           "load_average": [3.0, 4.0]}
    doc = tmp_path / "doc.md"
    doc.write_text("# T\n\n<!-- bench:x start -->\nold\n<!-- bench:x end -->\n")
    common.publish("x", "body", doc=doc, run=run)
    assert doc.read_text().splitlines()[3] == ("_Written by `python bench/x.py --publish` on 2026-01-02; Some CPU, "
                                               "8 cores; load average 3.00 → 4.00._")
    now = common.stamp()
    assert now["machine"] == common.machine() and now["load_average"] == [0.25, 1.5]
    assert common.section("x", "body").splitlines()[1] == common.written_by(now)


def test_md_table_aligns_its_columns():
    assert common.md_table(["a", "b"], [[1, "x"]], ["---", "---:"]) == "| a | b |\n|---|---:|\n| 1 | x |"


def suite_times():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "suite_times.py"
    spec = importlib.util.spec_from_file_location("suite_times", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_suite_times_reads_the_wall_time_from_the_xml_and_earlier_runs_from_git(tmp_path):
    """The wall time is pytest's own (the XML's session duration), and the history lists each published run of the
    same command once, newest first, from the document's git history."""
    times = suite_times()
    xml = tmp_path / "suite.xml"
    xml.write_text('<testsuites><testsuite name="pytest" time="636.8" tests="2"><testcase classname="tests.core.test_a"'
                   ' name="t" time="1.5"/><testcase classname="tests.core.test_a" name="u" time="2.0"><skipped/>'
                   '</testcase></testsuite></testsuites>')
    assert times.wall_seconds(xml) == pytest.approx(636.8)
    assert times.read(xml) == [("core", "tests.core.test_a", 1.5, "passed"), ("core", "tests.core.test_a", 2.0,
                                                                              "skipped")]

    def published(date, machine, command, wall):
        return (f"# T\n\n<!-- bench:suite-times start -->\n_Written by `python scripts/suite_times.py x --publish` on "
                f"{date}; {machine}; Python 3.11.7._\n\nFrom `{command}` on a clean clone: 5 passed; the tests' own "
                f"times add up to 2.0 min; the run's wall time {wall} min.\n<!-- bench:suite-times end -->\n")

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(git[:5] + ["init", "-q", str(tmp_path)], check=True)
    doc = tmp_path / "docs" / "testing.md"
    doc.parent.mkdir()
    for edit, (date, machine, command, wall) in enumerate([("2026-01-01", "AMD EPYC, 2 cores", "pytest tests", "19.0"),
                                         ("2026-01-01", "AMD EPYC, 2 cores", "pytest tests", "19.0"),  # re-committed
                                         ("2026-01-02", "AMD EPYC, 2 cores", "pytest -n 1 tests", "30.0"),
                                         ("2026-01-03", "Intel Xeon, 2 cores", "pytest tests", "10.5")]):
        doc.write_text(published(date, machine, command, wall) + f"\nprose, edit {edit}\n")
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", date], check=True)
    assert times.published_runs(doc, "pytest tests", root=tmp_path) == [
        ("2026-01-03", "Intel Xeon, 2 cores", "5 passed", "2.0", "10.5"),
        ("2026-01-01", "AMD EPYC, 2 cores", "5 passed", "2.0", "19.0")]

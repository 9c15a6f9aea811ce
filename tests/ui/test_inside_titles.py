"""The Inside tab's score anatomy in words a student reads (ui/views/inside.py): every form's figure title names
the query's and the key's tokens and the score, wrapped into lines that fit a phone-wide plot (so the wide page
never clips it either), with what the split is in the subtitle; the note counts the parts with thousands
separators and says what they are."""

from __future__ import annotations

import pytest
from tiny_app_model import build_tiny_llama

from core import load_model
from ui.plots.base import NARROW_TITLE_CHARS
from ui.services.inside import encode_walk
from ui.services.text import token_texts
from ui.views import inside as views

TEXT = "the bread is warm and the lamp is lit"
FORMS = [("layers", False), ("heads", False), ("heads", True)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_model(str(build_tiny_llama(tmp_path_factory.mktemp("inside-titles") / "llama")), device="cpu")


def annotation(fig, name: str) -> str:
    return next(a.text for a in fig.layout.annotations if a.name == name)


@pytest.mark.parametrize("split,relative", FORMS)
def test_the_title_names_query_and_key_and_fits_the_plot(llama, split, relative):
    enc = encode_walk(llama, TEXT)
    tokens = token_texts(llama, enc.ids)
    query, key = len(tokens) - 1, 2
    result, note, fig, _ = views.anatomy_parts(llama, enc, 1, 0, query, key, split, relative)
    title, subtitle = annotation(fig, "title"), annotation(fig, "subtitle")
    lines = title.split("<br>")
    assert all(len(line) <= NARROW_TITLE_CHARS for line in lines), lines
    assert not fig.layout.title.text   # plotly's own title, which it clips at the plot's width, is left empty
    whole = " ".join(lines)
    assert views.quoted(tokens[query]) in whole and views.quoted(tokens[key]) in whole, whole
    assert f"{result.score:+.3f}" in whole and ("relative score" in whole) == relative
    flat = " ".join(subtitle.split("<br>"))
    assert ("every earlier head its own part" in flat) == (split == "heads")
    assert ("against the query's attention-weighted mean key" in flat) == relative
    if split == "layers":
        assert views.pairs_words(result.matrix.shape) in flat


@pytest.mark.parametrize("split,relative", FORMS)
def test_the_note_counts_the_parts_in_words(llama, split, relative):
    enc = encode_walk(llama, TEXT)
    result, note, _, _ = views.anatomy_parts(llama, enc, 1, 0, len(enc.ids) - 1, 2, split, relative)
    rows, cols = result.matrix.shape
    assert f"the {rows * cols:,} pairs ({rows:,} query-side parts × {cols:,} key-side parts) add up to" in note
    assert f" {rows * cols} parts" not in note


def test_a_large_count_reads_with_thousands_separators():
    assert views.pairs_words((182, 182)) == "33,124 pairs (182 query-side parts × 182 key-side parts)"

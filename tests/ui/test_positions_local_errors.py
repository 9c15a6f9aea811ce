"""The Positional encoding tab's figures each check the inputs they read: a refused field is a note under the
figures it changes, and every other figure is still drawn (ui/views/positions.py over ui/services/positions.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tiny_app_model import build_tiny_llama
from ui.services import Services
from ui.services.checks import UserError
from ui.services.models import ModelStore
from ui.services.positions import check_offset, check_sinusoid_size, check_start
from ui.views.positions import NOT_DRAWN, export_data, positional_view

TEXT = "The keeper lit the lamp at dawn."
PARTS = ("heat", "dots", "sim", "check", "learned", "learned_sim", "angles", "scores", "rope_note", "sinusoid_note",
         "dots_note", "learned_note")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = str(build_tiny_llama(tmp_path_factory.mktemp("pe-models") / "tiny-llama", max_positions=64))
    return Services.create(models=ModelStore()), folder


def view(served, n=16, d=8, p=0, k=1, layer=0, head=0, text=TEXT) -> dict:
    services, folder = served
    return dict(zip(PARTS, positional_view(services, folder, n, d, p, k, layer, head, text)))


def drawn(figure) -> bool:
    return bool(figure.data) and not any(NOT_DRAWN in a.text for a in figure.layout.annotations or ())


def test_the_checks_name_the_field_and_its_range_for_these_positions():
    assert check_offset(3, 4) == 3 and check_start(2, 4) == 2 and check_sinusoid_size(16, 8) == (16, 8)
    with pytest.raises(UserError, match=r"Offset k must be between 1 and 3, got 5.*n = 4 positions"):
        check_offset(5, 4)
    with pytest.raises(UserError, match="Start position p"):
        check_start(3, 4)
    with pytest.raises(UserError, match="Dimensions d must be even"):
        check_sinusoid_size(16, 7)


def test_an_offset_beyond_n_is_a_note_under_the_rotation_check_and_every_figure_is_drawn(served):
    out = view(served, n=4, k=5)
    assert "Offset k must be between 1 and 3, got 5" in out["check"]
    assert "is a rotation" not in out["check"]
    for name in ("heat", "dots", "sim", "angles", "scores"):
        assert drawn(out[name]), f"{name} was not drawn"
    assert np.asarray(out["heat"].data[0].z).shape == (4, 8)
    assert "depends only on the distance" in out["rope_note"]
    assert out["sinusoid_note"] == out["dots_note"] == out["learned_note"] == ""


def test_a_bad_start_position_leaves_the_rotation_check_and_the_heatmaps(served):
    out = view(served, n=4, p=9, k=2)
    assert not drawn(out["dots"]) and "Start position p" in out["dots_note"]
    assert "is a rotation of PE(p)" in out["check"]
    assert drawn(out["heat"]) and drawn(out["sim"]) and drawn(out["scores"])


def test_a_bad_layer_is_a_note_under_rope_only_and_odd_dimensions_under_the_sinusoids_only(served):
    out = view(served, layer=7)
    assert not drawn(out["angles"]) and not drawn(out["scores"])
    assert "Layer must be between 0 and 1, got 7" in out["rope_note"]
    assert drawn(out["heat"]) and drawn(out["dots"]) and "is a rotation" in out["check"]
    out = view(served, d=7)
    assert not drawn(out["heat"]) and "Dimensions d must be even" in out["sinusoid_note"]
    assert drawn(out["angles"]) and drawn(out["scores"])  # RoPE reads n, not d


def test_a_refused_note_is_escaped_text(served):
    out = view(served, layer="<b>x</b>")
    assert "<b>" not in out["rope_note"] and "&lt;b&gt;" in out["rope_note"]


def test_the_export_still_refuses_a_bad_field_in_words(served):
    services, folder = served
    with pytest.raises(UserError, match="Offset k"):
        export_data(services, folder, 4, 8, 0, 5, 0, 0, TEXT)

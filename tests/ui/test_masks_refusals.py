"""The Masks tab's refusals are notes beside their figures, never an error: a window demo setting it cannot run,
a too-short text, the stages' window out of range and two padding texts of one length each
leave their figures in a stated empty state and say why; on a tiny BERT the window demo runs, symmetric, and says
what it measured (the hidden-state change and the mean-pooled sentence embeddings' cosine)."""
from __future__ import annotations

import numpy as np
import pytest

from tiny_app_model import build_tiny_bert, build_tiny_llama
from ui.views.masks import NOT_DRAWN, mask_view, window_view

TEXT = "The keeper lit the lamp at dawn and again at dusk."


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from ui.services import Services
    from ui.services.models import ModelStore

    root = tmp_path_factory.mktemp("mask-refusals")
    llama = str(build_tiny_llama(root / "tiny-llama", max_positions=64))
    bert = str(build_tiny_bert(root / "tiny-bert"))
    return Services.create(models=ModelStore()), llama, bert


def empty_state(fig) -> bool:
    return not fig.data and [a.text for a in fig.layout.annotations] == [NOT_DRAWN]


@pytest.mark.parametrize(("model", "window", "glob", "text", "said"), [
    ("llama", 0, 0, TEXT, "Window w must be between 1 and 256, got 0"),
    ("llama", 4, -1, TEXT, "Global tokens g must be between 0 and 256, got -1"),
    ("bert", 300, 0, TEXT, "Window w must be between 1 and 256, got 300"),
    ("llama", 4, 0, "a", "needs at least 2 tokens"),
])
def test_a_window_setting_it_cannot_run_is_a_note_and_empty_figures(served, model, window, glob, text, said):
    services, llama, bert = served
    note, *figures, words = window_view(services, {"llama": llama, "bert": bert}[model], text, 0, 0, window, glob)
    assert note.startswith("⚠️ The window demo did not run") and said in note
    assert len(figures) == 4 and all(empty_state(fig) for fig in figures) and words == ""


def test_the_window_demo_runs_on_an_encoder_and_says_what_it_measured(served):
    services, _, bert = served
    note, mask, weights, change, cost, words = window_view(services, bert, TEXT, 1, 2, 3, 1)
    assert "is an encoder: its window is symmetric" in note and "symmetric" in mask.layout.title.text
    z = np.asarray(mask.data[0].z, dtype=np.float64)
    assert np.array_equal(z, z.T) and not np.isnan(z).any()        # every key readable, the window symmetric
    assert z[0].all() and z[:, 0].all() and z[5, 9] == 0             # the global token both ways; a far key hidden
    full_panel = np.asarray(weights.data[0].z, dtype=np.float64)
    assert not np.isnan(full_panel).any()                            # an encoder reads later keys too
    y = np.asarray(change.data[0].y, dtype=np.float64)
    assert change.data[0].name == "‖h_window − h‖ / ‖h‖" and (y > 0).any()
    assert f"{y.mean():.4f} on average over {len(y)} positions" in words
    assert "mean of the final hidden states over the positions" in words and "cosine" in words
    assert "reads every key." in words and "with the window" in words


def test_a_short_text_is_a_note_beside_every_figure_of_the_mask_demo(served):
    services, llama, _ = served
    out = mask_view(services, llama, "a", 0, 0, 0, 6, "A longer sentence than the other one.", "Short.")
    note, *stages, causal, causal_note, padding, padding_note, entropy, entropy_note = out
    assert "needs at least 2 tokens" in note and all(empty_state(f) for f in (*stages, causal, padding, entropy))
    assert causal_note == padding_note == entropy_note == note


def test_the_stages_window_and_equal_padding_texts_are_notes_beside_their_figures(served):
    services, llama, _ = served
    out = mask_view(services, llama, TEXT, 1, 2, 500, 6, "Same length.", "Same length.")
    note, *stages, causal, causal_note, padding, padding_note, entropy, entropy_note = out
    assert "stages of eq. 2.1 are not drawn" in note and "Window start must be between" in note
    assert all(empty_state(f) for f in stages) and empty_state(padding)
    assert padding_note.startswith("⚠️") and "nothing is padded" in padding_note
    assert causal.data and entropy.data and "loss" in causal_note     # the other sections still ran

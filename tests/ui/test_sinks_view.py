"""The Heads tab's sink section on tiny random models, the real core underneath: the map's tiles are the core's
sink_scores (token 0 over the queries after it; an encoder's [CLS] and [SEP] over every query), its rings and the
note's share are the heads above ε; the window's curves are the core's streaming_perplexity losses beside full
attention; every refusal (an encoder-decoder's map, an encoder's perplexity, a window or sink count out of range,
a text over the limit) is the note, in words, beside an empty figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.analysis.sinks import sink_scores, streaming_perplexity
from tiny_app_model import build_tiny_bert, build_tiny_llama, build_tiny_marian
from ui.plots.heads import sink_maps, window_loss_figure
from ui.services import Services
from ui.services.checks import UserError
from ui.services.models import ModelStore
from ui.services.sinks import EPSILON, MAX_STREAMING_TOKENS, MAX_SINKS
from ui.services.text import encode
from ui.views.sinks import sinks_view, streaming_view

SHORT = "the bread is warm"  # few tokens: a random head's mean on token 0 is about the mean of 1/2, 1/3, …
LONG = "The keeper lit the lamp. The keeper lit the lamp again at dawn, and the boats came home. " * 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sinks-views")
    folders = dict(llama=str(build_tiny_llama(root / "tiny-llama", max_positions=2048)),
                   bert=str(build_tiny_bert(root / "tiny-bert")), marian=str(build_tiny_marian(root / "tiny-marian")))
    return Services.create(models=ModelStore()), folders


def core_first(model, text: str):
    ids = encode(model, text).ids
    return sink_scores(model, [torch.tensor(ids)]), ids


def last(updates):
    """A streaming view's finished result: its last (note, figure)."""
    result = None
    for result in updates:
        pass
    return result


def heatmaps(fig) -> list:
    return [trace for trace in fig.data if trace.type == "heatmap"]


def rings(fig) -> list[set[tuple[int, int]]]:
    return [set(zip(trace.x, trace.y)) for trace in fig.data if trace.type == "scatter"]


@pytest.mark.parametrize("text", [SHORT, LONG])
def test_the_decoders_map_is_the_cores_attention_on_token_0_and_the_note_says_the_share(setup, text):
    services, folders = setup
    model = services.models.get(folders["llama"])
    note, fig = sinks_view(services, folders["llama"], text)
    expected, ids = core_first(model, text)
    first = expected.first.mean.numpy()                                      # [L, H]
    (tile,) = heatmaps(fig)
    np.testing.assert_allclose(np.asarray(tile.z), first.T, atol=1e-6)       # layers across, heads down
    above = {(int(layer), int(head)) for layer, head in zip(*np.nonzero(first > EPSILON))}
    assert rings(fig) == ([above] if above else [])   # no ring trace where no head is a sink
    heads = first.size
    share = float(expected.share.mean)
    assert share == pytest.approx(len(above) / heads)
    assert f"**{len(above)} of {heads} heads ({share:.0%})**" in note and f"ε = {EPSILON:g}" in note
    assert f"queries 1–{len(ids) - 1} of the text's {len(ids)} tokens" in note and "token 0 ('" in note
    assert "Sink^ε" in note


def test_a_short_text_has_sink_heads_ringed_and_named(setup):
    # the other case of the test above, stated: a random head's attention is spread over the few keys it sees
    services, folders = setup
    note, fig = sinks_view(services, folders["llama"], SHORT)
    assert rings(fig)[0] and "(ringed): L" in note


def test_an_encoders_map_shows_cls_and_sep_over_every_query(setup):
    services, folders = setup
    model = services.models.get(folders["bert"])
    note, fig = sinks_view(services, folders["bert"], LONG)
    expected, ids = core_first(model, LONG)
    cls, sep = heatmaps(fig)
    np.testing.assert_allclose(np.asarray(cls.z), expected.first.mean.numpy().T, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sep.z), expected.sep.mean.numpy().T, atol=1e-6)
    assert [a.text for a in fig.layout.annotations][:2] == ["on [CLS]", "on [SEP]"]
    assert f"averages over all {len(ids)} queries" in note and f"[SEP] (token {len(ids) - 1})" in note
    assert "encoder" in note


def test_an_encoder_decoders_map_is_refused_in_words(setup):
    services, folders = setup
    note, fig = sinks_view(services, folders["marian"], LONG)
    assert "encoder-decoder" in note and not heatmaps(fig)


@pytest.mark.parametrize("window, sinks, positions", [(8, 0, "text"), (8, 2, "text"), (6, 2, "cache")])
def test_the_window_curves_are_the_cores_losses_beside_full_attention(setup, window, sinks, positions):
    services, folders = setup
    model = services.models.get(folders["llama"])
    note, fig = last(streaming_view(services, folders["llama"], LONG, window, sinks, positions))
    ids = torch.tensor(encode(model, LONG).ids)
    run = streaming_perplexity(model, ids, window, sinks, positions)
    full = streaming_perplexity(model, ids, len(ids), 0, "text")
    windowed, whole = fig.data
    np.testing.assert_allclose(np.asarray(windowed.y), run.loss.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(whole.y), full.loss.numpy(), atol=1e-5)
    assert list(windowed.x) == list(range(len(ids) - 1)) and whole.name == "full attention"
    assert fig.layout.shapes[0].x0 == window + sinks                          # the first query that misses a key
    assert f"**Perplexity {run.perplexity:.2f}**" in note and f"**{full.perplexity:.2f}**" in note
    assert f"from query {window + sinks} on" in note


def test_a_window_that_covers_the_text_hides_nothing(setup):
    services, folders = setup
    note, fig = last(streaming_view(services, folders["llama"], SHORT, 64, 0, "text"))
    windowed, whole = fig.data
    np.testing.assert_allclose(np.asarray(windowed.y), np.asarray(whole.y), atol=1e-6)
    assert not fig.layout.shapes and "hides nothing" in note


@pytest.mark.parametrize("model, text, window, sinks, positions, words", [
    ("bert", LONG, 8, 2, "text", "this model is an encoder"),
    ("marian", LONG, 8, 2, "text", "encoder-decoder"),
    ("llama", LONG, 0, 2, "text", f"Window must be between 1 and {MAX_STREAMING_TOKENS}"),
    ("llama", LONG, 8, MAX_SINKS + 1, "text", f"Sinks must be between 0 and {MAX_SINKS}"),
    ("llama", SHORT, 2, 9, "text", "-token text: give fewer sinks than tokens"),
    ("llama", LONG, 8, 2, "both", "Positions must be one of"),
    ("llama", "the lamp " * MAX_STREAMING_TOKENS, 8, 2, "text", f"at most {MAX_STREAMING_TOKENS:,} tokens here"),
])
def test_what_the_window_cannot_read_is_said_in_the_note(setup, model, text, window, sinks, positions, words):
    services, folders = setup
    note, fig = last(streaming_view(services, folders[model], text, window, sinks, positions))
    assert words in note and not fig.data


def test_the_plots_take_arrays_and_check_their_shapes():
    first = np.array([[0.9, 0.1], [0.2, 0.5]], dtype=np.float32)
    fig = sink_maps({"on token 0": first}, {"on token 0": first > 0.3}, 0.3, "title")
    assert rings(fig) == [{(0, 0), (1, 1)}] and fig.data[0].zmax == 1.0
    with pytest.raises(ValueError, match="one shape"):
        sink_maps({"a": first, "b": first[:1]}, {"a": first > 0.3, "b": first[:1] > 0.3}, 0.3, "title")
    with pytest.raises(ValueError, match="one length"):
        window_loss_figure({"a": np.zeros(4), "b": np.zeros(5)}, None, "title")


def test_the_comparison_is_each_models_own_map_layer_by_layer(setup, monkeypatch):
    """Each model's row is its own sink map on the text (its share, its layers' means over heads); a model that
    cannot be measured (the encoder-decoder) says why in the note, and the models left out are named."""
    import ui.views.sinks as views

    services, folders = setup
    names = [folders["llama"], folders["bert"], folders["marian"]]
    monkeypatch.setattr(views, "installed", lambda models, first: (names, ["not-compared-model"]))
    note, fig = views.comparison_view(services, folders["llama"], LONG)
    drawn = {trace.name: np.asarray(trace.y, float) for trace in fig.data}
    assert len(drawn) == 2                                           # the decoder and the encoder
    for kind in ("llama", "bert"):
        model = services.models.get(folders[kind])
        expected, ids = core_first(model, LONG)
        first = expected.first.mean.numpy()                          # [L, H]
        share = float(expected.share.mean)
        (line,) = [y for name, y in drawn.items() if name.startswith(folders[kind])]
        np.testing.assert_allclose(line, first.mean(axis=1), atol=1e-6)
        assert f"{share:.0%} of {first.size} heads, over {len(ids):,} tokens" in note
    assert "not measured" in note and "not-compared-model" in note
    long_text = LONG * 40                                              # past the map's 512 tokens: said per model
    note, _ = views.comparison_view(services, folders["llama"], long_text)
    assert note.count("were dropped") == 2, note
    asked = []   # an empty text is refused before any model is loaded for it (the page's own model aside)
    monkeypatch.setattr(services.models, "get", lambda name, progress=None: asked.append(name))
    for empty in ("", "   ", None):
        with pytest.raises(UserError, match="The text is empty"):
            views.comparison_view(services, folders["llama"], empty)
    assert asked == [folders["llama"]] * 3


def test_installed_lists_the_pickers_ready_models_with_the_page_model_first():
    from ui.services.sinks import MAX_COMPARED, installed

    class Store:
        def names(self):
            return [f"m{i}" for i in range(MAX_COMPARED + 3)]

        def names_ready(self):   # the store's own rule: ready names are among the picker's, never a private run
            return [name for name in self.names() if name != "m1"]

    compared, left_out = installed(Store(), "m4")
    assert compared[0] == "m4" and "m1" not in compared + left_out
    assert len(compared) == MAX_COMPARED and set(compared) | set(left_out) == set(Store().names_ready())



def test_the_reading_reports_each_token_and_stops_when_closed(setup, monkeypatch):
    """Through the cache the reading reports after every token, then the full pass (WindowSettings.steps); its
    result is window_read's; closing the updates (the page's Stop) ends the worker at its next token."""
    import threading
    import time

    from ui.services.sinks import stream_window, window_read, window_settings

    services, folders = setup
    model = services.models.get(folders["llama"])
    settings = window_settings(model, LONG, 6, 2, "cache")
    assert settings.steps == len(settings.tokens.ids)                           # T − 1 tokens, then the full pass
    updates = list(stream_window(model, settings))
    assert [u.done for u in updates[1:-1]] == list(range(1, settings.steps + 1))  # every step, in order
    assert {u.total for u in updates} == {settings.steps} and updates[-1].finished
    expected = window_read(model, LONG, 6, 2, "cache")
    assert updates[-1].result.windowed.perplexity == pytest.approx(expected.windowed.perplexity, rel=1e-6)

    import core.analysis.sinks as core_sinks

    steps, gate, decode = [], threading.Event(), core_sinks.rolling_decode_step

    def held(*args, **kwargs):  # the second token waits until the page has stopped the reading
        steps.append(1)
        if len(steps) == 2:
            gate.wait(30)
        return decode(*args, **kwargs)

    monkeypatch.setattr(core_sinks, "rolling_decode_step", held)
    stream = stream_window(model, settings)
    next(stream), next(stream)                                                   # started, one token read
    stream.close()
    gate.set()
    deadline = time.monotonic() + 30
    while any(t.name == "streaming-perplexity" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)                                                         # polled: the worker's own end
    assert not any(t.name == "streaming-perplexity" for t in threading.enumerate()), "the reading went on"
    assert len(steps) == 2                                                       # no token after the Stop


@pytest.mark.parametrize("text", [SHORT, LONG])
def test_the_atlas_and_the_sink_map_name_the_same_sink_heads_at_one_threshold(setup, text):
    """The Heads tab shows sink heads twice, in the atlas's named heads and on the sink map: both are
    core.analysis.heads.sink_heads at Gu et al.'s ε, so they name the same heads with the same scores."""
    from ui.services.heads import head_scores, named_heads, naming_rule, session_cache
    from ui.services.sinks import sink_map

    services, folders = setup
    model = services.models.get(folders["llama"])
    tokens = encode(model, text)
    atlas = named_heads(head_scores(model, session_cache(None, folders["llama"], tokens)))["first_token"]
    mapped = sink_map(model, text)
    assert mapped.epsilon == EPSILON == 0.3 and naming_rule("first_token") == f"> ε = {EPSILON:g}"
    assert {(layer, head) for layer, head, _ in atlas} == {(layer, head) for layer, head, _ in mapped.above}
    for (layer, head, score), (_, _, shown) in zip(sorted(atlas), sorted(mapped.above)):
        assert score == pytest.approx(shown, abs=1e-5) and score > EPSILON
    if text == SHORT:      # few tokens: a random model's heads spread over them, above ε, and both say so
        assert atlas

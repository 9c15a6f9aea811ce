"""Every tab of the app on a tiny model of every new family (tests/tiny.py): each service or view returns its
result, or refuses in words (a UserError), never with a traceback; and what the views say about a family's
terms is measured on the model: the card's parameter table adds up, the score bias drawn in the Positions tab is
the model's own, and the Masks tab's stages are the model's own probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch

from ui.services import Services
from ui.services.checks import UserError
from ui.services.models import ModelStore
from ui.settings import AppSettings

NAMES = [*tiny.FAMILY_DECODERS, *tiny.FAMILY_SEQ2SEQ]
TEXT = "the lamp at dawn, the lamp at dusk."  # 35 characters: one token each, past every tiny sliding window
SHORT = "the lamp."


def char_tokenizer(model_config):
    """A character tokenizer whose ids fit the tiny models' vocabulary of tiny.VOCAB: pad 0, bos 1, eos 2, then one
    id per character of the texts here."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(TEXT + SHORT + "abcdefghijklmnopqrstuvwxyz .,"))
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: 4 + i for i, c in enumerate(chars)}}
    assert len(vocab) <= tiny.VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name → a folder with the family's tiny transformers model and the character tokenizer (the app loads
    models by folder, as `python app.py --model FOLDER` does)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in NAMES:
        hf = tiny.family_pair(name)[0]
        folder = root / name
        tiny.save(hf, str(folder))
        char_tokenizer(hf.config).save_pretrained(folder)
        out[name] = str(folder)
    return out


@pytest.fixture(scope="module")
def services(folders):
    return Services.create(AppSettings(), ModelStore(capacity=len(NAMES), extra_names=list(folders.values())))


def answered(call):
    """The call's result, or the words of its refusal (a UserError); any other exception fails the test."""
    try:
        return call()
    except UserError as exc:
        assert len(str(exc)) > 20, f"a refusal in too few words: {exc}"
        return str(exc)


@pytest.mark.parametrize("name", NAMES)
def test_model_card_names_the_family_terms_and_counts_every_parameter(name, services, folders):
    from ui.views.card import FAMILY_WORDS, model_card, parameter_table

    model = services.models.get(folders[name])
    family = model.config.family
    assert family in FAMILY_WORDS, f"the card has no words for {family}"
    card = model_card(name, model)
    assert FAMILY_WORDS[family] in card
    rows = {row[0]: int(row[1].replace(",", "")) for row in parameter_table(model) if not row[2]}
    parts = sum(v for k, v in rows.items() if k != "total")
    assert parts == rows["total"] == sum(p.numel() for p in model.parameters()), rows
    attn = model.stack.blocks[0].attn                              # the card's W^Q, W^K, W^V, W^O count
    weights = sum(m.weight.numel() for m in (attn.qkv, attn.out))
    cfg = model.config
    if cfg.n_kv_heads != cfg.n_heads or cfg.n_heads * cfg.head_dim != cfg.d_model:
        assert f"= {weights:,} (plus biases" in card, card


@pytest.mark.parametrize("name", NAMES)
def test_generate_tab_writes_with_the_cache(name, services, folders):
    from ui.services.generation import run_trace, stream_generation
    from ui.services.generation.trace import step_view
    from ui.services.generation.kv_cache import encode_prompt, kv_sizes, time_kv, window_note

    model = services.models.get(folders[name])
    updates = list(stream_generation(model, TEXT, False, 4, 0.0, None, None, 0))
    assert updates[-1].done and updates[-1].n_new >= 1
    # the KV panel's parts, on a prompt longer than every sliding window: the cache holds what the formula says,
    # and greedy decoding writes the same tokens with the cache as without it
    cfg = model.config
    ids = encode_prompt(model, TEXT)
    source, decoder = (ids, [cfg.decoder_start_token_id]) if cfg.is_encoder_decoder else ([], ids)
    timing = time_kv(model, source, decoder, n_new=4, lengths=(40, 48))
    assert timing.same_tokens
    sizes = kv_sizes(model, source, decoder + timing.continuation)
    assert sizes.allocated == sizes.formula_allocated
    if "sliding" in cfg.layer_types:
        assert f"last {cfg.sliding_window} keys (a sliding window in the mask)" in window_note(cfg)
    # the Generate tab's trace: each step's attention row per layer and head, a distribution over the keys, none
    # of it more than a window back on a sliding layer; a seq2seq model's cross-attention rows over its source
    trace = run_trace(model, folders[name], None, TEXT, False, 3, 0.0, 0, 1.0, 0, services.kept)
    last = trace.rows(services.kept)[-1].astype(np.float32)                         # [L, H, keys]
    np.testing.assert_allclose(last.sum(-1), 1.0, atol=2e-3)
    for layer in range(cfg.n_layers):
        if cfg.layer_type(layer) == "sliding":
            assert not last[layer, :, :-cfg.sliding_window].any()
    if cfg.is_encoder_decoder:
        np.testing.assert_allclose(trace.cross_rows(services.kept)[-1].astype(np.float32).sum(-1), 1.0, atol=2e-3)
    assert step_view(model, trace, 1, cfg.n_layers - 1, 1, services.kept).keys


@pytest.mark.parametrize("name", NAMES)
def test_positions_tab_draws_or_says_why(name, services, folders):
    from ui.views.positions import first_view

    out = first_view(services, folders[name], 32, 16, 0, 1, 0, 1, TEXT)
    notes = [x for x in out if isinstance(x, str)]
    model = services.models.get(folders[name])
    cfg = model.config
    if cfg.score_bias != "none":
        assert any("bias on the scores" in n for n in notes), notes
    if cfg.position_offset:   # OPT: position p is row p + 2 of the table, and the heatmap starts there
        table = model.stack.embed.positions.weight.detach().numpy()
        np.testing.assert_allclose(np.asarray(out[4].data[0].z)[0], table[cfg.position_offset], rtol=1e-6)
        assert f"row p + {cfg.position_offset}" in out[11]
    rotated = 2 * len(model.inv_freq) if model.inv_freq is not None else 0   # one pair per frequency
    if 0 < rotated < cfg.head_dim:
        assert any(f"first {rotated} of its {cfg.head_dim}" in n for n in notes), notes
        assert f"first {rotated} of d_k = {cfg.head_dim}" in out[6].layout.title.text


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith(("bloom", "t5"))])
def test_score_bias_drawn_is_the_models_own(name, services, folders):
    from ui.plots.charts import score_bias_figure
    from ui.services.positions import score_bias_by_distance

    model = services.models.get(folders[name])
    distances, bias = score_bias_by_distance(model, 10)          # [D], [H, D]: key j = query i − distance
    stack = model.attention_stack()[0]
    i = torch.full((1, 1), 12)
    for d_index, d in enumerate(distances):
        own = stack.score_bias(i, torch.tensor([[12 - int(d)]]))[0, :, 0, 0]  # [H]
        np.testing.assert_allclose(bias[:, d_index], own.detach().numpy(), rtol=1e-6, atol=1e-7)
    figure = score_bias_figure(distances, bias, "bias")              # what the Positions tab draws
    assert len(figure.data) == bias.shape[0]
    for h, trace in enumerate(figure.data):
        np.testing.assert_array_equal(np.asarray(trace.y), bias[h].astype(np.float64))
    if model.config.score_bias == "alibi":    # −m_h·distance: a straight line through 0 per head
        np.testing.assert_allclose(bias[:, 0], 0.0, atol=1e-7)
        slopes = bias[:, 1:] / -distances[1:]
        np.testing.assert_allclose(slopes, slopes[:, :1].repeat(slopes.shape[1], 1), rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_masks_tab_stages_are_the_models_own(name, services, folders):
    from ui.views.masks import mask_view

    model = services.models.get(folders[name])
    layer = model.config.n_layers - 1
    out = answered(lambda: mask_view(services, folders[name], TEXT, layer, 1, 0, 40, TEXT, SHORT))
    if model.config.is_encoder_decoder:
        assert isinstance(out, tuple) and "encoder-decoder" in out[0]   # a note, the figures in their empty state
        return
    assert isinstance(out, tuple)
    stage_titles = [fig.layout.title.text for fig in out[1:7]]
    assert all(len(title) <= 32 for title in stage_titles), stage_titles   # a panel a third of a page across
    if model.config.attn_softcap is not None:
        assert f"{model.config.attn_softcap:g}·tanh(" in stage_titles[0] and "soft-capped" in out[0]
    if model.config.layer_type(layer) == "sliding":
        assert f"window {model.config.sliding_window}" in stage_titles[1] and "sliding-window layer" in out[0]
    from ui.services.masks import mask_stages, qk_for_head
    from ui.services.text import encode

    ids = encode(model, TEXT).ids
    q, k = qk_for_head(model, ids, layer, 1)
    stages = mask_stages(model, q, k, layer, 1, 0)
    with torch.inference_mode():
        pattern = model(torch.tensor([ids]), capture_attention=True).attentions[layer][0, 1].numpy()
    np.testing.assert_allclose(stages["causal mask on"][2], pattern, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_attention_and_heads_tabs_answer(name, services, folders):
    from ui.services.heads import attribution, heads_cache
    from ui.services.text import encode
    from ui.views import heads as heads_views
    from ui.views.attention import attention_view

    folder = folders[name]
    note, *figures, _ = attention_view(services, folder, TEXT, 1, "1", False, 0, 0, 8)
    assert "tokens" in note and len(figures) == 4
    cfg = services.models.get(folder).config
    if cfg.sliding_window is not None and "sliding" in cfg.layer_types:
        assert f"sliding window of {cfg.sliding_window} keys" in figures[0].layout.title.text
    model = services.models.get(folder)
    tokens = encode(model, SHORT)
    *_, shared = heads_views.atlas_view(services, folder, SHORT, "previous_token", 0, 0)
    for call in (lambda: heads_views.lens_view(services, folder, SHORT, previous=shared),
                 lambda: heads_views.surprisal_view(services, folder, SHORT, previous=shared),
                 lambda: heads_views.ablation_view(services, folder, SHORT, "0.0, 1.1", "zero"),
                 lambda: attribution(model, heads_cache(shared, folder, tokens), -1, 1, 1, 2)):
        out = answered(call)
        assert out is not None


@pytest.mark.parametrize("name", NAMES)
def test_inside_and_patching_tabs_answer(name, services, folders):
    from ui.views import inside as inside_views
    from ui.views import patching as patching_views

    folder = folders[name]
    for call in (lambda: inside_views.walk_view(services, folder, SHORT, 0, 1, -1, 1.0, 0, 1.0),
                 lambda: inside_views.anatomy_view(services, folder, SHORT, 1, 1, 6, 2),
                 lambda: inside_views.geometry_view(services, folder, SHORT, 1, 1),
                 lambda: patching_views.attribution_view(services, folder, "the lamp.", "the dusk.", "a", "b"),
                 lambda: list(patching_views.patch_view(services, folder, "the lamp.", "the dusk.", "a", "b",
                                                        "resid_pre", "denoise", 0)),
                 lambda: patching_views.flow_view(services, folder, "the lamp.", 0.05)):
        out = answered(call)
        assert isinstance(out, (str, tuple, list))


@pytest.mark.parametrize("family", ["gpt_neox", "bloom", "opt", "mistral", "qwen3", "phi3", "gemma", "gemma2",
                                    "gemma3", "t5"])
def test_lab_refuses_other_families_in_words(family):
    from ui.services.lab.configs import DEFAULT_FIELDS, make_config
    from ui.settings import LabSettings

    with pytest.raises(UserError, match=f"got '{family}': '{family}' is a family the app loads and analyses, but the "
                                         "Lab trains only these two layouts"):
        make_config(LabSettings(), **{**DEFAULT_FIELDS, "family": family})

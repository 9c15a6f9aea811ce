"""ui/services without Gradio: model cache, text handling, pooling, the positional and mask measurements."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_app_model import build_tiny_llama, build_tiny_marian
from ui.services.attention import pool_attention, pool_edges
from ui.services.checks import REPO_ROOT, UserError, check_choice, check_float, check_range, check_seed, public_text
from ui.services.generation import stream_generation
from ui.services.heads import (ablation, attribution, head_map, head_scores, heads_cache, parse_heads,
                               score_names, stream_sweep)
from ui.services.kept import KeptStore
from ui.services.masks import padding_effect
from ui.services.models import ModelStore
from ui.services.positions import pe_shift_check, sinusoidal
from ui.services import Services
from ui.services.text import as_batch, encode, read_upload, token_texts
from ui.settings import DEFAULT_TEXT_BYTES, AppSettings
from ui.views.card import model_card


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("service-models") / "tiny-llama", max_positions=64))


def test_services_import_no_gradio():
    folder = Path(REPO_ROOT) / "ui" / "services"
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "gradio" not in imported, f"{path.relative_to(REPO_ROOT)} imports gradio"


def test_model_store_loads_each_name_once_even_when_sessions_ask_together(tiny_llama, monkeypatch):
    store = ModelStore()
    loads = []
    real_load = store._load
    monkeypatch.setattr(store, "_load", lambda name, progress: loads.append(name) or real_load(name, progress))
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.get(tiny_llama))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == [tiny_llama]
    assert len({id(m) for m in results}) == 1


def test_model_store_evicts_the_least_recently_used(tiny_llama, tmp_path):
    other = str(build_tiny_llama(tmp_path / "other", max_positions=32))
    store = ModelStore(capacity=1)
    first = store.get(tiny_llama)
    store.get(other)
    assert store.get(tiny_llama) is not first  # evicted, loaded again


def test_encode_cuts_long_text_and_says_how_much(tiny_llama):
    model = ModelStore().get(tiny_llama)
    enc = encode(model, "the lamp at dawn " * 100, max_tokens=1000)
    assert len(enc.ids) == 64  # the model's context, smaller than the view's limit
    assert "only the first 64 are used (the model's context)" in enc.note
    assert enc.labels[0].startswith("0 ") and len(set(enc.labels)) == len(enc.labels)
    with pytest.raises(UserError, match="The text is empty"):
        encode(model, " \n ")


def test_pool_attention_keeps_rows_summing_to_one():
    rng = np.random.default_rng(0)
    probs = rng.random((3, 37, 37)).astype(np.float32)
    probs /= probs.sum(-1, keepdims=True)
    edges = pool_edges(37, 8)
    pooled = pool_attention(probs, edges, edges)
    assert pooled.shape == (3, 8, 8)
    np.testing.assert_allclose(pooled.sum(-1), 1.0, atol=1e-5)
    assert edges[0] == 0 and edges[-1] == 37


def test_sinusoidal_shift_is_a_rotation():
    pe = sinusoidal(100, 32)
    np.testing.assert_allclose(pe[1, 2], np.sin(1 / 10000 ** (2 / 32)), atol=1e-7)  # eq. 4.1
    check = pe_shift_check(pe, 32, 7)
    assert check["analytic_max_error"] < 1e-5 and check["rotation_orthogonality"] < 1e-12
    assert check["fit_max_error"] < 1e-5
    with pytest.raises(UserError, match="offset k"):
        pe_shift_check(pe, 32, 100)


def test_read_upload_messages(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfhello")  # a UTF-8 BOM is dropped
    assert read_upload(tmp_path / "a.txt") == "hello"
    (tmp_path / "big.md").write_bytes(b"x" * (DEFAULT_TEXT_BYTES + 1))
    with pytest.raises(UserError, match="the limit for typed and uploaded text is 1 MB.*ATTN_MAX_TEXT_MB"):
        read_upload(tmp_path / "big.md")
    (tmp_path / "b.txt").write_bytes(b"ok \xff")
    with pytest.raises(UserError, match=r"not UTF-8 text \(byte 3 is 0xff\)"):
        read_upload(tmp_path / "b.txt")


def test_padding_mask_keeps_real_outputs_and_its_absence_moves_them(tiny_llama):
    model = ModelStore().get(tiny_llama)
    long_ids = encode(model, "The keeper rowed out to the rocks at dawn.").ids
    short_ids = encode(model, "At dawn.").ids
    result = padding_effect(model, long_ids, short_ids)
    on, off = result["results"]["padding mask on"], result["results"]["padding mask off"]
    assert result["side"] == "left" and result["n_pad"] == len(long_ids) - len(short_ids)
    assert max(on["pad_mass"]) == 0 and min(off["pad_mass"]) > 0
    assert on["max_change"] < 1e-4 < off["max_change"]


def test_the_attention_cap_is_a_setting_of_the_store(tiny_llama):
    from ui.views.attention import attention_view

    services = Services.create(AppSettings(max_attention_tokens=20))

    note, _, head_view, _, _, capture = attention_view(services, tiny_llama, "the lamp at dawn " * 20, 0, "0", False, 0, 0, 8)
    assert "only the first 20 are used (this view's limit" in note
    assert len(head_view.data[0].x) == 20
    assert capture.overview(services.kept).shape[-1] == 20


def test_a_sessions_kept_capture_holds_no_model_and_an_evicted_model_is_freed(tiny_llama, tmp_path):
    import gc
    import pickle
    import weakref

    from tiny_app_model import build_tiny_bert
    from ui.views.attention import attention_view

    store = ModelStore(capacity=1)

    services = Services.create(models=store)
    model = weakref.ref(store.get(tiny_llama))
    _, _, _, _, _, kept = attention_view(services, tiny_llama, "the lamp at dawn", 1, "0", False, 0, 0, 8)
    assert len(pickle.dumps(kept)) < 500  # a key and a ticket: nothing that can keep a model alive
    again = attention_view(services, tiny_llama, "the lamp at dawn", 0, "0", False, 0, 0, 8, previous=kept)
    assert "recomputed" in again[0] and again[-1] == kept  # the other layers came from the server-wide store
    store.get(str(build_tiny_bert(tmp_path / "bert")))  # capacity 1: the llama is evicted
    gc.collect()
    assert model() is None, "an evicted model is still referenced"
    reloaded = attention_view(services, tiny_llama, "the lamp at dawn", 0, "0", False, 0, 0, 8, previous=kept)
    assert "recomputed" in reloaded[0]  # the reloaded model reads the kept overview; no old copy was used


def test_kept_values_stay_within_the_byte_budget_least_recently_used_first():
    kept = KeptStore(budget_bytes=300)
    for session in "abcd":
        assert kept.put(session, ("m", 1), session.upper(), 100)
    assert len(kept) == 3 and kept.nbytes == 300
    assert kept.get("a", ("m", 1)) is None  # the oldest went first
    kept.get("b", ("m", 1))  # b used: c is now the oldest
    kept.put("e", ("m", 1), "E", 100)
    assert kept.get("c", ("m", 1)) is None and kept.get("b", ("m", 1)) == "B"
    assert kept.get("e", ("m", 2)) is None  # another key under the same ticket is not reused
    assert not kept.put("huge", ("m", 1), "H", 301) and kept.get("huge", ("m", 1)) is None
    assert kept.grow("e", ("m", 1), 150)  # e grew to 250: the least recently used (d, then b) make room
    assert kept.nbytes <= 300 and kept.get("e", ("m", 1)) == "E" and len(kept) == 1
    assert not kept.grow("e", ("m", 1), 100)  # past the whole budget: dropped, never kept over it
    assert kept.get("e", ("m", 1)) is None and kept.nbytes == 0
    kept.put("s", ("new",), "N", 10)  # the session's newer value under the same ticket
    assert not kept.grow("s", ("old",), 5) and kept.get("s", ("new",)) == "N"  # an older writer leaves it alone


def test_messages_never_show_absolute_server_paths():
    from core.store import WeightStore

    root = WeightStore.default().root.resolve()
    text = public_text(f"no {root}/gpt2, see {REPO_ROOT}/core/x.py, /tmp/a/b/c.txt, /home/alice, "
                               "https://huggingface.co/a/b, ratio 1/2 and/or, typed: </b> <a/b> /x")
    assert text == ("no weights/gpt2, see core/x.py, …/b/c.txt, …/home/alice, https://huggingface.co/a/b, ratio 1/2 "
                    "and/or, typed: </b> <a/b> /x")


def test_a_folder_that_is_not_a_model_gives_a_clear_message(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be loaded: .*malformed JSON"):
        ModelStore().get(str(tmp_path))


def test_settings_out_of_range_or_not_numbers_are_named_in_the_message():
    assert check_range("Layer", 3.0, 0, 5) == 3
    with pytest.raises(UserError, match="Layer must be between 0 and 5, got 9"):
        check_range("Layer", 9, 0, 5)
    with pytest.raises(UserError, match="Layer is missing"):
        check_range("Layer", None, 0, 5)
    with pytest.raises(UserError, match="Layer must be a number from 0 to 5, got 'two'"):
        check_range("Layer", "two", 0, 5)
    with pytest.raises(UserError, match="Layer must be a whole number from 0 to 5, got 2.5"):
        check_range("Layer", 2.5, 0, 5)
    for bad in (float("nan"), float("inf"), "1e999", "-inf"):
        with pytest.raises(UserError, match=r"Layer must be a number from 0 to 5, got .*must be finite"):
            check_range("Layer", bad, 0, 5)
    with pytest.raises(UserError, match="Layer must be a number from 0 to 5, got a bool"):
        check_range("Layer", True, 0, 5)
    assert check_range("Layer", np.int64(4), 0, 5) == 4 and check_range("Layer", " 2 ", 0, 5) == 2
    with pytest.raises(UserError, match=r"Seed must be between 0 and 9.22e\+18, got 1.84e\+19"):
        check_seed(2**64)
    assert check_seed("") is None and check_seed(2**62) == 2**62
    assert check_float("Top-p", "0.25", 0.0, 1.0, low_open=True) == 0.25
    with pytest.raises(UserError, match=r"Top-p must be in \(0, 1\], got 0"):
        check_float("Top-p", 0, 0.0, 1.0, low_open=True)


def test_an_encoder_decoder_shows_its_encoder_attention_and_says_what_it_cannot_show(tmp_path):
    from ui.views.attention import attention_view
    from ui.views.masks import mask_view
    from ui.views.positions import positional_view

    folder = str(build_tiny_marian(tmp_path / "tiny-marian"))
    store = ModelStore()
    services = Services.create(models=store)
    note, model_view, head_view, _, _, _ = attention_view(services, folder, "The lamp at dawn.", 1, "2", False, 0, 0, 8)
    z = np.asarray(head_view.data[0].z)
    assert z[np.triu_indices(len(z), 1)].max() > 0  # the encoder reads both ways
    assert "encoder's self-attention" in model_view.layout.title.text
    card = model_card("marian", store.get(folder))
    assert "two attention blocks" in card
    assert "Marian: an encoder-decoder translation model family, as in MarianMT" in card  # the word explained
    learned = positional_view(services, folder, 32, 8, 0, 1, 0, 0, "The lamp")[4]
    assert "adds the fixed sinusoids" in learned.layout.annotations[0].text
    refused = mask_view(services, folder, "The lamp at dawn.", 0, 0, 0, 4, "The lamp at dawn.", "Dawn.")
    assert "encoder-decoder" in refused[0] and all(not fig.data for fig in refused[1:7])  # a note, figures empty
    updates = list(stream_generation(store.get(folder), "The lamp", False, 5, 0.0, None, None, 0))
    assert updates[-1].done and updates[-1].n_new >= 1


def test_the_model_card_names_the_config_fields_the_core_did_not_read(tiny_llama, tmp_path, caplog):
    import json
    import logging
    import shutil

    folder = tmp_path / "tiny-llama-newer"
    shutil.copytree(tiny_llama, folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "some_future_flag": True}))
    store = ModelStore()
    with caplog.at_level(logging.WARNING):
        card = model_card("newer", store.get(str(folder)))
    assert "some_future_flag=True is in no field table" in caplog.text
    assert "Not read from config.json:** `some_future_flag`" in card and "llama family" in card
    assert "Not read from config.json" not in model_card("tiny", store.get(tiny_llama))


def test_a_choice_is_checked_by_one_function_that_names_every_choice():
    assert check_choice("Kind", "t5", ("alibi", "t5")) == "t5"
    assert check_choice("Site", "z", {"resid_pre": 0, "z": 1}) == "z"
    with pytest.raises(UserError, match=r"^Kind must be one of alibi, t5, got 'x'\.$"):
        check_choice("Kind", "x", ("alibi", "t5"))
    with pytest.raises(UserError, match=r"^Site must be one of resid_pre, z, got \"\['z'\]\"\.$"):   # unhashable
        check_choice("Site", ["z"], {"resid_pre": 0, "z": 1})
    with pytest.raises(UserError, match=r"^Export must be one of 'head CSV', 'all maps' \(a hint\), got 'x'\.$"):
        check_choice("Export", "x", ("head CSV", "all maps"), " (a hint)")


def test_the_services_one_of_checks_are_the_one_helper():
    from ui.services import attention, heads, patching, positions
    from ui.services.corpus import over

    for module in (attention, heads, patching, positions, over):
        assert module.check_choice is check_choice
    for check, value in ((attention.check_export, "pdf"), (over.check_corpus, "poems"), (over.check_kind, "x"),
                         (positions.check_bias_kind, "sinusoid"), (positions.check_t5_stack, "middle"),
                         (patching.check_site, "nowhere")):
        with pytest.raises(UserError, match="must be one of .*, got "):
            check(value)


HEADS_TEXT = "The keeper lit the lamp. The keeper lit the lamp again at dawn."


def test_heads_are_parsed_as_layer_dot_head_and_bad_ones_are_named():
    assert parse_heads("1.2, 0.3;1.2  0.0", 2, 4) == [(1, 2), (0, 3), (0, 0)]  # in order, repeats dropped
    for text, message in [
        ("", "No heads to ablate"),
        (" , ", "No heads to ablate"),
        ("3.x", "'3.x' is not a head"),
        ("1.2.3", "'1.2.3' is not a head"),
        ("-1.0", "'-1.0' is not a head"),
        ("99.0", "Head 99.0 does not exist: this model has layers 0–1 and heads 0–3"),
        ("1.4", "Head 1.4 does not exist"),
    ]:
        with pytest.raises(UserError, match=message):
            parse_heads(text, 2, 4)


def test_the_heads_cache_keeps_results_for_one_text_and_the_probe_for_one_model(tiny_llama):
    model = ModelStore().get(tiny_llama)
    tokens = encode(model, HEADS_TEXT)
    cache = heads_cache(None, tiny_llama, tokens)
    scores = head_scores(model, cache)
    assert set(scores) == set(score_names(model)) and scores["induction"].shape == (2, 4)
    assert heads_cache(cache, tiny_llama, encode(model, HEADS_TEXT)) is cache
    other = heads_cache(cache, tiny_llama, encode(model, "Another text."))
    assert other is not cache and other.scores is None and other.induction is cache.induction
    assert heads_cache(cache, "another-model", tokens).induction is None


def test_ablation_lists_exactly_the_positions_whose_top_prediction_changed(tiny_llama):
    model = ModelStore().get(tiny_llama)  # this store's own copy: louder heads, so removing them matters
    with torch.no_grad():
        for block in model.stack.blocks:
            block.attn.out.weight.mul_(300)
    tokens = encode(model, HEADS_TEXT)
    chosen = [(0, 0), (0, 1), (1, 2)]
    view = ablation(model, tokens, chosen, "zero")
    ids = as_batch(tokens.ids)
    with torch.inference_mode():
        clean = model(ids).logits[0].argmax(-1)
        ablated = model(ids, ablate_heads=chosen).logits[0].argmax(-1)
    expected = (clean != ablated).nonzero().flatten().tolist()
    assert expected and [row[0] for row in view.changed] == expected
    for position, label, before, after, answer in view.changed:
        assert label == tokens.labels[position] and answer == tokens.labels[position + 1]
        assert (before, after) == tuple(token_texts(model, [clean[position], ablated[position]]))
    assert view.delta.shape == (len(tokens.ids) - 1,) and np.abs(view.delta).max() > 0.01
    assert view.labels == tokens.labels[1:]  # a decoder's loss at t is for token t + 1


def test_an_encoder_with_a_masked_lm_head_is_ablated_on_its_own_tokens(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from tests.tiny import spread_weights
    from tiny_app_model import build_tokenizer
    from ui.views import heads as heads_views

    folder = tmp_path / "tiny-bert-mlm"
    tok = build_tokenizer(folder, bert_style=True)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, pad_token_id=tok.pad_token_id)
    spread_weights(BertForMaskedLM(config), seed=1).save_pretrained(folder)
    store = ModelStore()
    services = Services.create(models=store)
    model = store.get(str(folder))
    note, loss, rows = heads_views.ablation_view(services, str(folder), HEADS_TEXT, "0.0, 1.1, 1.3", "zero")
    n = len(encode(model, HEADS_TEXT).ids)
    assert "masked-LM head" in note and len(loss.data[0].x) == n  # every token, [CLS] included, is scored
    assert loss.data[0].x[0].startswith("0 ")
    assert all(row[4] == row[1] for row in rows)  # the answer is the token at that position
    updates = list(heads_views.sweep_view(services, str(folder), HEADS_TEXT, "mean", "local"))
    assert "Swept 8 heads" in updates[-1][0] and "surprisal" in heads_views.model_note(model)


def test_the_sweep_streams_each_batch_then_the_same_map_as_the_core(tiny_llama):
    from core.analysis import heads

    model = ModelStore().get(tiny_llama)
    ids = encode(model, HEADS_TEXT).ids
    updates = list(stream_sweep(model, ids, "zero", batch=3))
    assert [u.done for u in updates] == [0, 3, 6, 8, 8] and updates[-1].increase is not None
    assert all(u.increase is None for u in updates[:-1])
    expected = heads.ablation_sweep(model, as_batch(ids), "zero")
    np.testing.assert_allclose(updates[-1].increase.numpy(), expected.numpy(), atol=1e-6)


def test_closing_the_sweep_stops_its_worker(tiny_llama):
    model = ModelStore().get(tiny_llama)
    ids = encode(model, HEADS_TEXT).ids
    stream = stream_sweep(model, ids, "mean", batch=1)
    next(stream), next(stream)
    stream.close()
    for thread in threading.enumerate():
        if thread.name == "ablation-sweep":
            thread.join(timeout=10)
            assert not thread.is_alive()


def test_attribution_checks_its_settings_and_the_steps_times_tokens_budget(tiny_llama):
    model = ModelStore().get(tiny_llama)
    cache = heads_cache(None, tiny_llama, encode(model, HEADS_TEXT))
    n = len(cache.tokens.ids)
    result = attribution(model, cache, -1, 1, 2, 4)
    assert result.position == n - 1 and len(result.integrated) == n
    assert attribution(model, cache, n - 1, 1, 2, 4) is result  # the same settings: kept
    for args, message in [
        ((n, 0, 0, 4), f"Position must be between -1 and {n - 1}, got {n}"),
        ((0, 2, 0, 4), "Layer must be between 0 and 1"),
        ((0, 0, 4, 4), "Head must be between 0 and 3"),
        ((0, 0, 0, 0), "Steps must be between 1 and 256"),
        ((0, 0, 0, 10_000), "Steps must be between 1 and 256"),
        ((-1, 0, 0, 256), f"256 steps × {n} tokens .* the limit is 4,096. Use at most {4096 // n} steps"),
    ]:
        with pytest.raises(UserError, match=message):
            attribution(model, cache, *args)
    assert len(attribution(model, cache, 3, 0, 0, 256).integrated) == 4  # position 3 reads 4 tokens


def test_attribution_reads_target_and_foil_as_one_token_each_and_checks_the_baseline(tiny_llama):
    from core.analysis import heads

    model = ModelStore().get(tiny_llama)
    cache = heads_cache(None, tiny_llama, encode(model, HEADS_TEXT))
    the, lit = (model.tokenizer(word, add_special_tokens=False).input_ids for word in (" the", " lit"))
    assert len(the) == len(lit) == 1  # one token each in the tiny tokenizer
    result = attribution(model, cache, 5, 1, 2, 4, " the", " lit", "mean")
    assert (result.target, result.foil, result.baseline) == (the[0], lit[0], "mean")
    expected = heads.attribute(model, as_batch(cache.tokens.ids), 5, 1, 2, 4, target=the[0], foil=lit[0],
                               baseline="mean")
    torch.testing.assert_close(result.integrated, expected.integrated)
    top = attribution(model, cache, 5, 1, 2, 4, "", None, "pad")  # empty boxes: the top token, no foil
    with torch.inference_mode():
        assert top.foil is None and top.target == model(as_batch(cache.tokens.ids)).logits[0, 5].argmax().item()
    for args, message in [
        ((" lamp", "", "pad"), r"Target token must be one token, and ' lamp' splits into 2 here: ' lam' \+ 'p'\. "
                                r".*leave the field empty for the model's top token"),
        (("", " lamp again", "pad"), r"Foil token must be one token, and ' lamp again' splits into 3 here: "
                                     r"' lam' \+ 'p' \+ ' again'.* empty for no foil"),
        (("", "", "ones"), "Baseline must be one of pad, mean, zero, got 'ones'"),
        ((" the", " the", "pad"), "the foil must differ from the target"),
        (("", 3, "pad"), "Foil token must be text typed as one token, got a int"),
    ]:
        with pytest.raises(UserError, match=message):
            attribution(model, cache, 5, 1, 2, 4, *args)


def test_the_completeness_table_measures_each_step_count_within_the_budget(tiny_llama):
    from core.analysis import heads
    from ui.services.heads import COMPLETENESS_STEPS, completeness_table

    model = ModelStore().get(tiny_llama)
    cache = heads_cache(None, tiny_llama, encode(model, f"{HEADS_TEXT} {HEADS_TEXT}"))
    n = len(cache.tokens.ids)
    assert 32 * n <= 4096 < 128 * n  # this text fits 8 and 32 steps, not 128
    result = attribution(model, cache, -1, 0, 0, 4, "", " lit", "pad")
    table = completeness_table(model, cache, result)
    assert [row.steps for row in table] == sorted({4, *COMPLETENESS_STEPS})
    assert table[0].measured.error == pytest.approx(result.completeness_error)  # its own steps, read not rerun
    measured = heads.completeness_by_steps(model, as_batch(cache.tokens.ids), n - 1, (8, 32), result.target,
                                           result.foil, "pad")
    assert [row.measured.error for row in table[1:3]] == pytest.approx([m.error for m in measured])
    assert table[3].measured is None and f"128 steps × {n} tokens" in table[3].skipped
    assert completeness_table(model, cache, result) is table  # kept for the same settings
    short = attribution(model, cache, 3, 0, 0, 4)  # 4 tokens: 128 steps fit
    assert all(row.measured is not None for row in completeness_table(model, cache, short))


def test_the_heads_tab_head_map_is_the_attention_tabs_head_view(tiny_llama):
    from ui.views.attention import attention_view

    store = ModelStore()

    services = Services.create(models=store)
    model = store.get(tiny_llama)
    ids = encode(model, HEADS_TEXT).ids
    _, _, head_view, _, _, _ = attention_view(services, tiny_llama, HEADS_TEXT, 1, "3", False, 0, 0, 8)
    np.testing.assert_allclose(head_map(model, ids, 1, 3), np.asarray(head_view.data[0].z), atol=1e-6)


def test_an_encoder_decoder_gets_its_encoders_scores_and_reasons_for_the_rest(tmp_path):
    from ui.views import heads as heads_views

    folder = str(build_tiny_marian(tmp_path / "tiny-marian"))
    store = ModelStore()
    services = Services.create(models=store)
    model = store.get(folder)
    assert "induction" not in score_names(model)
    note, score_map, table, _, head_view, _ = heads_views.atlas_view(services, folder, HEADS_TEXT, "local", 1, 2)
    assert "encoder's self-attention" in note and np.asarray(score_map.data[0].z).shape == (4, 2)
    z = np.asarray(head_view.data[0].z)
    assert z[np.triu_indices(len(z), 1)].max() > 0  # the encoder reads both ways
    assert "needs a target text" in heads_views.ablation_view(services, folder, HEADS_TEXT, "0.0", "zero")[0]
    assert "encoder-decoder" in heads_views.attribution_view(services, folder, HEADS_TEXT, -1, 0, 0, 4)[0]
    assert "encoder-decoder" in heads_views.lens_view(services, folder, HEADS_TEXT)[0]
    assert "decoder needs a target text" in heads_views.surprisal_view(services, folder, HEADS_TEXT)[0]
    with pytest.raises(UserError, match="induction score is not available"):
        heads_views.atlas_view(services, folder, HEADS_TEXT, "induction", 0, 0)


def test_first_views_compute_each_key_once_even_when_two_sessions_ask_at_once():
    import threading
    import time as clock

    from ui.services.kept import FirstViews

    views, calls = FirstViews(size=2), []

    def compute():
        calls.append(1)
        clock.sleep(0.2)  # the second session asks while the first computes
        return "screen"

    got = []
    threads = [threading.Thread(target=lambda: got.append(views.get(("attention", "m", 1), compute)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert got == ["screen", "screen"] and len(calls) == 1
    views.get(("masks", "m", 1), lambda: "masks")
    views.get(("heads", "m", 1), lambda: "heads")  # the least recently used, attention, is dropped
    assert len(views) == 2 and views.get(("attention", "m", 1), lambda: "again") == "again"
    with pytest.raises(ZeroDivisionError):  # an error is raised, and nothing is kept
        views.get(("bad", "m", 1), lambda: 1 / 0)
    assert views.get(("bad", "m", 1), lambda: "fixed") == "fixed"


def test_the_kv_panel_refuses_an_encoder_in_the_words_of_generate(tmp_path):
    from tiny_app_model import build_tiny_bert
    from ui.services.generation import generation_reason
    from ui.services.generation.kv_cache import check_generator, kv_report

    bert = ModelStore().get(str(build_tiny_bert(tmp_path / "bert")))
    reason = generation_reason(bert)
    assert reason and "is an encoder" in reason
    with pytest.raises(UserError) as refused:
        kv_report(bert, "The keeper lit the lamp.")
    assert str(refused.value) == reason
    with pytest.raises(UserError) as again:
        check_generator(bert)
    assert str(again.value) == reason


def test_the_attention_tabs_checks_are_the_services_own(tiny_llama):
    from ui.services.attention import EXPORTS, all_maps, check_export, text_positions

    model = ModelStore().get(tiny_llama)
    tokens = encode(model, "The keeper lit the lamp.", 64)
    assert [check_export(kind) for kind in EXPORTS] == list(EXPORTS)
    with pytest.raises(UserError, match="Export must be one of 'head CSV'"):
        check_export("all maps .zip")
    assert text_positions(tokens, hide_special=False).tolist() == list(range(len(tokens.ids)))
    special = encode(model, "<|endoftext|>", 64)
    assert all(special.special)
    with pytest.raises(UserError, match="untick 'hide special tokens' to export them"):
        text_positions(special, hide_special=True, what="export them")
    cfg, n = model.config, len(tokens.ids)
    assert all_maps(model, tokens, side=3).shape == (cfg.n_layers, cfg.n_heads, 3, 3)
    full = all_maps(model, tokens, side=n)  # not pooled: every map as the head view draws it
    np.testing.assert_allclose(full[1, 2], head_map(model, tokens.ids, 1, 2), atol=1e-3)


def test_the_page_is_sent_the_first_tokens_each_then_one_update_per_interval(monkeypatch):
    from ui.views import generate as generate_views

    clock = iter(np.arange(0, 100, 0.01))  # a token every 10 ms
    monkeypatch.setattr(generate_views.time, "monotonic", lambda: float(next(clock)))
    sent = list(generate_views.paced(iter(range(200)), every_s=0.1, first=16))
    assert sent[:16] == list(range(16)) and sent[-1] == 199  # the first each, the last always
    gaps = np.diff(sent[15:-1])  # tokens between two updates after the first 16: 0.1 s of them
    assert len(sent) < 40 and (gaps >= 9).all() and (gaps <= 11).all()
    closed = []

    def stream():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    updates = generate_views.paced(stream())
    next(updates)
    updates.close()  # what Stop does to the page's generator
    assert closed == [True], "closing the paced updates must close the model's stream"

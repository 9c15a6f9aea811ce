"""The course's lessons on the block and on the encoder-decoder: each sublayer's share of the residual recomputed
here with forward hooks on SmolLM2's modules (not the core's records), the √d comparison on fresh Lab models, the
Lab's reversing model's cross-attention recomputed from a plain forward pass, and both lessons measured and drawn on
tiny models and on the real encoder minilm-l6."""

import math

import numpy as np
import pytest
import torch
from tiny_app_model import build_tiny_bert, build_tiny_llama, build_tiny_marian

from core import load_model
from core.lab import train as lab
from core.store import check_folder
from ui.services.lab import residual
from ui.services.lab import saved as shipped
from ui.services.learn import block as lessons
from ui.services.learn import reveal
from ui.views.learn.block import FIGURES

BY_NAME = {lesson.name: lesson for lesson in lessons.LESSONS}


def test_the_lessons_and_their_figures_are_named_alike():
    assert list(BY_NAME) == ["block", "encoder-decoder"] and set(FIGURES) == set(BY_NAME)
    assert BY_NAME["block"].question.numeric and BY_NAME["block"].question.unit
    assert lessons.ANTI in BY_NAME["encoder-decoder"].question.choices


def hooked_shares(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per layer of a Pre-LN stack without sandwich norms, the median over tokens of ‖attention's output‖ / ‖the
    block's input‖ and ‖the FFN's output‖ / ‖block input + attention output‖, in %, read with forward hooks."""
    seen: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for i, block in enumerate(model.stack.blocks):
        handles.append(block.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(("in", i), args[0])))
        handles.append(block.attn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(("attn", i), out)))
        handles.append(block.ffn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(("ffn", i), out)))
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]))
    finally:
        for handle in handles:
            handle.remove()
    attn, ffn = [], []
    for i in range(len(model.stack.blocks)):
        x, a, f = (seen[(name, i)][0].float() for name in ("in", "attn", "ffn"))
        attn.append(100 * float((a.norm(dim=-1) / x.norm(dim=-1)).median()))
        ffn.append(100 * float((f.norm(dim=-1) / (x + a).norm(dim=-1)).median()))
    return np.array(attn), np.array(ffn)


def test_the_ffn_share_per_layer_is_what_hooks_on_smollm_read(smollm):
    measured = BY_NAME["block"].measure(smollm, None)
    ids = smollm.tokenizer(lessons.BLOCK_SAMPLE)["input_ids"]
    attn, ffn = hooked_shares(smollm, ids)
    v = measured.values
    assert v["n_tokens"] == len(ids) and len(v["mlp"]) == smollm.config.n_layers
    assert np.allclose(v["mlp"], ffn, rtol=1e-4) and np.allclose(v["attn"], attn, rtol=1e-4)
    assert measured.answer == pytest.approx(ffn[lessons.ASKED_LAYER], rel=1e-4)
    assert f"{measured.answer:,.0f} %" in measured.answer_text and f"{measured.answer:,.0f} %" in measured.alt
    # the sentence on "a correction" says where the share drops below the residual, as measured
    settled = lessons.settled_from(ffn)
    assert all(ffn[settled:] < 100) and (settled == 0 or ffn[settled - 1] >= 100)
    if 0 < settled < len(ffn):
        assert f"from layer {settled} on its share stays at or below {ffn[settled:].max():,.0f} %" in measured.why
    assert measured.link == {"tab": "inside", "layer": lessons.ASKED_LAYER, "text": lessons.BLOCK_SAMPLE,
                             "show": "inside-stage7"}   # the walk's feed-forward stage
    figure = FIGURES["block"](measured)
    assert np.allclose(figure.data[0].y, v["mlp"])
    shown = reveal(BY_NAME["block"], measured, "25")
    assert "Your guess: 25.0 % of the residual" in shown and measured.why in shown


def test_the_sqrt_d_scale_shrinks_a_fresh_pre_ln_models_first_update():
    shares = lessons.initial_shares()
    pairs = lab.examples("reverse", 0, residual.EXAMPLES, True, lab.LabConfig().lengths)
    batch = lab.make_batch(pairs, seq2seq=True)
    real = batch.inputs["attention_mask"].bool()
    for name, scaled in (("with", True), ("without", False)):
        model = lab.build_model(lab.LabConfig(task="reverse", family="marian", norm="pre", embed_scale=scaled)).eval()
        seen = {}
        block = model.encoder.blocks[0]
        block.register_forward_pre_hook(lambda m, args, seen=seen: seen.__setitem__("in", args[0]))
        block.attn.register_forward_hook(lambda m, args, out, seen=seen: seen.__setitem__("attn", out))
        with torch.inference_mode():
            model(**batch.inputs)
        ratio = seen["attn"][real].norm(dim=-1) / seen["in"][real].norm(dim=-1)
        assert shares[name] == pytest.approx(100 * float(ratio.median()), rel=1e-4)
    assert shares["with"] < shares["without"]          # what the lesson's sentence says of them


def test_the_reversing_models_cross_attention_is_read_from_a_plain_pass(smollm):
    folder = lessons.ASSET
    assert check_folder(folder)                       # its manifest matches its files
    assert sum(p.stat().st_size for p in folder.iterdir()) < 400_000
    assert lab.held_out(lessons.SOURCE)                # never trained on
    measured = BY_NAME["encoder-decoder"].measure(smollm, None)
    model = load_model(folder, device="cpu")
    n = len(lessons.SOURCE)
    with torch.inference_mode():
        answer = model.generate(torch.tensor([lab.encode(lessons.SOURCE) + [lab.EOS]]), n + 2)[0, 1:].tolist()
        target = lab.decode(answer)
        out = model(**lab.make_batch([(lessons.SOURCE, target)], seq2seq=True).inputs, capture_attention=True)
    assert target == lessons.SOURCE[::-1]             # it reverses a source it never saw
    weights = out.cross_attentions[-1][0].mean(0)      # [T, S], mean of heads
    anti = float(np.mean([weights[r, n - 1 - r] for r in range(n)]))
    v = measured.values
    assert v["masses"][lessons.ANTI] == pytest.approx(anti, abs=1e-5)
    assert np.allclose(v["weights"], weights.numpy(), atol=1e-5)
    assert measured.answer == lessons.ANTI and anti > 0.5
    assert f"{100 * anti:.0f} %" in measured.answer_text and "no cross-attention" in measured.note
    # the Lab opens this very run (its Run list holds the shipped runs) on the lesson's source
    assert measured.link == {"tab": "lab", "settings": {"lab_run": shipped.REVERSE, "source": lessons.SOURCE},
                             "show": "lab-cross"}
    assert shipped.SAVED_RUNS[shipped.REVERSE] == lessons.ASSET
    assert FIGURES["encoder-decoder"](measured).data


def test_a_missing_lab_model_is_refused_in_words(monkeypatch, tmp_path):
    from ui.services.checks import UserError

    monkeypatch.setattr(lessons, "ASSET", tmp_path)
    lessons.lab_model.cache_clear()
    try:
        with pytest.raises(UserError, match="README.md"):
            lessons.lab_model()
    finally:
        lessons.lab_model.cache_clear()


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn-block")
    return {name: load_model(str(build(root / name)), device="cpu") for name, build in
            (("llama", build_tiny_llama), ("bert", build_tiny_bert), ("marian", build_tiny_marian))}


@pytest.mark.parametrize("kind", ["llama", "bert", "marian"])
def test_both_lessons_measure_and_draw_on_each_kind_of_model(tiny_models, kind):
    model = tiny_models[kind]
    measured = BY_NAME["block"].measure(model, None)
    assert math.isfinite(measured.answer) and len(measured.values["mlp"]) == model.attention_stack()[0].cfg.n_layers
    assert FIGURES["block"](measured).data and measured.why and measured.alt
    crossed = BY_NAME["encoder-decoder"].measure(model, None)
    assert crossed.answer == lessons.ANTI and crossed.note
    assert ("no cross-attention" in crossed.note) == (kind != "marian")


def test_the_real_encoder_gets_both_lessons():
    from core.store import WeightsUnavailable, ensure

    try:
        model = load_model(ensure("minilm-l6"), device="cpu")
    except WeightsUnavailable as error:
        pytest.skip(f"minilm-l6 is not installed here: {error}")
    measured = BY_NAME["block"].measure(model, None)   # Post-LN: the FFN against its own input, norm(x + attn)
    with torch.inference_mode():
        records = model(torch.tensor([model.tokenizer(lessons.BLOCK_SAMPLE)["input_ids"]]),
                        record=["mlp_in", "mlp_out"]).records
    first = records["mlp_out"][0][0].norm(dim=-1) / records["mlp_in"][0][0].norm(dim=-1)
    assert measured.answer == pytest.approx(100 * float(first.median()), rel=1e-4)
    assert "an encoder alone" in BY_NAME["encoder-decoder"].measure(model, None).note


def test_the_block_figure_is_drawn_on_a_scale_that_shows_its_data():
    """The 100 % line is a trace: a shape's y on a log axis is read as log10(y), which stretched the axis to 10^100
    and flattened the data along its bottom."""
    from ui.services.learn import Measured

    values = {"layers": np.arange(3), "mlp": [5.0, 6.0, 30.0], "attn": [20.0, 10.0, 15.0], "n_tokens": 32}
    fig = FIGURES["block"](Measured(answer=5.0, answer_text="", why="", alt="", values=values))
    assert fig.layout.yaxis.type == "log" and not fig.layout.shapes
    reference = next(trace for trace in fig.data if trace.name == "as large as the residual")
    assert list(reference.y) == [100.0, 100.0] and list(reference.x) == [0, 2]
    drawn = [y for trace in fig.data for y in trace.y]
    assert min(drawn) == 5.0 and max(drawn) == 100.0     # the axis autoranges over these, on a log scale

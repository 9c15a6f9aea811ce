"""Gated and differential attention as named terms of the one attention layer, checked against a hand computation
on tiny tensors (no transformers class has either, so no parity test applies); the Lab trains with each attention
choice (softmax, Performer through core.approx, gated, differential) and refuses bad choices in words; the variants
engine's result has its documented keys; docs/lab.md's section is the rendering of the saved run, every figure in it
one of the run's."""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core.config import ConfigError, ModelConfig
from core.lab import train as lab
from core.lab import variants
from core.model import Transformer

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(family="llama", n_layers=2, d_model=16, n_heads=2, d_ff=32, batch=8, eval_examples=6, warmup=2,
            lengths=(2, 4), task="copy-62", lr=3e-3)


def tiny_model(**terms) -> Transformer:
    """A two-layer decoder (RoPE, Pre-LN RMSNorm), d_model 16, 2 heads of 8, every weight drawn N(0, 0.3²)."""
    cfg = replace(lab.model_config(lab.LabConfig(**{k: v for k, v in TINY.items() if k in ("family", "n_layers",
                                                                                          "d_model", "n_heads",
                                                                                          "d_ff")})), **terms)
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3) if p.ndim >= 2 or "lambda" in name else p.normal_(1.0, 0.1)
    return model.eval()


IDS = torch.tensor([[1, 7, 12, 9, 30, 7, 12]])


@pytest.fixture(autouse=True)
def one_thread():
    """These tiny models run fastest on one thread (as the engine's own runs do): threads that wait on each other
    for matrices this small only cost time, the more so on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over keys j ≤ i, written out: exp(s − max) / Σ exp(s − max) on the allowed keys."""
    n = scores.shape[-1]
    allowed = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    s = scores.masked_fill(~allowed, -math.inf)
    e = (s - s.max(-1, keepdim=True).values).exp()
    return e / e.sum(-1, keepdim=True)


def rotate_pairs(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoPE on x [T, d] by hand: the pair (x_i, x_{i + d/2}) at position t turned by t·θ^(−2i/d)."""
    t, d = x.shape
    out = x.clone()
    for pos in range(t):
        for i in range(d // 2):
            angle = pos * theta ** (-2 * i / d)
            a, b = x[pos, i].item(), x[pos, i + d // 2].item()
            out[pos, i] = a * math.cos(angle) - b * math.sin(angle)
            out[pos, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def test_the_gate_is_a_sigmoid_of_the_layer_input_on_each_heads_output_before_w_o():
    model = tiny_model(attn_output_gate=True)
    out = model(IDS, record=("attn_in", "q", "k", "v", "z", "attn_out"))
    rec = out.records
    for layer in range(2):
        attn = model.stack.blocks[layer].attn
        x = rec["attn_in"][layer][0]                                             # [T, d_model]
        gate = torch.sigmoid(x @ attn.gate.weight.T).view(len(x), 2, 8)          # [T, H, d_k]: σ(x·W_g,h)
        for h in range(2):
            q, k, v = rec["q"][layer][0, :, h], rec["k"][layer][0, :, h], rec["v"][layer][0, :, h]
            plain = causal_softmax(q @ k.T / math.sqrt(8)) @ v                    # [T, d_k]
            torch.testing.assert_close(rec["z"][layer][0, :, h], plain * gate[:, h], atol=1e-5, rtol=1e-4)
        # z (gated) through W_O is the layer's output: the gate sits before W_O, inside the head
        torch.testing.assert_close(rec["z"][layer][0].flatten(1) @ attn.out.weight.T, rec["attn_out"][layer][0],
                                   atol=1e-5, rtol=1e-4)
    assert model.stack.blocks[0].attn.gate.weight.shape == (2 * 8, 16)         # [H·d_k, d_model]
    plain = tiny_model()
    assert not torch.allclose(plain(IDS).logits, model(IDS).logits)            # the gate changes the pass


def test_the_differential_map_and_output_match_a_hand_computation():
    model = tiny_model(differential_attention=True)
    out = model(IDS, record=("q_unrotated", "k_unrotated", "q", "v", "pattern", "z"), capture_attention=True)
    rec = out.records
    for layer in range(2):
        attn = model.stack.blocks[layer].attn
        lam_init = 0.8 - 0.6 * math.exp(-0.3 * (layer + 1 - 1))                  # layer counted from 1, as the paper
        lam = (math.exp((attn.lambda_q1 @ attn.lambda_k1).item()) - math.exp((attn.lambda_q2 @ attn.lambda_k2).item())
               + lam_init)
        # heads 0 and 1 form the one differential head: Q₁, K₁ from head 0, Q₂, K₂ from head 1, V both heads' values
        q1, q2 = (rotate_pairs(rec["q_unrotated"][layer][0, :, h]) for h in (0, 1))   # [T, 8], RoPE as any head's
        k1, k2 = (rotate_pairs(rec["k_unrotated"][layer][0, :, h]) for h in (0, 1))
        torch.testing.assert_close(rec["q"][layer][0, :, 1], q2, atol=1e-5, rtol=1e-4)
        a = causal_softmax(q1 @ k1.T / math.sqrt(8)) - lam * causal_softmax(q2 @ k2.T / math.sqrt(8))
        for h in (0, 1):
            torch.testing.assert_close(rec["pattern"][layer][0, h], a, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.attentions[layer][0, h], a, atol=1e-5, rtol=1e-4)
        values = torch.cat([rec["v"][layer][0, :, 0], rec["v"][layer][0, :, 1]], -1)   # [T, 16]: 2·d_k
        o = a @ values
        normed = o / (o.pow(2).mean(-1, keepdim=True) + model.config.norm_eps).sqrt() * attn.diff_norm.weight
        z = (1 - lam_init) * normed                                              # [T, 16]: heads 0 and 1's halves
        torch.testing.assert_close(rec["z"][layer][0].flatten(1), z, atol=1e-5, rtol=1e-4)
        # each row weighs the values by 1 − λ in all, and may weigh a key below 0
        torch.testing.assert_close(a.sum(-1), torch.full((len(a),), 1 - lam), atol=1e-5, rtol=1e-4)
    assert model.stack.blocks[1].attn.differential_lambda(1)[1] == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    # the fused path gives the explicit path's output, and the cached decode step the full pass's
    torch.testing.assert_close(model(IDS).logits, out.logits, atol=1e-5, rtol=1e-4)
    cached = model.generate(IDS[:, :3], 4)                                       # stops after <eos>, if it comes
    ids = IDS[:, :3]
    for _ in range(4):
        ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], 1)
    assert cached.shape[1] > 3 and torch.equal(cached, ids[:, :cached.shape[1]])


def test_the_variants_keep_the_softmax_layers_shapes_and_say_what_they_add():
    count = lambda m: sum(p.numel() for p in m.parameters())                     # noqa: E731
    base = count(tiny_model())
    assert count(tiny_model(attn_output_gate=True)) - base == 2 * (16 * 16)      # W_g [H·d_k, d_model] per layer
    assert count(tiny_model(differential_attention=True)) - base == 2 * (4 * 8 + 16)  # λ's 4 × d_k, gain 2·d_k


@pytest.mark.parametrize("attention", lab.ATTENTIONS)
def test_each_attention_trains_in_the_lab(attention):
    config = lab.LabConfig(**TINY, steps=12, eval_every=12, attention=attention, performer_features=16)
    batch = lab.make_batch(lab.examples("copy-62", 0, 4, True, (4, 4)), seq2seq=False)
    before = lab.build_model(config)(**batch.inputs, approx=lab.lab_approx(config)).logits.detach()
    run = None
    for run, _ in lab.train(config):
        pass
    losses = [p.train_loss for p in run.history]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < sum(losses[:3])
    assert run.final.exact_match is not None and math.isfinite(run.final.held_loss)
    after = run.model(**batch.inputs, approx=lab.lab_approx(config)).logits.detach()
    assert not torch.allclose(before, after)
    maps = lab.lab_attention(run.model, "llama", "ab3", approx=lab.lab_approx(config))
    rows = maps.decoder.sum(-1)
    if attention == "differential":
        assert run.initial_entropy == []                       # a signed map has no entropy
        assert not torch.allclose(rows, torch.ones_like(rows))
    else:
        torch.testing.assert_close(rows, torch.ones_like(rows))
    if attention == "performer":   # the run's own passes go through FAVOR+: its maps are not the exact softmax's
        exact = run.model(**batch.inputs, capture_attention=True).attentions[0]
        ours = run.model(**batch.inputs, capture_attention=True, approx=lab.lab_approx(config)).attentions[0]
        assert (exact - ours).abs().max() > 1e-3
        assert lab.lab_approx(config).budget == {"features": 16, "seed": 0}


@pytest.mark.parametrize("changes,words", [
    (dict(attention="flash"), "attention must be one of softmax, performer, gated, differential"),
    (dict(attention="performer", family="marian"), "family 'llama' only"),
    (dict(attention="performer", family="llama", positions="alibi"), "cannot carry alibi positions"),
    (dict(attention="performer", family="llama", performer_features=0), "performer_features must be a whole number"),
    (dict(attention="performer", family="llama", performer_seed=-1), "performer_seed must be a whole number"),
    (dict(attention="differential", family="llama", d_model=24, n_heads=3), "n_heads must be even; got 3"),
    (dict(attention="differential", family="llama", sinks="key"), "differential attention subtracts two softmaxes"),
])
def test_the_lab_refuses_bad_attention_choices_in_words(changes, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        lab.LabConfig(**changes).check()


def test_the_core_refuses_what_the_terms_cannot_carry():
    cfg = lab.model_config(lab.LabConfig(family="llama"))
    with pytest.raises(ConfigError, match="differential attention has no form here with a sink"):
        replace(cfg, differential_attention=True, attention_sinks="logit")
    with pytest.raises(ConfigError, match="attn_output_gate must be True or False"):
        replace(cfg, attn_output_gate="yes")
    assert isinstance(replace(cfg, attn_output_gate=True), ModelConfig)
    model = tiny_model(differential_attention=True)
    from core.approx import Approx
    with pytest.raises(ValueError, match="a differential-attention head weighs a difference of two"):
        model(IDS, approx=Approx("performer"))
    with pytest.raises(ValueError, match="not saved as a checkpoint"):
        lab.hf_config(lab.LabConfig(family="llama", attention="gated"))


def test_the_engine_result_has_its_documented_keys(tmp_path):
    config = variants.VariantsConfig(seeds=(0,), copy_steps=2, induction_steps=2, features=8, test_examples=3,
                                     circuit_texts=2)
    result = variants.run_all(config, command="python -m core.lab.variants --tiny")
    assert not result.stopped and len(result.runs) == 2 * 4
    raw = json.loads((variants.save(result, tmp_path) / "result.json").read_text(encoding="utf-8"))
    assert set(raw) == {"command", "date", "seconds", "threads", "stopped", "config", "task_runs", "test_lengths",
                        "measures", "thresholds", "summary", "runs"}
    assert set(raw["summary"]) == {"copy", "induction"} and set(raw["summary"]["copy"]) == set(lab.ATTENTIONS)
    for task, by_variant in raw["summary"].items():
        for variant, s in by_variant.items():
            assert set(s) == {"seeds", "exact_match", "accuracy", "sink_max", "sink_share", "seconds", "circuits"}
            run = next(r for r in raw["runs"] if (r["task"], r["variant"]) == (task, variant))
            assert s["seeds"] == 1 and s["exact_match"] == run["exact_match"] and s["accuracy"] == run["accuracy"]
            assert (s["circuits"] is None) == (task == "copy")
    assert raw["thresholds"] == {"epsilon": 0.3, "induction_min": 0.4, "previous_min": 0.5}
    for run in raw["runs"]:
        assert set(run) == {"task", "variant", "seed", "steps", "seconds", "parameters", "train_loss", "held_loss",
                            "exact_match", "accuracy", "exact", "first_token", "sink_max", "sink_share", "circuit",
                            "gate_mean", "lambdas"}
        assert (run["gate_mean"] is not None) == (run["variant"] == "gated")
        assert (run["lambdas"] is not None) == (run["variant"] == "differential")
        assert sorted(run["accuracy"], key=int) == [str(n) for n in config.test_lengths(run["task"])]
        assert all(0 <= v <= 1 for v in [*run["accuracy"].values(), *run["exact"].values(), run["sink_share"]])
        assert len(run["first_token"]) == 2 and len(run["first_token"][0]) == 4
        if run["task"] == "copy":
            assert run["circuit"] is None
        else:
            assert {"found", "previous_token", "induction", "induction_head", "words"} <= set(run["circuit"])
            assert (run["circuit"]["found"] is None) == (run["variant"] == "differential")
    gated = next(r for r in raw["runs"] if r["variant"] == "gated" and r["task"] == "copy")
    softmax = next(r for r in raw["runs"] if r["variant"] == "softmax" and r["task"] == "copy")
    assert gated["parameters"] - softmax["parameters"] == 2 * 32 * 32
    again = variants.load(tmp_path)
    assert again.run("copy", "gated", 0).accuracy == result.run("copy", "gated", 0).accuracy
    text = variants.section(raw)
    assert "| differential | 0 |" in text and not not_in_run(text, raw)


# ---- docs/lab.md's section is the saved run's rendering ----

NUMBER = re.compile(r"(?<![\w])\d+(?:[.,]\d+)*")


def numbers_of(value, found: set[float], words: set[str]) -> None:
    if isinstance(value, dict):
        for v in value.values():
            numbers_of(v, found, words)
    elif isinstance(value, list):
        for v in value:
            numbers_of(v, found, words)
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, (int, float)):
        found.add(float(value))
    elif isinstance(value, str):
        words.update(NUMBER.findall(value))


def not_in_run(text: str, raw: dict) -> list[str]:
    """The numbers of `text` that are no number of the run printed to the same decimals, nor written in its
    strings (the command, the words)."""
    found, words = set(), set()
    numbers_of(raw, found, words)
    printed = {d: {f"{v:.{d}f}" for v in found} | {f"{v:,.{d}f}" for v in found} for d in range(5)}
    missing = []
    for token in NUMBER.findall(text):
        decimals = len(token.rsplit(".", 1)[1]) if "." in token else 0
        if token not in words and token not in printed[decimals]:
            missing.append(token)
    return missing


def saved_section() -> tuple[str, dict]:
    raw = json.loads((ROOT / "assets" / "variants" / "result.json").read_text(encoding="utf-8"))
    text = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- variants start -->\n(.*?)\n<!-- variants end -->", text, re.S)
    assert found, "docs/lab.md has no variants section"
    return found.group(1), raw


def test_the_docs_section_is_the_rendering_of_the_saved_run():
    body, raw = saved_section()
    assert body == variants.section(raw), "run `python -m core.lab.variants --render --out assets/variants`"
    assert raw["threads"] == 1 and raw["command"].startswith("python -m core.lab.variants")


def test_every_figure_in_the_docs_section_is_in_the_saved_run():
    body, raw = saved_section()
    assert len(NUMBER.findall(body)) > 100
    assert not not_in_run(body, raw), not_in_run(body, raw)
    assert not_in_run(body.replace("A head is", "A head at 0.8137 is"), raw) == ["0.8137"]   # the check can fail

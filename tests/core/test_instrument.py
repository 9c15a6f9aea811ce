"""The model as an instrument: machine-independent parameters, per-head weights, recorded internals, head
ablation, the logit lens, gradients, and a decode step that compiles to one graph."""
import copy

import pytest
import torch

from core import load_model
from core.attention import attention
from core.generate import decode_step
from core.layers import rope_cos_sin, rotate
from core.attention import Observer
from tests import tiny

FAMILIES = {
    "gpt2": lambda: tiny.gpt2(),
    "llama-gqa": lambda: tiny.llama(num_key_value_heads=2),
    "qwen2": lambda: tiny.llama("qwen2", num_key_value_heads=2),
    "bert": lambda: tiny.bert(),
    "marian": lambda: tiny.marian(),
}


@pytest.fixture(scope="module")
def pairs():
    """name → (transformers model, its folder, our model on the same weights)"""
    made = {}
    for name, build in FAMILIES.items():
        hf = build()
        folder = tiny.save(hf)
        made[name] = (hf, folder, load_model(folder, device="cpu"))
    return made


def ids(batch=2, n=10, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_state_dict_does_not_depend_on_the_thread_count(pairs):
    _, folder, _ = pairs["llama-gqa"]
    threads = torch.get_num_threads()
    shapes = {}
    try:
        for n in (1, 4):
            torch.set_num_threads(n)
            shapes[n] = {k: tuple(v.shape) for k, v in load_model(folder, device="cpu").state_dict().items()}
    finally:
        torch.set_num_threads(threads)
    assert shapes[1] == shapes[4]
    assert shapes[1]["stack.blocks.0.attn.qkv.weight"] == ((4 + 2 * 2) * 12, 48)   # [out, in], q/k/v rows fused
    assert shapes[1]["stack.blocks.0.attn.out.weight"] == (48, 48)
    assert shapes[1]["stack.embed.tokens.weight"] == (tiny.VOCAB, 48)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_state_dict_loads_into_a_fresh_model(pairs, name):
    _, _, model = pairs[name]
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(model.state_dict())
    x = ids()
    extra = {"decoder_input_ids": ids(seed=1)} if name == "marian" else {}
    torch.testing.assert_close(fresh(x, **extra).hidden_states, model(x, **extra).hidden_states, atol=0, rtol=0)


def rope_for(model, n):
    if model.config.positional != "rope":
        return None
    return rope_cos_sin(torch.arange(n)[None], model.inv_freq, torch.float32)


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "qwen2", "bert"])
def test_head_weights_recombine_into_the_layers_output(pairs, name):
    _, _, model = pairs[name]
    cfg, x = model.config, ids(batch=1)
    out = model(x, record=("attn_in", "q", "k", "z", "attn_out"))
    for layer in range(cfg.n_layers):
        w = model.head_weights(layer)
        assert w.W_Q.shape == (cfg.n_heads, cfg.d_model, cfg.head_dim)
        assert w.W_K.shape == w.W_V.shape == (cfg.n_kv_heads, cfg.d_model, cfg.head_dim)
        assert w.W_O.shape == (cfg.n_heads, cfg.head_dim, cfg.d_model)
        h = out.records["attn_in"][layer]                                      # [1, T, d]
        q, k, v = (torch.einsum("btd,hde->bhte", h, m) for m in (w.W_Q, w.W_K, w.W_V))
        if w.b_Q is not None:
            q, k, v = q + w.b_Q[:, None], k + w.b_K[:, None], v + w.b_V[:, None]
        rope = rope_for(model, x.shape[1])
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        torch.testing.assert_close(q.transpose(1, 2), out.records["q"][layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k.transpose(1, 2), out.records["k"][layer], atol=1e-5, rtol=1e-5)
        z, _ = attention(q, k, v, is_causal=cfg.causal, return_probs=True)      # [1, H, T, d_head]
        torch.testing.assert_close(z.transpose(1, 2), out.records["z"][layer], atol=1e-5, rtol=1e-5)
        recombined = torch.einsum("bhte,hed->btd", z, w.W_O) + (0 if w.b_O is None else w.b_O)
        torch.testing.assert_close(recombined, out.records["attn_out"][layer], atol=1e-5, rtol=1e-5)


def test_head_weights_are_views_of_the_parameters(pairs):
    _, _, model = pairs["llama-gqa"]
    w = model.head_weights(1)
    qkv, o = model.stack.blocks[1].attn.qkv.weight, model.stack.blocks[1].attn.out.weight
    assert w.W_Q.data_ptr() == qkv.data_ptr() and w.W_O.data_ptr() == o.data_ptr()
    torch.testing.assert_close(w.W_Q[2], qkv[2 * 12:3 * 12].t())               # head 2's query rows
    torch.testing.assert_close(w.W_O[3], o[:, 3 * 12:4 * 12].t())              # head 3's columns of W^O
    cross = pairs["marian"][2].head_weights(0, kind="cross")
    assert cross.W_K.shape == (4, 48, 12)
    with pytest.raises(ValueError, match=r"layer 2 is out of range: the model has layers 0\.\.1"):
        model.head_weights(2)
    with pytest.raises(ValueError, match="no 'cross' attention"):
        model.head_weights(0, kind="cross")


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_pre_ln_records_add_up(pairs, name):
    _, _, model = pairs[name]
    out = model(ids(), record=("resid_pre", "attn_out", "mlp_out", "resid_post"))
    r = out.records
    for layer in range(model.config.n_layers):
        torch.testing.assert_close(r["resid_post"][layer], r["resid_pre"][layer] + r["attn_out"][layer]
                                   + r["mlp_out"][layer], atol=1e-5, rtol=1e-5)
        if layer:
            assert torch.equal(r["resid_pre"][layer], r["resid_post"][layer - 1])
    assert set(r) == {"resid_pre", "attn_out", "mlp_out", "resid_post"}


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "bert"])
def test_records_equal_transformers_hidden_states(pairs, name):
    hf, _, model = pairs[name]
    x = ids(batch=1)
    with torch.no_grad():
        ref = hf(input_ids=x, output_hidden_states=True).hidden_states   # embeddings, then each layer's output
    out = model(x, record=("resid_pre", "resid_post"))
    last = model.config.n_layers - 1
    for layer in range(model.config.n_layers):
        torch.testing.assert_close(out.records["resid_pre"][layer], ref[layer], atol=1e-5, rtol=1e-5)
        if layer < last or model.stack.final_norm is None:  # transformers gives the last one after the final norm
            torch.testing.assert_close(out.records["resid_post"][layer], ref[layer + 1], atol=1e-5, rtol=1e-5)


def test_encoder_records_are_prefixed(pairs):
    hf, _, model = pairs["marian"]
    src, dec = ids(batch=1), ids(batch=1, n=5, seed=1)
    out = model(src, decoder_input_ids=dec, record=("encoder.resid_post", "resid_post", "cross_out"))
    with torch.no_grad():
        ref = hf(input_ids=src, decoder_input_ids=dec, output_hidden_states=True)
    for layer in range(2):
        torch.testing.assert_close(out.records["encoder.resid_post"][layer], ref.encoder_hidden_states[layer + 1],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.records["resid_post"][layer], ref.decoder_hidden_states[layer + 1],
                                   atol=1e-5, rtol=1e-5)
    assert out.records["cross_out"][0].shape == (1, 5, 48)
    with pytest.raises(ValueError, match="cannot record nonsense"):
        model(src, record=("nonsense",))


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "bert"])
def test_zero_ablation_equals_zeroing_the_heads_slice_of_W_O(pairs, name):
    _, _, model = pairs[name]
    x, layer, head, d_head = ids(), 1, 2, model.config.head_dim
    ablated = model(x, ablate_heads=[(layer, head)]).logits if model.lm_head else None
    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.stack.blocks[layer].attn.out.weight[:, head * d_head:(head + 1) * d_head] = 0
    expected = edited(x)
    reference = model(x)
    got = model(x, ablate_heads=[(layer, head)])
    torch.testing.assert_close(got.hidden_states, expected.hidden_states, atol=1e-6, rtol=1e-5)
    if ablated is not None:
        torch.testing.assert_close(ablated, expected.logits, atol=1e-6, rtol=1e-5)
    assert (got.hidden_states - reference.hidden_states).abs().max() > 1e-3, "the head's removal should show"


def test_mean_ablation_replaces_the_head_by_its_mean_output(pairs):
    _, _, model = pairs["llama-gqa"]
    x, layer, head = ids(batch=1), 0, 1
    clean = model(x, record=("z", "attn_out"))
    out = model(x, ablate_heads={(layer, head)}, ablation="mean", record=("z", "attn_out"))
    z = clean.records["z"][layer]                                              # [1, T, H, d_head]
    expected_z = z.clone()
    expected_z[:, :, head] = z[:, :, head].mean(1, keepdim=True)
    torch.testing.assert_close(out.records["z"][layer], expected_z, atol=1e-6, rtol=1e-5)
    w = model.head_weights(layer)
    shift = (expected_z - z)[0, :, head] @ w.W_O[head]                         # [T, d]
    torch.testing.assert_close(out.records["attn_out"][layer][0], clean.records["attn_out"][layer][0] + shift,
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="ablation must be"):
        model(x, ablate_heads=[(0, 0)], ablation="noise")
    with pytest.raises(ValueError, match=r"head 9 is out of range: layer 0 has heads 0\.\."):
        model(x, ablate_heads=[(0, 9)])


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "bert", "marian"])
def test_logit_lens_last_layer_equals_the_logits(pairs, name):
    _, _, model = pairs[name]
    x = ids()
    extra = {"decoder_input_ids": ids(seed=1)} if name == "marian" else {}
    out = model(x, logit_lens=True, logit_lens_top_k=5, **extra)
    lens = out.logit_lens
    assert lens.values.shape == (model.config.n_layers, *out.logits.shape[:2], 5)
    top = out.logits.topk(5, dim=-1)
    torch.testing.assert_close(lens.values[-1], top.values, atol=1e-5, rtol=1e-5)
    assert torch.equal(lens.indices[-1], top.indices)
    assert out.records == {}, "the lens reads each layer's output without returning it unasked"
    full = model(x, logit_lens=True, logit_lens_top_k=None, **extra).logit_lens
    torch.testing.assert_close(full.values[-1], out.logits, atol=1e-5, rtol=1e-5)
    assert full.indices is None and not torch.allclose(full.values[0], full.values[-1])


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "bert"])
def test_gradients_reach_the_token_embeddings_as_in_transformers(pairs, name):
    hf, _, model = pairs[name]
    x = ids(batch=1)
    with torch.inference_mode():  # the caller's mode does not stop it
        out = model(x, grad=True)
    target = x[0, -1]
    out.logits[0, -2, target].backward()
    ours = out.token_embeddings.grad
    embeds = hf.get_input_embeddings()(x).detach().requires_grad_(True)
    hf(inputs_embeds=embeds).logits[0, -2, target].backward()
    torch.testing.assert_close(ours, embeds.grad, atol=1e-5, rtol=1e-4)
    assert not any(p.requires_grad for p in model.parameters()), "a loaded model's weights stay frozen"
    attribution = (ours * out.token_embeddings).sum(-1)                        # gradient × input per token
    assert attribution.shape == (1, x.shape[1]) and attribution.abs().sum() > 0


def test_token_embeddings_stand_in_for_the_lookup(pairs):
    _, _, model = pairs["llama-gqa"]
    x = ids(batch=1)
    rows = model.stack.embed.tokens(x)
    torch.testing.assert_close(model(x, token_embeddings=rows).logits, model(x).logits, atol=0, rtol=0)
    assert (model(x, token_embeddings=0.5 * rows).logits - model(x).logits).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "marian"])
def test_decode_step_is_one_graph_without_breaks(pairs, name):
    """The static one-token step never reads a value back to the host: torch.compile sees one graph."""
    _, _, model = pairs[name]
    x, context = ids(n=6), {}
    cache = model.new_cache(2, 16)
    with torch.inference_mode():
        if model.encoder is not None:
            memory = model.run_stack(model.encoder, x, None, kind="encoder", causal=False)
            context = dict(memory=memory, memory_mask=None)
            model.run_stack(model.stack, x[:, :1], None, kind="self", cache=cache, **context)
        else:
            model.run_stack(model.stack, x, None, kind="self", cache=cache)
        explained = torch._dynamo.explain(decode_step)(model, x[:, :1], cache, None, **context)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_recorded_pattern_is_the_captured_attention(pairs):
    _, _, model = pairs["llama-gqa"]
    x = ids()
    out = model(x, record="pattern", capture_attention=True)
    assert len(out.records["pattern"]) == model.config.n_layers
    for recorded, captured in zip(out.records["pattern"], out.attentions):
        assert torch.equal(recorded, captured)
    torch.testing.assert_close(out.records["pattern"][0].sum(-1), torch.ones(2, 4, 10))


class OneLayer(Observer):
    """Wants one layer of one kind; with rows_per_block, gathers the blocks back into the whole map."""

    def __init__(self, kind, layer, rows_per_block=None):
        self.kind, self.layer, self.rows_per_block = kind, layer, rows_per_block
        self.calls, self.blocks = [], []

    def wants(self, kind, layer):
        return (kind, layer) == (self.kind, self.layer)

    def __call__(self, kind, layer, probs, start=0, n=None, first_key=0):
        self.calls.append((kind, layer, start))
        self.blocks.append(torch.nn.functional.pad(probs, (0, (n or probs.shape[-1]) - probs.shape[-1])))


@pytest.mark.parametrize("rows_per_block", [None, 4])
@pytest.mark.parametrize("name, kind", [("llama-gqa", "self"), ("bert", "self"), ("marian", "encoder"),
                                        ("marian", "cross")])
def test_an_observer_sees_only_what_it_wants_and_changes_no_number(pairs, name, kind, rows_per_block):
    _, _, model = pairs[name]
    x = ids(batch=1, n=10)
    extra = {"decoder_input_ids": ids(batch=1, n=6, seed=1)} if name == "marian" else {}
    plain = model(x, capture_attention=True, **extra)
    observer = OneLayer(kind, 1, rows_per_block)
    observed = model(x, observer=observer, **extra)
    assert {(k, layer) for k, layer, _ in observer.calls} == {(kind, 1)}
    reference = {"self": plain.attentions, "encoder": plain.encoder_attentions, "cross": plain.cross_attentions}[kind]
    if rows_per_block:
        assert [start for *_, start in observer.calls] == list(range(0, reference[1].shape[2], rows_per_block))
    torch.testing.assert_close(torch.cat(observer.blocks, dim=2), reference[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(observed.logits if observed.logits is not None else observed.hidden_states,
                               plain.logits if plain.logits is not None else plain.hidden_states, atol=1e-5, rtol=0)


def test_the_base_observer_wants_everything_whole():
    class Seen(Observer):
        def __call__(self, kind, layer, probs, start=0, n=None):
            self.seen = (kind, layer)

    observer = Seen()
    assert observer.wants("cross", 7) and observer.rows_per_block is None
    observer("self", 0, torch.zeros(1, 1, 1, 1))
    assert observer.seen == ("self", 0)
    with pytest.raises(TypeError, match="abstract"):  # an observer must say what it does with the probabilities
        Observer()


def test_two_patches_of_one_activation_compose_in_order(pairs):
    from core.probe import Patch
    _, _, model = pairs["llama-gqa"]
    x, other = ids(batch=1), ids(batch=1, seed=5)
    with torch.inference_mode():
        source = model(other, record="resid_pre").records["resid_pre"][1]            # [1, T, d]
        at = lambda *ps: torch.tensor([p in ps for p in range(10)])[None, :, None]    # noqa: E731
        both = model(x, patches=[Patch("resid_pre", 1, source, at(2)), Patch("resid_pre", 1, source, at(6))])
        one = model(x, patches=[Patch("resid_pre", 1, source, at(2, 6))])
        torch.testing.assert_close(both.logits, one.logits, atol=0, rtol=0)
        # where both apply, the later one is written last
        first, last = Patch("resid_pre", 1, source, at(3)), Patch("resid_pre", 1, torch.zeros_like(source), at(3))
        ordered = model(x, patches=[first, last], record="resid_pre").records["resid_pre"][1]
        assert torch.equal(ordered[0, 3], torch.zeros_like(ordered[0, 3]))
        assert torch.equal(ordered[0, 2], model(x, record="resid_pre").records["resid_pre"][1][0, 2])

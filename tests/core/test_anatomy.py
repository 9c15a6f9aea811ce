"""Inside one forward pass (core/analysis/anatomy.py): every stage is the pass's own record, the score
decomposition adds up to the score in Pre-LN and Post-LN stacks, RoPE's rotation comes off exactly, the queries
and keys share one PCA basis, and on the real SmolLM2 the stages equal transformers' own modules."""
import pytest
import torch
import torch.nn.functional as F

from core import load_model
from core.analysis import anatomy, qk
from core.layers import rotate, sinusoidal_encoding
from core.probe import Probe
from tests import tiny

FAMILIES = {
    "gpt2": lambda: tiny.gpt2(),
    "llama": lambda: tiny.llama(num_key_value_heads=2),
    "bert": lambda: tiny.bert(),
    "marian": lambda: tiny.marian(),
}
RECORDS = anatomy.STAGE_RECORDS


@pytest.fixture(scope="module")
def models():
    return {name: load_model(tiny.save(build()), device="cpu") for name, build in FAMILIES.items()}


@pytest.fixture(params=list(FAMILIES))
def model(request, models):
    return models[request.param]


def text(n=9, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (1, n), generator=torch.Generator().manual_seed(seed))


def pass_records(model, ids):
    """The model's own forward pass: records of the stack that reads the text (without 'encoder.') and its output."""
    prefix = "encoder." if model.encoder is not None else ""
    with torch.inference_mode():
        out = model(ids, record=[prefix + name for name in RECORDS], capture_attention=True)
    records = {name.removeprefix(prefix): value for name, value in out.records.items()}
    attentions = out.encoder_attentions if model.encoder is not None else out.attentions
    return out, records, attentions


def close(ours, theirs, rel=1e-4):
    """ours equals theirs within rel of theirs' largest entry."""
    ours, theirs = ours.float(), theirs.float()
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= rel * theirs.abs().max().item() + 1e-7


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3)])
def test_every_stage_is_what_the_forward_pass_records(model, layer, head):
    ids = text()
    stages = anatomy.forward_stages(model, ids, layer, head)
    out, rec, attentions = pass_records(model, ids)
    kv = head // (model.config.n_heads // model.config.n_kv_heads) if model.encoder is None else head
    assert (stages.kv_head, stages.kind) == (kv, "encoder" if model.encoder is not None else "self")
    assert head in stages.shared_heads
    assert torch.equal(stages.tokens, ids[0])
    for stage, name in (("embeddings", "embed"), ("positions", "pos_embed"), ("token_types", "type_embed")):
        ours = getattr(stages, stage)
        assert (ours is None) == (name not in rec)
        if ours is not None:
            assert torch.equal(ours, rec[name][0][0])
    # that pass takes attention's explicit path in every layer, forward_stages only in its own: float rounding apart
    for name in ("resid_pre", "attn_in", "attn_out", "mlp_in", "mlp_up", "mlp_hidden", "mlp_out", "resid_post"):
        close(getattr(stages, name), rec[name][layer][0], 1e-5)
    assert (stages.mlp_gate is None) == (not model.config.gated_ffn)
    if stages.mlp_gate is not None:
        close(stages.mlp_gate, rec["mlp_gate"][layer][0], 1e-5)
    for name, h in (("q", head), ("k", kv), ("v", kv), ("q_unrotated", head), ("k_unrotated", kv), ("z", head)):
        close(getattr(stages, name), rec[name][layer][0, :, h], 1e-5)
    close(stages.probs, rec["pattern"][layer][0, head], 1e-5)
    close(stages.probs, attentions[layer][0, head], 1e-5)
    final = out.encoder_hidden_states if model.encoder is not None else out.hidden_states
    close(stages.final, final[0], 1e-5)
    if model.encoder is not None or model.lm_head is None:
        assert stages.logits is None
    else:
        with torch.inference_mode():
            close(stages.logits, model(ids).logits[0], 1e-5)


def test_the_stages_fit_together(model):
    """The identities between neighbouring stages, from the weights: the embeddings' sum, the norm's scale, the
    projections, the FFN's hidden stages and its down projection."""
    ids, layer, head = text(), 1, 1
    s = anatomy.forward_stages(model, ids, layer, head)
    stack, kind = model.attention_stack()
    cfg, n = stack.cfg, ids.shape[1]
    assert torch.equal(s.embeddings, stack.embed.tokens.weight[ids[0]] * cfg.embed_scale)
    if cfg.positional == "learned":
        assert torch.equal(s.positions, stack.embed.positions.weight[:n])
    if cfg.positional == "sinusoidal":
        close(s.positions, sinusoidal_encoding(torch.arange(n), cfg.d_model, interleaved=False))
    block = stack.blocks[layer]
    x = s.resid_pre if block.pre_norm else s.resid_pre + s.attn_out      # what the attention norm reads
    if cfg.norm == "rmsnorm":
        expected = torch.rsqrt(x.pow(2).mean(-1) + cfg.norm_eps)
    else:
        expected = torch.rsqrt(x.var(-1, unbiased=False) + cfg.norm_eps)
    close(s.norm_scale, expected, 1e-5)
    w = model.head_weights(layer, kind)
    close(s.q_unrotated, s.attn_in @ w.W_Q[head] + (0 if w.b_Q is None else w.b_Q[head]), 1e-5)
    close(s.k_unrotated, s.attn_in @ w.W_K[s.kv_head] + (0 if w.b_K is None else w.b_K[s.kv_head]), 1e-5)
    close(s.scores, s.q @ s.k.T, 1e-6)
    ffn = block.ffn
    up = F.linear(s.mlp_in, ffn.up.weight, ffn.up.bias)
    if ffn.gated:
        gate, linear = up.chunk(2, dim=-1)
        close(s.mlp_gate, ffn.act(gate), 1e-5)
        close(s.mlp_up, linear, 1e-5)
        close(s.mlp_hidden, s.mlp_gate * s.mlp_up, 1e-6)
    else:
        close(s.mlp_up, up, 1e-5)
        close(s.mlp_hidden, ffn.act(s.mlp_up), 1e-6)
    close(ffn.down(s.mlp_hidden), s.mlp_out, 1e-5)
    if model.encoder is None and model.lm_head is not None:
        close(model.logits(s.final[None])[0], s.logits, 1e-6)


def test_softmax_of_the_scaled_masked_scores_is_the_pattern(model):
    ids = text(11)
    for layer, head in ((0, 2), (1, 0)):
        s = anatomy.forward_stages(model, ids, layer, head)
        assert s.scale == pytest.approx(model.attention_stack()[0].cfg.head_dim ** -0.5)
        masked = (s.scores * s.scale).masked_fill(~s.mask, float("-inf"))   # eq. 2.1: softmax(QKᵀ/√d_k + M)
        close(masked.softmax(-1), s.probs, 1e-5)
        everything = torch.ones(11, 11, dtype=torch.bool)
        causal = model.attention_stack()[0].cfg.causal
        assert torch.equal(s.mask, everything.tril() if causal else everything)


def test_rope_angles_rotate_the_unrotated_queries_and_keys_into_the_used_ones(models):
    s = anatomy.forward_stages(models["llama"], text(), 1, 2)
    emb = torch.cat([s.rope_angles, s.rope_angles], dim=-1)                  # [T, d_head]
    close(rotate(s.q_unrotated, emb.cos(), emb.sin()), s.q, 1e-5)
    close(rotate(s.k_unrotated, emb.cos(), emb.sin()), s.k, 1e-5)
    assert s.shared_heads == (2, 3) and s.kv_head == 1
    for name in ("gpt2", "bert", "marian"):
        other = anatomy.forward_stages(models[name], text(), 1, 2)
        assert other.rope_angles is None and torch.equal(other.q, other.q_unrotated)


PAIRS = [(6, 2), (8, 8), (0, 0), (3, 7)]   # (3, 7): a key the causal mask hides still has a score


@pytest.mark.parametrize("layer", [0, 1])
def test_the_decomposition_adds_up_to_the_score(model, layer):
    ids = text()
    stages = anatomy.forward_stages(model, ids, layer, 3)
    for query, key in PAIRS:
        d = qk.score_decomposition(model, ids, layer, 3, query, key)
        expected = (stages.q[query] @ stages.k[key]).item() * stages.scale
        assert d.score == pytest.approx(expected, rel=1e-5, abs=1e-7)
        assert d.matrix.sum().item() == pytest.approx(d.score, rel=1e-4, abs=1e-6 * d.matrix.abs().sum().item())
        assert d.allowed == (key <= query or not model.attention_stack()[0].cfg.causal)
        assert d.query_labels == d.key_labels and d.matrix.shape == (len(d.query_labels),) * 2
        earlier = [f"L{l} {part}" for l in range(layer) for part in ("attn", "MLP")]
        assert d.query_labels[-1] == "bias" and d.query_labels[-1 - len(earlier):-1] == earlier
        if d.terms is not None:
            assert sum(d.terms.values()) == pytest.approx(d.score, rel=1e-4, abs=1e-6 * d.matrix.abs().sum().item())
    assert (d.terms is not None) == (model.attention_stack()[0].cfg.positional in ("learned", "sinusoidal"))


def test_the_parts_of_the_residual_stream_add_up_to_what_attention_reads(model):
    """The Pre-LN sum and the Post-LN chain of frozen norms both rebuild attn_in at every layer."""
    ids = text()
    stack, _ = model.attention_stack()
    rec, _ = anatomy.recorded(model, ids, anatomy.DECOMPOSITION_RECORDS + ("attn_in",), None)
    at = torch.arange(ids.shape[1])
    for layer in range(len(stack.blocks)):
        labels, parts, bias = anatomy.residual_parts(stack, rec, layer, at)
        assert parts.shape == (len(labels), ids.shape[1], model.config.d_model)
        close(parts.sum(0) + bias, rec["attn_in"][layer], 1e-5)


def test_layer_0_position_term_of_gpt2_is_the_positions_through_the_frozen_norm(models):
    model = models["gpt2"]
    ids, query, key, head = text(), 6, 2, 1
    d = qk.score_decomposition(model, ids, 0, head, query, key)
    s = anatomy.forward_stages(model, ids, 0, head)
    norm, w = model.stack.blocks[0].attn_norm, model.head_weights(0)
    q_pos = norm.frozen(s.resid_pre[query])(s.positions[query]) @ w.W_Q[head]
    k_pos = norm.frozen(s.resid_pre[key])(s.positions[key]) @ w.W_K[head]
    assert d.terms["position·position"] == pytest.approx((q_pos @ k_pos).item() * s.scale, rel=1e-4)


def test_removing_the_rotation_gives_the_score_of_the_unrotated_queries_and_keys(models):
    model, ids, layer, head = models["llama"], text(12), 1, 3
    s = anatomy.forward_stages(model, ids, layer, head)
    for query, key in ((9, 4), (11, 0), (5, 5)):
        d = qk.score_decomposition(model, ids, layer, head, query, key)
        back_q = torch.cat([-s.rope_angles[query], -s.rope_angles[query]])         # undo m·θ_i
        back_k = torch.cat([-s.rope_angles[key], -s.rope_angles[key]])
        q0 = rotate(s.q[query], back_q.cos(), back_q.sin())
        k0 = rotate(s.k[key], back_k.cos(), back_k.sin())
        assert d.unrotated_score == pytest.approx((q0 @ k0).item() * s.scale, rel=1e-4, abs=1e-6)
        assert d.unrotated_score == pytest.approx((s.q_unrotated[query] @ s.k_unrotated[key]).item() * s.scale,
                                                  rel=1e-5, abs=1e-7)
        assert d.pair_scores.shape == (model.config.head_dim // 2,)
        assert d.pair_scores.sum().item() == pytest.approx(d.score, rel=1e-4, abs=1e-6)
        assert d.unrotated_pair_scores.sum().item() == pytest.approx(d.unrotated_score, rel=1e-4, abs=1e-6)
    assert d.terms is None   # RoPE adds no positions part to the residual stream
    gpt2 = qk.score_decomposition(models["gpt2"], ids, 1, 0, 3, 1)
    assert gpt2.unrotated_score is None and gpt2.pair_scores is None


def test_queries_and_keys_share_one_plane_with_the_keys_shifted_onto_the_queries_mean(model):
    """AttentionViz's translation, then one PCA: the keys move by mean(q) − mean(k), so both clouds are centred
    on the union's mean, and the axes are the union's top two, each with its largest-magnitude loading positive."""
    ids = text(10)
    for rotated in (True, False):
        g = anatomy.qk_geometry(model, ids, 1, 2, rotated=rotated)
        s = anatomy.forward_stages(model, ids, 1, 2)
        q, k = (s.q, s.k) if rotated else (s.q_unrotated, s.k_unrotated)
        close(g.shift, q.mean(0) - k.mean(0), 1e-5)
        union = torch.cat([q, k + g.shift])
        centred = union - union.mean(0)
        close(g.mean, q.mean(0), 1e-5)                                              # the union's mean is the queries'
        close(torch.cat([g.queries, g.keys]), centred @ g.components.T, 1e-5)       # one basis for both
        for cloud in (g.queries, g.keys):                                           # each centred on its own mean
            assert cloud.mean(0).abs().max() <= 1e-5 * cloud.abs().max()
        close(g.components @ g.components.T, torch.eye(2), 1e-5)
        eigenvalues, vectors = torch.linalg.eigh(centred.T.double() @ centred.double())
        eigenvalues, vectors = eigenvalues.flip(0), vectors.flip(1)                 # largest first
        close(g.explained, (eigenvalues[:2] / eigenvalues.sum()).float(), 1e-4)
        close(torch.cat([g.queries, g.keys]).pow(2).sum(0), eigenvalues[:2].float(), 1e-4)   # the top-2 scores
        top = vectors[:, :2].T.float()                                              # [2, d_head], sign unfixed
        top = top * top.gather(1, top.abs().argmax(1, keepdim=True)).sign()
        close(g.components, top, 1e-3)                                              # the sign convention
        assert (g.components.gather(1, g.components.abs().argmax(1, keepdim=True)) > 0).all()
        assert g.queries.shape == g.keys.shape == (10, 2) and g.kv_head == s.kv_head


def test_a_probe_keeps_only_the_layers_it_is_asked_for(models):
    model = models["llama"]
    probe = Probe(model.config, {"embed", "resid_pre", "pattern"}, layers={1})
    with torch.inference_mode():
        model.run_stack(model.stack, text(), None, kind="self", probe=probe)
    assert set(probe.records["resid_pre"]) == {1} and set(probe.records["pattern"]) == {1}
    assert set(probe.records["embed"]) == {0}


def test_errors_name_what_is_wrong_and_what_is_right(models):
    model, ids = models["llama"], text()
    with pytest.raises(ValueError, match=r"layer 2 is out of range: the model has layers 0\.\.1"):
        anatomy.forward_stages(model, ids, 2, 0)
    with pytest.raises(ValueError, match=r"head 4 is out of range: layer 0 has heads 0\.\.3"):
        qk.score_decomposition(model, ids, 0, 4, 1, 0)
    with pytest.raises(ValueError, match=r"query position 9 is out of range: the text has positions 0\.\.8"):
        qk.score_decomposition(model, ids, 0, 0, 9, 0)
    with pytest.raises(ValueError, match=r"key position -1 is out of range: the text has positions 0\.\.8"):
        qk.score_decomposition(model, ids, 0, 0, 0, -1)   # negatives are refused, not counted from the end
    with pytest.raises(ValueError, match=r"head -1 is out of range"):
        anatomy.qk_geometry(model, ids, 0, -1)
    with pytest.raises(ValueError, match=r"\[1, T\]"):
        anatomy.qk_geometry(model, torch.cat([ids, ids]), 0, 0)
    with pytest.raises(ValueError, match=r"token ids must lie in 0\.\.96"):
        anatomy.forward_stages(model, ids + 100, 0, 0)
    with pytest.raises(ValueError, match=r"layer must be an int in 0\.\.1"):
        anatomy.forward_stages(model, ids, 1.0, 0)
    with pytest.raises(ValueError, match=r"the encoder has layers 0\.\.1"):
        anatomy.forward_stages(models["marian"], ids, 5, 0)


# ---- the real SmolLM2 against transformers' own modules ----

@pytest.mark.real_weights
def test_smollm2_stages_equal_transformers_modules(smollm_folder, smollm):
    import transformers
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    folder, model = smollm_folder, smollm
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                           dtype=torch.float32).eval()
    ids = torch.tensor([model.tokenizer("The quick brown fox jumps over the lazy dog because it can.").input_ids])
    layer, head = 4, 5
    cfg = model.config
    kv, d_head = head // (cfg.n_heads // cfg.n_kv_heads), cfg.head_dim
    seen = {}
    block = hf.model.layers[layer]

    def output(name):   # a hook that keeps a module's output (returning None leaves the output alone)
        return lambda module, args, out: seen.__setitem__(name, out.detach()[0])

    def inputs(name):
        return lambda module, args, out: seen.__setitem__(name, args[0].detach()[0])

    def attention(module, args, kwargs, out):
        seen.update(attn_in=kwargs["hidden_states"][0], attn_out=out[0][0], rope=kwargs["position_embeddings"])

    hooks = [
        block.self_attn.register_forward_hook(attention, with_kwargs=True),
        block.self_attn.q_proj.register_forward_hook(output("q_proj")),
        block.self_attn.k_proj.register_forward_hook(output("k_proj")),
        block.self_attn.v_proj.register_forward_hook(output("v_proj")),
        block.mlp.register_forward_hook(inputs("mlp_in")),
        block.mlp.register_forward_hook(output("mlp_out")),
        block.mlp.up_proj.register_forward_hook(output("mlp_up")),
        block.mlp.act_fn.register_forward_hook(output("mlp_gate")),
        block.mlp.down_proj.register_forward_hook(inputs("mlp_hidden")),
    ]
    try:
        with torch.inference_mode():
            ref = hf(ids, output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    s = anatomy.forward_stages(model, ids, layer, head)
    for name in ("attn_in", "attn_out", "mlp_in", "mlp_out", "mlp_up", "mlp_gate", "mlp_hidden"):
        close(getattr(s, name), seen[name])
    close(s.resid_pre, ref.hidden_states[layer][0])
    close(s.resid_post, ref.hidden_states[layer + 1][0])
    T = ids.shape[1]
    q = seen["q_proj"].view(T, cfg.n_heads, d_head).transpose(0, 1)[None]       # [1, H, T, d_head]
    k = seen["k_proj"].view(T, cfg.n_kv_heads, d_head).transpose(0, 1)[None]
    close(s.q_unrotated, q[0, head])
    close(s.k_unrotated, k[0, kv])
    close(s.v, seen["v_proj"].view(T, cfg.n_kv_heads, d_head)[:, kv])
    q_rot, k_rot = apply_rotary_pos_emb(q, k, *seen["rope"])
    close(s.q, q_rot[0, head])
    close(s.k, k_rot[0, kv])
    close(s.probs, ref.attentions[layer][0, head])
    close(s.logits, ref.logits[0])
    d = qk.score_decomposition(model, ids, layer, head, T - 1, 3)
    assert d.matrix.sum().item() == pytest.approx(d.score, rel=1e-4, abs=1e-5 * d.matrix.abs().sum().item())
    assert d.query_labels[0] == "embeddings" and len(d.query_labels) == 2 + 2 * layer

"""The Inside walk and the score decomposition (core/analysis/anatomy.py) on every family with named attention terms
(tests/tiny.py): the stages are the layer's own (its mask with the window, its scale, its soft-cap, its score bias,
its partial and per-layer RoPE, its QK-norm) and reproduce transformers' attention weights; a score's parts add up
to the value before the cap, and the cap and the bias are stages of their own that give the model's score."""
import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from core.analysis import anatomy, qk
from core.layers import rotate
from tests import tiny

NAMES = list(tiny.FAMILY_DECODERS) + list(tiny.FAMILY_SEQ2SEQ)
N = 13                                   # every term is live on a text this long (tests/tiny.py)
PAIRS = [(12, 12), (12, 0), (9, 6), (4, 10), (7, 3)]   # (12, 0): outside every window; (4, 10): ahead of a causal query
PROBS_TOL = 1e-5


def text(n=N, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (1, n), generator=torch.Generator().manual_seed(seed))


def transformers_attentions(hf, ids):
    """transformers' eager attention weights of the stack our walk reads: [layers] of [H, T, T]."""
    with torch.no_grad():
        if hf.config.is_encoder_decoder:
            return [a[0] for a in hf.get_encoder()(input_ids=ids, output_attentions=True).attentions]
        return [a[0] for a in hf(input_ids=ids, output_attentions=True).attentions]


def close(ours, theirs, tol):
    worst = (ours.float() - theirs.float()).abs().max().item()
    assert worst <= tol, f"largest difference {worst:.2e} > {tol:.0e}"


@pytest.fixture(scope="module", params=NAMES)
def family(request):
    hf, model = tiny.family_pair(request.param)
    return request.param, hf, model


def expected_scale(name, stack) -> float:
    """The factor on q·k by each family's definition: Gemma 2/3 query_pre_attn_scalar^-½ (24 in tests/tiny.py),
    T5 none, the others 1/√d_k."""
    if name in ("gemma2", "gemma3"):
        return 24 ** -0.5
    return 1.0 if name.startswith("t5") else stack.cfg.head_dim ** -0.5


def expected_mask(stack, layer, n) -> torch.Tensor:
    """From the definition: query i reads key j when j ≤ i (causal stacks) and i − j < w on "sliding" layers."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = (j <= i) if stack.cfg.causal else torch.ones(n, n, dtype=torch.bool)
    if stack.cfg.layer_type(layer) == "sliding" and stack.cfg.sliding_window is not None:
        mask = mask & (i - j < stack.cfg.sliding_window)
    return mask


def test_the_stages_reproduce_the_attention_weights_of_transformers(family):
    """softmax(mask(cap(scores·scale) + bias)) is the pass's pattern and transformers' weights, in every layer
    and head, with the mask, scale and cap each by its family's definition."""
    name, hf, model = family
    ids = text()
    stack, _ = model.attention_stack()
    theirs = transformers_attentions(hf, ids)
    windowed = False
    for layer in range(len(stack.blocks)):
        for head in range(stack.cfg.n_heads):
            s = anatomy.forward_stages(model, ids, layer, head)
            assert s.scale == pytest.approx(expected_scale(name, stack))
            assert torch.equal(s.mask, expected_mask(stack, layer, N))
            windowed |= bool((~s.mask).tril().any())                           # a key hidden behind the query
            scaled = s.scores * s.scale
            if s.softcap is None:
                assert s.capped is None
            else:
                close(s.capped, s.softcap * torch.tanh(scaled / s.softcap), 1e-6)
                assert s.capped.abs().max() < s.softcap
            close(s.scored, (scaled if s.capped is None else s.capped) + (0 if s.bias is None else s.bias), 1e-6)
            probs = s.scored.masked_fill(~s.mask, float("-inf")).softmax(-1)       # eq. 2.1 with every term
            close(probs, s.probs, PROBS_TOL)
            close(probs, theirs[layer][head], PROBS_TOL)
    assert windowed == (stack.cfg.sliding_window is not None and "sliding" in stack.cfg.layer_types)
    assert (s.softcap is not None) == (name == "gemma2")


def test_the_bias_stage_is_the_heads_own_bias(family):
    """ALiBi against transformers' own tensor (m_h·j, which differs from −m_h·(i − j) by a constant per row),
    T5's bucket bias against its first layer's compute_bias; no bias elsewhere."""
    name, hf, model = family
    ids = text()
    stack, _ = model.attention_stack()
    biases = [anatomy.forward_stages(model, ids, 1, head).bias for head in range(stack.cfg.n_heads)]
    if name == "bloom":
        theirs = build_alibi_tensor(torch.ones(1, N), stack.cfg.n_heads, torch.float32)[:, 0]       # [H, T]
        for head, bias in enumerate(biases):
            close(bias - bias[:, :1], theirs[head].expand(N, N), 1e-5)
            close(bias.diagonal(), torch.zeros(N), 0.0)
    elif name.startswith("t5"):
        theirs = hf.encoder.block[0].layer[0].SelfAttention.compute_bias(N, N)[0]                  # [H, T, T]
        for head, bias in enumerate(biases):
            close(bias, theirs[head], 1e-6)
    else:
        assert all(bias is None for bias in biases)


def test_rope_angles_turn_the_rotated_dims_only_with_the_layers_base(family):
    """rope_angles cover the rotated dims (rotary_dim under partial rotary), at the base of the layer's type
    (Gemma 3's sliding layers have their own); the rest of q passes through unrotated. With QK-norm, q_unrotated
    is after the norm: the head's q/k norm of attn_in·W_Q."""
    name, _, model = family
    ids = text()
    stack, kind = model.attention_stack()
    for layer in range(len(stack.blocks)):
        s = anatomy.forward_stages(model, ids, layer, 1)
        if stack.cfg.positional != "rope":
            assert s.rope_angles is None and torch.equal(s.q, s.q_unrotated)
            continue
        dim = stack.cfg.rotary_dim or stack.cfg.head_dim
        base = stack.cfg.rope_theta
        if s.layer_type == "sliding" and stack.cfg.rope_local_theta:
            base = stack.cfg.rope_local_theta
        theta = base ** (-torch.arange(0, dim, 2).double() / dim)                               # θ_i
        r = 2 * len(theta)    # the rotated dims: an odd rotary_dim (3) turns 4, as transformers does
        close(s.rope_angles, (torch.arange(N).double()[:, None] * theta).float(), 1e-5)
        emb = torch.cat([s.rope_angles, s.rope_angles], dim=-1)                                 # [T, r]
        close(rotate(s.q_unrotated, emb.cos(), emb.sin()), s.q, 1e-5)
        if r < stack.cfg.head_dim:
            close(s.q[:, r:], s.q_unrotated[:, r:], 0.0)
        attn = stack.blocks[layer].attn
        if attn.q_norm is not None:
            w = model.head_weights(layer, kind)
            with torch.inference_mode():
                q = s.attn_in @ w.W_Q[1] + (0 if w.b_Q is None else w.b_Q[1])
                close(attn.q_norm(q), s.q_unrotated, 1e-5)
    if name in ("gpt_neox-parallel", "gpt_neox-sequential", "phi3-window"):
        assert s.rope_angles.shape[-1] == (stack.cfg.rotary_dim + 1) // 2 < stack.cfg.head_dim // 2


def test_the_residual_parts_rebuild_what_attention_reads(family):
    """Parallel blocks (x + attn_out + mlp_out), sandwich norms (records after the post norm) and Post-LN OPT:
    the parts, through the frozen norms, add up to attn_in at every layer."""
    _, _, model = family
    ids = text()
    stack, _ = model.attention_stack()
    rec, _ = anatomy.recorded(model, ids, anatomy.DECOMPOSITION_RECORDS + ("attn_in",), None)
    at = torch.arange(N)
    for layer in range(len(stack.blocks)):
        labels, parts, bias = anatomy.residual_parts(stack, rec, layer, at)
        assert len(labels) == parts.shape[0] and ("positions" in labels) == (stack.cfg.positional == "learned")
        scale = rec["attn_in"][layer].abs().max().item()
        close(parts.sum(0) + bias, rec["attn_in"][layer], 1e-5 * scale)


def test_the_parts_add_up_to_the_score_before_the_cap_and_the_bias_is_its_own_part(family):
    """matrix.sum() is the model's q·k·scale; the cap and the bias then give the score the mask reads, and over a
    query's allowed keys those scores are transformers' log-weights up to the row's constant."""
    name, hf, model = family
    ids = text()
    stack, _ = model.attention_stack()
    theirs = transformers_attentions(hf, ids)
    head = 1
    for layer in range(len(stack.blocks)):
        s = anatomy.forward_stages(model, ids, layer, head)
        for query, key in PAIRS:
            d = qk.score_decomposition(model, ids, layer, head, query, key)
            size = d.matrix.abs().sum().item()
            model_score = (s.scores[query, key] * s.scale).item()             # the model's own, before the cap
            assert d.score == pytest.approx(model_score, rel=1e-5, abs=1e-6)
            assert d.matrix.sum().item() == pytest.approx(d.score, rel=1e-4, abs=1e-6 * size)
            assert d.allowed == bool(s.mask[query, key])
            assert (d.capped is None) == (s.capped is None) and d.softcap == s.softcap
            if d.capped is not None:
                assert d.capped == pytest.approx(s.capped[query, key].item(), rel=1e-5, abs=1e-6)
            assert (d.bias_term is None) == (s.bias is None) == (d.bias_label is None)
            if d.bias_term is not None:
                assert d.bias_term == pytest.approx(s.bias[query, key].item(), abs=1e-6)
            assert d.scored == pytest.approx(s.scored[query, key].item(), rel=1e-5, abs=1e-5)
            if d.pair_scores is not None:
                r = 2 * s.rope_angles.shape[-1]                                   # the rotated dims
                assert d.pair_scores.shape == (r // 2 + (r < stack.cfg.head_dim),)
                assert d.pair_scores.sum().item() == pytest.approx(d.score, rel=1e-4, abs=1e-6 * size)
        # a whole row from the decomposition: log-softmax over the allowed keys is transformers' log-weights
        query = N - 1
        keys = torch.nonzero(s.mask[query]).flatten().tolist()
        row = torch.tensor([qk.score_decomposition(model, ids, layer, head, query, k).scored for k in keys])
        close(row.log_softmax(-1), theirs[layer][head, query, keys].log(), 1e-4)
    labels = d.query_labels
    assert labels[-1] == "bias" and ("positions" in labels) == (stack.cfg.positional == "learned")
    if name == "bloom":
        assert d.bias_label == "position bias (ALiBi)"
    if name.startswith("t5"):
        assert d.bias_label == "relative-position bias (T5)" and labels[:1] == ["embeddings"]


@pytest.mark.parametrize("name", ["qwen3", "qwen3-window", "gemma3"])
def test_the_qk_norm_is_frozen_at_the_heads_own_query(name):
    """With QK-norm (Qwen3, Gemma 3) the query parts go through the q norm frozen at this head's query before the
    norm (gain γ or 1 + γ, over d_head): the parts' sum is the model's q_unrotated at that position."""
    _, model = tiny.family_pair(name)
    stack, kind = model.attention_stack()
    attn = stack.blocks[1].attn
    assert attn.q_norm is not None and (attn.q_norm.offset == 1.0) == (name == "gemma3")
    ids, query, key = text(), 9, 4
    rec, _ = anatomy.recorded(model, ids, anatomy.DECOMPOSITION_RECORDS, range(2))
    s = anatomy.forward_stages(model, ids, 1, 2)
    with torch.inference_mode():
        labels, parts, bias = anatomy.residual_parts(stack, rec, 1, torch.tensor([query, key]))
        rows = torch.cat([parts, bias[None]])
        w = model.head_weights(1, kind)
        q_parts = anatomy.projected_parts(stack, w, 1, 2, rows[:, 0], "query")
        k_parts = anatomy.projected_parts(stack, w, 1, s.kv_head, rows[:, 1], "key")
    close(q_parts.sum(0), s.q_unrotated[query], 1e-5)
    close(k_parts.sum(0), s.k_unrotated[key], 1e-5)

"""The information-flow graph against an independent computation written from Ferrando & Voita (2024): every
vector is read from transformers' own modules (hooks on the value projection, the attention block and the MLP),
every importance is computed with plain loops from the paper's definition, and the pruned graph is walked again
by hand. Nothing here calls core.analysis.patching's helpers. Beside GPT-2 and Llama: a parallel GPT-NeoX (one
sum per block: the residual, every head's part and the MLP's output) and Gemma 2 (sandwich norms: each head's
part through the attention's post-norm with its divisor frozen at its input; windows and soft-capped scores)."""
import pytest
import torch

from core import load_model
from core.analysis import patching
from tests import tiny

N = 10


def build(name):
    return {"gpt2": tiny.gpt2, "llama-gqa": lambda: tiny.llama(num_key_value_heads=2)}[name]()


@pytest.fixture(scope="module", params=["gpt2", "llama-gqa", "gpt_neox-parallel", "gemma2"])
def pair(request):
    if request.param in tiny.FAMILY_DECODERS:
        return (request.param, *tiny.family_pair(request.param))
    reference = build(request.param)
    return request.param, reference, load_model(tiny.save(reference), device="cpu")


def neox_vectors(reference, ids):
    """GPT-NeoX with parallel blocks: per layer x, the block's one sum y = x + attention + MLP, the head parts
    and the MLP's output, from transformers' modules."""
    cfg = reference.config
    H, d = cfg.num_attention_heads, cfg.hidden_size
    hd = d // H
    seen, hooks = {}, []
    blocks = reference.gpt_neox.layers
    for l, block in enumerate(blocks):
        hooks.append(block.attention.query_key_value.register_forward_hook(
            lambda m, i, o, l=l: seen.__setitem__(("qkv", l), o)))
        hooks.append(block.attention.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("attn", l), o[0])))
        hooks.append(block.mlp.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("mlp", l), o)))
    with torch.no_grad():
        out = reference(ids, output_hidden_states=True, output_attentions=True)
    for hook in hooks:
        hook.remove()
    layers = []
    for l, block in enumerate(blocks):
        assert block.use_parallel_residual
        x, a = out.hidden_states[l][0], out.attentions[l][0]
        v = seen["qkv", l][0].view(N, H, 3 * hd)[..., 2 * hd:]                    # [T, H, hd]: q, k, v per head
        W = block.attention.dense.weight                                           # [d, H·hd]
        vo = [v[:, h] @ W[:, h * hd:(h + 1) * hd].T for h in range(H)]
        parts = torch.stack([a[h, :, :, None] * vo[h][None] for h in range(H)])   # [H, T, T, d]
        y = x + seen["attn", l][0] + seen["mlp", l][0]
        layers.append(dict(x=x, y_attn=y, parts=parts, mlp=seen["mlp", l][0], parallel=True))
    return layers


def gemma2_vectors(reference, ids):
    """Gemma 2's sandwich blocks: x + post_attn(o_proj(...)) then + post_ffn(mlp(...)). A head's part is
    a_hij·(v_hj W_O^h) through the post-norm read as a linear map at its input u_i = o_proj's output:
    c ↦ c·(1 + γ)/rms(u_i), the map that gives post_attn(u_i) from u_i."""
    cfg = reference.config
    H, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    seen, hooks = {}, []
    blocks = reference.model.layers
    for l, block in enumerate(blocks):
        hooks.append(block.self_attn.v_proj.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("v", l), o)))
        hooks.append(block.self_attn.o_proj.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("u", l), o)))
        hooks.append(block.post_attention_layernorm.register_forward_hook(
            lambda m, i, o, l=l: seen.__setitem__(("attn", l), o)))
        hooks.append(block.post_feedforward_layernorm.register_forward_hook(
            lambda m, i, o, l=l: seen.__setitem__(("mlp", l), o)))
    with torch.no_grad():
        out = reference(ids, output_hidden_states=True, output_attentions=True)
    for hook in hooks:
        hook.remove()
    layers = []
    for l, block in enumerate(blocks):
        x, a = out.hidden_states[l][0], out.attentions[l][0]
        v = seen["v", l][0].view(N, kv, hd)
        W = block.self_attn.o_proj.weight                                          # [d, H·hd]
        u = seen["u", l][0]                                                        # [T, d]
        post = block.post_attention_layernorm
        linear = (1.0 + post.weight) / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + post.eps)   # [T, d]
        vo = [v[:, h // (H // kv)] @ W[:, h * hd:(h + 1) * hd].T for h in range(H)]
        parts = torch.stack([a[h, :, :, None] * vo[h][None] * linear[:, None] for h in range(H)])   # [H, T, T, d]
        layers.append(dict(x=x, y_attn=x + seen["attn", l][0], parts=parts, mlp=seen["mlp", l][0]))
    return layers


def reference_vectors(name, reference, ids):
    """Per layer: x [T, d] the block's input, y_attn [T, d] the sum after attention, parts [H, T(i), T(j), d]
    each head's a_hij·(v_hj W_O^h), mlp [T, d] the MLP's output; all from transformers' modules."""
    if name == "gpt_neox-parallel":
        return neox_vectors(reference, ids)
    if name == "gemma2":
        return gemma2_vectors(reference, ids)
    cfg = reference.config
    blocks = reference.transformer.h if name == "gpt2" else reference.model.layers
    d = cfg.hidden_size
    H = cfg.num_attention_heads
    hd = d // H
    seen = {}
    hooks = []
    for l, block in enumerate(blocks):
        attn = block.attn if name == "gpt2" else block.self_attn
        value = attn.c_attn if name == "gpt2" else attn.v_proj
        hooks.append(value.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("v", l), o)))
        hooks.append(attn.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("attn", l), o[0])))
        hooks.append(block.mlp.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(("mlp", l), o)))
    with torch.no_grad():
        out = reference(ids, output_hidden_states=True, output_attentions=True)
    for hook in hooks:
        hook.remove()
    layers = []
    for l, block in enumerate(blocks):
        x = out.hidden_states[l][0]
        a = out.attentions[l][0]                                                  # [H, T, T]
        if name == "gpt2":
            v = seen["v", l][0][:, 2 * d:].view(N, H, hd)                         # [T, H, hd]
            W_O = [block.attn.c_proj.weight[h * hd:(h + 1) * hd, :] for h in range(H)]   # Conv1D: [in, out]
            vo = [v[:, h] @ W_O[h] for h in range(H)]
        else:
            kv = cfg.num_key_value_heads
            v = seen["v", l][0].view(N, kv, hd)
            W = block.self_attn.o_proj.weight                                      # [d, H·hd]
            vo = [v[:, h // (H // kv)] @ W[:, h * hd:(h + 1) * hd].T for h in range(H)]
        parts = torch.stack([a[h, :, :, None] * vo[h][None] for h in range(H)])   # [H, T, T, d]
        layers.append(dict(x=x, y_attn=x + seen["attn", l][0], parts=parts, mlp=seen["mlp", l][0]))
    return layers


def prox(part, total):
    """Ferrando & Voita's proximity: max(‖y‖₁ − ‖y − c‖₁, 0)."""
    return max(total.abs().sum().item() - (total - part).abs().sum().item(), 0.0)


def paper_importances(layers):
    """Normalised importances by the definition: attention edges j → i summed over heads; residuals; MLPs.
    A parallel block is one sum: the residual, every (head, source) and the MLP are its parts, and the level
    after it is the same state (mlp_res 1)."""
    out = []
    for layer in layers:
        H = layer["parts"].shape[0]
        tokens, heads = torch.zeros(N, N), torch.zeros(H, N, N)
        attn_res, mlp, mlp_res = torch.zeros(N), torch.zeros(N), torch.zeros(N)
        for i in range(N):
            y = layer["y_attn"][i]
            raw = {(h, j): prox(layer["parts"][h, i, j], y) for h in range(H) for j in range(N)}
            residual = prox(layer["x"][i], y)
            total = residual + sum(raw.values())            # the output bias is in y but is not a part
            if layer.get("parallel"):
                p_mlp = prox(layer["mlp"][i], y)
                total += p_mlp
                mlp[i], mlp_res[i] = p_mlp / total, 1.0
            for (h, j), value in raw.items():
                heads[h, i, j] = value / total
                tokens[i, j] += value / total
            attn_res[i] = residual / total
            if layer.get("parallel"):
                continue
            mid, f = layer["y_attn"][i], layer["mlp"][i]
            p_mid, p_mlp = prox(mid, mid + f), prox(f, mid + f)
            mlp[i], mlp_res[i] = p_mlp / (p_mid + p_mlp), p_mid / (p_mid + p_mlp)
        out.append(dict(tokens=tokens, heads=heads, attn_res=attn_res, mlp=mlp, mlp_res=mlp_res,
                        parallel=bool(layer.get("parallel"))))
    return out


def paper_walk(imp, position, tau):
    """The kept edges (kind, layer, source, target, level), walking down from the prediction."""
    kept, frontier = set(), {position}
    for level in range(2 * len(imp), 0, -1):
        layer, below = imp[(level - 1) // 2], set()
        l = (level - 1) // 2
        for t in frontier:
            if level % 2:
                if layer["attn_res"][t] >= tau:
                    kept.add(("residual", l, t, t, level)), below.add(t)
                for j in range(N):
                    if layer["tokens"][t, j] >= tau:
                        kept.add(("attention", l, j, t, level)), below.add(j)
                if layer["parallel"] and layer["mlp"][t] >= tau:    # the block's MLP reads its input
                    kept.add(("mlp", l, t, t, level)), below.add(t)
            elif layer["parallel"]:                                # the block's output again
                kept.add(("residual", l, t, t, level)), below.add(t)
            else:
                if layer["mlp_res"][t] >= tau:
                    kept.add(("residual", l, t, t, level)), below.add(t)
                if layer["mlp"][t] >= tau:
                    kept.add(("mlp", l, t, t, level)), below.add(t)
        frontier = below
    return kept


def test_flow_graph_equals_the_papers_definition_computed_on_transformers(pair):
    name, reference, model = pair
    ids = torch.randint(3, tiny.VOCAB, (1, N), generator=torch.Generator().manual_seed(1))
    imp = paper_importances(reference_vectors(name, reference, ids))
    graph = patching.flow_graph(model, ids, threshold=0.0)
    for l, layer in enumerate(imp):
        torch.testing.assert_close(graph.tokens[l], layer["tokens"], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(graph.heads[l], layer["heads"], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(graph.attn_residual[l], layer["attn_res"], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(graph.mlp[l], layer["mlp"], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(graph.mlp_residual[l], layer["mlp_res"], atol=2e-5, rtol=1e-4)
    for tau in (0.02, 0.04, 0.1, 0.3):
        kept = graph.pruned(tau)
        mine = {(e.kind, e.layer, e.source, e.target, e.level) for e in kept.edges}
        # importances this close to tau could fall either side of it by rounding alone
        near = any(abs(v - tau) < 1e-4 for layer in imp for key in ("tokens", "attn_res", "mlp", "mlp_res")
                   for v in layer[key].flatten().tolist())
        if not near:
            assert mine == paper_walk(imp, N - 1, tau), tau
        assert all(e.importance >= tau for e in kept.edges)


def test_an_attention_edge_adds_its_heads_and_lists_them_strongest_first(pair):
    _, _, model = pair
    ids = torch.randint(3, tiny.VOCAB, (1, N), generator=torch.Generator().manual_seed(2))
    graph = patching.flow_graph(model, ids, threshold=0.0)
    # the importances of one sum's parts add up to 1: the residual and every (head, source) part (and the MLP's in
    # a parallel block)
    mlp = graph.mlp if graph.parallel else 0
    torch.testing.assert_close(graph.tokens.sum(-1) + graph.attn_residual + mlp, torch.ones(model.config.n_layers, N))
    kept = graph.pruned(0.05)
    attention = [e for e in kept.edges if e.kind == "attention"]
    assert attention, "a 10-token graph at 0.05 keeps some attention edge"
    for e in attention:
        parts = [p for _, p in e.heads]
        assert parts == sorted(parts, reverse=True) and all(p > 0 for p in parts)
        assert e.head == e.heads[0][0]
        assert sum(parts) == pytest.approx(e.importance, rel=1e-5, abs=1e-7)
        assert e.importance == pytest.approx(graph.tokens[e.layer, e.target, e.source].item())


def test_a_higher_threshold_keeps_a_subset_reachable_from_the_prediction(pair):
    _, _, model = pair
    ids = torch.randint(3, tiny.VOCAB, (1, N), generator=torch.Generator().manual_seed(3))
    graph = patching.flow_graph(model, ids, threshold=0.0)
    previous = None
    for tau in (0.01, 0.05, 0.1, 0.3):
        kept = graph.pruned(tau)
        edges = {(e.kind, e.layer, e.source, e.target, e.level) for e in kept.edges}
        if previous is not None:
            assert edges <= previous
        previous = edges
        top = 2 * model.config.n_layers
        sources = {(e.level - 1, e.source) for e in kept.edges} | {(top, N - 1)}
        assert all((e.level, e.target) in sources for e in kept.edges)


@pytest.mark.real_weights
def test_on_smollm2_routes_spread_over_heads_are_kept(smollm):
    """On a real model many token edges reach τ only as a sum over heads: thresholding each head alone dropped
    them (78 % of the token edges kept on this sentence when it was written)."""
    text = "The old lighthouse keeper climbed the stairs every night to light the lamp for the ships."
    ids = smollm.tokenizer(text, return_tensors="pt").input_ids
    graph = patching.flow_graph(smollm, ids, threshold=0.04)
    attention = [e for e in graph.edges if e.kind == "attention"]
    spread = [e for e in attention if e.heads[0][1] < 0.04]
    assert len(spread) >= len(attention) // 4, (len(spread), len(attention))
    assert all(e.importance >= 0.04 for e in spread)

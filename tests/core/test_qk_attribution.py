"""Why a head attends where it does (core/analysis/qk.py): a score split into query-side × key-side parts down to
single upstream heads adds up to the model's score, and its relative form to score(i, j) − Σ_k a_ik·score(i, k),
on every family the core loads (tests/tiny.py; a seq2seq model's self-attention is its encoder's, the stack the
core's analyses read); the heads of a layer add up to its layer part, which is score_decomposition's; a key-side
part equals one computed by hand from head_weights and the recorded z; the flow graph's edges read through the
transposed maps give the same sides as the explicit split; the weights-only composition scores equal a dense
hand computation; bad input is refused in words."""
import math

import pytest
import torch

from core import load_model
from core.analysis import anatomy, patching, qk
from core.layers import rotate
from tests import tiny

BASIC = {"gpt2": lambda: tiny.gpt2(), "llama": lambda: tiny.llama(num_key_value_heads=2),
         "bert": lambda: tiny.bert(), "marian": lambda: tiny.marian()}
NAMES = list(BASIC) + list(tiny.FAMILY_DECODERS) + list(tiny.FAMILY_SEQ2SEQ)
N = 13
PAIRS = [(9, 6), (4, 10)]     # (4, 10): ahead of a causal query, masked there
_LOADED: dict = {}


def load(name):
    if name in BASIC:
        if name not in _LOADED:
            _LOADED[name] = load_model(tiny.save(BASIC[name]()), device="cpu", dtype=torch.float32)
        return _LOADED[name]
    return tiny.family_pair(name)[1]


def text(n=N, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (1, n), generator=torch.Generator().manual_seed(seed))


def adds_up(matrix, value, rel=1e-4):
    size = matrix.abs().sum().item()
    assert matrix.sum().item() == pytest.approx(value, rel=rel, abs=1e-6 * size + 1e-7)


def by_layer(labels):
    """Each head's label ("L3 H5", "L3 attn bias") → its layer's ("L3 attn"); the others as they are."""
    return [f"{label.split()[0]} attn" if label.split()[-1].startswith("H") or label.endswith("attn bias") else label
            for label in labels]


def grouped(result, layer_labels):
    """result.matrix summed into the layer labels on both sides."""
    index = {label: i for i, label in enumerate(layer_labels)}
    rows = torch.zeros(len(result.query_labels), len(layer_labels))
    for i, label in enumerate(by_layer(result.query_labels)):
        rows[i, index[label]] = 1.0
    return rows.T @ result.matrix @ rows


@pytest.fixture(scope="module", params=NAMES)
def family(request):
    return request.param, load(request.param)


def test_the_parts_add_up_to_the_score_and_the_heads_to_their_layer(family):
    """by="head" and by="layer" add up to the model's q·k·scale (relative: to score(i, j) − Σ_k a_ik·score(i, k)),
    the head parts of each layer add up to that layer's part, and by="layer" is score_decomposition itself;
    the relative scored value is log a_ij − Σ_k a_ik·log a_ik, what softmax reads."""
    name, model = family
    stack, _ = model.attention_stack()
    layer, head, ids = len(stack.blocks) - 1, 1, text()
    s = anatomy.forward_stages(model, ids, layer, head)
    raw = s.scores * s.scale                                                            # [T, T] before the cap
    for query, key in PAIRS:
        d = qk.score_decomposition(model, ids, layer, head, query, key)
        for relative in (False, True):
            heads = qk.qk_attribution(model, ids, layer, head, query, key, by="head", relative=relative)
            layers = qk.qk_attribution(model, ids, layer, head, query, key, by="layer", relative=relative)
            expected = raw[query, key] - (s.probs[query] * raw[query]).sum() if relative else raw[query, key]
            for r in (heads, layers):
                assert r.score == pytest.approx(expected.item(), rel=1e-4, abs=1e-5)
                adds_up(r.matrix, r.score)
                assert r.relative is relative and r.scored == pytest.approx(d.scored, rel=1e-4, abs=1e-5)
            assert layers.query_labels == d.query_labels and heads.query_labels[-1] == "bias"
            assert any(label.endswith(" H0") for label in heads.query_labels) == (layer > 0)
            size = heads.matrix.abs().sum().item()
            worst = (grouped(heads, layers.query_labels) - layers.matrix).abs().max().item()
            assert worst <= 1e-5 * size, f"{name}: heads differ from their layer's part by {worst:.2e}"
            if not relative:
                assert (layers.matrix - d.matrix).abs().max().item() <= 1e-5 * size
            elif s.probs[query, key] > 0:
                a = s.probs[query][s.probs[query] > 0]
                softmax_reads = torch.log(s.probs[query, key]) - (a * a.log()).sum()
                assert heads.relative_scored == pytest.approx(softmax_reads.item(), rel=1e-4, abs=1e-4)
                assert heads.pair_score == pytest.approx(d.score, rel=1e-4, abs=1e-6)


def rms_or_layer_norm(norm, x, c):
    """The norm at x applied to c with its scale frozen, written out: γ·c/rms(x) or γ·(c − mean c)/σ(x)."""
    if norm.kind == "rmsnorm":
        return norm.gain.float() * c / torch.sqrt(x.pow(2).mean() + norm.eps)
    return norm.gain.float() * (c - c.mean()) / torch.sqrt(x.var(unbiased=False) + norm.eps)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_key_side_part_by_hand_from_head_weights_and_the_recorded_z(name):
    """Upstream head h' of layer 0 at key position k: z_{h'}(k)·W_O[h'], through layer 1's attention norm frozen
    at resid_pre, through W_K (no bias: that is the bias part), rotated at k (Llama's RoPE), dotted with the
    recorded query: its key-side part, plain and relative (Σ_k (δ_jk − a_ik)·that)."""
    model = load(name)
    stack, _ = model.attention_stack()
    ids, layer, head, query, key, upstream = text(), 1, 3, 9, 6, 2
    kv = stack.cfg.kv_head(head)
    rec, _ = anatomy.recorded(model, ids, qk.QK_RECORDS, range(2))
    s = anatomy.forward_stages(model, ids, layer, head)
    w0, w1, norm = model.head_weights(0), model.head_weights(1), stack.blocks[1].attn_norm

    def key_part(k):
        with torch.no_grad():
            out = rec["z"][0][k, upstream].float() @ w0.W_O[upstream].float()                   # [d]
            part = rms_or_layer_norm(norm, rec["resid_pre"][1][k].float(), out) @ w1.W_K[kv].float()
            if s.rope_angles is not None:
                emb = torch.cat([s.rope_angles[k], s.rope_angles[k]])
                part = rotate(part, emb.cos(), emb.sin())
            return (s.q[query] @ part).item() * s.scale

    label = f"L0 H{upstream}"
    plain = qk.qk_attribution(model, ids, layer, head, query, key)
    assert plain.key_side[plain.key_labels.index(label)].item() == pytest.approx(key_part(key), rel=1e-4, abs=1e-6)
    relative = qk.qk_attribution(model, ids, layer, head, query, key, relative=True)
    by_hand = key_part(key) - sum(s.probs[query, k].item() * key_part(k) for k in range(query + 1))
    assert relative.key_side[relative.key_labels.index(label)].item() == pytest.approx(by_hand, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("name", ["llama", "gpt2", "gpt_neox-parallel", "bloom", "qwen3", "gemma2", "gemma3"])
def test_each_kept_edge_gives_its_heads_sides_as_the_explicit_split_does(name):
    """edge_attribution reads the sides through the transposed maps (no part projected): every side equals
    qk_attribution(relative=True)'s row and column sums, the heads come strongest first, and with top parts
    named the rest is summed so each side still adds up to the relative score."""
    model = load(name)
    ids = text()
    graph = patching.flow_graph(model, ids, threshold=0.02)
    edges = [e for e in qk.attention_edges(graph) if e.layer > 0][:3]
    assert edges, "the graph keeps no attention edge above layer 0"
    for e in edges:
        found = qk.edge_attribution(model, ids, graph, e.layer, e.target, e.source, top=1000)
        assert [h.head for h in found.heads] == [h for h, _ in e.heads] and found.importance == e.importance
        for reason in found.heads:
            r = qk.qk_attribution(model, ids, e.layer, reason.head, e.target, e.source, relative=True)
            size = r.matrix.abs().sum().item() + 1e-6
            assert reason.score == pytest.approx(r.score, rel=1e-4, abs=1e-6 * size)
            for parts, side, labels in ((reason.query_parts, r.query_side, r.query_labels),
                                        (reason.key_parts, r.key_side, r.key_labels)):
                ours = dict(parts)
                assert len(ours) == len(labels)
                worst = max(abs(ours[label] - side[i].item()) for i, label in enumerate(labels))
                assert worst <= 1e-5 * size
            assert (reason.unrotated is None) == (r.unrotated_score is None)   # RoPE only
            if reason.unrotated is not None:   # Σ_k (δ_jk − a_ik)·q_u·k_u·scale from the model's own records
                rec = model(ids, record={"q_unrotated", "k_unrotated"}, capture_attention=True)
                kv = reason.head // (model.config.n_heads // model.config.n_kv_heads)
                q_u = rec.records["q_unrotated"][e.layer][0, e.target, reason.head].float()
                k_u = rec.records["k_unrotated"][e.layer][0, :, kv].float()
                c = -rec.attentions[e.layer][0, reason.head, e.target].float()
                c[e.source] += 1
                by_hand = (c * (k_u @ q_u)).sum().item() * model.config.score_scale
                assert reason.unrotated == pytest.approx(by_hand, rel=1e-4, abs=1e-6 * size)
        short = qk.edge_attribution(model, ids, graph, e.layer, e.target, e.source, top=3).heads[0]
        for parts in (short.query_parts, short.key_parts):
            assert len(parts) == 4 and parts[-1][0] == "rest"
            assert abs(parts[0][1]) >= abs(parts[1][1]) >= abs(parts[2][1])
            assert sum(v for _, v in parts) == pytest.approx(short.score, rel=1e-4, abs=1e-5)
    every = qk.graph_attribution(model, ids, graph, top=2)
    assert len(every) == len(qk.attention_edges(graph))


def dense_scores(model, layer, head):
    """Elhage et al.'s Q-, K-, V-composition from the [d, d] matrices, row-vector form, gains folded as
    CompositionScores says."""
    stack, _ = model.attention_stack()
    group = stack.cfg.n_heads // stack.cfg.n_kv_heads

    def ov(l, h):
        w, block = model.head_weights(l), stack.blocks[l]
        post = 1.0 if block.attn_post_norm is None else block.attn_post_norm.gain.float()
        return torch.diag(block.attn_norm.gain.float()) @ w.W_V[h // group].float() @ (w.W_O[h].float() * post)

    w, gain = model.head_weights(layer), torch.diag(stack.blocks[layer].attn_norm.gain.float())
    qk_matrix = gain @ w.W_Q[head].float() @ w.W_K[head // group].float().T @ gain
    mine = ov(layer, head)
    found = torch.zeros(3, layer, stack.cfg.n_heads)
    for l in range(layer):
        for h in range(stack.cfg.n_heads):
            theirs = ov(l, h)
            found[0, l, h] = (theirs @ qk_matrix).norm() / (theirs.norm() * qk_matrix.norm())
            found[1, l, h] = (qk_matrix @ theirs.T).norm() / (theirs.norm() * qk_matrix.norm())
            found[2, l, h] = (theirs @ mine).norm() / (theirs.norm() * mine.norm())
    return found


@pytest.mark.parametrize("name", ["llama", "gpt2", "gemma2"])
def test_the_composition_scores_are_the_dense_computation(name):
    model = load(name)
    layer = len(model.stack.blocks) - 1
    with torch.no_grad():
        expected = dense_scores(model, layer, 1)
    scores = qk.composition_scores(model, layer, 1)
    for i, found in enumerate((scores.q, scores.k, scores.v)):
        assert found.shape == (layer, model.config.n_heads)
        assert torch.allclose(found, expected[i], rtol=1e-4, atol=1e-6)
        assert ((found > 0) & (found <= 1)).all()


def test_composition_over_is_the_pairs_relative_split_summed_per_text():
    """One text's share of each key-side component is Σ_p a_p·key_side_p / Σ_p a_p·score_p over its chosen
    pairs, from qk_attribution on each pair; the shares of a text add up to 1; the mean is over the texts."""
    model = load("llama")
    texts = [text(seed=s)[0] for s in range(3)]
    layer, head = 1, 2
    over = qk.composition_over(model, texts, layer, head, side="key", pairs=4)
    assert over.shares.per_item.shape == (3, len(over.labels)) and over.shares.n == 3
    assert torch.allclose(over.shares.per_item.sum(-1), torch.ones(3), atol=1e-4)
    assert torch.allclose(over.shares.mean, over.shares.per_item.mean(0), atol=1e-6)
    assert over.weights.k.shape == (layer, model.config.n_heads) and "after key 0" in over.pairs
    pattern = anatomy.forward_stages(model, texts[0][None], layer, head).probs
    chosen = qk.chosen_pairs(pattern, 4, first=False)
    assert len(chosen) == 4 and all(key > 0 for _, key in chosen)
    total, score = 0.0, 0.0
    for query, key in chosen:
        r = qk.qk_attribution(model, texts[0][None], layer, head, query, key, relative=True)
        assert r.key_labels == over.labels
        total = total + pattern[query, key] * r.key_side
        score += pattern[query, key].item() * r.score
    assert torch.allclose(over.shares.per_item[0], total / score, rtol=1e-3, atol=1e-4)
    queries = qk.composition_over(model, texts, layer, head, side="query", pairs=4)
    assert torch.allclose(queries.shares.per_item.sum(-1), torch.ones(3), atol=1e-4)


def test_bad_input_is_refused_in_words():
    model = load("llama")
    ids = text()
    with pytest.raises(ValueError, match="by must be one of"):
        qk.qk_attribution(model, ids, 1, 0, 5, 3, by="neuron")
    with pytest.raises(ValueError, match="relative must be True or False"):
        qk.qk_attribution(model, ids, 1, 0, 5, 3, relative="yes")
    with pytest.raises(ValueError, match="key position 40 is out of range"):
        qk.qk_attribution(model, ids, 1, 0, 5, 40)
    with pytest.raises(ValueError, match="ids is empty: one text needs at least one token"):
        qk.qk_attribution(model, torch.zeros(1, 0, dtype=torch.long), 1, 0, 0, 0)
    graph = patching.flow_graph(model, ids, threshold=0.5)
    with pytest.raises(ValueError, match="keeps no attention edge 3 → 2"):
        qk.edge_attribution(model, ids, graph, 1, 2, 3)
    with pytest.raises(ValueError, match="another model or text"):
        qk.edge_attribution(model, text(n=7), graph, 1, 2, 3)
    with pytest.raises(ValueError, match="FlowGraph"):
        qk.edge_attribution(model, ids, "graph", 1, 2, 3)
    with pytest.raises(ValueError, match="top is how many parts"):
        qk.graph_attribution(model, ids, graph, top=0)
    with pytest.raises(ValueError, match="side must be 'key'"):
        qk.composition_over(model, [ids[0]], 1, 0, side="value")
    with pytest.raises(ValueError, match="the corpus is empty"):
        qk.composition_over(model, [], 1, 0)
    with pytest.raises(ValueError, match="pairs is how many"):
        qk.composition_over(model, [ids[0]], 1, 0, pairs=0)
    assert math.isnan(qk.composition_over(model, [ids[0]], 1, 0).shares.low[0])    # one text: no interval

"""Why a head attends where it does: one attention score split into the components that wrote its query and its
key, down to single upstream heads, for one pair (qk_attribution), for a kept attention edge of the flow graph
(edge_attribution) and over a corpus (composition_over), beside the weights-only composition scores of Elhage
et al. (2021) (composition_scores).

One split, two grains: by="layer" (score_decomposition) parts the residual stream into the embeddings, the positions
and each earlier layer's attention and MLP output (anatomy.residual_parts); by="head" opens each earlier layer's
attention output into its heads, z_h·W_O[h] (patching.head_outputs: through a
sandwich post-norm frozen at its input), plus "L3 attn bias" for that layer's b_O and post-norm β where it has
them, so the head parts of a layer add up to its layer part exactly. Every norm on the way is frozen at its value
on this input; the parts add up to the score of this input, not of another.

The relative form decomposes score(i, j) − Σ_k a_ik·score(i, k): softmax reads only differences between a query's
scores, and this one says why key j wins over the query's attention-weighted mean key. Its key side is
Σ_k (δ_jk − a_ik)·k_k, so every key the query reads enters, each rotated at its own position under RoPE.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..attention import layer_mask, soft_cap
from ..config import check_index
from ..corpus.jobs import Job, Progress, Stop, check_texts
from ..layers import rotate
from . import anatomy
from .anatomy import ScoreDecomposition
from . import Part, upstream_parts
from .patching import head_outputs

BY = ("head", "layer")
SIDES = ("key", "query")
QK_RECORDS = anatomy.DECOMPOSITION_RECORDS + ("z", "pattern")
TOP = 8                     # parts named per side of an edge's head; the others are summed into "rest"


@dataclass
class QKAttribution(ScoreDecomposition):
    """A score split into pairs (query part, key part): matrix[a, b], matrix.sum() = score. by "head": each
    earlier layer's heads one by one ("L3 H5") and "L3 attn bias"; by "layer": score_decomposition's parts
    ("L3 attn"). relative: score is score(i, j) − Σ_k a_ik·score(i, k) (a_ik: weights, the query's attention)
    and matrix splits that; pair_score is then the plain q·k·scale at (query, key). The stage fields (capped,
    bias_term, scored, the RoPE pair scores) are the plain pair's, as score_decomposition gives them;
    relative_scored is what softmax compares: scored(i, j) − Σ_k a_ik·scored(i, k) = log a_ij − Σ_k a_ik·log a_ik."""
    by: str = "head"
    relative: bool = False
    pair_score: float | None = None         # relative: q·k·scale at (query, key)
    weights: Tensor | None = None           # relative: [T] the query's attention over the keys (a_i)
    relative_bias: float | None = None      # relative: bias(i, j) − Σ_k a_ik·bias(i, k) where the stack has one
    relative_scored: float | None = None    # relative: scored(i, j) − Σ_k a_ik·scored(i, k)

    @property
    def query_side(self) -> Tensor:
        """[n_query_parts] each query part against the whole key: matrix.sum(1)."""
        return self.matrix.sum(1)

    @property
    def key_side(self) -> Tensor:
        """[n_key_parts] the whole query against each key part: matrix.sum(0)."""
        return self.matrix.sum(0)


# ---- the parts of one pass ----

def check_by(by) -> str:
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(map(repr, BY))} (a part per head or per layer), got {by!r}")
    return by


def check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


class Pass:
    """One recorded pass of ids [1, T] through the stack that reads it, and the parts its scores split into."""

    def __init__(self, model, ids: Tensor, layers, by: str = "head", pattern: bool = True):
        self.model, self.by = model, by
        self.stack, self.kind = model.attention_stack()
        self.n = ids.shape[1]
        # recording the pattern runs attention's explicit path, not the fused one: without it the pass is the plain one
        names = QK_RECORDS if pattern else tuple(name for name in QK_RECORDS if name != "pattern")
        self.rec, _ = anatomy.recorded(model, ids, names, layers)
        self.scale = anatomy.head_scale(self.stack)
        self.outputs = {}           # (layer, positions) → head_outputs there: read once, whatever layer reads them

    def heads_of(self, layer: int, at: Tensor) -> tuple[list[str], Tensor]:
        """Layer `layer`'s attn_out at positions at [P] as its heads' parts and its bias part: labels, [k, P, d]."""
        place = (layer, tuple(at.tolist()))
        if place not in self.outputs:
            self.outputs[place] = head_outputs(self.model, layer, self.rec["z"][layer][at], self.kind)
        heads, bias, beta = self.outputs[place]                                         # [P, H, d], [P, d], [d]
        labels = [f"L{layer} H{h}" for h in range(heads.shape[1])]
        parts = heads.transpose(0, 1)                                                    # [H, P, d]
        if bias is not None or beta is not None:
            rest = (0 if bias is None else bias) + (0 if beta is None else beta)         # [P, d] or [d]
            labels.append(f"L{layer} attn bias")
            parts = torch.cat([parts, torch.as_tensor(rest).expand(parts.shape[1:])[None]])
        return labels, parts

    def rows(self, layer: int, at: Tensor) -> tuple[list[str], Tensor]:
        """What `layer`'s attention reads at positions at [P]: labels (the bias last) and rows [n + 1, P, d]."""
        split = self.heads_of if self.by == "head" else None
        labels, parts, bias = anatomy.residual_parts(self.stack, self.rec, layer, at, split)
        return labels + ["bias"], torch.cat([parts, bias[None]])

    def projected(self, layer: int, index: int, at: Tensor, rows: Tensor, side: str) -> Tensor:
        """rows [n + 1, P, d] at positions at [P] → [n + 1, P, d_head], the query (key) parts of head (kv head)
        `index`, rotated at their own positions under RoPE."""
        w = self.model.head_weights(layer, self.kind)
        parts = anatomy.projected_parts(self.stack, w, layer, index, rows, side)
        rope = self.model.layer_rope(self.stack, layer, at[None])                       # cos, sin [1, 1, P, r]
        if rope is not None:
            parts = rotate(parts, rope[0][0, 0].float(), rope[1][0, 0].float())
        return parts

    def weights(self, layer: int, head: int, query: int) -> Tensor:
        """[T] float32 the query's attention over every key (0 where masked)."""
        return self.rec["pattern"][layer][head, query].float()

    def scores(self, layer: int, head: int, query: int) -> tuple[Tensor, Tensor]:
        """The query's row [T] of q·k·scale (before the cap) and of scored (cap, then bias), from the records."""
        kv = self.stack.cfg.kv_head(head)
        q = self.rec["q"][layer][query, head].float()
        raw = (self.rec["k"][layer][:, kv].float() @ q) * self.scale                    # [T]
        scored = soft_cap(raw, self.stack.cfg.attn_softcap)
        bias = anatomy.head_bias(self.stack, head, self.n, self.model.device)
        return raw, scored if bias is None else scored + bias[query].float()


def pair_matrix(p: Pass, layer: int, head: int, query: int, key: int, relative: bool):
    """(labels, matrix [n + 1, n + 1], c [K], keys [K]): query parts × key parts of the plain score at (query,
    key) or of its relative form, c the weights on the keys' parts (δ_jk, or δ_jk − a_ik)."""
    kv = p.stack.cfg.kv_head(head)
    device = p.model.device
    if relative:   # every key the query reads, and the key itself
        a = p.weights(layer, head, query)
        keys = torch.nonzero((a > 0) | (torch.arange(p.n, device=a.device) == key)).flatten()
        c = (keys == key).float() - a[keys]
    else:
        keys, c = torch.tensor([key]), torch.ones(1)
    at = torch.cat([torch.tensor([query]), keys.cpu()]).to(device)
    labels, rows = p.rows(layer, at)
    q_parts = p.projected(layer, head, at[:1], rows[:, :1], "query")[:, 0]            # [n + 1, d_head]
    k_parts = p.projected(layer, kv, at[1:], rows[:, 1:], "key")                       # [n + 1, K, d_head]
    k_mix = torch.einsum("nkd,k->nd", k_parts, c.to(k_parts))                           # Σ_k c_k·k_parts(k)
    return labels, (q_parts @ k_mix.T) * p.scale, c, keys


def qk_attribution(model, ids: Tensor, layer: int, head: int, query: int, key: int, by: str = "head",
                   relative: bool = False) -> QKAttribution:
    """The score q·k·scale of `head` in `layer` from position `query` to `key` of ids [1, T] as a sum over pairs
    (query part, key part), every norm frozen at its value on this input: by="layer" is score_decomposition, and
    by="head" opens each earlier layer's attention part into its heads, which add up to it. relative=True splits
    score(i, j) − Σ_k a_ik·score(i, k) instead, the score against the query's attention-weighted mean score: what
    says why key j wins."""
    ids = anatomy.check_text(model, ids)
    layer, head = model.check_head(layer, head)
    by, relative = check_by(by), check_flag(relative, "relative")
    n = ids.shape[1]
    query = check_index(query, n, "query position", "the text has positions")
    key = check_index(key, n, "key position", "the text has positions")
    p = Pass(model, ids, range(layer + 1), by, pattern=relative)     # the plain split reads no attention weights
    kv = p.stack.cfg.kv_head(head)
    with torch.inference_mode():
        labels, matrix, c, keys = pair_matrix(p, layer, head, query, key, relative)
        raw, scored = p.scores(layer, head, query)
        score = raw[key].item()
        allowed = bool(layer_mask(p.stack.cfg, layer, n)[query, key])
        result = QKAttribution(layer, head, kv, query, key, score, allowed, anatomy.cpu(matrix), labels,
                               list(labels), by=by, relative=relative)
        anatomy.add_stages(result, model, p.stack, p.rec, score)
        if relative:   # Σ_k c_k·x_k over the keys: the relative form of each row
            result.pair_score, result.weights = score, anatomy.cpu(p.weights(layer, head, query))
            cpu_keys = keys.to(raw.device)
            result.score = (c.to(raw) @ raw[cpu_keys]).item()
            result.relative_scored = (c.to(scored) @ scored[cpu_keys]).item()
            bias = anatomy.head_bias(p.stack, head, n, model.device)
            if bias is not None:
                result.relative_bias = (c.to(bias) @ bias[query, cpu_keys].float()).item()
    if "positions" in labels:
        result.terms = anatomy.position_terms(result.matrix, labels.index("positions"))
    return result


def score_decomposition(model, ids: Tensor, layer: int, head: int, query: int, key: int) -> QKAttribution:
    """qk_attribution by="layer": the attention score of `head` in `layer` from position `query` to position `key`
    of ids [1, T] as a sum over pairs of residual-stream parts: q = Σ_a R_query(N_q(part_a·W_Q)) + R_query(N_q(bias_q))
    and k likewise (R: RoPE's rotation, where the model has it, of the rotated dims only under partial rotary; N_q:
    QK-norm frozen at this head's query before it, where the model has one; biases: b_Q, b_K and every norm's β,
    through W_Q, W_K), so score = Σ_ab (q_a·k_b)·scale = matrix.sum(), exact up to float rounding; scale is the
    layer's own.

    The terms after the sum are their own stages (anatomy.ScoreDecomposition): the soft-cap c·tanh(score / c) is a
    tanh, so no part maps through it linearly and the parts add up to the value before it; the score bias (ALiBi,
    T5) is added after, a part of its own that carries the positions in those families (their residual stream has
    no positions part). Parallel blocks (GPT-NeoX) add attn_out and mlp_out to the same residual stream, and with
    sandwich norms (Gemma 2/3) those records are after the post norms: both are plain Pre-LN sums.

    Every norm on the way is frozen at its value on this input (Norm.frozen): the sum is this input's
    linearisation, exact here and not a decomposition that holds for another text. Pre-LN (GPT-2, Llama) reads
    resid_pre through one frozen norm. Post-LN (BERT, Marian's encoder) has norm(x + f(x)) between layers, so
    the residual stream is no plain sum of layer outputs: there each part is what is left of it at this layer
    after every later norm (each frozen at its own input on this text), and the norms' β join "bias". At layer 0
    of BERT that is the embeddings' LayerNorm alone.

    With learned or sinusoidal positions, terms groups the parts into "position" (the positions part) and
    "token" (every other part, the bias included): at layer 0 that is the classic split of (x + p)·W_Q·W_Kᵀ·(x + p)
    into four terms; at later layers "token" also holds what earlier layers wrote, positional or not."""
    return qk_attribution(model, ids, layer, head, query, key, by="layer")


# ---- a kept attention edge of the flow graph ----

@dataclass
class HeadReason:
    """One head of an attention edge source → target: its relative score there split by side. query_parts:
    each query-side component against the whole relative key (matrix.sum(1)), key_parts: the whole query against
    each key-side component (matrix.sum(0)); each (label, value), largest |value| first, `top` of them and then
    ("rest", the others' sum) where there are more. Each side adds up to score."""
    head: int
    importance: float           # the head's part of the edge in the flow graph
    weight: float               # a_ij, its attention from target to source
    score: float                # score(i, j) − Σ_k a_ik·score(i, k), before any cap
    query_parts: list[tuple[str, float]]
    key_parts: list[tuple[str, float]]
    unrotated: float | None = None  # RoPE: the same relative score with the rotation taken off q and every k, as
                                    # if no distance separated them (score − unrotated: what the distance adds)


@dataclass
class EdgeAttribution:
    """Why the heads of one kept attention edge of a flow graph attend from target to source: each head's
    relative-score attribution (HeadReason), the strongest head first."""
    layer: int
    target: int
    source: int
    importance: float           # the edge's importance in the flow graph
    heads: list[HeadReason] = field(default_factory=list)


def ranked(labels: list[str], values: Tensor, top: int) -> list[tuple[str, float]]:
    """(label, value) largest |value| first, `top` of them and ("rest", the others' sum) where there are more."""
    return ranked_rows(labels, values[None], top)[0]


def ranked_rows(labels: list[str], values: Tensor, top: int) -> list[list[tuple[str, float]]]:
    """ranked of each row of values [m, n], sorted in one call."""
    order = values.abs().argsort(dim=-1, descending=True, stable=True)[:, :top]       # [m, top]
    kept, picked = values.gather(1, order).tolist(), order.tolist()
    rest = values.scatter(1, order, 0.0).sum(1).tolist() if values.shape[1] > top else None
    return [[(labels[i], v) for i, v in zip(index, row)] + ([("rest", rest[r])] if rest is not None else [])
            for r, (index, row) in enumerate(zip(picked, kept))]


def check_graph(model, ids: Tensor, graph) -> None:
    from .patching import FlowGraph
    if not isinstance(graph, FlowGraph):
        raise ValueError(f"graph must be the FlowGraph of patching.flow_graph on these ids, got {type(graph).__name__}")
    layers, heads, n = len(model.stack.blocks), model.config.n_heads, ids.shape[1]
    if tuple(graph.heads.shape) != (layers, heads, n, n):
        raise ValueError(f"the graph is of another model or text: its heads are {list(graph.heads.shape)}, this "
                         f"model and text give [{layers}, {heads}, {n}, {n}]; build it with flow_graph on these ids")


def check_top(top) -> int:
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top is how many parts each side names, an int ≥ 1; got {top!r}")
    return top


def frozen_transpose(norm, x: Tensor):
    """The transpose of norm.frozen(x) (a linear map c ↦ γ ⊙ P(c) / s): v ↦ P(γ ⊙ v) / s, so that
    frozen(x)(c)·v = c·frozen_transpose(x)(v) for every c."""
    s, gain = norm.divisor(x), norm.gain.float()
    if norm.kind == "rmsnorm":
        return lambda v: gain * v.float() / s
    centred = lambda g: g - g.mean(-1, keepdim=True)                                    # noqa: E731
    return lambda v: centred(gain * v.float()) / s


class EdgeParts:
    """Every kept attention edge's heads over one pass, read through the transpose of the maps that make the
    parts: a side's component is x_part·g, g what the other side's whole vector pulls back through RoPE, the
    frozen QK-norm and W_Q (W_K), so no part is projected to d_head. Each layer's rows at every position are
    built once; the heads read at one target give the key side of all their sources in one product.

    In a Pre-LN stack (no norm on the embeddings) the rows are the raw parts, each earlier layer's appended once
    whatever layer reads them, and g also passes back through the attention norm frozen at resid_pre
    (frozen_transpose): part·frozen(g) = frozen(part)·g, and the norm's β is the bias row. Otherwise (Post-LN, an
    embedding norm) every part passes every later norm, so each layer's rows are built from anatomy.residual_parts."""

    def __init__(self, p: Pass):
        self.p, self.layer, self.rows, self.found = p, None, None, {}
        self.everywhere = torch.arange(p.n, device=p.model.device)
        blocks = p.stack.blocks
        self.raw = p.stack.embed.norm is None and all(b.pre_norm for b in blocks)
        self.raw_labels, self.raw_layers = [], 0

    def at_layer(self, layer: int) -> None:
        if self.layer != layer:
            self.layer, self.found = layer, {}
            if self.raw:
                self.append_raw(layer)
                norm, x = self.p.stack.blocks[layer].attn_norm, self.p.rec["resid_pre"][layer].float()
                beta = torch.zeros_like(x[0]) if norm.bias is None else norm.bias.float()
                self.labels = self.raw_labels[:self.raw_n[layer]] + ["bias"]
                self.rows = self.raw_rows[:, :self.raw_n[layer]]                           # [T, n, d] a view
                self.norm, self.x, self.beta = norm, x, beta
                self.totals = norm.frozen(x)(x) + beta                                      # [T, d] attn_in
            else:
                self.labels, rows = self.p.rows(layer, self.everywhere)                 # [n + 1, T, d]
                self.rows = rows.transpose(0, 1).contiguous()                           # [T, n + 1, d]
                self.totals = self.rows.sum(1)                                          # [T, d] what attention reads
            self.w = self.p.model.head_weights(layer, self.p.kind)
            # [heads, d, d_head] and its transpose as plain float32 copies: products with the views are far slower
            self.weights = {side: (m.float().contiguous(), m.float().transpose(1, 2).contiguous())
                            for side, m in (("query", self.w.W_Q), ("key", self.w.W_K))}
            rope = self.p.model.layer_rope(self.p.stack, layer, self.everywhere[None])
            self.rope = None if rope is None else (rope[0][0, 0].float(), rope[1][0, 0].float())   # [T, r]
            self.attn = self.p.stack.blocks[layer].attn

    def append_raw(self, layer: int) -> None:
        """The raw parts of every layer before `layer` in raw_rows [T, N, d], in residual_parts' order: the
        embeddings, then each layer's heads (and its attn bias) and its MLP; raw_n[l]: how many layer l reads."""
        p = self.p
        if not self.raw_labels:
            first = [(label, p.rec[name][0].float()) for name, label in
                     (("embed", "embeddings"), ("pos_embed", "positions"), ("type_embed", "token types"))
                     if 0 in p.rec[name]]
            per_layer = p.model.config.n_heads + 2                                        # heads, attn bias, MLP
            size = len(first) + per_layer * max(p.rec["resid_pre"])
            self.raw_rows = first[0][1].new_empty(p.n, size, first[0][1].shape[-1])          # [T, N, d]
            for i, (label, value) in enumerate(first):
                self.raw_rows[:, i] = value
            self.raw_labels = [label for label, _ in first]
            self.raw_n = {0: len(first)}
        while self.raw_layers < layer:
            l, n = self.raw_layers, len(self.raw_labels)
            labels, heads = p.heads_of(l, self.everywhere)                                 # [k, T, d]
            self.raw_rows[:, n:n + len(labels)] = heads.transpose(0, 1)
            self.raw_rows[:, n + len(labels)] = p.rec["mlp_out"][l].float()
            self.raw_labels += labels + [f"L{l} MLP"]
            self.raw_layers += 1
            self.raw_n[self.raw_layers] = len(self.raw_labels)

    def dots_at(self, at: Tensor, g: Tensor) -> Tensor:
        """Each position at[i]'s rows dotted with its own g[i] (g [m, d]): [m, n + 1], the bias row last. The rows
        of one position are read in place, once for all the g that ask there."""
        if self.raw:
            g_in = frozen_transpose(self.norm, self.x[at])(g)                              # [m, d]
        else:
            g_in = g.float()
        found = g.new_empty(len(at), self.rows.shape[1])                                   # [m, n]
        for position in at.unique().tolist():
            here = (at == position).nonzero()[:, 0]
            found[here] = g_in[here] @ self.rows[position].T
        if not self.raw:
            return found
        return torch.cat([found, (g * self.beta).sum(-1, keepdim=True)], 1)

    def dots(self, start: int, stop: int, g: Tensor) -> Tensor:
        """Every row at positions start..stop−1 dotted with g [h, P, d] (what multiplies attention's input there):
        [P, n + 1, h], the bias row last."""
        if not self.raw:
            return torch.bmm(self.rows[start:stop], g.permute(1, 2, 0))
        back = frozen_transpose(self.norm, self.x[start:stop])(g)                          # [h, P, d]
        found = torch.bmm(self.rows[start:stop], back.permute(1, 2, 0))                   # [P, n, h]
        return torch.cat([found, (g @ self.beta).T[:, None]], 1)

    def pulled_back(self, v: Tensor, at: Tensor, index: list[int], side: str) -> tuple[Tensor, Tensor]:
        """v [h, P, d_head] given to the final q (k) of heads (kv heads) `index` [h] at positions at [P] (or
        [h, P], each row its own) → (g [h, P, d], the bias term [h, P]): the parts' rows dotted with g, and the
        bias row plus this, give v·(the parts' q or k) at each position."""
        bias, norm = (self.w.b_Q, self.attn.q_norm) if side == "query" else (self.w.b_K, self.attn.k_norm)
        weight, weight_t = self.weights[side]                                           # [H, d, dh], [H, dh, d]
        v = v.float().contiguous()                                                      # its own, written below
        if self.rope is not None:   # the transpose of a rotation turns back
            v = rotate(v, self.rope[0][at], -self.rope[1][at])
        bias = None if bias is None else bias[index].float()[:, None]                   # [h, 1, dh]
        g = v.new_empty(*v.shape[:2], weight_t.shape[-1])                               # [h, P, d]
        for one in sorted(set(index)):  # each weight read in place, for the heads that share it
            rows = [i for i, other in enumerate(index) if other == one]
            if norm is not None:    # frozen at the head's q (k) before the norm, as projected_parts freezes it
                read = self.totals[at[rows] if at.dim() == 2 else at]                     # [(h',) P, d]
                before = read @ weight[one] + (0 if bias is None else bias[rows])         # [h', P, dh]
                v[rows] = frozen_transpose(norm, before)(v[rows])
            g[rows] = v[rows] @ weight_t[one]
        extra = v.new_zeros(v.shape[:2]) if bias is None else (v * bias).sum(-1)
        return g, extra

    def key_scores(self, wanted: list[tuple[int, int]]) -> None:
        """For each (head, target) wanted, the head's query at target against each key part at each position it
        may read, [n + 1, K] (K = target + 1 in a causal stack, else T): q·k_part(k)·scale, kept in found. All
        of a layer's at once: the rows are read in one product however many heads and targets ask."""
        wanted = sorted({w for w in wanted if w not in self.found}, key=lambda w: -w[1])
        causal = self.p.stack.cfg.causal
        while wanted:   # causal: targets within a factor 2 share one product as wide as the first one's keys
            width = wanted[0][1] + 1 if causal else self.p.n
            chunk = [w for w in wanted if not causal or 2 * (w[1] + 1) > width]
            wanted = wanted[len(chunk):]
            heads, targets = [h for h, _ in chunk], [t for _, t in chunk]
            kvs = [self.p.stack.cfg.kv_head(h) for h in heads]
            q = self.p.rec["q"][self.layer][targets, heads]                              # [w, d_head]
            g, extra = self.pulled_back(q[:, None].expand(-1, width, -1), self.everywhere[:width], kvs, "key")
            scores = self.dots(0, width, g)                                              # [K, n + 1, w]
            for i, (head, target) in enumerate(chunk):
                keys = target + 1 if causal else width   # a causal query reads no later key: its c_k is 0 there
                found = scores[:keys, :, i].T.clone()                                    # [n + 1, K]
                found[-1] += extra[i, :keys]
                self.found[(head, target)] = found * self.p.scale

    def sides(self, triples: list[tuple[int, int, int]]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """For each (head, source, target) of this layer: (query sides [m, n + 1], key sides [m, n + 1], the
        relative scores [m], a_ij [m], and under RoPE the relative scores with the rotation taken off [m], else
        None). The relative score score(i, j) − Σ_k a_ik·score(i, k) split by the
        query's parts against the whole relative key, and by the whole query against the key's parts (each side
        adds up to the relative score)."""
        p, layer = self.p, self.layer
        heads, sources, targets = (list(t) for t in zip(*triples))
        kvs = [p.stack.cfg.kv_head(h) for h in heads]
        at = torch.tensor(targets, device=self.everywhere.device)
        a = p.rec["pattern"][layer][heads, targets].float()                             # [m, T]
        c = (self.everywhere[None] == torch.tensor(sources)[:, None].to(at)).float() - a   # δ_jk − a_ik
        keys = p.rec["k"][layer][:, kvs].float()                                        # [T, m, d_head]
        k_mix = torch.einsum("mt,tmd->md", c, keys)                                     # Σ_k c_k·k_k
        g, extra = self.pulled_back(k_mix[:, None], at[:, None], heads, "query")        # [m, 1, d], [m, 1]
        query_side = self.dots_at(at, g[:, 0])                                          # [m, n + 1]
        query_side[:, -1] += extra[:, 0]
        self.key_scores(list(zip(heads, targets)))
        key_side = torch.stack([self.found[(h, t)] @ c[i, :self.found[(h, t)].shape[1]]
                                for i, (h, t) in enumerate(zip(heads, targets))])       # [m, n + 1]
        q = p.rec["q"][layer][targets, heads].float()                                   # [m, d_head]
        raw = torch.einsum("md,tmd->mt", q, keys) * p.scale                             # [m, T] before the cap
        weight = a.gather(1, torch.tensor(sources)[:, None].to(at))[:, 0]
        unrotated = None
        if self.rope is not None and layer in p.rec["q_unrotated"]:
            q_u = p.rec["q_unrotated"][layer][targets, heads].float()                   # [m, d_head]
            k_u = p.rec["k_unrotated"][layer][:, kvs].float()                           # [T, m, d_head]
            unrotated = (c * torch.einsum("md,tmd->mt", q_u, k_u)).sum(-1) * p.scale
        return query_side * p.scale, key_side, (c * raw).sum(-1), weight, unrotated


def attention_edges(graph, layer: int | None = None, target: int | None = None, source: int | None = None):
    """The graph's kept attention edges, those of one layer, target or source where given."""
    return [e for e in graph.edges if e.kind == "attention" and layer in (None, e.layer)
            and target in (None, e.target) and source in (None, e.source)]


def edges_attribution(model, ids: Tensor, edges, top: int = TOP) -> list[EdgeAttribution]:
    """EdgeAttribution of each of `edges` (kept attention edges of graph) from one recorded pass of ids."""
    ids = anatomy.check_text(model, ids)
    p = Pass(model, ids, range(max((e.layer for e in edges), default=0) + 1), "head")
    parts = EdgeParts(p)
    found = []
    with torch.inference_mode():
        layers: dict[int, list] = {}
        for e in sorted(edges, key=lambda e: (e.layer, e.target)):
            layers.setdefault(e.layer, []).append(e)
        for layer, there in sorted(layers.items()):
            parts.at_layer(layer)
            triples = [(h, e.source, e.target) for e in there for h, _ in e.heads]
            if triples:     # every key side this layer's edges read comes from one product (key_scores)
                query_side, key_side, score, weight, unrotated = parts.sides(triples)
                query_parts, key_parts = (ranked_rows(parts.labels, side.cpu(), top) for side in (query_side, key_side))
                score, weight = score.tolist(), weight.tolist()
                unrotated = [None] * len(score) if unrotated is None else unrotated.tolist()
            i = 0
            for e in there:
                reasons = []
                for h, importance in e.heads:
                    reasons.append(HeadReason(h, importance, weight[i], score[i], query_parts[i], key_parts[i],
                                              unrotated[i]))
                    i += 1
                found.append(EdgeAttribution(e.layer, e.target, e.source, e.importance, reasons))
    return found


def edge_attribution(model, ids: Tensor, graph, layer: int, target: int, source: int,
                     top: int = TOP) -> EdgeAttribution:
    """Why the kept attention edge source → target through `layer` of graph (patching.flow_graph on ids [1, T])
    is there: each of its heads (strongest first) with qk_attribution(relative=True, by="head")'s split summed
    to its query-side and to its key-side components, `top` parts of each side first."""
    ids = anatomy.check_text(model, ids)
    check_graph(model, ids, graph)
    top = check_top(top)
    edge = attention_edges(graph, layer, target, source)
    if not edge:
        kept = [(e.source, e.target) for e in attention_edges(graph, layer)]
        raise ValueError(f"the graph keeps no attention edge {source} → {target} through layer {layer}; its kept "
                         f"attention edges there (source, target): {kept[:20] or 'none'}")
    return edges_attribution(model, ids, edge, top)[0]


def graph_attribution(model, ids: Tensor, graph, top: int = TOP) -> list[EdgeAttribution]:
    """edge_attribution of every kept attention edge of graph, from one recorded pass, in the order of their
    (layer, target)."""
    ids = anatomy.check_text(model, ids)
    check_graph(model, ids, graph)
    return edges_attribution(model, ids, attention_edges(graph), check_top(top))


# ---- over a corpus, and what the weights allow ----

@dataclass
class CompositionScores:
    """Elhage et al. (2021)'s weights-only composition of `head` in `layer` with every head of the layers before
    it, [layer, H] each: Q: ‖W_OV'·W_QK‖_F / (‖W_OV'‖_F·‖W_QK‖_F) (an upstream head's output read by the
    query), K: ‖W_QK·W_OV'ᵀ‖_F / (…) (read by the key), V: ‖W_OV'·W_OV‖_F / (‖W_OV'‖_F·‖W_OV‖_F) (read by the
    value), in row-vector form (x·W_QK·yᵀ is a score, x·W_OV an output): W_QK = W_Q[h]·W_K[kv]ᵀ, W_OV =
    W_V[kv]·W_O[h]. Each matrix has its layer's attention-norm gain γ folded in where it reads (Pre-LN), and a
    sandwich post-norm's gain where it writes; the norms' 1/s and LayerNorm's centring are left out: these scores
    read the weights alone, not any text."""
    layer: int
    head: int
    q: Tensor                   # [layer, H]
    k: Tensor
    v: Tensor


def frobenius(u1: Tensor, v1: Tensor, u2: Tensor, v2: Tensor) -> Tensor:
    """‖u1·v1ᵀ·u2·v2ᵀ‖_F from the d_head-wide factors ([..., d, r] each) without the [d, d] products:
    √tr(Gᵀ·A·G·B), A = u1ᵀu1, G = v1ᵀu2, B = v2ᵀv2."""
    t = lambda m: m.transpose(-1, -2)                                                   # noqa: E731
    g = t(v1) @ u2
    return ((g * ((t(u1) @ u1) @ g @ (t(v2) @ v2))).sum((-1, -2))).clamp_min(0).sqrt()


def gram_norm(u: Tensor, v: Tensor) -> Tensor:
    """‖u·vᵀ‖_F = √tr(uᵀu·vᵀv), u and v [..., d, r]."""
    return ((u.transpose(-1, -2) @ u) * (v.transpose(-1, -2) @ v)).sum((-1, -2)).clamp_min(0).sqrt()


def ov_factors(model, stack, kind, layer: int) -> tuple[Tensor, Tensor]:
    """Every head's W_OV of `layer` as factors u [H, d, d_head] (γ·W_V of its kv head) and v [H, d, d_head]
    ((W_O·post-norm gain)ᵀ), W_OV = u·vᵀ."""
    w, block = model.head_weights(layer, kind), stack.blocks[layer]
    gamma = block.attn_norm.gain.float() if block.pre_norm else torch.ones(w.W_O.shape[-1])
    post = 1.0 if block.attn_post_norm is None else block.attn_post_norm.gain.float()
    u = gamma[:, None] * w.W_V.float().repeat_interleave(stack.cfg.kv_group, dim=0)                  # [H, d, dh]
    return u, (w.W_O.float() * post).transpose(1, 2)                                    # [H, d, dh]


def composition_scores(model, layer: int, head: int) -> CompositionScores:
    """Q-, K- and V-composition of `head` in `layer` with each earlier head (CompositionScores), from the
    model's per-head weights (model.head_weights)."""
    layer, head = model.check_head(layer, head)
    stack, kind = model.attention_stack()
    kv = stack.cfg.kv_head(head)
    w, block = model.head_weights(layer, kind), stack.blocks[layer]
    with torch.inference_mode():
        gamma = block.attn_norm.gain.float() if block.pre_norm else torch.ones(w.W_Q.shape[1])
        u_qk, v_qk = gamma[:, None] * w.W_Q[head].float(), gamma[:, None] * w.W_K[kv].float()   # W_QK = u·vᵀ
        u_ov, v_ov = ov_factors(model, stack, kind, layer)
        u_ov, v_ov = u_ov[head], v_ov[head]
        found = {"q": [], "k": [], "v": []}
        for l in range(layer):
            u, v = ov_factors(model, stack, kind, l)                                    # [H, d, dh]
            ov = gram_norm(u, v)                                                        # [H]
            found["q"].append(frobenius(u, v, u_qk, v_qk) / (ov * gram_norm(u_qk, v_qk)))
            found["k"].append(frobenius(u_qk, v_qk, v, u) / (ov * gram_norm(u_qk, v_qk)))
            found["v"].append(frobenius(u, v, u_ov, v_ov) / (ov * gram_norm(u_ov, v_ov)))
    empty = torch.empty(0, stack.cfg.n_heads)
    return CompositionScores(layer, head, *(torch.stack(found[k]).cpu() if layer else empty for k in "qkv"))


@dataclass
class CompositionOver:
    """What feeds one head's keys (side "key") or queries ("query") over a corpus: shares.mean[b] is component
    labels[b]'s share of the relative score on the head's chosen pairs (see composition_over; the shares of one
    text add up to 1), with its interval and per-text values; weights: what the weights alone allow. parts[b] is
    labels[b]'s typed key (core.analysis.Part): code asks parts which component is a head, labels are shown."""
    layer: int
    head: int
    side: str
    labels: list[str]
    shares: object              # core.corpus.stats.Over [n_parts]
    pairs: str                  # how the pairs were chosen and weighed, in words
    weights: CompositionScores
    parts: list[Part]

    def index(self, part: Part) -> int:
        """Where `part` is in labels, parts and the shares."""
        if part not in self.parts:
            raise ValueError(f"{part} is not a part that layer {self.layer} reads; its parts: {', '.join(self.labels)}")
        return self.parts.index(part)

    def heads(self) -> list[int]:
        """Indices of the single earlier heads among the parts."""
        return [i for i, part in enumerate(self.parts) if part.is_head]


def check_side(side) -> str:
    if side not in SIDES:
        raise ValueError(f"side must be 'key' (what feeds the head's keys) or 'query' (its queries), got {side!r}")
    return side


def chosen_pairs(a: Tensor, pairs: int, first: bool) -> list[tuple[int, int]]:
    """The `pairs` (query, key) of largest attention a [T, T], among queries that read more than one key, and
    keys after position 0 unless first."""
    weights = a.clone()
    weights[(a > 0).sum(-1) < 2] = 0
    if not first:
        weights[:, 0] = 0
    flat = weights.flatten()
    top = flat.topk(min(pairs, int((flat > 0).sum()))).indices.tolist()
    return [divmod(i, a.shape[1]) for i in top]


def composition_over(model, texts, layer: int, head: int, side: str = "key", pairs: int = 16,
                     first: bool = False, progress: Progress | None = None, stop: Stop | None = None):
    """For `head` in `layer`, each upstream component's share of the relative score on each text's `pairs`
    (query, key) pairs of largest attention a_ij (the attention-weighted mean of the relative score over all of
    a query's keys is 0 by construction, so the head's attended pairs are taken instead): per text
    Σ_p a_p·part_p / Σ_p a_p·relative_score_p on the side asked for (its parts add up to 1), summarised over
    the texts (an Over). Key 0 is left out unless first (many heads park attention there, a sink). Beside it
    the weights-only composition scores (composition_scores). progress and stop as every corpus job's
    (core/corpus/jobs.py): stop() is asked between texts, and a stopped job summarises the texts it finished."""
    side = check_side(side)
    layer, head = model.check_head(layer, head)
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs is how many (query, key) pairs each text gives, an int ≥ 1; got {pairs!r}")
    texts = check_texts(model, texts)
    job, labels = Job(len(texts), "text", progress, stop), []

    def measure(i: int) -> None:
        parts = EdgeParts(Pass(model, texts[i][None], range(layer + 1), "head"))
        parts.at_layer(layer)
        labels[:] = parts.labels
        chosen = chosen_pairs(parts.p.rec["pattern"][layer][head].float(), pairs, first)
        if not chosen:
            job.skip(i, "no query reads more than one key there")
            return
        query_side, key_side, relative, weight, _ = parts.sides([(head, key, query) for query, key in chosen])
        total = weight @ (key_side if side == "key" else query_side)                 # Σ_p a_p·part_p
        job.finish(i, (total / (weight @ relative)).cpu())

    with torch.inference_mode():
        job.run(job.left(), measure)
    how = (f"each text's {pairs} (query, key) pairs of largest attention{'' if first else ' after key 0'}, "
           f"weighted by it; a share is Σ a·part / Σ a·(relative score)")
    labels = labels or Pass(model, texts[0][None], range(layer + 1), "head").rows(layer, torch.tensor([0]))[0]
    return CompositionOver(layer, head, side, labels, job.over((len(labels),), bounds=None), how,
                           composition_scores(model, layer, head),
                           upstream_parts(labels, layer, model.attention_stack()[0].cfg.n_heads))

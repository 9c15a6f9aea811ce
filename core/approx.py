"""Approximations of eq. 2.1, each one switch of the attention function (as a sliding window is), never a second
model. An `Approx` names the method, its budget, and the layers and heads it replaces:

  topk        each query keeps its k highest-scoring visible keys (the oracle a DeepSeek-style indexer estimates);
              k ≥ the visible keys is exact attention
  bigbird     Zaheer et al.'s block pattern: a query block reads its own and its two neighbouring key blocks, the
              first `global_blocks` blocks read and are read by every block, plus `random_blocks` seeded random key
              blocks; a decoder keeps its causal mask
  performer   FAVOR+ (Choromanski et al.): softmax's kernel exp(q·k·s) replaced by φ(q)·φ(k), positive orthogonal
              random features, so softmax(QKᵀs)V ≈ D⁻¹ φ(Q)(φ(K)ᵀV) in time linear in T; causal by prefix sums
  linformer   Wang et al.: keys and values projected along the sequence to `rank` rows, K' = E·K, V' = E·V, so each
              query weighs `rank` mixed rows, not the keys; it mixes positions, so it is for bidirectional attention
  lowrank_kv  the layer's stacked [W_K; W_V] replaced by its truncated SVD U_r Σ_r V_rᵀ: the cache holds the r numbers
              c = V_rᵀx per token per layer and keys and values are U_rΣ_r·c, rotated after (latent attention's way)

`approximate` is the kernel (q, k, v in, output and weights out), called by the model's attention for the layers an
Approx replaces; the model calls `lowrank_kv` where the projection itself changes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .attention import attention, causal_mask, masked_softmax_, scored, sliding_window_mask

# method → its budget's names with their defaults
METHODS: dict[str, dict[str, object]] = {
    "topk": {"k": 64},
    "bigbird": {"block": 16, "global_blocks": 1, "random_blocks": 1, "seed": 0},
    "performer": {"features": 64, "seed": 0},
    "linformer": {"rank": 32, "fit": "random", "seed": 0},
    "lowrank_kv": {"rank": 64},
}
HAS_WEIGHTS = {"topk": True, "bigbird": True, "performer": True, "linformer": False, "lowrank_kv": True}
NAMES = {"topk": "top-k", "bigbird": "BigBird", "performer": "Performer (FAVOR+)", "linformer": "Linformer",
         "lowrank_kv": "low-rank KV"}


def _whole(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number ≥ {least}, got {value!r}")
    return value


class Approx:
    """Which approximation replaces attention, with its budget, on which layers and heads of the stack that reads
    the text (a seq2seq model's encoder, else the main stack): Approx("topk", k=32), Approx("bigbird", block=16,
    global_blocks=1, random_blocks=2, seed=0, layers=[3]), Approx("lowrank_kv", rank=48), ...

    layers, heads: None for all. heads picks query heads (lowrank_kv compresses a layer's whole cache: no heads).
    shadow: compute the approximation beside exact attention and keep the exact output, so each head's error is
    measured on the very queries, keys and values exact attention saw (ModelOutput.approx_errors); else the
    approximation's output replaces exact attention's and flows on.
    projections: linformer with fit="fitted": {layer: E [rank, n_max]} (fit_linformer), used as E[:, :T].
    """

    def __init__(self, method: str, layers=None, heads=None, *, shadow: bool = False,
                 projections: dict[int, Tensor] | None = None, **budget):
        if method not in METHODS:
            raise ValueError(f"unknown approximation {method!r}: choose one of {', '.join(METHODS)}")
        unknown = set(budget) - set(METHODS[method])
        if unknown:
            raise ValueError(f"{method} takes {', '.join(METHODS[method])}; not {', '.join(sorted(unknown))}")
        self.method = method
        self.budget = {**METHODS[method], **budget}
        for name, value in self.budget.items():
            if name == "fit":
                if value not in ("random", "fitted"):
                    raise ValueError(f"fit must be 'random' or 'fitted', got {value!r}")
            else:
                _whole(name, value, 0 if name in ("global_blocks", "random_blocks", "seed") else 1)
        if method == "linformer" and self.budget["fit"] == "fitted" and not projections:
            raise ValueError("linformer with fit='fitted' needs its projections: "
                             "projections=core.approx.fit_linformer(model, texts, rank)")
        if method == "lowrank_kv" and heads is not None:
            raise ValueError("lowrank_kv compresses a layer's whole key/value projection, so it takes no heads")
        self.layers = None if layers is None else tuple(_whole("a layer", i, 0) for i in layers)
        self.heads = None if heads is None else tuple(_whole("a head", h, 0) for h in heads)
        self.shadow, self.projections = shadow, projections
        self._factors: dict[int, tuple[Tensor, Tensor]] = {}

    def shadowing(self, shadow: bool = True) -> Approx:
        """The same approximation (its SVD factors shared) measured beside exact attention (shadow) or replacing it."""
        twin = Approx(self.method, self.layers, self.heads, shadow=shadow, projections=self.projections, **self.budget)
        twin._factors = self._factors
        return twin

    def __getattr__(self, name):            # the budget's names read as attributes: approx.k, approx.rank
        budget = self.__dict__.get("budget", {})
        if name in budget:
            return budget[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        terms = [f"{k}={v!r}" for k, v in self.budget.items()]
        if self.layers is not None:
            terms.append(f"layers={list(self.layers)}")
        if self.heads is not None:
            terms.append(f"heads={list(self.heads)}")
        return f"Approx({self.method!r}, {', '.join(terms)}{', shadow=True' if self.shadow else ''})"

    def describe(self) -> str:
        """The method and its budget in words: "top-k (k = 32)"."""
        shown = {k: v for k, v in self.budget.items() if k != "seed"}
        return f"{NAMES[self.method]} ({', '.join(f'{k} = {v}' for k, v in shown.items())})"

    @property
    def has_weights(self) -> bool:
        """Whether the method gives a weight to each key (linformer weighs `rank` mixed rows instead)."""
        return HAS_WEIGHTS[self.method]

    def check(self, cfg, n_layers: int) -> None:
        """Refuse in words what this stack (config cfg, n_layers layers) cannot take."""
        for i in self.layers or ():
            if i >= n_layers:
                raise ValueError(f"layer {i} is out of range: this stack has layers 0–{n_layers - 1}")
        for h in self.heads or ():
            if h >= cfg.n_heads:
                raise ValueError(f"head {h} is out of range: its layers have heads 0–{cfg.n_heads - 1}")
        if self.method == "linformer" and cfg.causal:
            raise ValueError("linformer projects keys and values along the sequence, so every mixed row holds later "
                             "tokens: a causal model would read its future. It is for bidirectional attention (an "
                             "encoder such as MiniLM or BERT)")
        if self.method in ("performer", "linformer") and (cfg.attn_softcap is not None or cfg.score_bias != "none"
                                                          or cfg.attention_sinks):
            term = ("a soft cap on its scores" if cfg.attn_softcap is not None else
                    "a bias on its scores (ALiBi or relative buckets)" if cfg.score_bias != "none" else
                    "a sink in its softmax")
            how = ("estimates exp(q·k) with random features" if self.method == "performer" else
                   "softmaxes over mixed rows, not keys")
            raise ValueError(f"{self.method} {how}; this model's attention also has {term}, which it cannot carry")
        if self.method == "lowrank_kv":
            width = 2 * cfg.n_kv_heads * cfg.head_dim
            if self.rank > min(width, cfg.d_model):
                raise ValueError(f"rank {self.rank} is above [W_K; W_V]'s full rank "
                                 f"{min(width, cfg.d_model)} ({width} × {cfg.d_model})")
        if self.method == "linformer" and self.projections is not None:
            for i in self.layers if self.layers is not None else range(n_layers):
                if i not in self.projections:
                    raise ValueError(f"the fitted projections hold no layer {i}")

    def applies(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def head_mask(self, n_heads: int, device) -> Tensor | None:
        """[H] bool, the heads replaced, or None: all of them."""
        if self.heads is None:
            return None
        mask = torch.zeros(n_heads, dtype=torch.bool, device=device)
        mask[list(self.heads)] = True
        return mask

    def factors(self, layer: int, weight: Tensor) -> tuple[Tensor, Tensor]:
        """lowrank_kv's (down [r, d_model], up [2·kv_dim, r]) of one layer's [W_K; W_V] (weight [2·kv_dim, d_model]):
        the truncated SVD, up·down = U_r Σ_r V_rᵀ, its best rank-r approximation (Eckart–Young); kept per layer."""
        if layer not in self._factors:
            u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
            r = self.rank
            self._factors[layer] = ((vh[:r]).to(weight.dtype), (u[:, :r] * s[:r]).to(weight.dtype))
        return self._factors[layer]

    def cache_bytes_per_token(self, cfg, bytes_per: int = 2) -> int:
        """What a decoder's cache holds per token, over every layer: 2·H_kv·d_head numbers per exact layer; r per
        lowrank_kv layer; performer on every head keeps a fixed state instead (m × d per head), nothing per token;
        top-k and BigBird keep every key (they read fewer)."""
        exact = 2 * cfg.n_kv_heads * cfg.head_dim
        replaced = sum(self.applies(i) for i in range(cfg.n_layers))
        fixed_state = self.method == "performer" and self.heads is None     # exact heads still read the cache
        per_layer = self.budget["rank"] if self.method == "lowrank_kv" else 0 if fixed_state else exact
        return bytes_per * ((cfg.n_layers - replaced) * exact + replaced * per_layer)


def approximate(q: Tensor, k: Tensor, v: Tensor, approx: Approx, layer: int, allowed: Tensor | None = None,
                is_causal: bool = False, scale: float | None = None, softcap: float | None = None,
                bias: Tensor | None = None, window: int | None = None, sink: Tensor | None = None,
                return_probs: bool = False) -> tuple[Tensor, Tensor | None]:
    """attention()'s signature with one more switch, `approx`: q [B, H, Tq, d], k, v [B, H_kv, Tk, d].
    Returns (output [B, H, Tq, d], weights [B, H, Tq, Tk] float32 or None); the weights are the method's own
    (performer's φ(q)·φ(k) normalised), None for linformer, which has none per key. Every head is approximated:
    the model mixes the chosen heads with exact ones."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if window is not None:   # the window joins the mask, as in attention()
        band = sliding_window_mask(q.shape[-2], k.shape[-2], window, q.device)
        if is_causal:
            band, is_causal = band & causal_mask(q.shape[-2], k.shape[-2], q.device), False
        allowed = band if allowed is None else allowed & band
    method = approx.method
    if method == "lowrank_kv":      # the keys and values came through the low-rank projection (lowrank_kv)
        return attention(q, k, v, allowed, is_causal, scale, return_probs, softcap, bias, sink=sink)
    if method == "topk":
        return topk_attention(q, k, v, approx.k, allowed, is_causal, scale, softcap, bias, sink)
    if method == "bigbird":
        causal = is_causal or _is_causal(allowed)
        if not return_probs and allowed is None and softcap is None and bias is None and sink is None \
                and q.shape[-2] == k.shape[-2]:
            pattern = bigbird_blocks_pattern(-(-k.shape[-2] // approx.block), approx.global_blocks,
                                             approx.random_blocks, seed_for(approx.seed, layer), causal)
            return bigbird_blocks(q, k, v, pattern, approx.block, causal, scale), None
        pattern = bigbird_mask(q.shape[-2], k.shape[-2], approx.block, approx.global_blocks, approx.random_blocks,
                               seed_for(approx.seed, layer), causal, q.device)
        allowed = pattern if allowed is None else allowed & pattern
        return attention(q, k, v, allowed, False, scale, return_probs, softcap, bias, sink=sink)
    if softcap is not None or bias is not None or sink is not None:
        raise ValueError(f"{method} cannot carry this layer's soft cap, score bias or sink")
    if method == "performer":
        q_f, k_f = favor_features(q, k, scale, approx.features, seed_for(approx.seed, layer))
        return performer_attention(q_f, k_f, v, allowed, is_causal, return_probs)
    if is_causal:
        raise ValueError("linformer mixes positions along the sequence: it has no causal form here")
    n_keys = k.shape[-2]
    if approx.projections is not None:
        e = approx.projections[layer]
        if e.shape[1] < n_keys:
            raise ValueError(f"the fitted projection covers {e.shape[1]} tokens; this text has {n_keys}")
        e = e[:, :n_keys]
    else:
        e = linformer_projection(approx.rank, n_keys, seed_for(approx.seed, layer), q.device)
    return linformer_attention(q, k, v, e.to(q.device), allowed, scale), None


def seed_for(seed: int, layer: int) -> int:
    """One seed per layer, so layers draw different random features, blocks and projections."""
    return seed * 100_003 + layer


def _is_causal(allowed: Tensor | None) -> bool:
    """Whether a mask hides every key after its query (the last Tq of Tk places), as a causal one does."""
    if allowed is None:
        return False
    n_queries, n_keys = allowed.shape[-2], allowed.shape[-1]
    if n_queries == 1:
        return False
    return not bool((allowed & ~causal_mask(n_queries, n_keys, allowed.device)).any())


def visible_counts(allowed: Tensor | None, is_causal: bool, n_queries: int, n_keys: int, device) -> Tensor:
    """[..., Tq] the number of keys each query may read."""
    if allowed is None:
        if is_causal:
            return torch.arange(n_keys - n_queries + 1, n_keys + 1, device=device)
        return torch.full((n_queries,), n_keys, device=device)
    if is_causal:
        allowed = allowed & causal_mask(n_queries, n_keys, device)
    return allowed.sum(-1)


# ---- top-k ----

def topk_attention(q: Tensor, k: Tensor, v: Tensor, top: int, allowed: Tensor | None, is_causal: bool, scale: float,
                   softcap: float | None = None, bias: Tensor | None = None, sink: Tensor | None = None
                   ) -> tuple[Tensor, Tensor]:
    """Eq. 2.1 over each query's `top` highest-scoring visible keys: softmax(S + M + M_topk)V, M_topk −∞ off the top
    (a tie at the k-th score keeps every tied key). Every score is computed (the oracle is quadratic); the softmax
    and the sum over values see k keys."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if is_causal:
        causal = causal_mask(q.shape[-2], k.shape[-2], q.device)
        allowed = causal if allowed is None else allowed & causal
    scores = scored((q.float() @ k.float().transpose(-1, -2)).mul_(scale), softcap, bias)   # [B, H, Tq, Tk]
    if allowed is not None:
        scores = scores.masked_fill_(~allowed, float("-inf"))
    if top < scores.shape[-1]:
        kth = scores.topk(top, dim=-1).values[..., -1:]                                        # [B, H, Tq, 1]
        scores = scores.masked_fill_(scores < kth, float("-inf"))
    probs = masked_softmax_(scores, None if allowed is None else scores > float("-inf"), sink)
    return probs.to(v.dtype) @ v, probs


# ---- BigBird ----

def bigbird_blocks_pattern(n_blocks: int, global_blocks: int, random_blocks: int, seed: int,
                           causal: bool = False) -> Tensor:
    """[blocks, blocks] bool, BigBird's pattern by blocks (Zaheer et al. 2020): query block i reads key blocks i − 1,
    i, i + 1 (the window), the first `global_blocks` blocks (whose queries read every block), and `random_blocks`
    key blocks drawn with `seed` from the rest (causal: from the blocks before i, and no block after i)."""
    index = torch.arange(n_blocks)
    pattern = (index[:, None] - index[None, :]).abs() <= 1
    pattern[:, :global_blocks] = True
    pattern[:global_blocks, :] = True
    if causal:
        pattern &= index[:, None] >= index[None, :]
    if random_blocks:
        generator = torch.Generator().manual_seed(seed)
        for i in range(global_blocks, n_blocks):
            free = (~pattern[i]).nonzero().flatten()
            if causal:
                free = free[free < i]
            if len(free):
                pattern[i, free[torch.randperm(len(free), generator=generator)[:random_blocks]]] = True
    return pattern


def bigbird_mask(n_queries: int, n_keys: int, block: int, global_blocks: int, random_blocks: int, seed: int,
                 causal: bool = False, device=None) -> Tensor:
    """[Tq, Tk] bool, BigBird's block pattern by places (the queries the last Tq of Tk places), the causal mask in it
    when causal."""
    pattern = bigbird_blocks_pattern(-(-n_keys // block), global_blocks, random_blocks, seed, causal)
    place = torch.arange(n_keys) // block
    mask = pattern[place[n_keys - n_queries:]][:, place]
    if causal:
        mask &= causal_mask(n_queries, n_keys)
    return mask.to(device)


def bigbird_blocks(q: Tensor, k: Tensor, v: Tensor, pattern: Tensor, block: int, causal: bool, scale: float) -> Tensor:
    """Eq. 2.1 under BigBird's block pattern (pattern [blocks, blocks], bigbird_blocks_pattern) in time and memory
    linear in T: each query block gathers only the key blocks it reads, [B, H_kv, blocks, width·block, d], and the
    global query blocks, which read every block, run as dense rows. q, k, v: [B, H(_kv), T, d], one text's T places
    (no cache, no padding); causal adds the causal mask inside the blocks."""
    batch, n_heads, n, d = q.shape
    n_kv, group = k.shape[1], q.shape[1] // k.shape[1]
    n_blocks = pattern.shape[0]
    padded = n_blocks * block
    pattern = pattern.to(q.device)
    place = torch.arange(padded, device=q.device) // block
    reads = pattern.sum(-1)                                            # [n_blocks] key blocks per query block
    dense = reads == n_blocks                                          # query blocks that read every key block
    out = q.new_empty(q.shape)
    rows_dense = dense[place[:n]]
    if rows_dense.any():
        allowed = causal_mask(n, n, q.device)[rows_dense] if causal else None
        out[:, :, rows_dense] = attention(q[:, :, rows_dense], k, v, allowed, False, scale)[0]
    sparse = (~dense).nonzero().flatten()
    if len(sparse) == 0:
        return out
    width = int(reads[sparse].max())
    # the key blocks each sparse query block reads, first; padded with blocks it does not read, masked below
    order = torch.sort((~pattern[sparse]).to(torch.int8), dim=-1, stable=True).indices[:, :width]     # [S, w]
    valid = torch.gather(pattern[sparse], 1, order)                                                 # [S, w]
    pad = padded - n
    k_blocks = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(batch, n_kv, n_blocks, block, d)
    v_blocks = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(batch, n_kv, n_blocks, block, d)
    k_read = k_blocks[:, :, order].reshape(batch, n_kv, len(sparse), width * block, d)
    v_read = v_blocks[:, :, order].reshape(batch, n_kv, len(sparse), width * block, d)
    offsets = torch.arange(block, device=q.device)
    key_place = (order[:, :, None] * block + offsets).reshape(len(sparse), -1)                     # [S, w·b]
    query_place = sparse[:, None] * block + offsets                                                  # [S, b]
    mask = valid.repeat_interleave(block, dim=1)[:, None, :] & (key_place < n)[:, None, :]         # [S, 1, w·b]
    if causal:
        mask = mask & (key_place[:, None, :] <= query_place[:, :, None])                            # [S, b, w·b]
    mask = mask.expand(len(sparse), block, width * block)
    mask = mask | ~mask.any(-1, keepdim=True)       # padded query rows read something; their output is dropped
    q_blocks = torch.nn.functional.pad(q, (0, 0, 0, pad)).view(batch, n_heads, n_blocks, block, d)[:, :, sparse]
    # query head h reads key/value head h // group: [B, H_kv, S, group·b, d]
    q_read = q_blocks.reshape(batch, n_kv, group, len(sparse), block, d).transpose(2, 3)
    q_read = q_read.reshape(batch, n_kv, len(sparse), group * block, d)
    z = torch.nn.functional.scaled_dot_product_attention(q_read, k_read, v_read, attn_mask=mask.repeat(1, group, 1),
                                                         scale=scale)
    z = z.view(batch, n_kv, len(sparse), group, block, d).transpose(2, 3)
    z = z.reshape(batch, n_heads, len(sparse) * block, d)
    sparse_rows = (~rows_dense).nonzero().flatten()
    out[:, :, sparse_rows] = z[:, :, :len(sparse_rows)]
    return out


# ---- Performer (FAVOR+) ----

def orthogonal_features(n_features: int, d: int, seed: int, device=None) -> Tensor:
    """ω [m, d]: blocks of d orthogonal rows (QR of a Gaussian matrix), each row rescaled to the norm of a Gaussian
    vector so every row is still distributed as N(0, I_d) (FAVOR+'s positive orthogonal random features)."""
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(-(-n_features // d), d, d, generator=generator, dtype=torch.float64)
    orthonormal, triangular = torch.linalg.qr(gaussian)                                  # [blocks, d, d] at once
    orthonormal = orthonormal * torch.sign(torch.diagonal(triangular, dim1=-2, dim2=-1))[:, None, :]  # Haar signs
    omega = orthonormal.transpose(-1, -2).reshape(-1, d)[:n_features]
    norms = torch.randn(n_features, d, generator=generator, dtype=torch.float64).norm(dim=-1)
    return (omega * norms[:, None]).to(device=device, dtype=torch.float32)


def favor_features(q: Tensor, k: Tensor, scale: float, n_features: int, seed: int,
                   stabilise: bool = True) -> tuple[Tensor, Tensor]:
    """φ(q) [B, H, Tq, m] and φ(k) [B, H_kv, Tk, m], float32, with E[φ(q)·φ(k)] = exp(q·k·scale) up to one constant
    per head (which the normalisation cancels): φ(x) = exp(ω·x − |x|²/2) / √m at x = q·√scale and k·√scale. A query's
    largest exponent is taken out of its row and the keys' largest out of all keys, so nothing overflows (stabilise;
    without it E[φ(q)·φ(k)] = exp(q·k·scale) exactly)."""
    omega = orthogonal_features(n_features, q.shape[-1], seed, q.device)              # [m, d]
    root = math.sqrt(scale)
    qs, ks = q.float() * root, k.float() * root
    q_proj, k_proj = qs @ omega.T, ks @ omega.T                                         # [B, H, T, m]
    q_exp = q_proj - qs.pow(2).sum(-1, keepdim=True) / 2
    k_exp = k_proj - ks.pow(2).sum(-1, keepdim=True) / 2
    if stabilise:
        q_exp, k_exp = q_exp - q_exp.amax(-1, keepdim=True), k_exp - k_exp.amax((-1, -2), keepdim=True)
    q_f, k_f = q_exp.exp() / math.sqrt(n_features), k_exp.exp() / math.sqrt(n_features)
    return q_f, k_f


def performer_attention(q_f: Tensor, k_f: Tensor, v: Tensor, allowed: Tensor | None, is_causal: bool,
                        return_probs: bool = False, chunk: int = 128) -> tuple[Tensor, Tensor | None]:
    """softmax(QKᵀs)V ≈ D⁻¹ φ(Q)(φ(K)ᵀV), D = diag(φ(Q)(φ(K)ᵀ1)). Without a mask it never forms a [Tq, Tk] matrix:
    bidirectional, φ(K)ᵀV [m, d] once; causal, the prefix sums Σ_{j≤i} φ(k_j)v_jᵀ a chunk at a time (inside a chunk
    its own [chunk, chunk] triangle), linear in T. Under any other mask (padding, a window), for fewer queries than
    keys under the causal mask (the last Tq of Tk places), or when the weights are wanted it forms the weights A_ij = φ(q_i)·φ(k_j) over the allowed keys, normalised per row."""
    group = q_f.shape[1] // k_f.shape[1]
    if group > 1:
        k_f, v = k_f.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    values = v.float()
    if return_probs or allowed is not None or (is_causal and q_f.shape[-2] != k_f.shape[-2]):
        weights = q_f @ k_f.transpose(-1, -2)                                           # [B, H, Tq, Tk]
        if is_causal:
            weights = weights.masked_fill(~causal_mask(q_f.shape[-2], k_f.shape[-2], q_f.device), 0.0)
        if allowed is not None:
            weights = weights.masked_fill(~allowed, 0.0)
        probs = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
        return (probs @ values).to(v.dtype), probs
    if not is_causal:
        state = k_f.transpose(-1, -2) @ values                                           # [B, H, m, d]
        norm = q_f @ k_f.sum(-2)[..., None]                                              # [B, H, Tq, 1]
        return ((q_f @ state) / norm.clamp_min(1e-30)).to(v.dtype), None
    n = q_f.shape[-2]
    state = q_f.new_zeros(*q_f.shape[:2], q_f.shape[-1], values.shape[-1])              # Σ φ(k_j) v_jᵀ [B, H, m, d]
    total = q_f.new_zeros(*q_f.shape[:2], q_f.shape[-1])                                 # Σ φ(k_j) [B, H, m]
    out = values.new_empty(*q_f.shape[:3], values.shape[-1])
    triangle = causal_mask(min(chunk, n), min(chunk, n), q_f.device)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        qc, kc, vc = q_f[:, :, start:stop], k_f[:, :, start:stop], values[:, :, start:stop]
        inside = (qc @ kc.transpose(-1, -2)).masked_fill_(~triangle[:stop - start, :stop - start], 0.0)
        numerator = qc @ state + inside @ vc
        denominator = qc @ total[..., None] + inside.sum(-1, keepdim=True)
        out[:, :, start:stop] = numerator / denominator.clamp_min(1e-30)
        state = state + kc.transpose(-1, -2) @ vc
        total = total + kc.sum(-2)
    return out.to(v.dtype), None


# ---- Linformer ----

def linformer_projection(rank: int, n: int, seed: int, device=None) -> Tensor:
    """E [rank, n], the paper's fixed Gaussian projection along the sequence, E_ij ~ N(0, 1/rank)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rank, n, generator=generator) / math.sqrt(rank)).to(device)


def linformer_attention(q: Tensor, k: Tensor, v: Tensor, e: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    """softmax(Q(EK)ᵀs)(EV): each query weighs rank mixed rows. Padded keys (no query reads them) are zeroed before
    the projection. e [rank, Tk]; q [B, H, Tq, d], k, v [B, H_kv, Tk, d]."""
    if allowed is not None:
        real = allowed.any(-2, keepdim=True).transpose(-1, -2)                           # [B, 1, Tk, 1]
        k, v = k * real, v * real
    k_mixed, v_mixed = e.to(k.dtype) @ k, e.to(v.dtype) @ v                               # [B, H_kv, rank, d]
    return attention(q, k_mixed, v_mixed, None, False, scale)[0]


@torch.no_grad()
def fit_linformer(model, texts: list[Tensor], rank: int) -> dict[int, Tensor]:
    """Linformer's E fitted to the model's own keys and values, one per layer, by least squares: over the texts
    (token ids [T] each) and every key/value head, M = [K | V] ∈ R^{T × 2d}, E is the rank-r orthonormal basis of
    positions (rows of E) that minimises Σ ‖M − EᵀE·M‖², the top r eigenvectors of Σ M·Mᵀ (a text shorter than the
    longest contributes zeros past its end). An eigenvector's sign is the solver's choice, yet E·K's sign changes
    what the softmax reads, so each row is signed to sum ≥ 0: the fit is one E wherever it runs.
    Returns {layer: E [rank, n_max]}."""
    if len(texts) == 0:
        raise ValueError("fit_linformer needs at least one text (token ids [T]) to fit to")
    n_max = max(len(t) for t in texts)
    if rank > n_max:
        raise ValueError(f"rank {rank} is above the {n_max} positions the texts cover: E [rank, n_max] has at most "
                         f"{n_max} orthonormal rows")
    moments = {}
    for ids in texts:
        out = model(ids.reshape(1, -1).to(model.device), record=("k", "v"))
        for layer, (k, v) in enumerate(zip(out.records["k"], out.records["v"])):
            m = torch.cat([k[0], v[0]], dim=-1).double().transpose(0, 1)              # [H_kv, T, 2d]
            gram = torch.zeros(n_max, n_max, dtype=torch.float64)
            gram[:m.shape[1], :m.shape[1]] = (m @ m.transpose(-1, -2)).sum(0).cpu()
            moments[layer] = moments.get(layer, 0) + gram
    fitted = {}
    for layer, gram in moments.items():
        _, vectors = torch.linalg.eigh(gram)
        e = vectors[:, -rank:].flip(-1).T                                               # [rank, n_max]
        e = e * torch.where(e.sum(-1, keepdim=True) < 0, -1.0, 1.0)
        fitted[layer] = e.float().contiguous()
    return fitted


def head_errors(exact_out: Tensor, approx_out: Tensor, exact_probs: Tensor | None, approx_probs: Tensor | None,
                query_mask: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
    """Each head's error, [B, H] each: the mean over real queries of the total variation ½Σ_j|p̂_ij − p_ij| of its
    rows (None without weights), and the relative error ‖ẑ − z‖ / ‖z‖ of its output over real queries.
    outputs [B, H, Tq, d]; probs [B, H, Tq, Tk]; query_mask [B, Tq] (False on padding) or None."""
    weight = torch.ones(exact_out.shape[0], exact_out.shape[2], device=exact_out.device) if query_mask is None \
        else query_mask.float()
    w = weight[:, None, :]                                                               # [B, 1, Tq]
    diff = (approx_out.float() - exact_out.float()).pow(2).sum(-1)                      # [B, H, Tq]
    size = exact_out.float().pow(2).sum(-1)
    z_error = ((diff * w).sum(-1) / (size * w).sum(-1).clamp_min(1e-30)).sqrt()
    tv = None
    if exact_probs is not None and approx_probs is not None:
        rows = 0.5 * (approx_probs.float() - exact_probs.float()).abs().sum(-1)          # [B, H, Tq]
        tv = (rows * w).sum(-1) / w.sum(-1).clamp_min(1)
    return tv, z_error

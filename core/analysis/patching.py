"""What carries the answer: activation patching, direct logit attribution and the information-flow graph.

All three explain one next-token prediction of a decoder through the metric logit(answer) − logit(foil) at the
last position (answer and foil are token ids), and all three read the forward pass's records (core/probe.py).

- patch_sweep: run a corrupted prompt with one activation taken from the clean run (denoising), or the clean
  run with one from the corrupted run (noising), for every layer × position or layer × head, and report how
  much of the clean metric comes back. It shows a sufficient path on this pair, not the only one.
- logit_attribution: the final residual stream is a sum of the embeddings, every head's output and every MLP's
  output (Pre-LN, sequential or parallel blocks); with the final norm's scale frozen at its value on this input,
  the metric splits into one exact part per head and per MLP. Sandwich norms (Gemma 2/3) put a norm on the
  attention's output: each head's part passes it frozen at its input too. A final soft-cap c·tanh(·/c) (Gemma 2)
  is no sum: the split is of the metric before the cap, and the capped metric is its own stage.
- flow_graph: the contribution graph of Ferrando & Voita (2024, "Information Flow Routes"): each residual state
  is a sum of parts (its residual input, each head's contribution from each earlier token, the MLP's output),
  each part weighted by its proximity to the sum; a token→token attention edge adds its heads' weights, and the
  graph keeps the edges at or above a threshold, walking down from the prediction. A parallel block (GPT-NeoX)
  is one sum of all its parts; a sandwich post-norm (Gemma 2/3) is frozen at its input (see FlowGraph).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..probe import Patch, Probe

SITES = ("resid_pre", "attn_out", "mlp_out", "z")
MODES = ("denoise", "noise")
SWEEP_TOKENS = 4096  # patched rows × resumed positions per batch: bounds a sweep's memory on long prompts


def check_decoder(model, what: str) -> None:
    if model.encoder is not None or model.lm_head is None or not model.config.causal:
        raise ValueError(f"{what} explains a next-token prediction: it needs a decoder-only model with an LM head "
                         f"(this {model.config.model_type or model.config.family} model is an encoder or an "
                         "encoder-decoder)")


def check_token(model, token: int, name: str) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < model.config.vocab_size:
        raise ValueError(f"{name} must be a token id in 0..{model.config.vocab_size - 1}, got {token!r}")
    return token


def metric(model, hidden: Tensor, answer: int, foil: int) -> Tensor:
    """logit(answer) − logit(foil) at the last position of hidden [B, T, d] → [B] float32: the logits of that
    position alone, [B, vocab], never the whole text's."""
    logits = model.logits(hidden[:, -1:])[:, 0].float()
    return logits[:, answer] - logits[:, foil]


# ---- activation patching ----

@dataclass
class PatchSweep:
    site: str
    mode: str
    layer: int | None           # the layer a "z" sweep over heads × positions is at, else None
    scores: Tensor              # normalised: 1 is the clean run's metric, 0 the corrupted run's
    metrics: Tensor             # logit(answer) − logit(foil) of each patched run, the same shape
    clean_metric: float
    corrupted_metric: float
    computed: int               # cells that needed a pass; the rest write the value already there

    @property
    def axes(self) -> tuple[str, str]:
        """What the rows and columns of `scores` are."""
        if self.site != "z":
            return "layer", "position"
        return ("head", "position") if self.layer is not None else ("layer", "head")


@dataclass
class Cell:
    index: tuple[int, int]      # where its score goes
    layer: int                  # the layer whose activation is patched
    where: Tensor               # bool, the record's layout without the batch: [T, 1] or [T, H, 1]
    first: int                  # the first position the patch changes (everything before is as in the target)


def sweep_cells(site: str, layer: int | None, source: tuple[Tensor, ...], target: tuple[Tensor, ...],
                n_layers: int, n_heads: int) -> tuple[list[Cell], tuple[int, int], int]:
    """The sweep's cells whose patch changes something, its shape, and the count of cells that change nothing
    (the source and target activations there are equal: under a causal mask, every position before the first
    token that differs)."""
    n = source[0].shape[1]
    cells, total = [], 0
    layers = range(n_layers) if layer is None else [layer]
    for l in layers:
        differs = source[l][0] != target[l][0]            # [T, d] or [T, H, d_head]
        if site == "z" and layer is None:                 # each head at every position
            changed = differs.any(-1)                      # [T, H]
            for h in range(n_heads):
                total += 1
                rows = changed[:, h].nonzero()
                if len(rows):
                    where = torch.zeros(n, n_heads, 1, dtype=torch.bool)
                    where[:, h] = True
                    cells.append(Cell((l, h), l, where, int(rows[0])))
            continue
        changed = differs.flatten(1).any(-1) if site != "z" else differs.any(-1)   # [T] or [T, H]
        for p in range(n):
            heads = range(n_heads) if site == "z" else [None]
            for h in heads:
                total += 1
                if not (changed[p] if h is None else changed[p, h]):
                    continue
                if h is None:
                    where = torch.zeros(n, 1, dtype=torch.bool)
                    where[p] = True
                    cells.append(Cell((l, p), l, where, p))
                else:
                    where = torch.zeros(n, n_heads, 1, dtype=torch.bool)
                    where[p, h] = True
                    cells.append(Cell((h, p), l, where, p))
    shape = (n_heads, n) if site == "z" and layer is not None else (n_layers, n_heads if site == "z" else n)
    return cells, shape, total - len(cells)


class PrefixCache:
    """The target run's keys and values before position `start`, read by every resumed row: a read-only KV cache
    (what Attention and run_stack use of one: write, length, advance, cross). Rows keep their own keys from
    `start` on, so the batch may grow from one layer to the next."""

    def __init__(self, keys: tuple[Tensor, ...], values: tuple[Tensor, ...], start: int):
        # records are [1, T, H_kv, d_head]; attention reads [B, H_kv, T, d_head]
        self.keys = [k[:, :start].transpose(1, 2) for k in keys]
        self.values = [v[:, :start].transpose(1, 2) for v in values]
        self.length, self.cross = start, [None] * len(keys)

    def write(self, layer: int, k: Tensor, v: Tensor, slot: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rows = k.shape[0]
        return (torch.cat([self.keys[layer].expand(rows, -1, -1, -1), k], 2),
                torch.cat([self.values[layer].expand(rows, -1, -1, -1), v], 2))

    def advance(self, n: int) -> None:
        pass


def resumed_metrics(model, cells: list[Cell], site: str, source: tuple[Tensor, ...], target: dict,
                    answer: int, foil: int) -> Tensor:
    """The metric of each cell's patched run (cells sorted by layer), as one batch that grows layer by layer:
    a cell's row joins at the layer it patches, as the target run's residual stream entering that layer (the
    layers before it are the target run's), so the stack runs once for all of them. Every row starts at the
    cells' first changed position `start`: the keys and values before it are the target run's records."""
    cfg, ids = model.config, target["ids"]
    start = min(cell.first for cell in cells)
    prefix = PrefixCache(target["k"], target["v"], start) if start > 0 else None
    x = None
    for layer in range(cells[0].layer, cfg.n_layers):
        joining = [cell for cell in cells if cell.layer == layer]
        probe = None
        if joining:
            resid = target["resid_pre"][layer][:, start:].expand(len(joining), -1, -1)
            x = resid if x is None else torch.cat([x, resid])
            where = torch.zeros(x.shape[0], *joining[0].where[start:].shape, dtype=torch.bool)
            where[-len(joining):] = torch.stack([cell.where[start:] for cell in joining])
            patch = Patch(site, layer, source[layer][:, start:], where.to(model.device))
            probe = Probe(cfg, patches=[patch])
        last = layer == cfg.n_layers - 1                   # the last block, then the final norm
        x = model.run_stack(model.stack, ids[:, start:].expand(x.shape[0], -1), None, kind="self", causal=True,
                            probe=probe, cache=prefix, start_layer=layer, n_layers=None if last else layer + 1,
                            resid=x)
    return metric(model, x, answer, foil)


def patch_sweep(model, clean_ids: Tensor, corrupted_ids: Tensor, answer: int, foil: int, site: str,
                mode: str = "denoise", layer: int | None = None, batch_tokens: int = SWEEP_TOKENS,
                progress=None) -> PatchSweep:
    """Activation patching of one site over every layer × position (resid_pre, attn_out, mlp_out), layer × head
    (z: each head's output at all positions) or, with layer given, head × position (z).

    clean_ids, corrupted_ids [1, T]: the same length. mode "denoise" writes clean activations into the corrupted
    run, "noise" corrupted ones into the clean run. Cells whose activation is the same in both runs are not run
    (patching them writes what is there). The rest go in batches of at most `batch_tokens` rows × positions
    (see resumed_metrics), never one whole pass per patch. progress(done, total) after each batch."""
    check_decoder(model, "patching")
    cfg = model.config
    answer, foil = check_token(model, answer, "answer"), check_token(model, foil, "foil")
    if site not in SITES:
        raise ValueError(f"site must be one of {', '.join(SITES)}, got {site!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be 'denoise' or 'noise', got {mode!r}")
    if layer is not None and site != "z":
        raise ValueError(f"layer= sweeps one layer's heads × positions: it applies to site 'z' only, not {site!r}")
    if layer is not None and not 0 <= layer < cfg.n_layers:
        raise IndexError(f"layer {layer} is out of range: the model has layers 0..{cfg.n_layers - 1}")
    if clean_ids.shape != corrupted_ids.shape or clean_ids.dim() != 2 or clean_ids.shape[0] != 1:
        raise ValueError(f"the clean and corrupted prompts must be [1, T] with the same T; got "
                         f"{list(clean_ids.shape)} and {list(corrupted_ids.shape)}")
    record = {"resid_pre", "k", "v", site}
    runs = {}
    with torch.inference_mode():
        for name, ids in (("clean", clean_ids), ("corrupted", corrupted_ids)):
            out = model(ids.to(model.device), record=record, return_logits=False)
            runs[name] = dict(out.records, metric=metric(model, out.hidden_states, answer, foil).item(),
                              ids=ids.to(model.device))
        clean, corrupted = runs["clean"]["metric"], runs["corrupted"]["metric"]
        if clean == corrupted:
            raise ValueError(f"the clean and corrupted runs give the same logit difference ({clean:.4g}): "
                             "choose an answer and a foil that tell them apart")
        source, target = (runs["clean"], runs["corrupted"]) if mode == "denoise" else (runs["corrupted"], runs["clean"])
        cells, shape, unchanged = sweep_cells(site, layer, source[site], target[site], cfg.n_layers, cfg.n_heads)
        metrics = torch.full(shape, target["metric"])
        total, done = len(cells) + unchanged, unchanged
        cells.sort(key=lambda cell: (cell.layer, cell.first))
        n = clean_ids.shape[1]
        i = 0
        while i < len(cells):    # a batch holds rows × (n − start) ≤ batch_tokens
            j, start = i, cells[i].first
            while j < len(cells) and (j + 1 - i) * (n - min(start, cells[j].first)) <= max(batch_tokens, n):
                start = min(start, cells[j].first)
                j += 1
            chunk = cells[i:j]
            values = resumed_metrics(model, chunk, site, source[site], target, answer, foil)
            for cell, value in zip(chunk, values.tolist()):
                metrics[cell.index] = value
            done += len(chunk)
            i = j
            if progress is not None:
                progress(done, total)
    scores = (metrics - corrupted) / (clean - corrupted)
    return PatchSweep(site, mode, layer, scores, metrics, clean, corrupted, len(cells))


# ---- direct logit attribution ----

@dataclass
class LogitAttribution:
    answer: int
    foil: int
    position: int
    heads: Tensor               # [L, H] each head's direct part of logit(answer) − logit(foil)
    mlps: Tensor                # [L]
    embeddings: float           # the token (and position) embeddings' part
    biases: float               # the attention output biases (through any post-norm), the norms' β, the LM head's bias
    total: float                # logit(answer) − logit(foil) before any final soft-cap: what the parts add up to
    capped: float | None = None     # the model's own difference after its final soft-cap (Gemma 2), else None
    softcap: float | None = None    # the cap c of that stage, c·tanh(logit / c)
    post_norm: bool = False     # sandwich norms: each head's part passed the attention post-norm frozen at its input

    @property
    def rest(self) -> float:
        return self.embeddings + self.biases

    @property
    def parts_sum(self) -> float:
        return self.heads.sum().item() + self.mlps.sum().item() + self.rest

    @property
    def model_total(self) -> float:
        """logit(answer) − logit(foil) as the model gives it: after the cap where there is one."""
        return self.total if self.capped is None else self.capped


def check_pre_norm(model, what: str) -> None:
    cfg = model.config
    if cfg.norm_placement != "pre" or model.lm_head.dense is not None:
        raise ValueError(f"{what} reads the residual stream as a sum of parts: it needs Pre-LN blocks "
                         f"(x + f(norm(x))), and this {cfg.model_type or cfg.family} model is Post-LN: the norm "
                         "after each block, norm(x + f(x)), mixes the parts, so no part has a share of its own")


def unembedding(model) -> tuple[Tensor, Tensor | None]:
    """W_U [vocab, d] and the LM head's bias [vocab] (or None)."""
    head = model.lm_head
    return (model.stack.embed.tokens.weight if head.weight is None else head.weight), head.bias


def head_outputs(model, layer: int, z: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """What each head writes into the residual stream at one position, from z [H, d_head]: the parts
    [H, d] z_h·W_O[h], the output bias's part [d] (or None) and the post-norm's β (or None), all float32.
    They add up to the layer's attn_out. With a sandwich post-norm (Gemma 2/3) attn_out = post_norm(u),
    u = Σ_h z_h·W_O[h] + b_O: every part passes the post-norm frozen at u (Norm.frozen), post_norm(u) =
    frozen(u)(u) + β, so the sum still holds exactly."""
    w = model.head_weights(layer)
    parts = torch.einsum("hk,hkd->hd", z.float(), w.W_O.float())                         # [H, d]
    bias = None if w.b_O is None else w.b_O.float()
    post = model.stack.blocks[layer].attn_post_norm
    if post is None:
        return parts, bias, None
    u = parts.sum(0) + (bias if bias is not None else 0)                                 # [d], post-norm's input
    frozen = post.frozen(u)
    return frozen(parts), (None if bias is None else frozen(bias)), (None if post.bias is None else post.bias.float())


def logit_attribution(model, ids: Tensor, answer: int, foil: int, position: int = -1) -> LogitAttribution:
    """Direct logit attribution of logit(answer) − logit(foil) at `position` of ids [1, T]: each head's output
    z_h·W_O[h] (through a sandwich post-norm frozen at its input, see head_outputs), each MLP's output and the
    embeddings, read through the final norm with its scale frozen at its value on this input and projected on
    W_U[answer] − W_U[foil]. The parts add up to the total exactly. A final soft-cap (Gemma 2) is a tanh of each
    logit, not a sum: `total` is the difference before the cap, and `capped` the model's own after it."""
    check_decoder(model, "direct logit attribution")
    check_pre_norm(model, "direct logit attribution")
    cfg = model.config
    answer, foil = check_token(model, answer, "answer"), check_token(model, foil, "foil")
    n = ids.shape[1]
    if not -n <= position < n:
        raise IndexError(f"position {position} is out of range: the text has positions 0..{n - 1}")
    position %= n
    with torch.inference_mode():
        out = model(ids.to(model.device), record={"resid_pre", "z", "mlp_out", "resid_post"}, return_logits=False)
        rec = out.records
        W_U, b_U = unembedding(model)
        head = model.lm_head
        # the two logits before the final cap, as LMHead computes them: (h·scale)·W_Uᵀ + b_U
        hidden = out.hidden_states[0, position].float() * head.scale                     # [d]
        raw = W_U[[answer, foil]].float() @ hidden + (0 if b_U is None else b_U[[answer, foil]].float())   # [2]
        capped = None if head.softcap is None else head.capped(raw)
        direction = (W_U[answer] - W_U[foil]).float() * head.scale                       # [d]
        final = model.stack.final_norm
        frozen = final.frozen(rec["resid_post"][-1][0, position]) if final is not None else (lambda c: c.float())
        part = lambda c: frozen(c) @ direction                                           # noqa: E731  [..., d] → [...]
        heads, biases = [], 0.0
        for l in range(cfg.n_layers):
            per_head, bias, beta = head_outputs(model, l, rec["z"][l][0, position])      # [H, d], [d], [d]
            heads.append(part(per_head))
            for vector in (bias, beta):
                if vector is not None:
                    biases += part(vector).item()
        mlps = torch.stack([part(rec["mlp_out"][l][0, position]) for l in range(cfg.n_layers)])
        if final is not None and final.bias is not None:
            biases += (final.bias.float() @ direction).item()
        if b_U is not None:
            biases += (b_U[answer] - b_U[foil]).item()
        embeddings = part(rec["resid_pre"][0][0, position]).item()
    return LogitAttribution(answer, foil, position, torch.stack(heads).cpu(), mlps.cpu(), embeddings, biases,
                            (raw[0] - raw[1]).item(), None if capped is None else (capped[0] - capped[1]).item(),
                            head.softcap, model.stack.blocks[0].attn_post_norm is not None)


# ---- the information-flow graph ----

@dataclass
class FlowEdge:
    kind: str                   # "attention" (source token → target token through one layer's heads), "mlp", "residual"
    layer: int
    head: int | None            # attention: the head with the largest part of the edge, else None
    source: int                 # token positions
    target: int
    level: int                  # the target's level; the source is at level − 1
    importance: float
    heads: tuple[tuple[int, float], ...] = ()   # attention: (head, its part) for every part > 0, largest first


@dataclass
class FlowGraph:
    """Levels: 2l is the residual stream entering layer l, 2l + 1 the same after its attention, 2L the output of
    the last layer. An attention edge goes from (2l, j) to (2l + 1, i), an MLP edge from (2l + 1, i) to
    (2l + 2, i), and residual edges join the same token on neighbouring levels. The i → i attention edge (what
    the heads carry from token i itself) is apart from the residual edge i → i.

    Parallel blocks (GPT-NeoX, `parallel`): attention and the MLP both read the block's input x, and no state
    lies between them. The block is one sum y_i = x_i + Σ_h Σ_j a_hij·(v_hj W_O^h) + b_O + mlp_i whose parts
    (the residual x_i, every (head, source) and the MLP's output) are normalised together. Level 2l + 1 is then
    the block's output y: the residual, attention and MLP edges all go from level 2l to 2l + 1 (`mlp` holds the
    MLP's importance in that sum, so attn_residual + heads + mlp add up to 1), and level 2l + 2 is the same
    state again, joined to 2l + 1 by residual edges of importance 1 (`mlp_residual` is 1)."""
    position: int
    n_layers: int
    heads: Tensor               # [L, H, T, T] importance of head h's part from key j in target i's sum
    attn_residual: Tensor       # [L, T] importance of the residual input in the sum after attention
    mlp: Tensor                 # [L, T] importance of the MLP's output in the layer's output
    mlp_residual: Tensor        # [L, T]
    threshold: float = 0.0
    edges: list[FlowEdge] = field(default_factory=list)
    parallel: bool = False      # parallel blocks: one sum per block (see above)

    @property
    def tokens(self) -> Tensor:
        """[L, T, T] the importance of each attention edge j → i: the sum of its heads' parts."""
        return self.heads.sum(1)

    @property
    def nodes(self) -> set[tuple[int, int]]:
        """(level, token) of every node on a kept edge, and the prediction's own."""
        found = {(2 * self.n_layers, self.position)}
        for e in self.edges:
            found |= {(e.level - 1, e.source), (e.level, e.target)}
        return found

    def head_parts(self, layer: int, target: int, source: int) -> tuple[tuple[int, float], ...]:
        """(head, part) of one attention edge, every part > 0, largest first."""
        parts = self.heads[layer, :, target, source]
        order = parts.argsort(descending=True, stable=True).tolist()
        return tuple((h, float(parts[h])) for h in order if parts[h] > 0)

    def pruned(self, threshold: float) -> FlowGraph:
        """The edges of importance ≥ threshold reachable from the prediction, walking down level by level."""
        edges, frontier, tokens = [], {self.position}, self.tokens
        for level in range(2 * self.n_layers, 0, -1):
            layer, below = (level - 1) // 2, set()
            for t in sorted(frontier):
                if level % 2:   # the sum after attention: the residual input, and each token j ≤ t through the heads
                    if float(self.attn_residual[layer, t]) >= threshold:
                        edges.append(FlowEdge("residual", layer, None, t, t, level, float(self.attn_residual[layer, t])))
                        below.add(t)
                    for j in (tokens[layer, t] >= threshold).nonzero()[:, 0].tolist():
                        parts = self.head_parts(layer, t, j)
                        edges.append(FlowEdge("attention", layer, parts[0][0] if parts else None, j, t, level,
                                              float(tokens[layer, t, j]), parts))
                        below.add(j)
                    if self.parallel and float(self.mlp[layer, t]) >= threshold:   # the MLP reads the block's input
                        edges.append(FlowEdge("mlp", layer, None, t, t, level, float(self.mlp[layer, t])))
                        below.add(t)
                elif self.parallel:   # the block's output once more: the same state, importance 1
                    edges.append(FlowEdge("residual", layer, None, t, t, level, float(self.mlp_residual[layer, t])))
                    below.add(t)
                else:           # the layer's output: the sum after attention and the MLP's output
                    for kind, importance in (("residual", self.mlp_residual[layer, t]), ("mlp", self.mlp[layer, t])):
                        if float(importance) >= threshold:
                            edges.append(FlowEdge(kind, layer, None, t, t, level, float(importance)))
                            below.add(t)
            frontier = below
        return FlowGraph(self.position, self.n_layers, self.heads, self.attn_residual, self.mlp,
                         self.mlp_residual, threshold, edges, self.parallel)


def proximity(part: Tensor, total: Tensor) -> Tensor:
    """max(‖y‖₁ − ‖y − c‖₁, 0) of parts c [..., d] of the sum y [..., d] (broadcast): how much closer to y the
    part is than nothing at all; a part that moves away from y counts 0."""
    return (total.abs().sum(-1) - (total - part).abs().sum(-1)).clamp_min(0)


def attention_importance(x: Tensor, vo: Tensor, probs: Tensor, y: Tensor, rows: int = 16, post=None,
                         u: Tensor | None = None, mlp: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """One layer's attention sums y_i = x_i + Σ_h Σ_j a_hij·vo_hj (+ b_O) (+ mlp_i in a parallel block), as
    proximities normalised over the parts x_i, every (h, j) and mlp_i: heads [H, T, T] (target i, source j),
    residual [T] and mlp [T] (or None). The output bias b_O is in y but is not a part. x, y [T, d]; vo [H, T, d]
    each head's value through W_O; probs [H, T, T]. With a sandwich post-norm `post` (a Norm), each (h, j) part
    passes it frozen at its input u_i [T, d] (Norm.frozen): post(u_i) = frozen(u_i)(u_i) + β, so the frozen parts,
    with b_O's and β, add up to the attention's output. Target rows go `rows` at a time, so [H, rows, T, d] is
    the largest tensor."""
    heads = torch.empty_like(probs)
    for i in range(0, x.shape[0], rows):
        block = probs[:, i:i + rows, :, None] * vo[:, None]              # [H, r, T, d]
        if post is not None:
            block = post.frozen(u[i:i + rows, None])(block)              # each row i its own divisor s_i
        heads[:, i:i + rows] = proximity(block, y[None, i:i + rows, None])
    residual = proximity(x, y)
    norm = residual + heads.sum((0, 2))
    mlp_part = None if mlp is None else proximity(mlp, y)
    if mlp_part is not None:
        norm = norm + mlp_part
    norm = norm.clamp_min(1e-30)
    return heads / norm[None, :, None], residual / norm, None if mlp_part is None else mlp_part / norm


def flow_graph(model, ids: Tensor, position: int = -1, threshold: float = 0.04) -> FlowGraph:
    """The information-flow graph of the prediction at `position` of ids [1, T] (Pre-LN decoders): every part's
    importance is its proximity to the sum it is part of, normalised over that sum's parts (the norms read by
    attention and the MLP are inside the parts, as in the paper); an attention edge j → i weighs the sum of its
    heads' parts. Then pruned at `threshold`.

    Parallel blocks (GPT-NeoX): one sum per block, x + the heads' parts + the MLP's output, see FlowGraph for the
    levels. Sandwich norms (Gemma 2/3): a head's part passes the attention's post-norm frozen at its input
    (attention_importance); the MLP's post-normed output is one part as it is. The score terms (a window, ALiBi,
    a soft-cap on the scores) are inside the attention weights a_hij and need nothing of their own."""
    check_decoder(model, "the information-flow graph")
    check_pre_norm(model, "the information-flow graph")
    cfg = model.config
    n = ids.shape[1]
    if not -n <= position < n:
        raise IndexError(f"position {position} is out of range: the text has positions 0..{n - 1}")
    if not 0 <= threshold <= 1:
        raise ValueError(f"the threshold is an importance between 0 and 1, got {threshold}")
    with torch.inference_mode():
        out = model(ids.to(model.device), record={"resid_pre", "v", "pattern", "attn_out", "mlp_out", "resid_post"},
                    return_logits=False)                                                # the graph reads no logits
        rec = out.records
        group = cfg.n_heads // cfg.n_kv_heads
        heads, attn_residual, mlp, mlp_residual = [], [], [], []
        for l in range(cfg.n_layers):
            w, block = model.head_weights(l), model.stack.blocks[l]
            x = rec["resid_pre"][l][0].float()                                          # [T, d]
            v = rec["v"][l][0].float().repeat_interleave(group, dim=1)                   # [T, H, d_head]
            vo = torch.einsum("thk,hkd->htd", v, w.W_O.float())                         # [H, T, d]
            probs = rec["pattern"][l][0].float()                                        # [H, T, T]
            u = None
            if block.attn_post_norm is not None:   # the post-norm's input: Σ_h a_h·vo_h + b_O, [T, d]
                u = torch.einsum("hij,hjd->id", probs, vo) + (0 if w.b_O is None else w.b_O.float())
            attn_out, mlp_out = rec["attn_out"][l][0].float(), rec["mlp_out"][l][0].float()
            if cfg.parallel_block:                 # one sum: y = x + attn_out + mlp_out
                y = rec["resid_post"][l][0].float()
                h, r, m = attention_importance(x, vo, probs, y, post=block.attn_post_norm, u=u, mlp=mlp_out)
                heads.append(h)
                attn_residual.append(r)
                mlp.append(m)
                mlp_residual.append(torch.ones_like(m))
                continue
            h, r, _ = attention_importance(x, vo, probs, x + attn_out, post=block.attn_post_norm, u=u)
            heads.append(h)
            attn_residual.append(r)
            mid = x + attn_out
            y = rec["resid_post"][l][0].float()
            p_mid, p_mlp = proximity(mid, y), proximity(mlp_out, y)
            norm = (p_mid + p_mlp).clamp_min(1e-30)
            mlp.append(p_mlp / norm)
            mlp_residual.append(p_mid / norm)
    graph = FlowGraph(position % n, cfg.n_layers, torch.stack(heads).cpu(), torch.stack(attn_residual).cpu(),
                      torch.stack(mlp).cpu(), torch.stack(mlp_residual).cpu(), parallel=cfg.parallel_block)
    return graph.pruned(threshold)

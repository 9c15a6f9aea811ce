"""What carries the answer: activation patching, direct logit attribution and the information-flow graph.

All three explain one next-token prediction of a decoder through the metric logit(answer) − logit(foil) at the
last position (answer and foil are token ids), and all three read the forward pass's records (core/probe.py).

- patch_sweep: run a corrupted prompt with one activation taken from the clean run (denoising), or the clean
  run with one from the corrupted run (noising), for every layer × position or layer × head, and report how
  much of the clean metric comes back. It shows a sufficient path on this pair, not the only one.
  sweep_pairs runs it on many pairs at once (left-padded), and patch_sweep is its batch of one.
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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..corpus.jobs import check_token, one_text
from ..probe import Patch, Probe

SITES = ("resid_pre", "attn_out", "mlp_out", "z")
MODES = ("denoise", "noise")
SWEEP_TOKENS = 4096  # patched rows × resumed positions per batch: bounds a sweep's memory on long prompts


def check_decoder(model, what: str) -> None:
    if model.encoder is not None or model.lm_head is None or not model.config.causal:
        raise ValueError(f"{what} explains a next-token prediction: it needs a decoder-only model with an LM head "
                         f"(this {model.config.model_type or model.config.family} model is an encoder or an "
                         "encoder-decoder)")


METRIC_ROWS = 256   # rows whose full-vocabulary logits are held at once while reading the metric


def metric(model, hidden: Tensor, answer: int | Tensor, foil: int | Tensor) -> Tensor:
    """logit(answer) − logit(foil) at the last position of hidden [B, T, d] → [B] float32; answer and foil are one
    token id for every row or one per row [B]. The logits of that position alone, METRIC_ROWS rows at a time,
    never the whole text's."""
    rows = hidden.shape[0]
    answer, foil = (torch.as_tensor(t, device=hidden.device).expand(rows) for t in (answer, foil))
    parts = []
    for i in range(0, rows, METRIC_ROWS):
        # a copy: F.linear on the strided slice [b, 1, d] takes a batched path many times slower than one matrix product
        logits = model.logits(hidden[i:i + METRIC_ROWS, -1:].contiguous())[:, 0].float()     # [b, vocab]
        picked = torch.arange(logits.shape[0], device=logits.device)
        parts.append(logits[picked, answer[i:i + METRIC_ROWS]] - logits[picked, foil[i:i + METRIC_ROWS]])
    return torch.cat(parts)


# ---- activation patching ----

@dataclass
class PatchSweep:
    site: str
    mode: str
    layer: int | None           # the layer a "z" sweep over heads × positions is at, else None
    scores: Tensor              # normalised: 1 is the clean run's metric, 0 the corrupted run's (NaN if they are equal)
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
    row: int = 0                # its pair's row in the PairBatch


@dataclass
class PairBatch:
    """Prompt pairs swept together, left-padded to one width T, so that every prompt ends at the last column, where
    the metric is read. The padding is the same token in both prompts of a pair and sees only itself, so its
    activations never differ between the two runs and no cell starts on it."""
    clean: Tensor               # [P, T] token ids
    corrupted: Tensor           # [P, T]
    answers: Tensor             # [P]
    foils: Tensor               # [P]
    mask: Tensor | None         # [P, T] bool, False on the padding; None when every pair has T tokens
    lengths: tuple[int, ...]    # each pair's own length


def pair_batch(pairs: Sequence[tuple[Tensor, Tensor, int, int]], pad: int = 0) -> PairBatch:
    """(clean [T_i], corrupted [T_i], answer, foil) of each pair → their PairBatch, padded on the left with `pad`."""
    lengths = tuple(len(clean) for clean, *_ in pairs)
    width = max(lengths)
    ids = torch.full((2, len(pairs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(pairs), width, dtype=torch.bool)
    for row, (clean, corrupted, _, _) in enumerate(pairs):
        ids[0, row, width - len(clean):], ids[1, row, width - len(clean):] = clean, corrupted
        mask[row, width - len(clean):] = True
    answers, foils = (torch.tensor([pair[k] for pair in pairs], dtype=torch.long) for k in (2, 3))
    return PairBatch(ids[0], ids[1], answers, foils, None if mask.all() else mask, lengths)


def by_position(site: str, layer: int | None) -> bool:
    """Whether a sweep's columns are token positions (every site but the layer × head sweep of z)."""
    return site != "z" or layer is not None


def sweep_shape(site: str, layer: int | None, n: int, n_layers: int, n_heads: int) -> tuple[int, int]:
    """The scores' shape on a prompt of n tokens: [H, T] (z at one layer), [L, H] (z) or [L, T]."""
    if site == "z":
        return (n_heads, n) if layer is not None else (n_layers, n_heads)
    return n_layers, n


def sweep_cells(site: str, layer: int | None, source: tuple[Tensor, ...], target: tuple[Tensor, ...],
                n_layers: int, n_heads: int, row: int = 0) -> tuple[list[Cell], int]:
    """The cells of the pair at `row` of the records whose patch changes something, and the count of cells that
    change nothing (the source and target activations there are equal: under a causal mask, every position
    before the first token that differs)."""
    n = source[0].shape[1]
    cells, total = [], 0
    layers = range(n_layers) if layer is None else [layer]
    for l in layers:
        differs = source[l][row] != target[l][row]        # [T, d] or [T, H, d_head]
        if site == "z" and layer is None:                 # each head at every position
            changed = differs.any(-1)                      # [T, H]
            for h in range(n_heads):
                total += 1
                rows = changed[:, h].nonzero()
                if len(rows):
                    where = torch.zeros(n, n_heads, 1, dtype=torch.bool)
                    where[:, h] = True
                    cells.append(Cell((l, h), l, where, int(rows[0]), row))
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
                    cells.append(Cell((l, p), l, where, p, row))
                else:
                    where = torch.zeros(n, n_heads, 1, dtype=torch.bool)
                    where[p, h] = True
                    cells.append(Cell((h, p), l, where, p, row))
    return cells, total - len(cells)


class PrefixCache:
    """The target run's keys and values before position `start`, read by every resumed row: a read-only KV cache
    (what Attention and run_stack use of one: write, length, key_mask, advance, cross). Rows keep their own keys
    from `start` on, so the batch may grow from one layer to the next; select() says which pair each row is of."""

    def __init__(self, keys: tuple[Tensor, ...], values: tuple[Tensor, ...], start: int):
        # records are [P, T, H_kv, d_head]; attention reads [B, H_kv, T, d_head]
        self.keys = [k[:, :start].transpose(1, 2) for k in keys]
        self.values = [v[:, :start].transpose(1, 2) for v in values]
        self.length, self.cross = start, [None] * len(keys)
        self.rows: Tensor | None = None         # [B] the pair of each row
        self.key_mask: Tensor | None = None     # [B, T] padded pairs: False on padding (run_stack writes the new part)

    def select(self, rows: Tensor, key_mask: Tensor | None) -> None:
        self.rows, self.key_mask = rows, key_mask

    def write(self, layer: int, k: Tensor, v: Tensor, slot: Tensor | None = None) -> tuple[Tensor, Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        if keys.shape[0] == 1:                  # one pair: every row reads the same prefix
            keys, values = keys.expand(k.shape[0], -1, -1, -1), values.expand(k.shape[0], -1, -1, -1)
        else:
            keys, values = keys[self.rows], values[self.rows]
        return torch.cat([keys, k], 2), torch.cat([values, v], 2)

    def advance(self, n: int) -> None:
        pass


def resumed_metrics(model, cells: list[Cell], site: str, source: tuple[Tensor, ...], target: dict,
                    answers: Tensor, foils: Tensor, mask: Tensor | None = None) -> Tensor:
    """The metric of each cell's patched run (cells sorted by layer), as one batch that grows layer by layer:
    a cell's row joins at the layer it patches, as its pair's target run's residual stream entering that layer
    (the layers before it are the target run's), so the stack runs once for all of them. Every row starts at the
    cells' first changed position `start`: the keys and values before it are its pair's target run's records.
    answers, foils [P] and mask [P, T] (or None): the pairs', indexed by each cell's row."""
    cfg, ids, device = model.config, target["ids"], model.device
    start = min(cell.first for cell in cells)
    prefix = PrefixCache(target["k"], target["v"], start) if start > 0 else None
    x = rows = None
    for layer in range(cells[0].layer, cfg.n_layers):
        joining = [cell for cell in cells if cell.layer == layer]
        probe = None
        if joining:
            pairs = torch.tensor([cell.row for cell in joining], device=device)
            resid = target["resid_pre"][layer][pairs, start:]
            x, rows = (resid, pairs) if x is None else (torch.cat([x, resid]), torch.cat([rows, pairs]))
            where = torch.zeros(x.shape[0], *joining[0].where[start:].shape, dtype=torch.bool)
            where[-len(joining):] = torch.stack([cell.where[start:] for cell in joining])
            patch = Patch(site, layer, source[layer][rows, start:], where.to(device))
            probe = Probe(cfg, patches=[patch])
        key_mask = None if mask is None else mask[rows]                     # [B, T]
        if prefix is not None:
            prefix.select(rows, key_mask)
        last = layer == cfg.n_layers - 1                   # the last block, then the final norm
        x = model.run_stack(model.stack, ids[rows, start:], key_mask, kind="self", causal=True, probe=probe,
                            cache=prefix, start_layer=layer, n_layers=None if last else layer + 1, resid=x)
    return metric(model, x, answers.to(device)[rows], foils.to(device)[rows])


def sweep_pairs(model, batch: PairBatch, site: str, mode: str = "denoise", layer: int | None = None,
                batch_tokens: int = SWEEP_TOKENS, progress=None) -> Iterator[tuple[int, PatchSweep]]:
    """patch_sweep of every pair of the batch together: one clean and one corrupted pass for all of them, then
    the cells of every pair in batches of at most `batch_tokens` rows × resumed positions (see resumed_metrics),
    the cells of neighbouring pairs sharing a batch. Yields (row, its PatchSweep) as each pair's last cell
    finishes, rows in order; a sweep over positions has the pair's own positions, its padding left out. A pair
    whose clean and corrupted runs give the same metric has no scale to normalise by: it runs no cell, and its
    scores are NaN. progress(done, total) in cells after each batch. Site, mode and layer are the caller's to
    check (patch_sweep)."""
    cfg, device = model.config, model.device
    source_name, target_name = ("clean", "corrupted") if mode == "denoise" else ("corrupted", "clean")
    mask = None if batch.mask is None else batch.mask.to(device)
    runs = {}
    with torch.inference_mode():
        for name, ids in (("clean", batch.clean), ("corrupted", batch.corrupted)):
            record = {"resid_pre", "k", "v", site} if name == target_name else {site}   # the source lends only its site
            out = model(ids.to(device), attention_mask=mask, record=record, return_logits=False)
            found = metric(model, out.hidden_states, batch.answers.to(device), batch.foils.to(device))
            runs[name] = dict(out.records, metric=found.tolist(), ids=ids.to(device))
    clean, corrupted = runs["clean"]["metric"], runs["corrupted"]["metric"]
    source, target = runs[source_name], runs[target_name]
    pairs, n = len(batch.lengths), batch.clean.shape[1]
    cells, unchanged = [], 0
    for row in range(pairs):
        if clean[row] != corrupted[row]:
            found, same = sweep_cells(site, layer, source[site], target[site], cfg.n_layers, cfg.n_heads, row)
            cells += found
            unchanged += same
    shape = sweep_shape(site, layer, n, cfg.n_layers, cfg.n_heads)
    metrics = torch.tensor(target["metric"])[:, None, None].repeat(1, *shape)      # [P, ...]: the target's own
    left = [0] * pairs                                                              # each pair's cells still to run
    for cell in cells:
        left[cell.row] += 1
    computed = list(left)
    total, done = len(cells) + unchanged, unchanged
    cells.sort(key=lambda cell: (cell.row, cell.layer, cell.first))

    def finished(row: int) -> PatchSweep:
        values = metrics[row]
        if by_position(site, layer):
            values = values[:, n - batch.lengths[row]:]
        values, c, k = values.clone(), clean[row], corrupted[row]
        return PatchSweep(site, mode, layer, (values - k) / (c - k), values, c, k, computed[row])

    ready, i = 0, 0
    while True:
        while ready < pairs and left[ready] == 0:
            yield ready, finished(ready)
            ready += 1
        if i == len(cells):
            return
        j, start = i, cells[i].first       # a batch holds rows × (n − start) ≤ batch_tokens
        while j < len(cells) and (j + 1 - i) * (n - min(start, cells[j].first)) <= max(batch_tokens, n):
            start = min(start, cells[j].first)
            j += 1
        chunk = sorted(cells[i:j], key=lambda cell: cell.layer)      # stable: each layer's rows in pair order
        with torch.inference_mode():
            values = resumed_metrics(model, chunk, site, source[site], target, batch.answers, batch.foils, mask)
        for cell, value in zip(chunk, values.tolist()):
            metrics[(cell.row, *cell.index)] = value
            left[cell.row] -= 1
        done += len(chunk)
        i = j
        if progress is not None:
            progress(done, total)


def check_sweep(model, site: str, mode: str, layer: int | None) -> None:
    """A sweep's site, mode and layer, and a model it can run on."""
    check_decoder(model, "patching")
    cfg = model.config
    if site not in SITES:
        raise ValueError(f"site must be one of {', '.join(SITES)}, got {site!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be 'denoise' or 'noise', got {mode!r}")
    if layer is not None and site != "z":
        raise ValueError(f"layer= sweeps one layer's heads × positions: it applies to site 'z' only, not {site!r}")
    if layer is not None:
        cfg.check_layer(layer)


def patch_sweep(model, clean_ids: Tensor, corrupted_ids: Tensor, answer: int, foil: int, site: str,
                mode: str = "denoise", layer: int | None = None, batch_tokens: int = SWEEP_TOKENS,
                progress=None) -> PatchSweep:
    """Activation patching of one site over every layer × position (resid_pre, attn_out, mlp_out), layer × head
    (z: each head's output at all positions) or, with layer given, head × position (z).

    clean_ids, corrupted_ids [T] or [1, T] (corpus.jobs.one_text): the same length. mode "denoise" writes clean activations into the corrupted
    run, "noise" corrupted ones into the clean run. Cells whose activation is the same in both runs are not run
    (patching them writes what is there). The rest go in batches of at most `batch_tokens` rows × positions
    (see resumed_metrics), never one whole pass per patch. progress(done, total) after each batch.
    The sweep of a batch of one pair (sweep_pairs, which sweeps many at once)."""
    check_sweep(model, site, mode, layer)
    answer, foil = check_token(model, answer, "answer"), check_token(model, foil, "foil")
    clean_ids, corrupted_ids = one_text(clean_ids, "clean_ids"), one_text(corrupted_ids, "corrupted_ids")
    if clean_ids.shape != corrupted_ids.shape:
        raise ValueError(f"the clean and corrupted prompts must have the same T; got "
                         f"{list(clean_ids.shape)} and {list(corrupted_ids.shape)}")
    batch = pair_batch([(clean_ids[0], corrupted_ids[0], answer, foil)])
    (_, sweep), = sweep_pairs(model, batch, site, mode, layer, batch_tokens, progress)
    if sweep.clean_metric == sweep.corrupted_metric:
        raise ValueError(f"the clean and corrupted runs give the same logit difference ({sweep.clean_metric:.4g}): "
                         "choose an answer and a foil that tell them apart")
    return sweep


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


def head_outputs(model, layer: int, z: Tensor, kind: str = "self") -> tuple[Tensor, Tensor | None, Tensor | None]:
    """What each head writes into the residual stream at one position, from z [..., H, d_head] (any leading
    positions): the parts [..., H, d] z_h·W_O[h], the output bias's part [..., d] (or None) and the post-norm's β
    (or None), all float32. They add up to the layer's attn_out. With a sandwich post-norm (Gemma 2/3) attn_out =
    post_norm(u), u = Σ_h z_h·W_O[h] + b_O: every part passes the post-norm frozen at u (Norm.frozen),
    post_norm(u) = frozen(u)(u) + β, so the sum still holds exactly. kind: the stack ("self", or "encoder" for a
    seq2seq model's encoder)."""
    w = model.head_weights(layer, kind)
    parts = torch.einsum("...hk,hkd->...hd", z.float(), w.W_O.float())                   # [..., H, d]
    bias = None if w.b_O is None else w.b_O.float()
    post = (model.encoder if kind == "encoder" else model.stack).blocks[layer].attn_post_norm
    if post is None:
        return parts, bias, None
    u = parts.sum(-2) + (bias if bias is not None else 0)                                # [..., d], post-norm's input
    frozen = post.frozen(u[..., None, :])
    return (frozen(parts), (None if bias is None else frozen(bias)[..., 0, :]),
            (None if post.bias is None else post.bias.float()))


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
    ids = one_text(ids)
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
    ids = one_text(ids)
    n = ids.shape[1]
    if not -n <= position < n:
        raise IndexError(f"position {position} is out of range: the text has positions 0..{n - 1}")
    if not 0 <= threshold <= 1:
        raise ValueError(f"the threshold is an importance between 0 and 1, got {threshold}")
    with torch.inference_mode():
        out = model(ids.to(model.device), record={"resid_pre", "v", "pattern", "attn_out", "mlp_out", "resid_post"},
                    return_logits=False)                                                # the graph reads no logits
        rec = out.records
        group = cfg.kv_group
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

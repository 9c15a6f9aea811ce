"""Cheap estimates of activation patching, each named by the exact sweep it estimates (patching.patch_sweep) and
measured against it.

approximate_sweep returns the shape and normalisation of patch_sweep (1: the clean run's metric, 0: the
corrupted run's) for head outputs (z, layer × head) and resid_pre / attn_out / mlp_out (layer × position), by:

- "atp", attribution patching (Nanda 2023): the patched run's metric ≈ the target run's + (a_source − a_target) ·
  ∂metric/∂a, the gradient taken at the run being patched (denoise: the corrupted run; noise: the clean run).
  One forward pass of the source run, one forward and one backward pass of the target run.
- "atp*", AtP with the query/key fix of Kramár et al. (2024, "AtP*"), see qk_fix. Implemented: where the patched
  activation enters a later layer's queries and keys directly through the residual stream, those queries and keys
  are computed again (exactly, not to first order) and that layer's probabilities through its softmax instead of
  linearised; from the probabilities to the metric it stays first order. Not implemented: the fix along paths
  through intermediate layers (linear, as in AtP), the fix for one head at one position (z with layer=), and
  GradDrop (the paper's second part, against cancelling gradients); so the estimate stays signed.
- "ig", integrated gradients in EAP-IG's form (Hanna et al. 2024): (a_clean − a_corrupted) times the gradient
  averaged over k runs whose token embeddings lie on the straight line between the two prompts' (midpoints
  (i + ½)/k), the gradient at the site of each.
- "flow", the information-flow graph's importance of the same part (patching.flow_graph on the clean prompt):
  a proximity, unsigned and not a metric, so it is compared by rank only; no causal claim. resid_pre has no part.

Every gradient comes from the model's own forward pass: grad=True makes the token embeddings a leaf, the records
are the tensors the pass itself computes with, and torch.autograd.grad reads ∂metric/∂record from them.
shortcut_report runs the exact sweep and each method on the same pairs and compares them (Spearman's ρ, top-k
overlap, false negatives, signed error, cost in forward-pass equivalents), per pair and over the pairs (Over).
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..attention import soft_cap
from ..corpus import Pair
from ..corpus.stats import CORRELATION, NONNEGATIVE, SHARE, UNBOUNDED, spearman
from ..corpus.jobs import Job, check_pairs, one_text
from ..corpus.stats import Over, summarise
from . import patching
from .patching import PatchSweep, check_sweep, check_token, metric

METHODS = ("atp", "atp*", "ig", "flow")
SIGNED = ("atp", "atp*", "ig")     # estimates of the normalised score itself; "flow" is an unsigned importance
IG_POINTS = 10                     # k, the points on the line between the two prompts
IG_BATCH = 16                      # interpolated runs in one forward and backward pass
FLOW_THRESHOLD = 0.04              # the flow graph's default pruning threshold
STRONG = 0.1                       # a false negative's exact effect: at least this share of clean − corrupted
STRONGEST = 10                     # the cells whose signed error is reported
QK_TOKENS = 4096                   # atp*: patches × positions whose queries and keys are recomputed at once
MEASURES = ("rho", "overlap", "false_negatives", "signed_error", "cost")   # an Agreement's, as reported
BOUNDS = {"rho": CORRELATION, "overlap": SHARE, "false_negatives": NONNEGATIVE, "signed_error": UNBOUNDED,
          "cost": NONNEGATIVE, "exact": NONNEGATIVE}    # each measure's range ("exact": a cost and a count)
SITES_COMPARED = ("z", "resid_pre")    # shortcuts_over: heads, and the residual stream


@dataclass
class ApproximateSweep(PatchSweep):
    """A PatchSweep estimated by `method` (computed is 0: no patched pass ran). For "flow", scores hold the
    graph's importances in [0, 1] and metrics are NaN."""
    method: str = "atp"
    note: str = ""


def check_prompts(model, clean_ids: Tensor, corrupted_ids: Tensor, what: str) -> None:
    """Two prompts [1, T] of one length, within the model's positions."""
    if not isinstance(clean_ids, Tensor) or not isinstance(corrupted_ids, Tensor):
        raise ValueError(f"{what} takes the prompts as token-id tensors [1, T]")
    if clean_ids.shape != corrupted_ids.shape or clean_ids.dim() != 2 or clean_ids.shape[0] != 1:
        raise ValueError(f"the clean and corrupted prompts must be [1, T] with the same T; got "
                         f"{list(clean_ids.shape)} and {list(corrupted_ids.shape)}")
    n = clean_ids.shape[1]
    if n == 0:
        raise ValueError(f"{what} needs at least one token in each prompt")
    if n > model.config.max_positions:
        raise ValueError(f"the prompts have {n} tokens, more than the model's {model.config.max_positions} positions: "
                         "shorten them")


def check_method(model, site: str, method: str, points: int, layer: int | None = None) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "flow" and site == "resid_pre":
        raise ValueError("the flow graph has no part for resid_pre (a residual state is a sum, not a part of one): "
                         "choose z, attn_out or mlp_out for method 'flow'")
    if method in ("atp*", "flow"):
        patching.check_pre_norm(model, f"method {method!r}")
    if method == "atp*" and site == "z" and layer is not None:
        raise ValueError("atp* sweeps heads as wholes (site 'z' without layer=): its fix for one head at one "
                         "position is not implemented")
    if method == "ig" and (isinstance(points, bool) or not isinstance(points, int) or not 1 <= points <= 1000):
        raise ValueError(f"ig takes k, the points between the two runs, as an integer in 1..1000; got {points!r}")


# ---- gradients from the model's own pass ----

def gradient_run(model, ids: Tensor, answer: int | Tensor, foil: int | Tensor, names: Sequence[str],
                 wanted: Sequence[str], token_embeddings: Tensor | None = None) -> tuple[Tensor, dict, dict]:
    """One forward pass with grad=True recording `names`, and one backward pass: the metric [B] (float32,
    detached), the records {name: (per layer [B, ...])} detached, and ∂Σmetric/∂record for the names in
    `wanted` (zeros where a record does not reach the metric)."""
    with torch.inference_mode(False), torch.enable_grad():
        out = model(ids.to(model.device), record=set(names), grad=True, return_logits=False,
                    token_embeddings=token_embeddings)
        value = metric(model, out.hidden_states, answer, foil)
        inputs = [t for name in wanted for t in out.records[name]]
        found = torch.autograd.grad(value.sum(), inputs, allow_unused=True)
    grads, i = {}, 0
    for name in wanted:
        layers = out.records[name]
        grads[name] = tuple(torch.zeros_like(t) if g is None else g.detach()
                            for t, g in zip(layers, found[i:i + len(layers)]))
        i += len(layers)
    records = {name: tuple(t.detach() for t in layers) for name, layers in out.records.items()}
    return value.detach(), records, grads


def plain_run(model, ids: Tensor, answer: int, foil: int, names: Sequence[str]) -> tuple[float, dict]:
    with torch.inference_mode():
        out = model(ids.to(model.device), record=set(names), return_logits=False)
        return metric(model, out.hidden_states, answer, foil).item(), out.records


def cell_sums(site: str, layer: int | None, products: tuple[Tensor, ...]) -> Tensor:
    """Per-layer products [T, d] or [T, H, d_head] (one row of the batch) → the sweep's cells: [L, T], [L, H],
    or [H, T] for z at one layer."""
    if site != "z":
        return torch.stack([p.float().sum(-1) for p in products])                    # [L, T]
    if layer is None:
        return torch.stack([p.float().sum((0, 2)) for p in products])                # [L, H]
    return products[layer].float().sum(-1).T                                         # [H, T]


def as_sweep(site: str, mode: str, layer: int | None, attribution: Tensor, clean: float, corrupted: float,
             method: str, note: str = "") -> ApproximateSweep:
    """attribution: the estimated change of the target run's metric by each patch, clean − corrupted direction
    for denoising (the patched metric ≈ corrupted + attribution), corrupted − clean for noising."""
    target = corrupted if mode == "denoise" else clean
    metrics = target + attribution.cpu()
    return ApproximateSweep(site, mode, layer, (metrics - corrupted) / (clean - corrupted), metrics, clean,
                            corrupted, 0, method, note)


# ---- the methods ----

def atp(model, clean_ids, corrupted_ids, answer, foil, sites: Sequence[str], mode, layer,
        qk: bool = False) -> dict[str, ApproximateSweep]:
    """AtP (or AtP*) of several sites from the same three passes: the source run's forward, the target run's
    forward and one backward, each recording every site."""
    source_ids, target_ids = (clean_ids, corrupted_ids) if mode == "denoise" else (corrupted_ids, clean_ids)
    source_metric, source = plain_run(model, source_ids, answer, foil, sites)
    names = [*sites, "pattern", "resid_pre"] if qk else list(sites)
    wanted = [*sites, "pattern"] if qk else list(sites)
    target_metric, target, grads = gradient_run(model, target_ids, answer, foil, names, wanted)
    clean, corrupted = ((source_metric, target_metric.item()) if mode == "denoise"
                        else (target_metric.item(), source_metric))
    sweeps = {}
    for site in sites:
        delta = tuple((s - t)[0].float() for s, t in zip(source[site], target[site]))          # per layer
        attribution = cell_sums(site, layer, tuple(d * g[0].float() for d, g in zip(delta, grads[site])))
        note = ""
        if qk:
            attribution = attribution + qk_fix(model, site, delta, target, grads["pattern"])
            note = ("AtP with the query/key fix on the direct path to later layers' queries and keys (softmax "
                    "recomputed); GradDrop is not implemented")
        sweeps[site] = as_sweep(site, mode, layer, attribution, clean, corrupted, "atp*" if qk else "atp", note)
    return sweeps


def atp_sweeps(model, clean_ids: Tensor, corrupted_ids: Tensor, answer: int, foil: int, sites: Sequence[str],
               mode: str = "denoise") -> dict[str, ApproximateSweep]:
    """approximate_sweep's "atp" of several sites at once (each site's sweep as approximate_sweep gives it, z over
    layer × head), sharing its forward and backward passes: what a sweep of heads and the residual stream costs
    together."""
    sites = tuple(dict.fromkeys(sites))
    if not sites:
        raise ValueError(f"atp_sweeps needs at least one site of {', '.join(patching.SITES)}")
    for site in sites:
        check_sweep(model, site, mode, None)
    answer, foil = check_token(model, answer, "answer"), check_token(model, foil, "foil")
    check_prompts(model, clean_ids, corrupted_ids, "atp_sweeps")
    check_different(clean_ids, corrupted_ids)
    sweeps = atp(model, clean_ids, corrupted_ids, answer, foil, sites, mode, None)
    check_metrics(next(iter(sweeps.values())))
    return sweeps


def integrated_gradients(model, clean_ids, corrupted_ids, answer, foil, site, mode, layer,
                         points: int) -> ApproximateSweep:
    clean_metric, clean = plain_run(model, clean_ids, answer, foil, [site])
    corrupted_metric, corrupted = plain_run(model, corrupted_ids, answer, foil, [site])
    embed = model.stack.embed.tokens
    with torch.inference_mode():
        start = embed(corrupted_ids.to(model.device))[0].float()                       # [T, d]
        end = embed(clean_ids.to(model.device))[0].float()
    total = None
    for i in range(0, points, IG_BATCH):
        alphas = (torch.arange(i, min(points, i + IG_BATCH), dtype=torch.float32, device=start.device) + 0.5) / points
        rows = (start + alphas[:, None, None] * (end - start)).to(embed.weight.dtype)   # [b, T, d]
        ids = corrupted_ids.to(model.device).expand(len(alphas), -1)
        _, _, grads = gradient_run(model, ids, answer, foil, [site], [site], token_embeddings=rows.clone())
        summed = tuple(g.float().sum(0) for g in grads[site])
        total = summed if total is None else tuple(a + b for a, b in zip(total, summed))
    delta = tuple((c - k)[0].float() for c, k in zip(clean[site], corrupted[site]))     # a_clean − a_corrupted
    attribution = cell_sums(site, layer, tuple(d * g / points for d, g in zip(delta, total)))
    if mode == "noise":          # the clean run with one corrupted activation: the same integral, the other way
        attribution = -attribution
    return as_sweep(site, mode, layer, attribution, clean_metric, corrupted_metric, "ig",
                    f"EAP-IG: the gradient averaged over {points} runs on the line between the token embeddings")


def flow_scores(model, clean_ids, corrupted_ids, answer, foil, site, mode, layer,
                threshold: float = FLOW_THRESHOLD) -> ApproximateSweep:
    """The kept graph's importance of each part: a head's parts on its layer's kept attention edges (z), a
    layer's attention edges into each token (attn_out), the MLP's edge at each token (mlp_out)."""
    clean_metric, _ = plain_run(model, clean_ids, answer, foil, [])
    corrupted_metric, _ = plain_run(model, corrupted_ids, answer, foil, [])
    graph = patching.flow_graph(model, clean_ids, threshold=threshold)
    cfg, n = model.config, clean_ids.shape[1]
    heads = torch.zeros(cfg.n_layers, cfg.n_heads, n)         # [L, H, target]
    mlp = torch.zeros(cfg.n_layers, n)
    for edge in graph.edges:
        if edge.kind == "attention":
            heads[edge.layer, :, edge.target] += graph.heads[edge.layer, :, edge.target, edge.source]
        elif edge.kind == "mlp":
            mlp[edge.layer, edge.target] = edge.importance
    if site == "z":
        scores = heads.sum(-1) if layer is None else heads[layer]
    else:
        scores = heads.sum(1) if site == "attn_out" else mlp
    return ApproximateSweep(site, mode, layer, scores, torch.full_like(scores, math.nan), clean_metric,
                            corrupted_metric, 0, "flow",
                            f"information-flow importance on the clean prompt (threshold {threshold}): no causal claim")


def approximate_sweep(model, clean_ids: Tensor, corrupted_ids: Tensor, answer: int, foil: int, site: str,
                      mode: str = "denoise", method: str = "atp", layer: int | None = None,
                      points: int = IG_POINTS) -> ApproximateSweep:
    """An estimate of patching.patch_sweep (same arguments, shape and normalisation) by `method`: "atp", "atp*",
    "ig" (k = points) or "flow" (see the module's docstring). The clean and corrupted runs must give different
    metrics, as for the exact sweep."""
    check_sweep(model, site, mode, layer)
    check_method(model, site, method, points, layer)
    answer, foil = check_token(model, answer, "answer"), check_token(model, foil, "foil")
    clean_ids, corrupted_ids = one_text(clean_ids, "clean_ids"), one_text(corrupted_ids, "corrupted_ids")
    check_prompts(model, clean_ids, corrupted_ids, "approximate_sweep")
    check_different(clean_ids, corrupted_ids)
    args = (model, clean_ids, corrupted_ids, answer, foil, site, mode, layer)
    if method == "ig":
        sweep = integrated_gradients(*args, points)
    elif method == "flow":
        sweep = flow_scores(*args)
    else:
        sweep = atp(model, clean_ids, corrupted_ids, answer, foil, (site,), mode, layer, qk=method == "atp*")[site]
    check_metrics(sweep)
    return sweep


def check_different(clean_ids: Tensor, corrupted_ids: Tensor) -> None:
    if torch.equal(clean_ids, corrupted_ids):
        raise ValueError("the clean and corrupted prompts are the same tokens, so they give the same logit "
                         "difference: corrupt the clean prompt somewhere")


def check_metrics(sweep: PatchSweep) -> None:
    if sweep.clean_metric == sweep.corrupted_metric:
        raise ValueError(f"the clean and corrupted runs give the same logit difference ({sweep.clean_metric:.4g}): "
                         "choose an answer and a foil that tell them apart")


# ---- AtP*: the query/key fix ----

def layer_qk(model, layer: int, x: Tensor) -> tuple[Tensor, Tensor]:
    """The queries [B, H, T, d_k] and keys [B, H, T, d_k] (key heads repeated for grouped-query attention) that
    layer `layer`'s self-attention computes from the residual stream x [B, T, d] entering it: its own norm,
    W_Q, W_K (any q/k norm) and rotation at positions 0..T−1."""
    cfg, block = model.config, model.stack.blocks[layer]
    positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
    rope = model.layer_rope(model.stack, layer, positions)
    q, k, _ = block.attn.self_qkv(block.attn_norm(x.to(model.dtype)), rope)
    return q.float(), k.float().repeat_interleave(cfg.kv_group, dim=1)


def raw_scores(model, q: Tensor, k: Tensor) -> Tensor:
    """Scores before the mask and any bias, after the scale and the soft-cap: [..., Tq, Tk]."""
    cfg = model.config
    return soft_cap((q @ k.transpose(-1, -2)) * cfg.score_scale, cfg.attn_softcap)


def qk_fix(model, site: str, delta: tuple[Tensor, ...], target: dict,
           pattern_grads: tuple[Tensor, ...]) -> Tensor:
    """What AtP* changes in AtP's cells: for each patch, its change Δ of the residual stream (a head's output
    through W_O, a sublayer's output, or the residual itself at one position) reaches each later attention layer
    l' directly. There the queries and keys are computed again from resid_pre[l'] + Δ (exactly, through the
    layer's norm, W_Q, W_K, RoPE), the probabilities through the softmax (A' = softmax(log A + Δscores), mask
    and biases unchanged), and ⟨A' − A, ∂metric/∂A⟩ replaces that path's first-order term ⟨∂metric/∂x_{l'}
    through q and k only, Δ⟩, which AtP's gradient holds and is taken out. Paths through intermediate layers stay
    linear, as in AtP. Returns the correction, the sweep's cell shape."""
    cfg = model.config
    resid = [r[0].float() for r in target["resid_pre"]]                    # [T, d] per layer
    patterns = [p[0].float() for p in target["pattern"]]                   # [H, T, T]
    grads = [g[0].float() for g in pattern_grads]
    sources = [residual_changes(model, site, l, delta[l]) for l in range(cfg.n_layers)]   # ([P, T, d], first)
    fixes = [changes.new_zeros(changes.shape[0]) for changes, _ in sources]
    for later in range(cfg.n_layers):
        reading = [l for l, (_, first) in enumerate(sources) if first <= later]
        if not reading:
            continue
        qk_grad = residual_qk_gradient(model, later, resid[later], patterns[later], grads[later])     # [T, d]
        base = raw_scores(model, *layer_qk(model, later, resid[later][None]))                      # [1, H, T, T]
        changes = torch.cat([sources[l][0] for l in reading])              # every earlier patch at once
        rows = max(1, QK_TOKENS // changes.shape[1])
        found = torch.cat([softmax_term(model, later, resid[later], base, patterns[later], grads[later], part)
                           - (qk_grad[None] * part).sum((1, 2)) for part in changes.split(rows)])
        for l, part in zip(reading, found.split([len(fixes[l]) for l in reading])):
            fixes[l] += part
    return torch.stack(fixes)                   # [L, P]: P positions, or heads (z)


def residual_changes(model, site: str, layer: int, delta: Tensor) -> tuple[Tensor, int]:
    """The change each cell's patch makes to the residual stream a later layer reads, [P, T, d], and the first
    layer that reads it directly. delta: the source − target activation of this layer, [T, d] or [T, H, d_head]."""
    n = delta.shape[0]
    if site == "z":                                  # head h: its output through W_O (and any post-norm), per head
        block = model.stack.blocks[layer]
        if block.attn_post_norm is not None:
            raise ValueError("atp* on heads does not handle a norm on the attention's output (sandwich norms)")
        w_o = model.head_weights(layer).W_O.float()                                  # [H, d_head, d]
        return torch.einsum("thk,hkd->htd", delta, w_o), layer + 1
    eye = torch.eye(n, device=delta.device)                                          # position p alone
    changes = eye[:, :, None] * delta[None]                                          # [T, T, d]
    return changes, layer if site == "resid_pre" else layer + 1


def softmax_term(model, layer: int, x: Tensor, base: Tensor, pattern: Tensor, grad: Tensor, changes: Tensor) -> Tensor:
    """⟨A' − A, ∂metric/∂A⟩ of layer `layer` for each change [P, T, d] of its input x [T, d]; base: the raw
    scores at x [1, H, T, T]; A [H, T, T]."""
    q, k = layer_qk(model, layer, x[None] + changes.to(x.dtype))                    # [P, H, T, d_k]
    moved = raw_scores(model, q, k) - base                                           # [P, H, T, T]
    patched = torch.softmax(pattern.log()[None] + moved, -1).nan_to_num(0.0)        # masked keys stay at 0
    return ((patched - pattern[None]) * grad[None]).sum((1, 2, 3))


def residual_qk_gradient(model, layer: int, x: Tensor, pattern: Tensor, grad: Tensor) -> Tensor:
    """∂metric/∂x [T, d] through layer `layer`'s queries and keys alone (its values and the residual path held):
    the softmax's backward of ∂metric/∂A, then the scores' backward to x."""
    with torch.inference_mode(False), torch.enable_grad():
        leaf = x.clone()[None].requires_grad_(True)
        q, k = layer_qk(model, layer, leaf)
        scores = raw_scores(model, q, k)[0]                                          # [H, T, T]
        score_grad = pattern * (grad - (pattern * grad).sum(-1, keepdim=True))      # softmax backward
        (found,) = torch.autograd.grad(scores, leaf, score_grad)
    return found[0].detach()


# ---- against the truth ----

@dataclass
class Agreement:
    """One method's map against the exact one on one pair. Cells are the map's (row, column) indices; ranks
    are by size |score|, largest first."""
    rho: float                                  # Spearman's ρ over every cell (against |exact| for "flow")
    overlap: float                              # the share of the exact top k among the method's top k
    false_negatives: tuple[tuple[int, int], ...]    # |exact| ≥ STRONG, ranked below k by the method
    strongest: tuple[tuple[int, int], ...]      # the STRONGEST cells by |exact|
    signed_errors: Tensor                       # method − exact on those cells (NaN for an unsigned method)
    seconds: float = math.nan
    cost: float = math.nan                      # seconds / one forward pass's, on the same pair

    @property
    def signed_error(self) -> float:
        return float(self.signed_errors.mean())

    def measure(self, name: str) -> float:
        """One of MEASURES as a number (false_negatives: how many)."""
        value = getattr(self, name)
        return float(len(value)) if name == "false_negatives" else float(value)


def compare(exact: Tensor, estimate: Tensor, signed: bool = True, k: int = 10, cells: Tensor | None = None) -> Agreement:
    """How far `estimate` agrees with the exact normalised scores `exact` (the same shape), over the cells where
    `cells` (bool, that shape) is True, or all of them."""
    if exact.shape != estimate.shape:
        raise ValueError(f"the maps differ in shape: {list(exact.shape)} and {list(estimate.shape)}")
    chosen = torch.ones(exact.shape, dtype=torch.bool) if cells is None else cells.bool()
    index = chosen.flatten().nonzero()[:, 0]                                           # flat cell of each value
    if not 1 <= k <= len(index):
        raise ValueError(f"k must be in 1..{len(index)} (the cells compared), got {k}")
    truth, guess = exact.flatten()[index].double(), estimate.flatten()[index].double()
    width = exact.shape[-1]
    cell = lambda i: (int(index[i]) // width, int(index[i]) % width)                  # noqa: E731
    by_truth = truth.abs().argsort(descending=True, stable=True)
    by_guess = guess.abs().argsort(descending=True, stable=True)
    top_guess = set(by_guess[:k].tolist())
    overlap = len(set(by_truth[:k].tolist()) & top_guess) / k
    misses = tuple(cell(i) for i in by_truth.tolist() if truth[i].abs() >= STRONG and i not in top_guess)
    strong = by_truth[:min(STRONGEST, len(truth))]
    errors = (guess[strong] - truth[strong]) if signed else torch.full((len(strong),), math.nan, dtype=torch.float64)
    rho = spearman(truth if signed else truth.abs(), guess)
    return Agreement(rho, overlap, misses, tuple(cell(i) for i in strong.tolist()), errors.float())


def changed_cells(model, clean_ids: Tensor, corrupted_ids: Tensor, site: str) -> Tensor:
    """bool, the sweep's shape (z: layer × head): the cells whose activation differs between the two runs. The
    others (under a causal mask, every position before the first changed token) are 0 in the exact sweep and in
    every gradient method alike, and would only add ties to the comparison."""
    with torch.inference_mode():
        records = model(torch.cat([clean_ids, corrupted_ids]).to(model.device), record=site,
                        return_logits=False).records[site]
    differs = [(r[0] != r[1]).flatten(2).any(-1) if site == "z" else (r[0] != r[1]).any(-1) for r in records]
    return torch.stack([d.any(0) if site == "z" else d for d in differs]).cpu()     # [L, H] or [L, T]


@dataclass
class ShortcutReport:
    site: str
    mode: str
    methods: tuple[str, ...]
    k: int
    exact: list[PatchSweep]                     # each measured pair's exact sweep, in `items` order
    per_pair: list[dict[str, Agreement]]        # the same pairs: method → its agreement
    estimates: list[dict[str, ApproximateSweep]]    # the same pairs: method → its map
    cells: list[Tensor]                         # the same pairs: the cells compared (changed_cells)
    over: dict[str, dict[str, Over]]            # method → "rho", "overlap", "false_negatives", "signed_error", "cost"
    exact_cost: Over                            # the exact sweep's forward-pass equivalents
    strong: Over                                # cells with |exact| ≥ STRONG per pair: more than k forces misses
    items: tuple[int, ...] = ()                 # the index in the input of each measured pair
    left_out: dict[int, str] = field(default_factory=dict)


def timed(run):
    start = time.perf_counter()
    value = run()
    return value, time.perf_counter() - start


def forward_seconds(model, ids: Tensor, repeats: int = 3) -> float:
    """The median time of one plain forward pass of ids [1, T] (inference mode, logits included)."""
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            times.append(timed(lambda: model(ids.to(model.device)))[1])
    return sorted(times)[len(times) // 2]


@dataclass
class PairMeasured:
    """One pair's exact sweep and each method against it (measure_pair)."""
    truth: PatchSweep
    found: dict[str, Agreement]                 # method → its agreement with the truth
    maps: dict[str, ApproximateSweep]           # method → its map
    cells: Tensor                               # the cells compared (changed_cells)
    exact_cost: float                           # the exact sweep's seconds / one forward pass's


def measure_pair(model, pair: Pair, site: str, mode: str, methods: Sequence[str], k: int, points: int) -> PairMeasured:
    """Exact patching and each method on one pair, compared over the cells whose activation differs (k at most
    their count); each cost is seconds over one plain forward pass of the same pair, timed in this call. A pair
    whose clean and corrupted runs give the same metric raises patch_sweep's ValueError."""
    clean, corrupted = pair.clean[None], pair.corrupted[None]
    one_pass = forward_seconds(model, clean)
    truth, seconds = timed(lambda: patching.patch_sweep(model, clean, corrupted, pair.answer, pair.foil, site, mode))
    found, maps, cells = {}, {}, changed_cells(model, clean, corrupted, site)
    for method in methods:
        sweep, spent = timed(lambda: approximate_sweep(model, clean, corrupted, pair.answer, pair.foil, site, mode,
                                                       method, points=points))
        agreement = compare(truth.scores, sweep.scores, method in SIGNED, min(k, int(cells.sum())), cells)
        agreement.seconds, agreement.cost = spent, spent / one_pass
        found[method], maps[method] = agreement, sweep
    return PairMeasured(truth, found, maps, cells, seconds / one_pass)


def check_report(model, site: str, mode: str, methods: Sequence[str], points: int, what: str) -> tuple[str, ...]:
    patching.check_decoder(model, what)
    methods = tuple(methods)
    if not methods or any(m not in METHODS for m in methods):
        raise ValueError(f"methods must be some of {', '.join(METHODS)}, got {methods!r}")
    check_sweep(model, site, mode, None)
    for method in methods:
        check_method(model, site, method, points)
    return methods


def shortcut_report(model, pairs: Sequence[Pair], site: str, methods: Sequence[str] = METHODS, k: int = 10,
                    mode: str = "denoise", points: int = IG_POINTS, progress=None, stop=None) -> ShortcutReport:
    """Exact patching (patching.patch_sweep) and each method (approximate_sweep) on the same cells of each pair,
    compared (measure_pair: compare, over the cells whose activation differs between the two runs; k at most
    their count) and summarised over the pairs (summarise: mean and 95 % interval, in each measure's BOUNDS).
    Each method's cost is its time over one plain forward pass of the same pair, measured in the same run. A pair
    whose clean and corrupted runs give the same metric is left out and named. progress(done, total) after each
    pair; stop() is asked between pairs."""
    methods = check_report(model, site, mode, methods, points, "shortcut_report")
    if not pairs:
        raise ValueError("shortcut_report needs at least one prompt pair")
    measured, items, left_out = [], [], {}
    for index, pair in enumerate(pairs):
        if stop is not None and stop():
            left_out.update({i: "the report was stopped" for i in range(index, len(pairs))})
            break
        try:
            measured.append(measure_pair(model, pair, site, mode, methods, k, points))
        except ValueError as error:          # the same metric in both runs: nothing to normalise by
            left_out[index] = str(error)
            continue
        items.append(index)
        if progress is not None:
            progress(index + 1, len(pairs))
    note = "; ".join(f"pair {i}: {why}" for i, why in sorted(left_out.items()))

    def over(values: list[float], name: str) -> Over:
        return summarise(torch.tensor(values, dtype=torch.float64).reshape(-1), note, items, left_out,
                         bounds=BOUNDS[name])

    summary = {method: {name: over([m.found[method].measure(name) for m in measured], name) for name in MEASURES}
               for method in methods}
    strong = over([float((m.truth.scores[m.cells].abs() >= STRONG).sum()) for m in measured], "exact")
    return ShortcutReport(site, mode, methods, k, [m.truth for m in measured], [m.found for m in measured],
                          [m.maps for m in measured], [m.cells for m in measured], summary,
                          over([m.exact_cost for m in measured], "exact"), strong, tuple(items), left_out)


# ---- over a corpus: the report as a job of core/corpus (saved, resumable, in chunks) ----

def methods_at(site: str) -> tuple[str, ...]:
    """The methods a site has: the flow graph has no part for resid_pre."""
    return METHODS if site == "z" else tuple(m for m in METHODS if m != "flow")


def pair_value(model, pair: Pair, mode: str, k: int, points: int) -> dict[str, Tensor]:
    """One pair's item of shortcuts_over: measure → [METHODS, SITES_COMPARED] (NaN where a site has no such
    method), and "exact" → [2, SITES_COMPARED]: the exact sweep's cost in forward passes, and its cells with
    |effect| ≥ STRONG."""
    value = {name: torch.full((len(METHODS), len(SITES_COMPARED)), math.nan) for name in MEASURES}
    value["exact"] = torch.full((2, len(SITES_COMPARED)), math.nan)
    for column, site in enumerate(SITES_COMPARED):
        measured = measure_pair(model, pair, site, mode, methods_at(site), k, points)
        for method, agreement in measured.found.items():
            for name in MEASURES:
                value[name][METHODS.index(method), column] = agreement.measure(name)
        strong = float((measured.truth.scores[measured.cells].abs() >= STRONG).sum())
        value["exact"][:, column] = torch.tensor([measured.exact_cost, strong])
    return value


def shortcuts_over(model, pairs: Sequence[Pair], mode: str = "denoise", k: int = 10, points: int = IG_POINTS,
                   progress=None, stop=None, each=None, done=None) -> dict[str, Over]:
    """shortcut_report of every method on heads (z) and on the residual stream (resid_pre) of each pair, as a
    corpus job of core/corpus (progress, stop, each and done as core/corpus/jobs.py's: saved item by item,
    resumable, run in chunks): measure → Over [METHODS, SITES_COMPARED] of the per-pair values (NaN where a site
    has no such method: flow on resid_pre), and "exact" → Over [2, SITES_COMPARED] (rows: the exact sweep's cost
    in forward passes, its cells with |effect| ≥ STRONG). A pair whose two runs give the same metric is left out
    and named; stop() is asked between pairs."""
    for site in SITES_COMPARED:
        check_report(model, site, mode, methods_at(site), points, "shortcuts_over")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k is the top-k overlap's k, a whole number ≥ 1, got {k!r}")
    pairs = check_pairs(model, pairs)
    job = Job(len(pairs), "pair", progress, stop, each).resume(done)

    def measure(index: int) -> None:
        try:
            job.finish(index, pair_value(model, pairs[index], mode, k, points))
        except ValueError as error:          # the same metric in both runs: nothing to normalise by
            job.skip(index, str(error))

    job.run(job.left(), measure)
    shapes = {name: (len(METHODS), len(SITES_COMPARED)) for name in MEASURES}
    shapes["exact"] = (2, len(SITES_COMPARED))
    return {name: job.over(shape, lambda value, name=name: value[name], bounds=BOUNDS[name])
            for name, shape in shapes.items()}

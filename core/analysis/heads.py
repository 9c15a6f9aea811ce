"""What each head does, and whether it matters: attention-pattern scores, the induction probe, head ablation,
attribution for one prediction, the logit lens and per-token surprisal. Pure PyTorch on top of the model.

A score is a number per layer × head measured on a text. Attention scores say where a head looks; ablation
says whether the output depends on it; attributions say which inputs the prediction is sensitive to. The
three need not agree, which is the point of measuring them side by side.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import row_entropy
from ..corpus.jobs import one_text
from ..corpus.stats import NONNEGATIVE, SHARE, spearman
from ..corpus.texts import induction_probe
from ..attention import Kind, Observer
from ..probe import Probe
from .. import logits as blocks

SINK_EPSILON = 0.3  # Gu et al.'s ε: a head whose first-token mass exceeds it is a sink head (sink_heads)
LOCAL_WINDOW = 3  # |i - j| ≤ 3 counts as local
IG_TOKENS_PER_PASS = 1024  # integrated gradients: path points × tokens in one backward pass
SCORES = {  # name → (what it measures, threshold for naming a head, the name)
    "previous_token": ("mean weight on the key just before the query (i − 1)", 0.5, "previous-token head"),
    "first_token": ("mean weight on the first position (the sink; a decoder's first query, which sees only it, "
                    "left out)", SINK_EPSILON, "sink head"),   # named by sink_heads
    "local": (f"mean weight within |i − j| ≤ {LOCAL_WINDOW}", 0.85, "local head"),
    "entropy": ("mean entropy of a row, in nats (low: focused)", None, None),
    "duplicate_token": ("mean weight on earlier copies of the query's own token", 0.5, "duplicate-token head"),
    "induction": ("on the repeated probe, mean weight on the token after the earlier copy", 0.4, "induction head"),
}
CAUSAL_ONLY = ("induction",)  # needs a model that predicts the next token from the left
SCORE_BOUNDS = {name: NONNEGATIVE if name == "entropy" else SHARE for name in SCORES}   # each score's range


def first_token_mass(probs: Tensor, causal: bool) -> Tensor:
    """A head's first-token mass: probs [..., H, T, T] → [..., H], its mean attention on token 0 over the queries
    that could look elsewhere (a decoder's query 0 sees only token 0, weight 1 by construction, so it is left out;
    an encoder's every query counts). The one definition row_scores and core.analysis.sinks.sink_scores read."""
    skip = int(causal and probs.shape[-2] > 1)
    return probs[..., skip:, 0].float().mean(-1)


def sink_heads(mass, epsilon: float = SINK_EPSILON):
    """Which heads are sink heads (Gu et al.): first-token mass (a tensor, an array or a number) above epsilon.
    Every view, lesson and script that names a sink head, or counts Sink^ε, asks this."""
    return mass > epsilon


def row_scores(probs: Tensor, ids: Tensor, causal: bool) -> dict[str, Tensor]:
    """The attention-pattern scores of one layer: probs [H, T, T] (rows sum to 1), ids [T] → name → [H].

    Rows that cannot have the pattern are left out, or must have it: the first query for previous-token (it has no
    key before it), and for first-token where the rows are causal (its one key is the first: weight 1 by
    construction, as core.analysis.sinks leaves it out); queries whose token occurs for the first time for
    duplicate-token."""
    heads, n, _ = probs.shape
    p = probs.float()
    i = torch.arange(n, device=p.device)
    out = {
        "previous_token": p[:, i[1:], i[1:] - 1].mean(-1) if n > 1 else p.new_zeros(heads),
        "first_token": first_token_mass(p, causal),
        "local": (p * ((i[:, None] - i[None, :]).abs() <= LOCAL_WINDOW)).sum(-1).mean(-1),
        "entropy": row_entropy(p).mean(-1),
    }
    same = (ids[:, None] == ids[None, :]) & (i[None, :] < i[:, None])          # [T, T]: earlier copies
    rows = same.any(-1)
    if rows.any():
        out["duplicate_token"] = (p * same).sum(-1)[:, rows].mean(-1)
    else:
        out["duplicate_token"] = p.new_zeros(heads)
    return out


class ScoreObserver(Observer):
    """Scores every layer of one stack as its probabilities are computed; never keeps an n × n map.

    ids [T] for one text, or [B, T] for a padded batch with mask [B, T] (False on padding, on either side): each
    row is scored by row_scores on its real queries and keys alone, so a text scores the same in a batch as alone.
    induction: also the induction score of every row whose text is a repeat (see repeat_halves), else NaN.
    scored(n), where given, is told after each layer is scored (n: layers scored so far); raising there ends the
    pass at that layer."""

    def __init__(self, ids: Tensor, kind: Kind = "self", mask: Tensor | None = None, induction: bool = False,
                 scored: Callable[[int], None] | None = None, *, causal: bool):
        self.ids, self.kind, self.scored, self.causal = (ids if ids.dim() == 2 else ids[None]), kind, scored, causal
        self.real = [None if mask is None else mask[b].nonzero().squeeze(-1) for b in range(len(self.ids))]
        self.repeats = [repeat_halves(self.row_ids(b)) for b in range(len(self.ids))] if induction else None
        self.layers: dict[int, list[dict[str, Tensor]]] = {}

    def row_ids(self, b: int) -> Tensor:
        """Row b's real tokens [T_b]."""
        return self.ids[b] if self.real[b] is None else self.ids[b, self.real[b]]

    def wants(self, kind: Kind, layer: int) -> bool:
        return kind == self.kind

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        rows = []
        for b, real in enumerate(self.real):
            p = probs[b] if real is None else probs[b][:, real][:, :, real]            # [H, T_b, T_b]
            scores = row_scores(p, self.row_ids(b), self.causal)
            if self.repeats is not None:
                found = self.repeats[b]
                scores["induction"] = (p.new_full((p.shape[0],), math.nan) if found is None
                                       else induction_score(p, *induction_places(p.shape[1], *found, p.device)))
            rows.append(scores)
        self.layers[layer] = rows
        if self.scored is not None:
            self.scored(len(self.layers))

    def tables(self) -> dict[str, Tensor]:
        """name → [B, L, H]"""
        names = self.layers[0][0].keys()
        return {name: torch.stack([torch.stack([rows[name] for rows in self.layers[i]]) for i in sorted(self.layers)],
                                  1) for name in names}

    def table(self) -> dict[str, Tensor]:
        """name → [L, H] of the first (or only) text"""
        return {name: t[0] for name, t in self.tables().items()}


def pattern_scores(model, ids: Tensor) -> dict[str, Tensor]:
    """Every head's attention-pattern scores on one text ids [T] or [1, T] (the encoder's, for seq2seq): name →
    [L, H]."""
    return {name: t[0] for name, t in batch_pattern_scores(model, one_text(ids)).items()}


def batch_pattern_scores(model, ids: Tensor, mask: Tensor | None = None, induction: bool = False,
                         progress: Callable[[int, int], None] | None = None) -> dict[str, Tensor]:
    """pattern_scores of each text of a padded batch in one pass: ids [B, T], mask [B, T] (False on padding, or
    None where nothing is) → name → [B, L, H], each row as its text alone scores. induction: add the induction
    score of each text that is a repeat (NaN for the others; a decoder's, as the probe's). progress(layers scored,
    n_layers) after each layer: a hook that raises ends the pass there, so a job's stop() lands within one batch."""
    stack, kind = model.attention_stack()
    ids = ids.to(model.device)
    mask = None if mask is None or bool(mask.all()) else mask.to(model.device).bool()
    scored = None if progress is None else (lambda done: progress(done, stack.cfg.n_layers))
    observer = ScoreObserver(ids, kind, mask, induction, scored, causal=stack.cfg.causal)
    with torch.inference_mode():
        model.run_stack(stack, ids, mask, kind=kind, causal=stack.cfg.causal, observer=observer)
    return {name: t.cpu() for name, t in observer.tables().items()}


@dataclass
class InductionResult:
    scores: Tensor          # [L, H]: mean weight from every second-copy token to the token after its earlier copy
    loss_first: float       # mean next-token loss (nats) over the first copy
    loss_second: float      # ... and over the second: far lower when the model has induction heads
    ids: Tensor             # the probe [1, n]


class InductionObserver(Observer):
    """Per main-stack layer and head, the mean weight from query queries[i] to key targets[i]: scores[layer] [H]."""

    def __init__(self, queries: Tensor, targets: Tensor):
        self.queries, self.targets = queries, targets
        self.scores: dict[int, Tensor] = {}

    def wants(self, kind: Kind, layer: int) -> bool:
        return kind == "self"

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        self.scores[layer] = induction_score(probs[0], self.queries, self.targets)


def induction_score(probs: Tensor, queries: Tensor, targets: Tensor) -> Tensor:
    """Each head's mean weight from query queries[i] to key targets[i]: probs [H, T, T] → [H]."""
    return probs[:, queries, targets].float().mean(-1)


def induction_places(n: int, offset: int, length: int, device=None) -> tuple[Tensor, Tensor]:
    """The probe's queries and keys in a text of n tokens whose `length` tokens from `offset` are repeated right
    after: every second-copy token is a query, its first one included (each has an earlier copy `length` before
    it), and the key is the token after that copy (for the first query, the first copy's second token)."""
    second = torch.arange(offset + length, n, device=device)
    return second, second - length + 1


def repeat_halves(ids: Tensor) -> tuple[int, int] | None:
    """(offset, length) where the text ids [T] is a span repeated once, after one leading token (a BOS) or none,
    as the induction probe is; None for any other text."""
    for offset in (0, 1):
        length, odd = divmod(len(ids) - offset, 2)
        if not odd and length > 1 and torch.equal(ids[offset:offset + length], ids[offset + length:]):
            return offset, length
    return None


def reads_a_target(model) -> str:
    """The words a refusal adds for an encoder-decoder model (naming its family), else ""."""
    if model.encoder is None:
        return ""
    return (f"; {model.config.family} is an encoder-decoder model, whose decoder predicts a target text of its own "
            "rather than the text it reads")


def induction(model, length: int = 100, seed: int = 0) -> InductionResult:
    """The induction probe through the model (decoders only)."""
    if not model.config.causal or model.lm_head is None or model.encoder is not None:
        raise ValueError("the induction probe needs a decoder-only model that predicts the next token"
                         + reads_a_target(model))
    tok = model.tokenizer
    special = tuple(tok.all_special_ids) if tok is not None else ()
    bos = model.config.bos_token_id
    ids = induction_probe(model.config.vocab_size, length, seed, bos, special).to(model.device)
    offset = 0 if bos is None else 1
    n = ids.shape[1]
    second, target = induction_places(n, offset, length, model.device)
    observer = InductionObserver(second, target)
    with torch.inference_mode():
        hidden = model(ids, observer=observer, return_logits=False).hidden_states
        losses = prediction_losses(model, hidden, ids)[0]                 # [n - 1]
    first_span = slice(offset, offset + length - 1)                       # predicting tokens 2..length of copy 1
    second_span = slice(offset + length, n - 1)
    scores = observer.scores
    return InductionResult(torch.stack([scores[i] for i in sorted(scores)]).cpu(),
                           losses[first_span].mean().item(), losses[second_span].mean().item(), ids.cpu())


def prediction_targets(model, ids: Tensor) -> Tensor:
    """What each position predicts, ids [B, T] → [B, T]: a decoder the next token (the last position nothing,
    −100, cross_entropy's ignore_index), a masked-language-model encoder its own token (nothing masked)."""
    if not model.config.causal:
        return ids
    return torch.cat([ids[:, 1:], ids.new_full((ids.shape[0], 1), -100)], 1)


def prediction_losses(model, hidden: Tensor, ids: Tensor) -> Tensor:
    """The loss ablation measures, per position, from the final hidden states [B, T, d] a block of positions at
    a time: ids [B, T] → [B, T - 1] for a decoder (the next token), [B, T] for a masked-language-model encoder
    (each token from its own position, nothing masked)."""
    if not model.config.causal:
        return blocks.losses(model, hidden, ids)
    return blocks.losses(model, hidden[:, :-1], ids[:, 1:])


def predictions(model, hidden: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """prediction_losses and the top token at every position ([B, T], the last one included), from one reading
    of the logits a block of positions at a time."""
    targets = prediction_targets(model, ids)
    loss, top = blocks.by_blocks(model, hidden, lambda logits, at: (blocks.cross_entropy(logits, targets[:, at]),
                                                                    logits.argmax(-1)))
    return (loss[:, :-1] if model.config.causal else loss), top


def check_loss_model(model) -> None:
    if model.encoder is not None or model.lm_head is None:
        raise ValueError("ablation measures the model's loss on the text: it needs an LM head (a decoder, or an "
                         "encoder with its masked-language-model head) and no separate encoder" + reads_a_target(model))


def naming_rule(name: str) -> str | None:
    """How a score names a head, in words ("≥ 0.5"; a sink head: "> ε = 0.3"), None where it names none."""
    threshold = SCORES[name][1]
    if threshold is None:
        return None
    return f"> ε = {threshold:g}" if name == "first_token" else f"≥ {threshold:g}"


def named_heads(scores: dict[str, Tensor]) -> dict[str, list[tuple[int, int, float]]]:
    """Heads whose score passes its naming threshold: name → [(layer, head, score)], strongest first. A sink head
    is named by core.analysis.sinks.sink_heads, the rule every sink count uses (Gu et al.'s ε, strictly above)."""
    named = {}
    for key, table in scores.items():
        threshold = SCORES[key][1]
        if threshold is None:
            continue
        hits = (sink_heads(table) if key == "first_token" else table >= threshold).nonzero().tolist()
        named[key] = sorted(((l, h, table[l, h].item()) for l, h in hits), key=lambda t: -t[2])
    return named


def top_heads(table: Tensor, k: int = 5, largest: bool = True) -> list[tuple[int, int, float]]:
    """The k heads with the highest (or lowest) score: [(layer, head, score)]."""
    flat = table.flatten()
    order = flat.topk(min(k, flat.numel()), largest=largest).indices
    return [(int(i) // table.shape[1], int(i) % table.shape[1], flat[i].item()) for i in order]


# ---- ablation ----

@dataclass
class AblationResult:
    clean_loss: Tensor      # [T - 1] per-token next-token loss without ablation ([T] for an encoder's MLM head)
    ablated_loss: Tensor    # the same with the heads removed
    clean_top: Tensor       # [T] the top next token at each position
    ablated_top: Tensor     # [T]

    @property
    def delta(self) -> Tensor:
        return self.ablated_loss - self.clean_loss

    @property
    def changed(self) -> Tensor:
        """Positions whose top next-token prediction changed."""
        return (self.clean_top != self.ablated_top).nonzero().squeeze(-1)


def ablate(model, ids: Tensor, heads, ablation: str = "zero") -> AblationResult:
    """The per-token loss with and without the chosen (layer, head) pairs (main stack's self-attention)."""
    check_loss_model(model)
    ids = one_text(ids).to(model.device)
    with torch.inference_mode():
        clean_loss, clean_top = predictions(model, model(ids, return_logits=False).hidden_states, ids)
        ablated = model(ids, ablate_heads=heads, ablation=ablation, return_logits=False).hidden_states
        ablated_loss, ablated_top = predictions(model, ablated, ids)
    return AblationResult(clean_loss[0].cpu(), ablated_loss[0].cpu(), clean_top[0].cpu(), ablated_top[0].cpu())


def ablation_sweep(model, ids: Tensor, ablation: str = "zero", batch: int = 16, progress=None) -> Tensor:
    """Mean loss increase when each head alone is removed: [L, H]. Heads go through `batch` at a time, one per
    copy of the text (each row of the batch ablates a different head), and each batch resumes from the clean
    residual stream entering its first layer: the blocks before it are the same as without ablation.
    progress(done, total) after each batch."""
    cfg = model.config
    check_loss_model(model)
    ids = one_text(ids).to(model.device)
    heads = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    with torch.inference_mode():
        out = model(ids, record="resid_pre", return_logits=False)
        clean = prediction_losses(model, out.hidden_states, ids).mean()
        increase = torch.zeros(len(heads))
        for start in range(0, len(heads), batch):
            chunk = heads[start:start + batch]
            rows = torch.zeros(len(chunk), cfg.n_layers, cfg.n_heads, dtype=torch.bool, device=model.device)
            for r, (l, h) in enumerate(chunk):
                rows[r, l, h] = True
            first = chunk[0][0]
            probe = Probe(cfg, ablate_heads=rows, ablation=ablation)
            tokens = ids.expand(len(chunk), -1)
            hidden = model.run_stack(model.stack, tokens, None, kind="self", causal=cfg.causal, probe=probe,
                                     start_layer=first, resid=out.records["resid_pre"][first].expand(len(chunk), -1, -1))
            loss = prediction_losses(model, hidden, tokens)                # [batch, T - 1], in blocks of positions
            increase[start:start + len(chunk)] = (loss.mean(-1) - clean).cpu()
            if progress is not None:
                progress(min(start + batch, len(heads)), len(heads))
    return increase.view(cfg.n_layers, cfg.n_heads)


# ---- attribution for one prediction ----

BASELINES = ("pad", "mean", "zero")  # integrated gradients' starting points (see baseline_embeddings)


@dataclass
class Attribution:
    position: int           # the query position whose next-token prediction is explained
    target: int             # the explained token id (by default the model's top choice there)
    foil: int | None        # with a foil, every view explains logit(target) − logit(foil) (contrastive)
    baseline: str           # integrated gradients' starting point, one of BASELINES
    steps: int              # points of the path integrated gradients walked
    head: Tensor            # [position + 1] the chosen head's attention row
    head_mean: Tensor       # [position + 1] the mean over the chosen layer's heads
    rollout: Tensor         # [position + 1] attention rollout over all layers
    grad_input: Tensor      # [position + 1] gradient × input, summed over d
    integrated: Tensor      # [position + 1] integrated gradients, summed over d
    completeness_error: float  # |Σ integrated − (f(x) − f(baseline))| at these steps; measured, not bounded
    logit_difference: float    # f(x) − f(baseline), f = logit(target) (− logit(foil))

    def correlations(self) -> dict[str, dict[str, float]]:
        views = {"head": self.head, "head mean": self.head_mean, "rollout": self.rollout,
                 "gradient × input": self.grad_input, "integrated gradients": self.integrated}
        return {a: {b: spearman(x, y) for b, y in views.items()} for a, x in views.items()}


@dataclass
class Completeness:
    """Integrated gradients' completeness at one number of steps: Σ IG should equal f(x) − f(baseline)."""
    steps: int
    total: float            # Σ integrated gradients over the tokens
    difference: float       # f(x) − f(baseline)

    @property
    def error(self) -> float:
        return abs(self.total - self.difference)


def check_baseline(baseline: str) -> str:
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(map(repr, BASELINES))}, got {baseline!r}")
    return baseline


def baseline_embeddings(model, embeds: Tensor, baseline: str = "pad") -> Tensor:
    """Integrated gradients' starting point [T, d], positions kept:
    - "pad": the padding (else end-of-text) token's row at every position, or the mean row where that one is
      missing or zero (an untrained padding row);
    - "mean": the mean of the embedding table's rows at every position;
    - "zero": all zeros. A poor start wherever nothing else enters the stream (no learned positions, no biases:
      a Llama-style stack): a final RMSNorm or LayerNorm turns a stream near zero into a full-sized one, so the
      path's whole change crowds into a jump at its very start, which the midpoints of a modest number of steps
      step over, leaving a large completeness error."""
    if check_baseline(baseline) == "zero":
        return torch.zeros_like(embeds)
    cfg = model.config
    table = model.stack.embed.tokens.weight.detach()
    token = cfg.pad_token_id if cfg.pad_token_id is not None else (cfg.eos_ids or [None])[0]
    row = table[token] if baseline == "pad" and token is not None else None
    if row is None or not row.any():
        row = table.mean(0)
    return row.to(embeds.dtype).expand_as(embeds)


def explained(logits: Tensor, target: int, foil: int | None) -> Tensor:
    """What attribution explains, from logits [..., V]: logit(target), or logit(target) − logit(foil)."""
    return logits[..., target] if foil is None else logits[..., target] - logits[..., foil]


def integrated_gradients(model, ids: Tensor, embeds: Tensor, baseline: Tensor, position: int, target: int,
                         foil: int | None, steps: int) -> Tensor:
    """Integrated gradients (Sundararajan et al. 2017) of f = explained(logits at `position`) for every input
    token, summed over d: [T]. eq.: IG_i = (x_i − x'_i) · (1/m) Σ_k ∂f(x' + α_k (x − x'))/∂x_i, α_k = (k + ½)/m,
    the midpoint rule with m = `steps` points of the straight path from the baseline x' to the input x
    (embeds, baseline [T, d]). The path goes through the model IG_TOKENS_PER_PASS token-points per pass."""
    alphas = (torch.arange(steps, device=embeds.device, dtype=embeds.dtype) + 0.5) / steps
    path_grad = torch.zeros_like(embeds)
    chunk = max(1, IG_TOKENS_PER_PASS // ids.shape[1])  # points of the path per pass: memory stays bounded
    for a in alphas.split(chunk):
        points = baseline[None] + a[:, None, None] * (embeds - baseline)[None]   # [chunk, T, d]
        path_grad += path_gradient(model, ids.expand(len(a), -1), points, position, target, foil)
    return (path_grad / steps * (embeds - baseline)).sum(-1)


def path_gradient(model, ids: Tensor, points: Tensor, position: int, target: int, foil: int | None) -> Tensor:
    """Σ over the path's points of ∂f/∂x at each: ids [P, T], points [P, T, d] → [T, d]. One pass that reads
    the logits of `position` alone ([P, vocab]); its graph is freed on return, before the next pass builds its
    own, so the peak is one pass's whatever the number of steps."""
    walked = model(ids, grad=True, token_embeddings=points, return_logits=False)
    explained(blocks.at_position(model, walked.hidden_states, position), target, foil).sum().backward()
    return walked.token_embeddings.grad.sum(0)


def explained_at(model, ids: Tensor, rows: Tensor, position: int, target: int, foil: int | None) -> float:
    """f at the input rows [T, d] (the baseline's, for the difference completeness compares with)."""
    with torch.inference_mode():
        hidden = model(ids, token_embeddings=rows[None], return_logits=False).hidden_states
        return explained(blocks.at_position(model, hidden, position)[0], target, foil).item()


def attribution_inputs(model, ids: Tensor, position: int | None, steps) -> tuple[Tensor, int]:
    """The ids attribution reads ([1, position + 1] for a decoder) and the position, checked."""
    if model.encoder is not None or model.lm_head is None:
        raise ValueError("attribution explains a next-token (or masked-token) prediction: it needs a model with "
                         "an LM head and no separate encoder" + reads_a_target(model))
    ids = one_text(ids)
    n = ids.shape[1]
    position = n - 1 if position is None else position
    if not 0 <= position < n:
        raise IndexError(f"position {position} is out of range: the text has positions 0..{n - 1}")
    for count in steps:
        if count < 1:
            raise ValueError(f"steps must be ≥ 1, got {count}")
    return (ids[:, :position + 1] if model.config.causal else ids).to(model.device), position


def explained_tokens(logits: Tensor, target: int | None, foil: int | None) -> tuple[int, int | None]:
    """(target, foil) checked against logits [V]: target defaults to the top token; a foil must differ."""
    vocab = logits.shape[-1]
    target = int(logits.argmax()) if target is None else int(target)
    for name, token in (("target", target), ("foil", foil)):
        if token is not None and not 0 <= token < vocab:
            raise IndexError(f"{name} token id {token} is out of range: the vocabulary has ids 0..{vocab - 1}")
    if foil is not None and int(foil) == target:
        raise ValueError(f"the foil must differ from the target (both are token {target}): "
                         "logit(target) − logit(foil) would be zero everywhere")
    return target, None if foil is None else int(foil)


def rollout(attentions: list[Tensor]) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): per layer the mean over heads plus the residual identity,
    rows renormalised, multiplied from the first layer up. attentions: per layer [H, T, T] → [T, T]."""
    n = attentions[0].shape[-1]
    eye = torch.eye(n, device=attentions[0].device)
    flow = eye
    for probs in attentions:
        a = 0.5 * probs.float().mean(0) + 0.5 * eye
        flow = (a / a.sum(-1, keepdim=True)) @ flow
    return flow


def attribute(model, ids: Tensor, position: int | None = None, layer: int = 0, head: int = 0, steps: int = 32,
              target: int | None = None, foil: int | None = None, baseline: str = "pad") -> Attribution:
    """Four answers to "which input tokens does the prediction at `position` depend on?" for a decoder or an
    encoder with an LM head: the chosen head's attention, rollout, gradient × input and integrated gradients
    (`steps` points of the straight path from a baseline, midpoint rule; see baseline_embeddings for the
    choices). The gradients explain f = logit(target), target by default the model's top token there; with a
    foil, f = logit(target) − logit(foil): why this token rather than that one (contrastive attribution).
    The completeness error |Σ IG − (f(x) − f(baseline))| is measured, not promised to fall as steps grow:
    completeness_by_steps measures it at several step counts."""
    cfg = model.config
    ids, position = attribution_inputs(model, ids, position, (steps,))
    layer, head = cfg.check_head(layer, head)
    check_baseline(baseline)  # a wrong name fails before the costly passes
    out = model(ids, grad=True, capture_attention=True, return_logits=False)
    logits = blocks.at_position(model, out.hidden_states, position)[0]         # [vocab], with its graph
    target, foil = explained_tokens(logits.detach(), target, foil)
    at_input = explained(logits, target, foil)
    at_input.backward()
    embeds = out.token_embeddings.detach()[0]                                  # [T, d]
    grad_input = (out.token_embeddings.grad[0] * embeds).sum(-1)
    base_rows = baseline_embeddings(model, embeds, baseline)                   # [T, d]
    integrated = integrated_gradients(model, ids, embeds, base_rows, position, target, foil, steps)
    difference = at_input.item() - explained_at(model, ids, base_rows, position, target, foil)
    attentions = [a[0] for a in out.attentions]
    keep = slice(0, position + 1) if cfg.causal else slice(None)
    return Attribution(
        position=position, target=target, foil=foil, baseline=baseline, steps=steps,
        head=attentions[layer][head, position, keep].detach().cpu(),
        head_mean=attentions[layer][:, position, keep].mean(0).detach().cpu(),
        rollout=rollout(attentions)[position, keep].detach().cpu(),
        grad_input=grad_input[keep].detach().cpu(), integrated=integrated[keep].detach().cpu(),
        completeness_error=Completeness(steps, integrated.sum().item(), difference).error,
        logit_difference=difference)


def completeness_by_steps(model, ids: Tensor, position: int | None = None, steps: tuple[int, ...] = (8, 32, 128),
                          target: int | None = None, foil: int | None = None,
                          baseline: str = "pad") -> list[Completeness]:
    """Integrated gradients' completeness measured at each number of steps, on the same path and the same f
    as attribute (which gives the same error at the same steps). The error need not shrink as steps grow: the
    midpoint rule's error falls steadily only where the gradient changes smoothly along the path, and where it
    changes sharply between points (a norm of a small stream, a softmax switching keys) more points can land
    worse."""
    ids, position = attribution_inputs(model, ids, position, steps)
    check_baseline(baseline)  # a wrong name fails before the costly passes
    out = model(ids, grad=True, return_logits=False)
    embeds = out.token_embeddings.detach()[0]                                  # [T, d]
    logits = blocks.at_position(model, out.hidden_states, position)[0].detach()
    target, foil = explained_tokens(logits, target, foil)
    base_rows = baseline_embeddings(model, embeds, baseline)
    difference = explained(logits, target, foil).item() - explained_at(model, ids, base_rows, position, target, foil)
    return [Completeness(count, integrated_gradients(model, ids, embeds, base_rows, position, target, foil, count)
                         .sum().item(), difference) for count in steps]


# ---- the logit lens and surprisal ----

@dataclass
class LensTable:
    top: Tensor             # [L, T] each layer's top next token at each position
    top_prob: Tensor        # [L, T] its probability there
    final_prob: Tensor      # [L, T] the probability each layer gives to the final layer's top token
    settles: Tensor         # [T] the first layer from which the final top token stays top-1


def lens_table(model, ids: Tensor) -> LensTable:
    """Each layer's residual stream read as a next-token prediction (see ModelOutput.logit_lens)."""
    if model.lm_head is None:
        raise ValueError("this model has no LM head, so its residual stream cannot be read as predictions")
    if model.encoder is not None:
        raise ValueError("the logit lens table reads the text's own stream, and an encoder-decoder predicts a "
                         f"translation ({model.config.family} here): model(ids, decoder_input_ids=..., "
                         "logit_lens=True) reads its decoder's stream over a target text")
    ids = one_text(ids)
    with torch.inference_mode():
        lens = model(ids.to(model.device), logit_lens=True, logit_lens_top_k=1, return_logits=False).logit_lens
    top = lens.indices[:, 0, :, 0].cpu()                                       # [L, T]
    agrees = top == top[-1]
    # the first layer after the last disagreement: from there on the answer stays the final one
    later_disagreement = torch.flip(torch.cumsum(torch.flip(~agrees, [0]).int(), 0), [0]) > 0   # [L, T]
    settles = later_disagreement.sum(0)
    return LensTable(top, lens.probs[:, 0, :, 0].cpu(), lens.final_probs[:, 0].cpu(), settles)


@dataclass
class Surprisal:
    loss: Tensor            # [T - 1] nats for each token after the first
    alternatives: Tensor    # [T - 1, k] the k most likely tokens at each step
    probs: Tensor           # [T - 1, k] their probabilities

    @property
    def mean(self) -> float:
        return self.loss.mean().item()

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean)


def surprisal(model, ids: Tensor, k: int = 5) -> Surprisal:
    """How surprised the model is by each token of the text, given the ones before it."""
    if not model.config.causal or model.lm_head is None or model.encoder is not None:
        raise ValueError("surprisal needs a decoder-only model that predicts the next token of the text"
                         + reads_a_target(model))
    ids = one_text(ids)
    if ids.shape[1] < 2:
        raise ValueError("surprisal needs at least two tokens")
    ids = ids.to(model.device)
    with torch.inference_mode():
        hidden = model(ids, return_logits=False).hidden_states[:, :-1]       # the last position predicts nothing here
        targets = ids[:, 1:]

        def read(logits: Tensor, at: slice) -> tuple[Tensor, Tensor, Tensor]:
            logits = logits.float()
            top = logits.softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
            return blocks.cross_entropy(logits, targets[:, at]), top.indices, top.values

        loss, indices, values = blocks.by_blocks(model, hidden, read)
    return Surprisal(loss[0].cpu(), indices[0].cpu(), values[0].cpu())

"""What each safeguard of eq. 2.1 changes, measured on the loaded model: the stages scores → mask → softmax for
one head (with the family's own terms: its scale, soft-cap, score bias and sliding window), and the model run with
the causal mask, the padding mask or the scale on QKᵀ switched off."""

from __future__ import annotations

import math

import numpy as np
import torch

from core.analysis.capture import LayerObserver
from core.analysis.inspect import queries_keys
from core.logits import by_blocks, cross_entropy
from core.attention import attention_stages, causal_mask, position_mask, row_entropy
from core.attention import local_global_mask as band_and_globals  # the mask the model itself uses
from ui.services.attention import score_formula
from ui.services.checks import UserError
from ui.services.text import as_batch, to_numpy

MAX_MASK_TOKENS = 512  # the mask demo runs the model six times on its text
MAX_STAGE_WINDOW = 48  # the mask demo draws 6 matrices of this size


def viewed_attentions(model, out) -> tuple:
    """The attentions of the stack the views read (model.attention_stack): a seq2seq model's encoder's."""
    return out.encoder_attentions if model.attention_stack()[1] == "encoder" else out.attentions
def qk_for_head(model, ids: list[int], layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen head's rotated queries and keys [T, d_k] (grouped-query heads share their key head)."""
    cfg = model.config
    q, k = queries_keys(model, as_batch(ids, model.device), layer, rotate=True)
    kv_head = cfg.kv_head(head)
    return q[0, head].float(), k[0, kv_head].float()


def window_terms(model, layer: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The terms of eq. 2.1 beyond QKᵀ·scale that layer `layer` applies to a window of n queries and keys from
    position `start`: its causal mask [n, n], narrowed to the sliding window on a "sliding" layer (i − j < w), and
    the bias on its scores [H, n, n] (ALiBi, T5's relative buckets), or None."""
    cfg = model.config
    positions = torch.arange(start, start + n)
    allowed = position_mask(positions, positions, True, cfg.layer_window(layer))
    stack = model.attention_stack()[0]
    if stack.score_bias is None:
        return allowed, None
    positions = torch.arange(start, start + n, device=model.device)[None]                    # [1, n]
    with torch.inference_mode():
        return allowed, stack.score_bias(positions, positions)[0].float().cpu()               # [H, n, n]


def mask_stages(model, q: torch.Tensor, k: torch.Tensor, layer: int, head: int,
                start: int) -> dict[str, tuple[np.ndarray, ...]]:
    """Eq. 2.1 for one window of queries and keys ([n, d_k] each, from position `start`) of one head, as the layer
    computes it: S = QKᵀ·scale (config.score_scale), then the soft-cap and the bias where the family has them
    (core.attention.attention_stages), with the layer's mask on (causal, and its sliding window) and off."""
    cfg, n = model.config, q.shape[0]
    allowed, bias = window_terms(model, layer, start, n)
    bias = None if bias is None else bias[head].to(q.device)[None, None]                     # [1, 1, n, n]
    out = {}
    for name, mask in (("causal mask on", allowed.to(q.device)), ("causal mask off", None)):
        scores, masked, probs = attention_stages(q[None, None], k[None, None], mask, cfg.score_scale,
                                                 softcap=cfg.attn_softcap, bias=bias)
        out[name] = (to_numpy(scores[0, 0]), to_numpy(masked[0, 0]), to_numpy(probs[0, 0]))
    return out


def next_token_metrics(model, hidden: torch.Tensor, ids: list[int]) -> tuple[float, float]:
    """Mean cross-entropy (nats) and accuracy of predicting token t+1 from position t, read from the final hidden
    states [1, T, d] a block of positions at a time (a 250k vocabulary's logits for a whole text are never held)."""
    target = torch.tensor(ids[1:], device=hidden.device)[None]                 # [1, T - 1]
    losses, top = by_blocks(model, hidden[:, :-1],
                            lambda logits, at: (cross_entropy(logits, target[:, at]), logits.argmax(-1)))
    return losses.mean().item(), (top == target).float().mean().item()


def causal_effect(model, ids: list[int]) -> dict | None:
    """Next-token loss and accuracy on the text with the causal mask on and off; None without an LM head."""
    if len(ids) < 2:
        raise UserError("The mask demo needs at least 2 tokens of text.")
    batch = as_batch(ids, model.device)
    if model.lm_head is None:
        return None
    with torch.inference_mode():
        on = model(batch, return_logits=False).hidden_states
        off = model(batch, causal_mask=False, return_logits=False).hidden_states
        loss_on, acc_on = next_token_metrics(model, on, ids)
        loss_off, acc_off = next_token_metrics(model, off, ids)
    return {"loss": (loss_on, loss_off), "accuracy": (acc_on, acc_off), "predictions": len(ids) - 1}


def pad_pair(model, ids_a: list[int], ids_b: list[int]) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Batch two sequences, padding the shorter: on the left for causal models (so padding sits before the
    real tokens, where a causal query can see it), on the right for encoders. Returns ids, mask [2, T], side."""
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (model.config.eos_ids or [0])[0]
    n = max(len(ids_a), len(ids_b))
    side = "left" if model.config.causal else "right"
    rows, masks = [], []
    for ids in (ids_a, ids_b):
        fill = [pad] * (n - len(ids))
        rows.append(fill + ids if side == "left" else ids + fill)
        real = [1] * len(ids)
        masks.append([0] * len(fill) + real if side == "left" else real + [0] * len(fill))
    return torch.tensor(rows, device=model.device), torch.tensor(masks, device=model.device), side


def padding_effect(model, ids_a: list[int], ids_b: list[int]) -> dict:
    """Two texts batched with padding, run with the padding mask on and off.

    Per layer: the attention mass that the real queries of the padded row put on pad keys (mean over heads
    and queries). And how far those real tokens' outputs move from running the short text alone."""
    if len(ids_a) == len(ids_b):
        raise UserError("The two padding texts have the same number of tokens, so nothing is padded; make one shorter.")
    if len(ids_a) < len(ids_b):
        ids_a, ids_b = ids_b, ids_a
    batch, mask, side = pad_pair(model, ids_a, ids_b)
    real = mask[1].bool()
    with torch.inference_mode():
        alone = model(as_batch(ids_b, model.device)).hidden_states[0].float()  # [Tb, d]
        results = {}
        for name, use_mask in (("padding mask on", True), ("padding mask off", False)):
            out = model(batch, attention_mask=mask, padding_mask=use_mask, capture_attention=True)
            attn = viewed_attentions(model, out)
            pad_mass = [float(a[1][:, real][:, :, ~real].sum(-1).mean()) for a in attn]  # a: [B, H, T, T]
            hidden = out.hidden_states[1][real].float()
            change = (hidden - alone).norm(dim=-1) / alone.norm(dim=-1).clamp_min(1e-12)
            results[name] = {
                "pad_mass": pad_mass,
                "max_change": float(change.max()),
                "mean_change": float(change.mean()),
            }
    return {"side": side, "n_pad": int((~real).sum()), "n_real": int(real.sum()), "results": results}


def scaling_entropy(model, ids: list[int], layer: int, head: int) -> dict:
    """Mean attention entropy per layer with and without the scale on QKᵀ (1/√d_k, or the family's own factor),
    and the chosen head's entropy. The first curve is the model as it is."""
    batch = as_batch(ids, model.device)
    formula = score_formula(model.config)
    out = {}
    with torch.inference_mode():
        for name, scale in (("scaled by 1/√d_k" if formula == "QKᵀ/√d_k" else f"scaled: {formula}", True),
                            ("not scaled", False)):
            res = model(batch, scale=scale, capture_attention=True)
            attn = viewed_attentions(model, res)
            per_layer = [float(row_entropy(a[0]).mean()) for a in attn]
            out[name] = {
                "per_layer": per_layer,
                "head": float(row_entropy(attn[layer][0, head]).mean()),
                "head_max_weight": float(attn[layer][0, head].max(-1).values.mean()),
            }
    causal = model.config.causal
    n = len(ids)
    # the most a row can have: log(number of keys it may see), averaged over rows
    uniform = float(np.mean(np.log(np.arange(1, n + 1)))) if causal else math.log(n)
    return {"curves": out, "uniform": uniform, "head_dim": model.config.head_dim,
            "factor": 1.0 / model.config.score_scale}


MAX_WINDOW_TOKENS = 256  # the window demo draws the chosen head's whole weights, three T × T matrices


def local_global_mask(n: int, window: int, global_tokens: int = 0, causal: bool = True) -> torch.Tensor:
    """[n, n] bool, the mask forward(window=w, global_tokens=g) puts on every layer (core.attention's
    local_global_mask): causal, query i sees key j when j ≤ i and (i − j < w or j < g); an encoder's (causal=False)
    is Longformer's, |i − j| < w, or j < g, or i < g (the global tokens see every key and every query sees them)."""
    band = band_and_globals(n, n, window, global_tokens, bidirectional=not causal)
    return band & causal_mask(n, n) if causal else band


def own_masks(cfg, n: int) -> list[torch.Tensor]:
    """Each layer's own mask [n, n] as the model is loaded: causal (every key for an encoder), narrowed to the
    family's window on a "sliding" layer."""
    full = local_global_mask(n, n, causal=cfg.causal)
    own = full if cfg.sliding_window is None else local_global_mask(n, cfg.sliding_window, causal=cfg.causal)
    return [own if cfg.layer_type(layer) == "sliding" else full for layer in range(cfg.n_layers)]


def attention_cost(cfg, n: int, window: int, global_tokens: int, itemsize: int) -> dict:
    """Scores computed by each layer's head (Σ over queries of the keys it reads) with the model's own masks and
    with the window on every layer, and the bytes its weights would hold at `itemsize` bytes a weight; totals
    over the layers and the n_heads query heads."""
    chosen = local_global_mask(n, window, global_tokens, causal=cfg.causal)
    own = [int(m.sum()) for m in own_masks(cfg, n)]
    windowed = [int((m & chosen).sum()) for m in own_masks(cfg, n)]
    total_own, total_windowed = sum(own) * cfg.n_heads, sum(windowed) * cfg.n_heads
    return {"per_layer": {"full": own, "windowed": windowed}, "heads": cfg.n_heads, "itemsize": itemsize,
            "scores": (total_own, total_windowed), "bytes": (total_own * itemsize, total_windowed * itemsize),
            "dense": n * n * cfg.n_heads * cfg.n_layers * itemsize}


def kl_per_position(model, full: torch.Tensor, windowed: torch.Tensor) -> torch.Tensor:
    """KL(P_full ‖ P_windowed) in nats of the next-token distributions at each position [T], from the final
    hidden states [1, T, d] of the two runs, read a block of positions at a time."""
    def read(logits, at):                                          # logits [2, t, vocab]
        logp = torch.log_softmax(logits.float(), -1)
        return (logp[0].exp() * (logp[0] - logp[1])).sum(-1)[None]  # [1, t]
    return by_blocks(model, torch.cat([full, windowed]), read)[0].clamp_min(0.0)


def own_window_check(model, ids: list[int]) -> dict | None:
    """Where the loaded model has its own window w: the demo's mask for w equals the family's own mask of a
    "sliding" layer, and forward's window=w reproduces it: on a model with full layers, the first full layer's
    weights under window=w are nonzero exactly where the family's sliding layer's are; on a model whose every
    layer slides, window=w on top changes no weight (max |Δ|). None without a window."""
    cfg = model.config
    if cfg.sliding_window is None or "sliding" not in cfg.layer_types:
        return None
    n, w = len(ids), cfg.sliding_window
    sliding = cfg.layer_types.index("sliding")
    full = cfg.layer_types.index("full") if "full" in cfg.layer_types else None
    own_obs, seam_obs = LayerObserver(sliding), LayerObserver(sliding if full is None else full)
    batch = as_batch(ids, model.device)
    with torch.inference_mode():
        model(batch, observer=own_obs, return_logits=False)
        model(batch, observer=seam_obs, window=w, return_logits=False)
    own = window_terms(model, sliding, 0, n)[0]
    result = {"window": w, "sliding_layer": sliding, "full_layer": full, "sliding": cfg.layer_types.count("sliding"),
              "layers": cfg.n_layers, "mask_equal": bool(torch.equal(own, local_global_mask(n, w)))}
    if full is None:
        result["max_diff"] = float((own_obs.probs - seam_obs.probs).abs().max())
        result["reproduced"] = result["max_diff"] < 1e-6
    else:   # where the weights are nonzero, every head, both layers
        own_support, seam_support = (own_obs.probs > 0).cpu(), (seam_obs.probs > 0).cpu()
        result["reproduced"] = bool((own_support == own).all() and (seam_support == own).all())
    return result


def hidden_change(full: torch.Tensor, windowed: torch.Tensor) -> tuple[np.ndarray, float]:
    """What the window changed in an encoder's output, from the final hidden states [1, T, d] of the two runs:
    the relative change ‖h_window − h_full‖ / ‖h_full‖ at each position [T], and the cosine between the two
    sentence embeddings, each the mean of its run's final hidden states over the positions (mean pooling)."""
    full, windowed = full[0].float(), windowed[0].float()                         # [T, d]
    change = (windowed - full).norm(dim=-1) / full.norm(dim=-1).clamp_min(1e-12)
    cosine = torch.nn.functional.cosine_similarity(full.mean(0), windowed.mean(0), dim=0)
    return to_numpy(change), float(cosine)


def window_effect(model, ids: list[int], layer: int, head: int, window: int, global_tokens: int) -> dict:
    """The model run as loaded and with a window of w keys (plus the g global tokens) on every layer: the chosen
    head's weights in both [T, T], the attention cost of both counted, and what the window changed in the output:
    with an LM head, the KL from the first run's next-token distribution to the second's at each position; on an
    encoder, each position's relative change of its final hidden state and the cosine of the mean-pooled sentence
    embeddings (hidden_change). A decoder's window is causal, an encoder's symmetric (local_global_mask)."""
    batch = as_batch(ids, model.device)
    full_obs, windowed_obs = LayerObserver(layer), LayerObserver(layer)
    with torch.inference_mode():
        full = model(batch, observer=full_obs, return_logits=False).hidden_states
        windowed = model(batch, observer=windowed_obs, window=window, global_tokens=global_tokens,
                         return_logits=False).hidden_states
        kl = None if model.lm_head is None else to_numpy(kl_per_position(model, full, windowed))
        change, cosine = hidden_change(full, windowed)
    itemsize = torch.finfo(model.dtype).bits // 8                   # the model's own dtype: 2 for bf16, 4 for fp32
    causal = model.config.causal
    return {"mask": local_global_mask(len(ids), window, global_tokens, causal).numpy(),                 # bool [T, T]
            "own_mask": own_masks(model.config, len(ids))[layer].numpy(), "causal": causal,
            "weights": (to_numpy(full_obs.probs[head]), to_numpy(windowed_obs.probs[head])), "kl": kl,
            "change": change, "cosine": cosine,
            "cost": attention_cost(model.config, len(ids), window, global_tokens, itemsize)}

"""What each safeguard of eq. 2.1 changes, measured on the loaded model: the stages scores → mask → softmax for
one head (with the family's own terms: its scale, soft-cap, score bias and sliding window), and the model run with
the causal mask, the padding mask or the scale on QKᵀ switched off."""

from __future__ import annotations

import math

import numpy as np
import torch

from core.analysis.inspect import queries_keys
from core.analysis.logits import by_blocks, cross_entropy
from core.attention import attention_stages, causal_mask, sliding_window_mask
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
    kv_head = head // (cfg.n_heads // cfg.n_kv_heads)
    return q[0, head].float(), k[0, kv_head].float()


def window_terms(model, layer: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The terms of eq. 2.1 beyond QKᵀ·scale that layer `layer` applies to a window of n queries and keys from
    position `start`: its causal mask [n, n], narrowed to the sliding window on a "sliding" layer (i − j < w), and
    the bias on its scores [H, n, n] (ALiBi, T5's relative buckets), or None."""
    cfg = model.config
    allowed = causal_mask(n, n)
    if cfg.layer_type(layer) == "sliding" and cfg.sliding_window is not None:
        allowed = allowed & sliding_window_mask(n, n, cfg.sliding_window)
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


def row_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each attention row, [..., Tq]."""
    p = probs.float()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


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

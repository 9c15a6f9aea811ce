"""The "lens" part of bench/corpus/speed.py: the head scores of head_scores_over, computed the way a
transformer-lens user would, from the attention patterns that run_with_cache keeps, on the same weights.

transformer-lens is not a dependency of the app: it is installed in an environment of its own
(requirements-bench.txt). Without it, lens_model says why and the part is skipped.

The scores are written out again here from their definitions (core/analysis/heads.py SCORES), over whole
[B, H, T, T] patterns, not through the core's row_scores: so the agreement check covers both the patterns and
the scoring. "induction" is measured by the core only on texts that repeat a span once; speed.py's windows
are not such texts, so it has no value to compare and is left out (the check says so).
"""
from __future__ import annotations

import torch
from torch import Tensor

from core.analysis.heads import CAUSAL_ONLY, LOCAL_WINDOW, SCORES

KINDS = tuple(name for name in SCORES if name not in CAUSAL_ONLY)     # the kinds compared on any text
TOLERANCE = 1e-4                                                        # largest per-item gap accepted


def lens_model(folder, tokenizer):
    """(transformer-lens model on the folder's weights, "") or (None, why it cannot be had). TransformerLens 4's
    TransformerBridge around a transformers model loaded from the folder (eager attention, so the pattern is
    computed), or 3's HookedTransformer without weight processing; no hub."""
    try:
        import transformer_lens
        from transformers import AutoModelForCausalLM
    except ImportError as error:
        return None, (f"transformer-lens is not installed in this environment ({error}); install it in one of its "
                      "own: see requirements-bench.txt")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    try:
        from transformer_lens.model_bridge import TransformerBridge
        model = TransformerBridge.boot_transformers(str(folder), hf_model=hf, tokenizer=tokenizer, device="cpu")
    except ImportError:
        model = transformer_lens.HookedTransformer.from_pretrained_no_processing(
            "HuggingFaceTB/SmolLM2-135M-Instruct", hf_model=hf, tokenizer=tokenizer, device="cpu")
    return model, ""


def is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern")


def pattern_scores(patterns: Tensor, ids: Tensor) -> dict[str, Tensor]:
    """SCORES' definitions over one layer's patterns [B, H, T, T] (rows sum to 1) of unpadded texts ids [B, T]:
    name → [B, H]."""
    p = patterns.float()
    n = p.shape[-1]
    i = torch.arange(n)
    earlier = i[None, :] < i[:, None]                                           # [T, T]: key j before query i
    copies = (ids[:, :, None] == ids[:, None, :]) & earlier                     # [B, T, T]: earlier copies
    rows = copies.any(-1)                                                       # [B, T]: queries with a copy
    on_copies = (p * copies[:, None]).sum(-1)                                   # [B, H, T]
    return {
        "previous_token": p[..., i[1:], i[1:] - 1].mean(-1),                   # weight A[i, i − 1], i ≥ 1
        "first_token": p[..., 0].mean(-1),
        "local": (p * ((i[:, None] - i[None, :]).abs() <= LOCAL_WINDOW)).sum(-1).mean(-1),
        "entropy": -torch.special.xlogy(p, p).sum(-1).mean(-1),                # H = −Σ_j A log A, 0 log 0 = 0
        "duplicate_token": (on_copies * rows[:, None]).sum(-1) / rows.sum(-1, keepdim=True).clamp_min(1),
    }


def lens_scores(model, texts: list[Tensor], batch: int = 1) -> dict[str, Tensor]:
    """run_with_cache over the texts, `batch` at a time (batch > 1 needs texts of one length: no padding), caching
    the patterns only; scored per layer: name → [N, L, H]."""
    if batch > 1 and len({len(t) for t in texts}) > 1:
        raise ValueError("a batched run_with_cache needs texts of one length (nothing pads them here)")
    per_batch = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            ids = torch.stack(texts[start:start + batch])                       # [B, T]
            _, cache = model.run_with_cache(ids, names_filter=is_pattern)
            layers = [pattern_scores(cache[f"blocks.{layer}.attn.hook_pattern"], ids)
                      for layer in range(len(model.blocks))]
            per_batch.append({name: torch.stack([scores[name] for scores in layers], 1) for name in KINDS})
    return {name: torch.cat([scores[name] for scores in per_batch]) for name in KINDS}


def largest_gaps(ours: dict, theirs: dict[str, Tensor]) -> dict[str, float]:
    """name → the largest |head_scores_over's per-item value − transformer-lens's| over texts × layers × heads.
    ours: head_scores_over's result (name → Over over every text, in order)."""
    gaps = {}
    for name in KINDS:
        mine = ours[name].per_item
        if mine.shape != theirs[name].shape:
            raise SystemExit(f"lens: {name} per-item shapes differ: head_scores_over {list(mine.shape)}, "
                             f"transformer-lens {list(theirs[name].shape)}")
        gaps[name] = (mine.double() - theirs[name].double()).abs().max().item()
    return gaps


def check_agreement(ours: dict, theirs: dict[str, Tensor]) -> str:
    """One line naming each kind's largest gap; stops the run where one passes TOLERANCE."""
    gaps = largest_gaps(ours, theirs)
    line = ", ".join(f"{name} {gap:.1e}" for name, gap in gaps.items())
    wrong = [name for name, gap in gaps.items() if not gap <= TOLERANCE]          # NaN counts as wrong
    if wrong:
        raise SystemExit(f"lens: head_scores_over and transformer-lens disagree on {', '.join(wrong)} by more than "
                         f"{TOLERANCE:g} (largest gaps: {line})")
    induction = ours.get("induction")
    left = ("" if induction is None else
            f"; induction not compared: head_scores_over measured it on {induction.n} of the texts (it needs a span "
            "repeated once)")
    return f"largest per-item gaps (≤ {TOLERANCE:g}): {line}{left}"

"""How large a fresh Lab model's first update is against the residual stream it joins: the reason a Marian-layout
Pre-LN run can stall where Post-LN learns (its token embeddings are scaled by √d, and Pre-LN adds each update to
that stream as it is). Measured on the model the config builds, before any step, with and without the scale; the
course's block lesson and the Lab's Pre-LN/Post-LN comparison both read it. Never imports gradio."""

from __future__ import annotations

from dataclasses import replace

import torch

from core.lab import train as engine
from core.lab.train import LabConfig

EXAMPLES = 16   # held-out examples the share is the median over (their real tokens)


def median_ratio(part: torch.Tensor, whole: torch.Tensor) -> float:
    """The median over tokens of ‖part‖ / ‖whole‖, as a percentage."""
    return 100 * float((part.norm(dim=-1) / whole.norm(dim=-1).clamp_min(1e-12)).median())


def first_update_share(config: LabConfig, examples: int = EXAMPLES) -> float:
    """The median over real tokens of ‖first attention output‖ / ‖residual it joins‖ (%), in the encoder of a
    Marian-layout model (the decoder's of a Llama one) as `config` builds it, seeded, untrained."""
    seq2seq = config.family == "marian"
    pairs = engine.examples(config.task, config.seed, examples, True, config.lengths)
    batch = engine.make_batch(pairs, seq2seq=seq2seq)
    prefix = "encoder." if seq2seq else ""
    real = batch.inputs["attention_mask"].bool()                                         # [B, T] real tokens
    model = engine.build_model(config).eval()
    with torch.inference_mode():
        records = model(**batch.inputs, record=[prefix + "resid_pre", prefix + "attn_out"]).records
    x, a = records[prefix + "resid_pre"][0][real], records[prefix + "attn_out"][0][real]   # [tokens, d]
    return median_ratio(a, x)


def first_update_shares(config: LabConfig) -> dict[str, float]:
    """first_update_share with the √d embedding scale ("with") and without it ("without"), and d_model."""
    return {"with": first_update_share(replace(config, embed_scale=True)),
            "without": first_update_share(replace(config, embed_scale=False)), "d_model": config.d_model}

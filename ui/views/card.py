"""The model card: the config that shapes every view, and where the parameters sit against the theory's 4d²
(attention) and 8d² (feed-forward) per layer."""

from __future__ import annotations

from ui.services.inside import parameter_counts
# a family name a newcomer may not know, in words: said where the name first shows (the card, the Lab)
FAMILY_WORDS = {
    "marian": "an encoder-decoder translation model family, as in MarianMT: an encoder reads the source, a decoder "
              "writes the output and reads the encoder through cross-attention",
    "gpt_neox": "a decoder (EleutherAI's Pythia, GPT-NeoX) whose RoPE turns only part of each head (rotary_pct), and "
                "whose blocks are usually parallel: attention and the feed-forward both read the block's input and "
                "their outputs are added together, x + attn(norm₁ x) + mlp(norm₂ x)",
    "bloom": "a decoder with no position embeddings at all: ALiBi adds −m_h·(i − j) to each head's scores, a penalty "
             "that grows linearly with distance, with a fixed slope m_h per head",
    "opt": "Meta's decoder in the GPT-2 layout (learned positions, LayerNorm), whose position table is read two rows "
           "on (position p uses row p + 2); the norm sits before each sublayer (Pre-LN), or after it (Post-LN) where the "
           "config says do_layer_norm_before = false",
    "llama": "a decoder with RoPE, RMSNorm and a gated (SwiGLU) feed-forward, as in Llama; Mistral's layers see only "
             "a sliding window of recent keys, Qwen3's normalise each head's queries and keys (QK-norm)",
    "phi3": "Microsoft's decoder in the Llama layout (RoPE, RMSNorm, gated feed-forward) with fused projections; some "
            "checkpoints see only a sliding window of recent keys, others turn only part of each head with RoPE",
    "gemma": "Google's decoder in the Llama layout with norms that scale by 1 + γ and embeddings multiplied by √d; "
             "Gemma 2 and 3 alternate sliding-window and full layers, put a second norm on each sublayer's output "
             "(sandwich norms) and scale the scores by their own factor; Gemma 2 soft-caps scores and logits "
             "(c·tanh(x / c)), Gemma 3 normalises queries and keys (QK-norm)",
    "t5": "Google's encoder-decoder: no position embeddings, but a learned bias per head for each bucket of "
          "relative distance j − i, added to the scores (exact for near keys, logarithmic buckets further away); "
          "RMSNorm before each sublayer and no 1/√d_k on the scores",
}

FAMILY_NAMES = {"gpt_neox": "GPT-NeoX", "bloom": "BLOOM", "opt": "OPT", "phi3": "Phi-3", "t5": "T5"}  # as written


def parameter_table(model) -> list[list[str]]:
    """Rows [part, measured, formula, ratio] comparing the model's counts with the theory's 4d² and 8d²."""
    cfg = model.config
    counts = parameter_counts(model)
    d = cfg.d_model
    per_layer = counts.get("per_layer", {})
    rows = []
    for part, formula_name, formula in (
        ("attention", "4d²", 4 * d * d),
        ("feed_forward", "8d²", 8 * d * d),
    ):
        measured = per_layer.get(part)
        if measured is None:
            continue
        rows.append(
            [
                f"{part.replace('_', '-')} per layer",
                f"{measured:,}",
                f"{formula_name} = {formula:,}",
                f"{measured / formula:.2f}",
            ]
        )
    names = {
        "attention": "attention (all layers)",
        "feed_forward": "feed-forward (all layers)",
        "lm_head": "LM head" + lm_head_note(model, counts.get("lm_head", 0)),
        "position_bias": "relative-position bias tables (one per stack)",
    }
    for part in ("embeddings", "attention", "feed_forward", "norms", "position_bias", "lm_head", "total"):
        if part in counts and (counts[part] or part != "position_bias"):
            rows.append([names.get(part, part), f"{counts[part]:,}", "", ""])
    return rows


def positions_words(cfg) -> str:
    """The config's `positional`, and where a model with "none" gets its positions from instead."""
    if cfg.positional == "none" and cfg.score_bias == "alibi":
        return "none added to the embeddings (ALiBi: a bias on the scores)"
    if cfg.positional == "none" and cfg.score_bias == "relative":
        return "none added to the embeddings (a relative-position bias on the scores)"
    return cfg.positional


def lm_head_note(model, own_parameters: int) -> str:
    if not model.config.has_lm_head:
        return " (none: this checkpoint is an encoder without one)"
    if own_parameters == 0 or model.config.tie_word_embeddings:
        return " (tied: it reuses the token embeddings)"
    return ""


def attention_terms(cfg) -> list[str]:
    """The named terms of this model's attention and blocks (core/attention.py, core/model.py), in words."""
    scale = cfg.score_scale
    plain = cfg.attn_scale is None and cfg.scale_attention
    terms = ["scores QKᵀ/√d_k" if plain else f"scores QKᵀ × {scale:.4g}" + (" (no 1/√d_k)" if scale == 1 else "")]
    if cfg.attn_softcap is not None:
        terms.append(f"soft-capped to {cfg.attn_softcap:g}·tanh(S / {cfg.attn_softcap:g})")
    if cfg.score_bias == "alibi":
        terms.append("+ ALiBi bias −m_h·(i − j)")
    elif cfg.score_bias == "relative":
        terms.append(f"+ learned relative-position bias ({cfg.relative_buckets} buckets per head, distances past "
                     f"{cfg.relative_max_distance} share the last)")
    sliding = [i for i in range(cfg.n_layers) if cfg.layer_type(i) == "sliding"]
    if sliding and cfg.sliding_window is not None:
        where = "every layer" if len(sliding) == cfg.n_layers else f"layers {', '.join(map(str, sliding))}"
        terms.append(f"a sliding window of {cfg.sliding_window} keys on {where}")
    if cfg.rope_local_theta and cfg.rope_local_theta != cfg.rope_theta and sliding:
        terms.append(f"RoPE base {cfg.rope_local_theta:g} on the sliding layers, {cfg.rope_theta:g} on the others")
    rotated = 2 * ((cfg.rotary_dim + 1) // 2)  # one pair per frequency θ_i: rotary_dim rounded up to even
    if cfg.positional == "rope" and cfg.rotary_dim and rotated < cfg.head_dim:
        terms.append(f"RoPE on the first {rotated} of {cfg.head_dim} dimensions of each head (partial)")
    if cfg.qk_norm:
        terms.append("QK-norm (RMSNorm on each head's q and k, before RoPE)")
    if cfg.parallel_block:
        terms.append("parallel blocks x + attn(norm₁ x) + mlp(norm₂ x)")
    if cfg.sandwich_norm:
        terms.append("sandwich norms (a norm on each sublayer's output too)")
    if cfg.norm_offset:
        terms.append(f"norms scale by {cfg.norm_offset:g} + γ")
    if cfg.position_offset:
        terms.append(f"position p reads row p + {cfg.position_offset} of the position table")
    if cfg.final_softcap is not None:
        terms.append(f"logits soft-capped to {cfg.final_softcap:g}·tanh(z / {cfg.final_softcap:g})")
    return terms


def unread_words(cfg) -> str:
    """The config.json fields the core did not read (in no field table of the family), in words; "" when none."""
    names = getattr(cfg, "unread_fields", ())
    if not names:
        return ""
    listed = ", ".join("`" + str(n).replace("`", "'") + "`" for n in names)
    return (f"**Not read from config.json:** {listed}: no field table of the {cfg.family} family names "
            f"{'it' if len(names) == 1 else 'them'}, so the core ignores {'it' if len(names) == 1 else 'them'}; "
            "where a newer transformers reads such a field, its numbers may differ from these.  ")


def model_card(name: str, model, source: str = "") -> str:
    """Markdown: the config that shapes every view, and where the parameters sit."""
    cfg = model.config
    d = cfg.d_model
    kind = (
        "encoder-decoder"
        if cfg.is_encoder_decoder
        else ("decoder (causal)" if cfg.causal else "encoder (bidirectional)")
    )
    gqa = f", {cfg.n_kv_heads} key/value heads (grouped-query)" if cfg.n_kv_heads != cfg.n_heads else ""
    lines = [
        f"### {name}",
        f"**{cfg.family}** {kind}: {cfg.n_layers} layers, {cfg.n_heads} heads{gqa}, d = {d}, d_k = {cfg.head_dim}, "
        f"d_ff = {cfg.d_ff}, vocabulary {cfg.vocab_size:,}, context {cfg.max_positions:,} tokens.  ",
        f"Positions: **{positions_words(cfg)}**; norm: {cfg.norm} ({cfg.norm_placement}-LN).  ",
        f"Attention: {'; '.join(attention_terms(cfg))}.  ",
        *([unread] if (unread := unread_words(cfg)) else []),
        f"{FAMILY_NAMES.get(cfg.family, cfg.family.capitalize())}: {FAMILY_WORDS[cfg.family]}.  " if cfg.family in FAMILY_WORDS else "",
        source,
        "",
        "| part | parameters | theory | measured / theory |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in parameter_table(model)]
    notes = []
    if cfg.is_encoder_decoder:
        notes.append(
            "Per layer means one decoder layer here: it has two attention blocks (self-attention and "
            "cross-attention into the encoder), so about 2 × 4d²."
        )
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    if cfg.n_kv_heads != cfg.n_heads or q != d:
        why = []
        if q != d:
            why.append(f"the {cfg.n_heads} query heads of d_k = {cfg.head_dim} span {q}, not d = {d}")
        if cfg.n_kv_heads != cfg.n_heads:
            why.append(f"keys and values have only {cfg.n_kv_heads} heads ({kv} wide)")
        notes.append(
            f"Attention is not the theory's four d × d matrices because {' and '.join(why)}: W^Q and W^O are d × {q}, "
            f"W^K and W^V d × {kv}, "
            f"2·d·{q} + 2·d·{kv} = {2 * d * q + 2 * d * kv:,} (plus biases and q/k norms if any)."
        )
    if cfg.d_ff != 4 * d or getattr(cfg, "gated_ffn", False):
        mats = 3 if getattr(cfg, "gated_ffn", False) else 2
        notes.append(
            f"The feed-forward has {mats} matrices of d × d_ff = {d} × {cfg.d_ff}: {mats}·d·d_ff = "
            f"{mats * d * cfg.d_ff:,}, "
            "against 8d² for the theory's 2 matrices with d_ff = 4d."
        )
    if cfg.qk_norm:
        notes.append(f"Attention includes the q and k norms: 2 × d_k = {2 * cfg.head_dim} weights per layer.")
    if cfg.sandwich_norm:
        notes.append("Norms include the sandwich norms on each sublayer's output: four norms per layer.")
    if cfg.score_bias == "alibi":
        # the rule for a head count that is not a power of two is longer: the Positional encoding tab states it
        notes.append("ALiBi's slopes are fixed by the head count (eq. 6.3), not learned: no parameters.")
    if notes:
        lines += ["", *("- " + n for n in notes)]
    return "\n".join(lines)

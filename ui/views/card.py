"""The model card: the config that shapes every view, and where the parameters sit against the theory's 4d²
(attention) and 8d² (feed-forward) per layer."""

from __future__ import annotations

from ui.services.inside import parameter_counts
# a family name a newcomer may not know, in words: said where the name first shows (the card, the Lab)
FAMILY_WORDS = {
    "marian": "an encoder-decoder translation model family, as in MarianMT: an encoder reads the source, a decoder "
              "writes the output and reads the encoder through cross-attention",
}


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
    }
    for part in ("embeddings", "attention", "feed_forward", "norms", "lm_head", "total"):
        if part in counts:
            rows.append([names.get(part, part), f"{counts[part]:,}", "", ""])
    return rows


def lm_head_note(model, own_parameters: int) -> str:
    if not model.config.has_lm_head:
        return " (none: this checkpoint is an encoder without one)"
    if own_parameters == 0 or model.config.tie_word_embeddings:
        return " (tied: it reuses the token embeddings)"
    return ""


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
        f"Positions: **{cfg.positional}**; norm: {cfg.norm} ({cfg.norm_placement}-LN).  ",
        f"{cfg.family.capitalize()}: {FAMILY_WORDS[cfg.family]}.  " if cfg.family in FAMILY_WORDS else "",
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
    if cfg.n_kv_heads != cfg.n_heads:
        kv = cfg.n_kv_heads * cfg.head_dim
        notes.append(
            f"Attention is below 4d² because keys and values have only {cfg.n_kv_heads} heads: "
            f"2d² + 2·d·{kv} = {2 * d * d + 2 * d * kv:,} (plus biases if any)."
        )
    if cfg.d_ff != 4 * d or getattr(cfg, "gated_ffn", False):
        mats = 3 if getattr(cfg, "gated_ffn", False) else 2
        notes.append(
            f"The feed-forward has {mats} matrices of d × d_ff = {d} × {cfg.d_ff}: {mats}·d·d_ff = "
            f"{mats * d * cfg.d_ff:,}, "
            "against 8d² for the theory's 2 matrices with d_ff = 4d."
        )
    if notes:
        lines += ["", *("- " + n for n in notes)]
    return "\n".join(lines)

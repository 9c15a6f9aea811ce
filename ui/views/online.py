"""The online softmax beside the Inside tab's softmax stage (eq. 6.10): one query row of the walked head read a
block of keys at a time with the running max and sum, as FlashAttention does, against the pass's own weights, and
the bytes each method holds at longer lengths. The body of the online_softmax endpoint."""

from __future__ import annotations

from ui.plots.online import online_softmax_figure
from ui.plots.text import escaped
from ui.services import Services
from ui.services.inside import encode_walk, online_row
from ui.services.text import token_texts
from ui.views import export


def mib(n_bytes: int) -> str:
    return f"{n_bytes / 2 ** 20:,.2f} MiB" if n_bytes >= 2 ** 20 else f"{n_bytes / 2 ** 10:,.1f} KiB"


def bytes_table(row) -> str:
    """The bytes each method holds beyond q, k, v and the output, one head in float32 (softmax_bytes)."""
    lines = [f"| tokens n | plain: scores + weights, 2·n² | online: one block n·{row.block} + m, ℓ 2·n | plain / online |",
             "|---:|---:|---:|---:|"]
    for n, plain, online in row.bytes:
        lines.append(f"| {n:,} | {mib(plain)} | {mib(online)} | {plain / online:,.0f}× |")
    return "\n".join(lines)


def online_view(services: Services, model_name, text_value, layer_index, head_index, token_index, block_value,
                progress=None):
    """(note, figure, bytes table): the followed token's softmax read online beside the pass's own."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    row = online_row(model, tokens_enc, layer_index, head_index, token_index, block_value)
    tokens = token_texts(model, tokens_enc.ids)
    blocks = len(row.starts)
    title = (f"Layer {row.layer}, head {row.head}, query {row.query}: softmax over {len(tokens)} keys, "
             f"{blocks} block{'s' if blocks > 1 else ''} of {row.block}")
    fig = online_softmax_figure(row.starts, row.stops, row.block_max, row.running_max, row.rescale, row.running_sum,
                                row.plain, row.online, tokens, title)
    last = blocks - 1
    note = (f"**The online softmax (eq. 6.10), as FlashAttention computes it.** The scores of query {row.query} "
            f"({escaped(repr(tokens[row.query]))}) are the walk's own (scaled, and capped and biased where this "
            f"family does, −∞ where masked), read {row.block} key{'s' if row.block > 1 else ''} at a time. Each "
            "block keeps only the running max m and sum ℓ: m_new = max(m_old, the block's max), "
            "ℓ ← ℓ·e^(m_old − m_new) + Σ e^(s_j − m_new), and the output Σ p_j·v_j is rescaled the same way. "
            f"After the last block m = {row.running_max[last]:.4g} and ℓ = {row.running_sum[last]:.4g}; "
            f"the weights e^(s_j − m)/ℓ differ from the pass's softmax by at most **{row.probs_difference:.1e}**, "
            f"and the output accumulated block by block from the pass's z row by **{row.output_difference:.1e}** "
            "(float64 here, against the pass's float32). The table counts what each method holds for one head, "
            "from the shapes; the timing at 8,192 tokens is measured in `bench/variants/online_softmax.py`.")
    if tokens_enc.note:
        note += f"  \n{escaped(tokens_enc.note)}"
    return note, export.named(fig, export.filename(name, "online-softmax", row.layer, row.head)), bytes_table(row)

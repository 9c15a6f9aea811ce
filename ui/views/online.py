"""The online softmax beside the Inside tab's softmax stage (eq. 6.10): one query row of the walked head read a
block of keys at a time with the running max and sum, as FlashAttention does, against the pass's own weights, and
the bytes each method holds at longer lengths. The body of the online_softmax endpoint."""

from __future__ import annotations

from ui.plots.online import online_softmax_figure
from ui.plots.text import escaped
from ui.services import Services
from ui.services.inside import BENCH, encode_walk, measured_source, online_row
from ui.services.text import token_texts
from ui.views import export


def mib(n_bytes: int) -> str:
    return f"{n_bytes / 2 ** 20:,.2f} MiB" if n_bytes >= 2 ** 20 else f"{n_bytes / 2 ** 10:,.1f} KiB"


def measured_table(memory) -> str:
    """The shipped measurement (ui/services/inside.py): the bytes one call added to the peak memory."""
    default = all(r.online_default is not None for r in memory.rows)
    lines = [f"**Measured**: {measured_source(memory)}.",
             "",
             "| tokens n | plain | online | torch's fused kernel (SDPA) | plain / online |"
             + (" online, glibc's default allocator |" if default else ""),
             "|---:|---:|---:|---:|---:|" + ("---:|" if default else "")]
    for r in memory.rows:
        lines.append(f"| {r.n:,} | {mib(r.plain)} | {mib(r.online)} | {mib(r.fused)} | {r.plain / r.online:,.1f}× |"
                     + (f" {mib(r.online_default)} |" if default else ""))
    return "\n".join(lines)


def formula_table(row) -> str:
    """The formula (core.attention.softmax_bytes) at this block and head size, counted from the shapes."""
    b, d = row.block, row.d_head
    lines = [f"**Formula, not a measurement** (`softmax_bytes`, counted from the shapes at blocks of {b} and "
             f"d_head {d}): the most each method holds at once beyond q, k, v and the output. Plain: the scores and "
             f"the weights, 2·n². Online: the previous block's scores and weights with the new block's product and "
             f"scores, up to 4·n·{b}, the output accumulator and its temporaries, n·{d} to 4·n·{d}, and the running "
             "max, sum and their temporaries, up to 8·n.",
             "",
             "| tokens n | plain | online | plain / online |",
             "|---:|---:|---:|---:|"]
    for n, plain, online in row.bytes:
        lines.append(f"| {n:,} | {mib(plain)} | {mib(online)} | {plain / online:,.1f}× |")
    return "\n".join(lines)


def bytes_table(row) -> str:
    """The measured peaks (where shipped) and, apart, the formula's count, one head in float32."""
    measured = (measured_table(row.measured) if row.measured is not None else
                f"**Measured**: not shipped with this copy; `{BENCH} --publish` measures and writes it.")
    return measured + "\n\n" + formula_table(row)


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
            "(float64 here, against the pass's float32). Below, the memory each method took for one head, measured "
            f"by `{BENCH}`, and apart from it the formula's count from the shapes.")
    if tokens_enc.note:
        note += f"  \n{escaped(tokens_enc.note)}"
    return note, export.named(fig, export.filename(name, "online-softmax", row.layer, row.head)), bytes_table(row)

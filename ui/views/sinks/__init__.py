"""The Heads tab's sink section: each head's mean attention on the first token as a map with the share of sink
heads in words (the `sink_scores` endpoint), the same on every installed model side by side (`sink_comparison`), and the loss per position of the text read through a window of keys
against full attention (the `streaming_perplexity` endpoint). A refusal is the note, beside an empty figure."""

from __future__ import annotations

from contextlib import closing

from ui.plots.base import empty_figure
from ui.plots.heads import sink_depth_figure, sink_maps, window_loss_figure
from ui.plots.text import escaped
from ui.services import Services
from ui.services.checks import UserError
from ui.services.sinks import (EPSILON, POSITION_WORDS, SinkMap, WindowRead, compare, installed, sink_heads,
                               sink_map, stream_window, window_settings)
from ui.views import export

SHOWN_EVERY_S = 0.5  # the window reading's progress reaches the page at most this often
SHOWN_HEADS = 8  # sink heads listed by name before "and N more"
GU_ET_AL = (f"Gu et al. (ICLR 2025) call a head a sink head when this mean exceeds ε = {EPSILON:g} and report the "
            "share of such heads (Sink^ε): 92 % for Llama-2-7B, 97 % for Mistral-7B.")


def quoted(label: str) -> str:
    """A token's label ("0 The") as the note quotes it: its text in quotes, escaped."""
    return escaped(repr(label.split(" ", 1)[1] if " " in label else label))


def refused(error: UserError, name: str, view: str):
    message = str(error)
    return escaped(message), export.named(empty_figure("Nothing to draw: see the note."), export.filename(name, view))


def sink_definition(result: SinkMap) -> str:
    """Which tokens and which queries each tile averages, in words."""
    n, labels = len(result.tokens.ids), result.tokens.labels
    if result.causal:
        return (f"Each tile is one head's attention on token 0 ({quoted(labels[0])}), averaged over every query "
                f"after it (queries 1–{n - 1} of the text's {n} tokens): query 0 can attend only to itself, so it "
                "would add a constant 1.")
    first = "[CLS]" if result.special[0] else f"token 0 ({quoted(labels[0])}; this tokenizer puts no [CLS] there)"
    last = (f"[SEP] (token {n - 1})" if result.special[1]
            else f"the last token ({quoted(labels[-1])}, token {n - 1}; this tokenizer puts no [SEP] there)")
    return (f"This model is an encoder: every query sees every key, so each tile averages over all {n} queries. "
            f"Left: each head's attention on {first}; right: on {last}.")


def sink_note(result: SinkMap) -> str:
    heads = result.first.size
    above = result.above
    shown = ", ".join(f"L{layer} H{head} ({value:.2f})" for layer, head, value in above[:SHOWN_HEADS])
    more = f" and {len(above) - SHOWN_HEADS} more" if len(above) > SHOWN_HEADS else ""
    named = f" (ringed): {shown}{more}." if above else "."
    where = "[CLS]" if not result.causal and result.special[0] else "the first token"
    lines = [
        f"**{len(above)} of {heads} heads ({result.share:.0%})** put more than ε = {result.epsilon:g} of their "
        f"attention on {where}, on average over the text{named} That share is Gu et al.'s Sink^ε on this one text.",
        sink_definition(result),
        f"{GU_ET_AL} Measured here on {len(result.tokens.ids):,} tokens in {result.seconds:.2f} s.",
    ]
    if not result.causal and result.last is not None:
        sep = int(sink_heads(result.last, result.epsilon).sum())
        lines.append(f"On the last token: {sep} of {heads} heads ({sep / heads:.0%}) above ε.")
    if result.tokens.note:
        lines.append("⚠️ " + escaped(result.tokens.note))
    return "  \n".join(lines)


def sinks_view(services: Services, model_name, text_value, progress=None):
    """(note, figure): each head's mean attention on the first token; the body of the `sink_scores` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    try:
        result = sink_map(model, text_value)
    except UserError as error:
        return refused(error, name, "sinks")
    maps = {"attention on token 0": result.first}
    if result.last is not None:
        maps = {"on [CLS]" if result.special[0] else "on token 0": result.first,
                "on [SEP]" if result.special[1] else "on the last token": result.last}
    title = f"Each head's mean attention on the first token; ringed: above ε = {result.epsilon:g}"
    fig = sink_maps(maps, {name: sink_heads(m, result.epsilon) for name, m in maps.items()}, result.epsilon, title)
    return sink_note(result), export.named(fig, export.filename(name, "sinks"))


def window_note(read: WindowRead) -> str:
    run, full = read.windowed, read.full
    n = len(read.tokens.ids)
    reads = (f"the first {run.sinks} token{'s' if run.sinks != 1 else ''} and the last {run.window} keys (keys "
             f"j ≤ i with j < {run.sinks} or j > i − {run.window})" if run.sinks
             else f"only the last {run.window} keys (keys j with i − {run.window} < j ≤ i)")
    reach = (f"from query {read.hides_from} on (dashed line) the window hides keys" if read.hides_from is not None
             else f"the text's {n} tokens never pass the window, so it hides nothing and both curves are the same")
    return "  \n".join([
        f"**Perplexity {run.perplexity:.2f}** through the window against **{full.perplexity:.2f}** with full "
        f"attention ({run.perplexity / full.perplexity:.2f}×), over the {n - 1} next-token predictions of the "
        f"text's {n} tokens (e^mean loss).",
        f"Query i reads {reads}: {reach}. Positions: {POSITION_WORDS[run.positions]}. Computed {run.method}; "
        f"both readings took {read.seconds:.2f} s.",
        "StreamingLLM (Xiao et al., ICLR 2024): a window alone collapses once the text passes it, and keeping the "
        "first few tokens as attention sinks brings it back near full attention.",
    ])


def streaming_view(services: Services, model_name, text_value, window_size, sink_count, positions, progress=None):
    """Yields (note, figure) as the reading goes (about twice a second), then the loss per position through the
    window and with full attention; the body of the `streaming_perplexity` endpoint. Closing it (the page's Stop)
    stops the reading at its next token, as the heavy jobs' time cap (ATTN_CORPUS_MAX_SECONDS) does."""
    name = model_name
    model = services.models.get(name, progress)
    try:
        settings = window_settings(model, text_value, window_size, sink_count, positions)
        shown = 0.0
        with closing(stream_window(model, settings, services.settings.corpus_max_seconds)) as updates:
            for update in updates:
                if update.finished:
                    read = update.result
                elif update.seconds - shown >= SHOWN_EVERY_S:
                    shown = update.seconds
                    message = f"step {update.done:,} of {update.total:,}"
                    if progress is not None:
                        progress(update.done / max(update.total, 1), message)
                    yield (f"Reading through the window: {message} ({update.seconds:.0f} s)…",
                           export.named(empty_figure(f"Reading: {message}."), export.filename(name, "streaming")))
    except UserError as error:
        yield refused(error, name, "streaming")
        return
    run = read.windowed
    view = f"streaming-w{run.window}-s{run.sinks}-{run.positions}"
    label = f"window {run.window}" + (f" + {run.sinks} sinks" if run.sinks else " alone")
    fig = window_loss_figure({label: run.loss.numpy(), "full attention": read.full.loss.numpy()}, read.hides_from,
                             f"Next-token loss per position: {label} ({run.positions} positions) against full "
                             f"attention")
    yield window_note(read), export.named(fig, export.filename(name, view))


def comparison_note(rows, left_out: list[str], epsilon: float) -> str:
    measured = [row for row in rows if row.share is not None]
    lines = [f"Each installed model on this text, loaded one at a time, each through its own tokenizer (so the token "
             f"counts differ): the share of its heads above ε = {epsilon:g} (Gu et al.'s Sink^ε on this one text), "
             "and per layer the mean over its heads of their attention on the first token ([CLS] for an encoder; a "
             "decoder's over the queries after it)."]
    lines += [f"- **{escaped(row.name)}**: {row.share:.0%} of {row.heads} heads, over {row.tokens:,} tokens "
              f"({'decoder' if row.causal else 'encoder'})" + (f". ⚠️ {escaped(row.cut)}" if row.cut else "")
              for row in measured]
    lines += [f"- **{escaped(row.name)}**: not measured. {escaped(row.why)}" for row in rows if row.share is None]
    if left_out:
        lines.append(f"Not compared (at most {len(rows)} models at a time): {escaped(', '.join(left_out))}.")
    return "  \n".join(lines)


def comparison_view(services: Services, model_name, text_value, progress=None):
    """(note, figure): every installed model's sinks on the text; the body of the `sink_comparison` endpoint."""
    services.models.get(model_name, progress)  # the page's model: checked (and loaded) as every endpoint's is
    names, left_out = installed(services.models, model_name)
    rows = compare(services.models, names, text_value, progress)
    drawn = {f"{row.name} ({row.share:.0%} sink heads)": row.per_layer for row in rows if row.share is not None}
    title = "Each layer's mean attention on the first token, model by model (depth 0 the first layer, 1 the last)"
    fig = sink_depth_figure(drawn, title) if drawn else empty_figure("No installed model could be measured here.")
    return comparison_note(rows, left_out, EPSILON), export.named(fig, export.filename(model_name, "sink-comparison"))

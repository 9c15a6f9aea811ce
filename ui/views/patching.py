"""The Patching tab's views: which component, at which position, carries the answer. A patching sweep between a
clean and a corrupted prompt, direct logit attribution of every head and MLP, and the information-flow graph;
the bodies of the tab's endpoints. A pair the tab cannot measure (different token counts, an answer of several
tokens, an encoder) is answered in the note, with the figures left empty."""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass

from ui.plots.base import empty_figure
from ui.plots.patching import flow_figure, logit_attribution_figure, patch_heatmap
from ui.plots.text import escaped
from ui.services import Services
from ui.services.checks import UserError
from ui.services.patching import (MAX_FLOW_TOKENS, MAX_PATCH_TOKENS, PatchPair, TokenMismatch, check_threshold,
                                  encode_flow, flow, logit_parts, prepare_pair, stream_patching)
from ui.services.text import token_texts
from ui.views import export

SITE_WORDS = {
    "resid_pre": "the residual stream entering each layer, at each position",
    "attn_out": "each layer's attention output, at each position",
    "mlp_out": "each layer's MLP output, at each position",
    "z": "each head's output (before W^O), at every position at once",
    "z_by_position": "each head of one layer, at each position",
}
WHAT_PATCHING_SHOWS = (
    "Patching shows what is **sufficient** on this pair: a cell near 1 carries, by itself, what tells the two "
    "prompts apart. It is not the only path, and a cell near 0 may still matter on other prompts or together "
    "with other cells."
)


@dataclass
class PatchingCache:
    """A session's last flow graph, so moving the threshold re-prunes it without another pass."""
    key: tuple
    tokens: list[str]
    graph: object


def quoted(piece: str) -> str:
    return escaped(repr(piece))


def metric_words(pair: PatchPair) -> str:
    return f"logit({quoted(pair.pieces[0])}) − logit({quoted(pair.pieces[1])})"


def cell(text: str) -> str:
    """A token as a Markdown table cell: escaped, with its pipes kept as text."""
    return escaped(text).replace("|", "\\|") or " "


def mismatch_note(error: TokenMismatch) -> str:
    rows = "\n".join(f"| {i} | {cell(a)} | {cell(b)} |" for i, a, b in error.rows)
    return f"{escaped(str(error))}\n\n| position | clean | corrupted |\n|---|---|---|\n{rows}"


def nothing(message: str, name: str, view: str):
    return export.named(empty_figure(message), export.filename(name, view))


def patch_view(services: Services, model_name, clean_prompt, corrupted_prompt, answer_token, foil_token, site,
               mode, layer_index, progress=None):
    """Yields (note, figure, data file) as the sweep goes, then the map of how much of the clean metric each
    patch brings back; the body of the `patch_sweep` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    view = f"patch-{site}-{mode}"
    try:
        pair = prepare_pair(model, clean_prompt, corrupted_prompt, answer_token, foil_token)
    except TokenMismatch as error:
        yield mismatch_note(error), nothing("The prompts differ in token count.", name, view), None
        return
    except UserError as error:
        yield escaped(str(error)), nothing("Nothing to patch yet.", name, view), None
        return
    result, seconds = None, 0.0
    with closing(stream_patching(model, pair, site, mode, layer_index)) as updates:   # a page gone: the sweep stops
        for update in updates:
            message = f"{update.done} of {update.total} patches"
            if progress is not None:
                progress(update.done / max(update.total, 1), message)
            if update.finished:
                result, seconds = update.result, update.seconds
            else:
                yield f"Patching: {message} ({update.seconds:.0f} s)…", nothing(message, name, view), None
    tokens = token_texts(model, pair.clean.ids)
    rows, cols = result.axes
    where = SITE_WORDS[site]
    layer_words = f" of layer {result.layer}" if result.layer is not None else ""
    direction = ("clean activations written into the corrupted run" if mode == "denoise"
                 else "corrupted activations written into the clean run")
    title = f"{'Denoising' if mode == 'denoise' else 'Noising'} {site}{layer_words}: how much of {metric_words(pair)} comes back"
    fig = patch_heatmap(result.scores.numpy(), result.metrics.numpy(), rows, cols, tokens, title, result.layer)
    note = (
        f"**{escaped(where)}{layer_words}**, {direction}, one patch per cell. The metric is {metric_words(pair)} at "
        f"the last position: **{result.clean_metric:+.3f}** on the clean prompt, **{result.corrupted_metric:+.3f}** "
        f"on the corrupted one ({escaped(pair.chosen) or 'both typed'}). Each cell shows (patched − corrupted) / "
        f"(clean − corrupted): 1 is the clean run's answer, 0 the corrupted run's.  \n"
        f"{result.scores.numel()} cells in {seconds:.1f} s; {result.computed} needed a pass, the rest patch an "
        "activation that is the same in both runs (before the first token that differs, under the causal mask). "
        f"{WHAT_PATCHING_SHOWS}"
    )
    if pair.clean.note:
        note += f"  \n{escaped(pair.clean.note)}"
    labels_r = [str(i) for i in range(result.scores.shape[0])]
    labels_c = [f"{i} {t}" for i, t in enumerate(tokens)] if cols == "position" else [str(i) for i in range(result.scores.shape[1])]
    csv = export.matrix_csv(result.scores.numpy(), labels_r, labels_c, f"{rows} \\ {cols}",
                            comments=[f"model {name}", f"{mode} {site}{layer_words}: restored fraction of "
                                      f"logit({pair.pieces[0]!r}) - logit({pair.pieces[1]!r})",
                                      f"clean {result.clean_metric:.6g}, corrupted {result.corrupted_metric:.6g}"])
    file = export.write(csv, export.filename(name, view) + ".csv")
    yield note, export.named(fig, export.filename(name, view)), str(file)


def attribution_view(services: Services, model_name, clean_prompt, corrupted_prompt, answer_token, foil_token,
                     progress=None):
    """(note, figure, data file): each head's and each MLP's direct part of logit(answer) − logit(foil) on the
    clean prompt; the body of the `logit_attribution` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    try:
        pair = prepare_pair(model, clean_prompt, corrupted_prompt, answer_token, foil_token)
        parts = logit_parts(model, pair)
    except TokenMismatch as error:
        return mismatch_note(error), nothing("The prompts differ in token count.", name, "logit-attribution"), None
    except UserError as error:
        return escaped(str(error)), nothing("Nothing to attribute yet.", name, "logit-attribution"), None
    heads, mlps = parts.heads.numpy(), parts.mlps.numpy()
    flat = sorted(((float(heads[l, h]), l, h) for l in range(heads.shape[0]) for h in range(heads.shape[1])),
                  key=lambda t: -abs(t[0]))[:5]
    largest = ", ".join(f"L{l} H{h} ({v:+.2f})" for v, l, h in flat)
    title = f"Direct logit attribution of {metric_words(pair)} on the clean prompt"
    fig = logit_attribution_figure(heads, mlps, title)
    note = (
        f"The last position's residual stream is a sum: the embeddings, every head's output and every MLP's. Read "
        f"through the final norm **with its scale frozen at its value on this input**, each part adds its own "
        f"share of {metric_words(pair)}, and the shares add up exactly: heads {heads.sum():+.3f}, MLPs "
        f"{mlps.sum():+.3f}, embeddings {parts.embeddings:+.3f}, biases {parts.biases:+.3f}; sum "
        f"**{parts.parts_sum:+.4f}**, the model's own difference **{parts.total:+.4f}**.  \n"
        f"Largest heads: {largest}. A direct part counts only what a head writes straight into the answer's "
        "direction: a head that moves information for later layers to use shows little here (patching finds it)."
    )
    rows = [[f"L{l} H{h}", float(heads[l, h])] for l in range(heads.shape[0]) for h in range(heads.shape[1])]
    rows += [[f"MLP {l}", float(v)] for l, v in enumerate(mlps)]
    rows += [["embeddings", parts.embeddings], ["biases", parts.biases], ["total", parts.total]]
    file = export.write(export.csv_text(rows, ["part", f"logit({pair.pieces[0]!r}) - logit({pair.pieces[1]!r})"]),
                        export.filename(name, "logit-attribution") + ".csv")
    return note, export.named(fig, export.filename(name, "logit-attribution")), str(file)


def flow_note(graph, tokens: list[str], seconds: float | None) -> str:
    heads = sorted((e for e in graph.edges if e.kind == "head"), key=lambda e: -e.importance)[:5]
    named = ", ".join(f"L{e.layer} H{e.head} {quoted(tokens[e.source])} → {quoted(tokens[e.target])} "
                      f"({e.importance:.2f})" for e in heads) or "none above this threshold"
    timing = "" if seconds is None else f" Computed in {seconds:.1f} s."
    return (
        f"How the prediction after {quoted(tokens[graph.position])} was assembled: every residual state is a sum "
        "(its residual input, each head's part from each earlier token, the MLP's output), and each part is "
        "weighted by how much closer to the sum it is than nothing (its proximity, normalised over the sum's "
        f"parts). Kept: **{len(graph.edges)} edges** of importance ≥ {graph.threshold:g}, walking down from the "
        f"prediction.{timing}  \nStrongest head edges: {named}. Click a head edge's dot to open that head."
    )


def flow_figure_of(graph, tokens: list[str], name: str):
    edges = [(e.kind, e.layer, e.head, e.source, e.target, e.level, e.importance) for e in graph.edges]
    fig = flow_figure(tokens, graph.n_layers, edges, graph.position,
                      f"Information flow into the prediction after {quoted(tokens[graph.position])} "
                      f"(threshold {graph.threshold:g})")
    return export.named(fig, export.filename(name, "flow-graph"))


def flow_file(graph, tokens: list[str], name: str) -> str:
    rows = [[e.kind, e.layer, "" if e.head is None else e.head, e.source, tokens[e.source], e.target,
             tokens[e.target], e.level, e.importance] for e in graph.edges]
    header = ["kind", "layer", "head", "source", "source token", "target", "target token", "level", "importance"]
    return str(export.write(export.csv_text(rows, header), export.filename(name, "flow-graph") + ".csv"))


def flow_view(services: Services, model_name, clean_prompt, threshold, previous=None, progress=None):
    """(note, figure, data file, cache): the information-flow graph of the last token of the clean prompt; the
    body of the `flow_graph` endpoint. The graph is kept, so a new threshold only re-prunes it."""
    name = model_name
    model = services.models.get(name, progress)
    threshold = check_threshold(threshold)   # a wrong setting is a message by the field; a wrong text, the note
    try:
        tokens = encode_flow(model, clean_prompt)
        key = (name, tuple(tokens.ids))
        started = time.perf_counter()
        if isinstance(previous, PatchingCache) and previous.key == key:
            graph, seconds = previous.graph.pruned(threshold), None
        else:
            graph = flow(model, tokens, threshold)
            seconds = time.perf_counter() - started
    except UserError as error:
        return escaped(str(error)), nothing("No graph yet.", name, "flow-graph"), None, previous
    texts = token_texts(model, tokens.ids)
    note = flow_note(graph, texts, seconds)
    if tokens.note:
        note += f"  \n{escaped(tokens.note)}"
    return (note, flow_figure_of(graph, texts, name), flow_file(graph, texts, name),
            PatchingCache(key, texts, graph))


LIMITS = (f"The prompts are read up to {MAX_PATCH_TOKENS} tokens, the flow graph's text up to "
          f"{MAX_FLOW_TOKENS}.")

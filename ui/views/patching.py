"""The Patching tab's views: which component, at which position, carries the answer. A patching sweep between a
clean and a corrupted prompt, direct logit attribution of every head and MLP, and the information-flow graph;
and exact patching against each cheap estimate of it (shortcut_report, approximate_sweep); the bodies of the tab's
endpoints. A pair the tab cannot measure (different token counts, a prompt over the
limit, equal prompts, an answer of several tokens, an encoder) is answered in the note, with the figures left
empty. Every word about a cell follows the direction shown: denoising measures what a patch brings back,
noising what stays."""

from __future__ import annotations

import math
from contextlib import closing
from urllib.parse import urlsplit

from ui import links
from ui.plots.base import empty_figure
from ui.plots.patching import edge_bars, flow_figure, logit_attribution_figure, patch_heatmap, shortcut_scatter
from ui.plots.text import escaped
from ui.services import Services
from ui.services.checks import UserError
from ui.services.patching import (EDGE_HEADS, MAX_FLOW_TOKENS, MAX_PATCH_TOKENS, METHOD_WORDS, SHORTCUT_SITES,
                                  STRONG, FlowResult, PairShortcuts, PatchPair, TokenMismatch, check_shortcut_site,
                                  check_sweep, check_threshold, edge_reasons, kept_flow, logit_parts, one_estimate,
                                  pair_shortcuts, prepare_pair, stream_patching)
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
WHAT_NOISING_SHOWS = (
    "Noising shows what is **necessary** on this pair: a cell near 0 is an activation the clean answer cannot do "
    "without. A cell near 1 may still matter when other cells are noised with it."
)

# what a cell's score, (patched − corrupted) / (clean − corrupted), means in each direction
MODE_WORDS = {
    "denoise": dict(
        gerund="Denoising", value="restored", ticks={1: "1 clean answer back", 0: "0 no change"},
        direction="clean activations written into the corrupted run", verb="comes back",
        meaning="**1** means this patch alone brings back the clean prompt's answer, **0** that it changes "
                "nothing (the corrupted run's answer stays), negative that it pushes further the other way"),
    "noise": dict(
        gerund="Noising", value="kept", ticks={1: "1 no change", 0: "0 needed"},
        direction="corrupted activations written into the clean run", verb="stays",
        meaning="**1** means this patch changes nothing (the clean answer stays), **near 0** that this "
                "activation is needed: the corrupted value here alone takes the clean answer away"),
}


def how_to_read(mode: str) -> str:
    """What a cell of the sweep means in this direction, in one line."""
    words = MODE_WORDS[mode]
    return f"**{words['gerund']}** ({words['direction']}): each cell is one patched run; {words['meaning']}."


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


def sentence_of(words: str) -> str:
    return words[:1].upper() + words[1:] + "."


def nothing(message: str, name: str, view: str):
    return export.named(empty_figure(message), export.filename(name, view))


def capped_words(model) -> str:
    cap = model.config.final_softcap
    return f" (the model's own logits, after its final soft-cap c·tanh(logit / c), c = {cap:g})" if cap else ""


def patch_view(services: Services, model_name, clean_prompt, corrupted_prompt, answer_token, foil_token, site,
               mode, layer_index, progress=None):
    """Yields (note, figure, data file) as the sweep goes, then the map of how much of the clean metric each
    patch brings back (denoise) or keeps (noise); the body of the `patch_sweep` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    view = f"patch-{site}-{mode}"
    settings = check_sweep(model, site, mode, layer_index)   # a wrong setting is a message by its field
    result, seconds = None, 0.0
    try:
        pair = prepare_pair(model, clean_prompt, corrupted_prompt, answer_token, foil_token)
        with closing(stream_patching(model, pair, settings)) as updates:   # a page gone: the sweep stops
            for update in updates:
                message = f"{update.done} of {update.total} patches"
                if progress is not None:
                    progress(update.done / max(update.total, 1), message)
                if update.finished:
                    result, seconds = update.result, update.seconds
                else:
                    yield f"Patching: {message} ({update.seconds:.0f} s)…", nothing(message, name, view), None
    except TokenMismatch as error:
        yield mismatch_note(error), nothing("The prompts differ in token count.", name, view), None
        return
    except UserError as error:
        yield escaped(str(error)), nothing("Nothing to patch yet.", name, view), None
        return
    words = MODE_WORDS[result.mode]
    tokens = token_texts(model, pair.clean.ids)
    rows, cols = result.axes
    where = SITE_WORDS[site]
    layer_words = f" of layer {result.layer}" if result.layer is not None else ""
    title = f"{words['gerund']} {site}{layer_words}: how much of {metric_words(pair)} {words['verb']}"
    fig = patch_heatmap(result.scores.numpy(), result.metrics.numpy(), rows, cols, tokens, title, result.layer,
                        value_name=words["value"], scale_ticks=words["ticks"])
    note = (
        f"**{escaped(where)}{layer_words}**, {words['direction']}, one patch per cell. The metric is "
        f"{metric_words(pair)} at the last position{capped_words(model)}: **{result.clean_metric:+.3f}** on the "
        "clean prompt, "
        f"**{result.corrupted_metric:+.3f}** on the corrupted one ({escaped(pair.chosen) or 'both typed'}). Each "
        f"cell shows (patched − corrupted) / (clean − corrupted), the fraction that {words['verb']}: "
        f"{words['meaning']}.  \n"
        f"{result.scores.numel()} cells in {seconds:.1f} s; {result.computed} needed a pass, the rest patch an "
        "activation that is the same in both runs (before the first token that differs, under the causal mask). "
        f"{WHAT_PATCHING_SHOWS if result.mode == 'denoise' else WHAT_NOISING_SHOWS}"
    )
    labels_r = [str(i) for i in range(result.scores.shape[0])]
    labels_c = [f"{i} {t}" for i, t in enumerate(tokens)] if cols == "position" else [str(i) for i in range(result.scores.shape[1])]
    csv = export.matrix_csv(result.scores.numpy(), labels_r, labels_c, f"{rows} \\ {cols}",
                            comments=[f"model {name}", f"{result.mode} {site}{layer_words}: (patched - corrupted) / "
                                      f"(clean - corrupted) of logit({pair.pieces[0]!r}) - logit({pair.pieces[1]!r}), "
                                      f"the fraction {words['value']}",
                                      f"clean {result.clean_metric:.6g}, corrupted {result.corrupted_metric:.6g}"])
    file = export.write(csv, export.filename(name, view) + ".csv")
    yield note, export.named(fig, export.filename(name, view)), str(file)


def attribution_view(services: Services, model_name, clean_prompt, corrupted_prompt, answer_token, foil_token,
                     progress=None):
    """(note, figure, data file): each head's and each MLP's direct part of logit(answer) − logit(foil) on the
    clean prompt; the body of the `logit_attribution` endpoint. The corrupted prompt may be empty: the foil is
    then the clean run's second most likely token."""
    name = model_name
    model = services.models.get(name, progress)
    try:
        pair = prepare_pair(model, clean_prompt, corrupted_prompt, answer_token, foil_token, "Logit attribution",
                            corrupted_needed=False)
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
        f"**{parts.parts_sum:+.4f}**, the model's own difference "
        f"{'before its final soft-cap ' if parts.capped is not None else ''}**{parts.total:+.4f}**.  \n"
        f"{cap_words(parts)}{post_norm_words(parts)}"
        f"Largest heads: {largest}. A direct part counts only what a head writes straight into the answer's "
        "direction: a head that moves information for later layers to use shows little here (patching finds it)."
    )
    if pair.chosen:
        note += f"  \n{escaped(sentence_of(pair.chosen))}"
    rows = [[f"L{l} H{h}", float(heads[l, h])] for l in range(heads.shape[0]) for h in range(heads.shape[1])]
    rows += [[f"MLP {l}", float(v)] for l, v in enumerate(mlps)]
    rows += [["embeddings", parts.embeddings], ["biases", parts.biases],
             ["total before the final soft-cap" if parts.capped is not None else "total", parts.total]]
    if parts.capped is not None:
        rows.append([f"after the final soft-cap c*tanh(logit/c), c = {parts.softcap:g} (not split)", parts.capped])
    file = export.write(export.csv_text(rows, ["part", f"logit({pair.pieces[0]!r}) - logit({pair.pieces[1]!r})"]),
                        export.filename(name, "logit-attribution") + ".csv")
    return note, export.named(fig, export.filename(name, "logit-attribution")), str(file)


def cap_words(parts) -> str:
    """The final soft-cap as its own stage, in words (empty without one)."""
    if parts.capped is None:
        return ""
    return (f"This model caps its logits, c·tanh(logit / c) with c = {parts.softcap:g}. A tanh is not a sum, so "
            "the parts split the difference **before the cap**; the cap is a stage of its own, not split: after "
            f"it the model's own difference is **{parts.capped:+.4f}**.  \n")


def post_norm_words(parts) -> str:
    """The sandwich post-norm, in words (empty without one)."""
    if not parts.post_norm:
        return ""
    return ("Each head's output passes the attention's own post-norm before it joins the residual stream: it is "
            "read through that norm with its scale frozen at its input too, so the heads still add up to the "
            "layer's attention output.  \n")


FLOW_DEFINITION = (
    "Every residual state is a sum of parts. After a layer's attention the parts are the residual input and "
    "every (head, source token) part, a head's attention weight times the source's value through W_O; the "
    "output bias is in the sum but is not a part. Each part's importance is its proximity to the sum "
    "(‖y‖₁ − ‖y − part‖₁, a proximity below 0 counts as 0), normalised over the sum's parts. An attention edge "
    "source → target adds its heads' parts (token edges: heads summed, then thresholded), and the i → i attention "
    "edge stays apart from the residual edge. After the MLP the parts are the sum after attention and the MLP's "
    "output. An edge is kept when its importance is ≥ the threshold and it leads, walking down, to the prediction."
)


def edge_words(edge, tokens: list[str]) -> str:
    """"layer 3 'Mary' → 'to' (0.31: H2 0.12, H5 0.04, …)": an attention edge and its three strongest heads."""
    heads = ", ".join(f"H{h} {part:.2f}" for h, part in edge.heads[:3]) + (", …" if len(edge.heads) > 3 else "")
    return (f"layer {edge.layer} {quoted(tokens[edge.source])} → {quoted(tokens[edge.target])} "
            f"({edge.importance:.2f}: {heads or 'no head above 0'})")


PARALLEL_WORDS = (
    " This model's blocks are parallel: attention and the MLP both read the block's input, and no state lies "
    "between them. Each block is one sum (the residual input, every (head, source token) part and the MLP's "
    "output, normalised together), drawn from the block's input to its output in one step; the level above it "
    "is the same state again, joined by residual edges of importance 1."
)
SANDWICH_WORDS = (
    " This model puts a norm on the attention's output too: each head's part is read through that norm with "
    "its scale frozen at its input, so the parts still add up to what joins the residual stream."
)


def flow_note(result: FlowResult, tokens: list[str], model=None) -> str:
    graph, seconds = result.graph, result.seconds
    variants = (PARALLEL_WORDS if graph.parallel else "") + (
        SANDWICH_WORDS if model is not None and model.config.sandwich_norm else "")
    attention = sorted((e for e in graph.edges if e.kind == "attention"), key=lambda e: -e.importance)[:5]
    named = "; ".join(edge_words(e, tokens) for e in attention) or "none above this threshold"
    timing = " Re-pruned from the kept graph, no pass." if seconds is None else f" Computed in {seconds:.1f} s."
    return (
        f"How the prediction after {quoted(tokens[graph.position])} was assembled (Ferrando and Voita, 2024). "
        f"{FLOW_DEFINITION}{variants} Kept: **{len(graph.edges)} edges** of importance ≥ "
        f"{graph.threshold:g}.{timing}  \n"
        f"Strongest attention edges (their strongest heads): {named}. Hover an attention edge's dot for all its "
        "heads; a click says why its heads attend there (*Why this edge?* below the graph)."
    )


def flow_figure_of(graph, tokens: list[str], name: str):
    edges = [(e.kind, e.layer, e.head, e.source, e.target, e.level, e.importance, e.heads) for e in graph.edges]
    fig = flow_figure(tokens, graph.n_layers, edges, graph.position,
                      f"Information flow into the prediction after {quoted(tokens[graph.position])} "
                      f"(threshold {graph.threshold:g})")
    return export.named(fig, export.filename(name, "flow-graph"))


def flow_file(graph, tokens: list[str], name: str) -> str:
    """One row per kept edge × head: an attention edge has a row for each head with a part > 0 (its share in
    "head part", strongest first); another edge one row with the head empty."""
    rows = []
    for e in graph.edges:
        edge = [e.kind, e.layer, e.source, tokens[e.source], e.target, tokens[e.target], e.level, e.importance]
        parts = e.heads if e.kind == "attention" and e.heads else [("", "")]
        rows += [[*edge[:2], head, *edge[2:], part] for head, part in parts]
    header = ["kind", "layer", "head", "source", "source token", "target", "target token", "level", "importance",
              "head part"]
    return str(export.write(export.csv_text(rows, header), export.filename(name, "flow-graph") + ".csv"))


def flow_view(services: Services, model_name, clean_prompt, threshold, previous=None, progress=None):
    """(note, figure, data file, cache): the information-flow graph of the last token of the clean prompt; the
    body of the `flow_graph` endpoint. The graph is kept in the server-wide store and the session holds its
    ticket, so a new threshold only re-prunes it."""
    name = model_name
    model = services.models.get(name, progress)
    check_threshold(threshold)   # a wrong setting is a message by the field; a wrong text, the note
    try:
        result = kept_flow(model, name, clean_prompt, threshold, services.kept, previous)
    except UserError as error:
        return escaped(str(error)), nothing("No graph yet.", name, "flow-graph"), None, previous
    texts = token_texts(model, result.tokens.ids)
    return (flow_note(result, texts, model), flow_figure_of(result.graph, texts, name),
            flow_file(result.graph, texts, name), result.cache)


EDGE_DEFINITION = ("Each head's **relative score**, score(i, j) − Σ_k a_ik·score(i, k) (the score of this key "
                   "against the query's attention-weighted mean, what softmax compares), is split exactly into the "
                   "components that wrote its query and its key: the embeddings, every earlier head one by one, every "
                   "earlier MLP and the biases, every norm frozen at its value on this prompt. The left panel gives "
                   "each query-side component against the whole key side, the right one the whole query against each "
                   "key-side component; each adds up to the relative score. Positive parts make the key win.")


def edge_link(model_name: str, text: str, layer: int, head: int, query: int) -> str:
    """The Inside tab at this head and query, on this prompt, as a link's query string (or "" where the prompt is
    too long for a link)."""
    link, left_out = links.make("/", model_name, "inside", layer, head, text, token=query)
    return "" if left_out else f"?{urlsplit(link).query}"


def content_and_position(reason) -> str:
    """Content against position for one head of an edge, in words: under RoPE the relative score with the rotation
    taken off (the same vectors at no distance) and what the distance adds; with added positions, the positions
    part on each side."""
    if reason.unrotated is not None:
        return (f"Content against position: with RoPE's rotation taken off q and every k (as if no distance "
                f"separated them) the relative score is {reason.unrotated:+.3f}, so the distance adds "
                f"{reason.score - reason.unrotated:+.3f}.")
    sides = [(side, dict(parts).get("positions")) for side, parts in (("query", reason.query_parts),
                                                                      ("key", reason.key_parts))]
    named = [f"{value:+.3f} on the {side} side" for side, value in sides if value is not None]
    return f"Content against position: the positions part gives {' and '.join(named)}." if named else ""


def edge_view(services: Services, model_name, clean_prompt, threshold, layer_index, target_index, source_index,
              previous=None, progress=None):
    """(note, figure, cache): why the flow graph keeps the attention edge source → target through a layer: each of
    its heads (the EDGE_HEADS strongest) with its relative score traced to the components that wrote its query and
    its key; the body of the `edge_attribution` endpoint. The graph is the session's kept one where it is of
    this prompt."""
    name = model_name
    model = services.models.get(name, progress)
    check_threshold(threshold)
    result, found = edge_reasons(model, name, clean_prompt, threshold, layer_index, target_index, source_index,
                                 services.kept, previous)
    texts = token_texts(model, result.tokens.ids)
    shown = found.heads[:EDGE_HEADS]
    edge = (f"layer {found.layer}'s attention from {quoted(texts[found.target])} (position {found.target}) to "
            f"{quoted(texts[found.source])} (position {found.source})")
    lines = [f"**Why the graph keeps {edge}** (importance {found.importance:.2f}, threshold {result.graph.threshold:g}): "
             f"its {len(found.heads)} head(s) with a part in it, the {len(shown)} strongest shown. {EDGE_DEFINITION}"]
    for reason in shown:
        link = edge_link(name, clean_prompt, found.layer, reason.head, found.target)
        query_top, key_top = reason.query_parts[0], reason.key_parts[0]
        opened = (f" [Open L{found.layer} H{reason.head} in the Inside tab at this query]({link})" if link else
                  " (the prompt is too long for a link to the Inside tab)")
        lines.append(f"- **L{found.layer} H{reason.head}**: its part of the edge {reason.importance:.2f}, weight "
                     f"{reason.weight:.3f}, relative score {reason.score:+.3f}; largest on the query side "
                     f"{escaped(query_top[0])} ({query_top[1]:+.3f}), on the key side {escaped(key_top[0])} "
                     f"({key_top[1]:+.3f}). {content_and_position(reason)}{opened}")
    heads = [(f"L{found.layer} H{r.head}", r.query_parts, r.key_parts) for r in shown]
    figure = edge_bars(heads, f"Why layer {found.layer} reads {texts[found.source]!r} from {texts[found.target]!r}")
    return ("\n".join(lines), export.named(figure, export.filename(name, f"edge-L{found.layer}-{found.target}-"
                                                                        f"{found.source}")), result.cache)


LIMITS = (f"Patching and logit attribution read prompts of up to {MAX_PATCH_TOKENS} tokens, the flow graph up to "
          f"{MAX_FLOW_TOKENS}; a longer prompt is refused, not cut, so the prediction explained is always the "
          "prompt's own.")


# ---- how good are the shortcuts ----

WARNING = ("A method's map can look right and still rank the wrong heads: a high ρ over every cell is carried by "
           "the many small ones, while the few cells that matter may be missed. Read the top-k overlap and the "
           "cells it misses beside ρ, and trust a shortcut only where it has been checked against patching.")


def as_text(text: str) -> str:
    """Text escaped for Markdown too: a method's "*" and a token's "*" or "_" stay characters, not emphasis."""
    return escaped(text).replace("*", "\\*").replace("_", "\\_")


def method_line(row, k: int) -> str:
    missed = ", ".join(as_text(n) for n in row.false_negatives[:6]) + ("…" if len(row.false_negatives) > 6 else "")
    error = "" if math.isnan(row.signed_error) else f", signed error on the strongest cells {row.signed_error:+.2f}"
    rho = "— (one of the maps is constant)" if math.isnan(row.rho) else f"{row.rho:.2f}"
    return (f"- **{as_text(row.method)}**, {as_text(METHOD_WORDS[row.method])}: ρ "
            f"{'against |exact| ' if not row.signed else ''}{rho}, top-{k} overlap {row.overlap:.2f}{error}, cost "
            f"**{row.cost:.1f}** forward passes; "
            + (f"misses {len(row.false_negatives)} strong cell(s) ({missed})." if row.false_negatives
               else "misses no strong cell."))


def report_note(result: PairShortcuts, pair, model_name: str) -> str:
    words = MODE_WORDS[result.mode]
    lines = "\n".join(method_line(row, result.k) for row in result.methods)
    return (
        f"**{WARNING}**  \n"
        f"Computed on model {escaped(model_name)}: this pair, {words['gerund'].lower()}, "
        f"{escaped(SHORTCUT_SITES[result.site])}; the metric {metric_words(pair)} is **{result.clean_metric:+.3f}** "
        f"clean and **{result.corrupted_metric:+.3f}** corrupted. Exact patching took **{result.exact_cost:.1f}** "
        f"forward passes. Compared: the {len(result.names)} of {result.cells} cells whose activation differs "
        f"between the two prompts (the others are 0 in every method); k = {result.k}; {result.strong} cell(s) reach "
        f"{STRONG:g} of the clean − corrupted difference"
        + (f", more than k, so even a perfect ranking leaves {result.strong - result.k} of them below k" if
           result.strong > result.k else "") + ".\n\n" + lines
        + "\n\nCost is each method's time over one forward pass of this pair, measured now (noisy on a busy machine).")


def shortcuts_view(services: Services, model_name, clean_prompt, corrupted_prompt, answer_token, foil_token, site,
                   mode, progress=None):
    """(note, figure): exact patching against every shortcut the site has, on the tab's pair; the body of the
    `shortcut_report` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    view = f"shortcuts-{site}-{mode}"
    try:
        check_shortcut_site(site)
        pair = prepare_pair(model, clean_prompt, corrupted_prompt, answer_token, foil_token)
        result = pair_shortcuts(model, pair, site, mode)
    except TokenMismatch as error:
        return mismatch_note(error), nothing("The prompts differ in token count.", name, view)
    except UserError as error:
        return escaped(str(error)), nothing("Nothing to compare yet.", name, view)
    rows = result.methods
    title = f"{MODE_WORDS[result.mode]['gerund']} {result.site}: exact patching against each shortcut"
    fig = shortcut_scatter(result.exact, [r.estimates for r in rows], [r.method for r in rows],
                           [r.rho for r in rows], [r.overlap for r in rows], [r.cost for r in rows],
                           [r.signed for r in rows], result.names, result.k, result.exact_cost, title)
    return report_note(result, pair, name), export.named(fig, export.filename(name, view))


def estimate_view(services: Services, model_name, clean_prompt, corrupted_prompt, answer_token, foil_token, site,
                  mode, method, progress=None):
    """(note, figure, data file): one shortcut's map of the whole sweep, in the exact sweep's normalisation; the
    body of the `approximate_sweep` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    view = f"approximate-{site}-{mode}-{method}".replace("*", "star")
    try:
        pair = prepare_pair(model, clean_prompt, corrupted_prompt, answer_token, foil_token)
        sweep = one_estimate(model, pair, site, mode, method)
    except TokenMismatch as error:
        return mismatch_note(error), nothing("The prompts differ in token count.", name, view), None
    except UserError as error:
        return escaped(str(error)), nothing("Nothing to estimate yet.", name, view), None
    words = MODE_WORDS[sweep.mode]
    tokens = token_texts(model, pair.clean.ids)
    rows, cols = sweep.axes
    signed = sweep.method != "flow"
    title = (f"{escaped(sweep.method)}'s estimate of {words['gerund'].lower()} {sweep.site}" if signed
             else f"The flow graph's importance of each {'head' if sweep.site == 'z' else 'cell'} (no causal claim)")
    fig = patch_heatmap(sweep.scores.numpy(), sweep.metrics.numpy(), rows, cols, tokens, title,
                        value_name=f"estimated {words['value']}" if signed else "importance",
                        scale_ticks=words["ticks"] if signed else None)
    note = (f"**{escaped(METHOD_WORDS[sweep.method])}** of {escaped(SHORTCUT_SITES[sweep.site])}, "
            f"{words['direction']}; metric {metric_words(pair)}: {sweep.clean_metric:+.3f} clean, "
            f"{sweep.corrupted_metric:+.3f} corrupted. " + escaped(sweep.note) + " "
            + ("An estimate, not a measurement: compare it with the exact sweep above. " if signed else "")
            + WARNING)
    labels_r = [str(i) for i in range(sweep.scores.shape[0])]
    labels_c = ([f"{i} {t}" for i, t in enumerate(tokens)] if cols == "position"
                else [str(i) for i in range(sweep.scores.shape[1])])
    csv = export.matrix_csv(sweep.scores.numpy(), labels_r, labels_c, f"{rows} \\ {cols}",
                            comments=[f"model {name}", f"{sweep.method} estimate of the {sweep.mode} {sweep.site} sweep"
                                      f" of logit({pair.pieces[0]!r}) - logit({pair.pieces[1]!r})"
                                      + ("" if signed else " (flow-graph importance, not a fraction)")])
    file = export.write(csv, export.filename(name, view) + ".csv")
    return note, export.named(fig, export.filename(name, view)), str(file)

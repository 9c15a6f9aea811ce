"""The Positional encoding tab's views: eq. 4.1's sinusoids and their rotation check, the model's learned
positions, RoPE's angles and its scores on the model's own queries and keys, and the permutation check; the
bodies of the `positional_encoding`, `position_bias`, `permutation_check` and `export_positions` endpoints."""

from __future__ import annotations

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.charts import bar_figure, line_figure, matrix_heatmap, score_bias_figure
from ui.services import Services
from ui.services.checks import UserError, check_range, index_of, parse_head, public_text
from ui.plots.text import escaped
from ui.services.attention import score_formula
from ui.services.positions import (FORMULA_ROTARY_PCT, PERMUTATION_TOKENS, alibi_by_distance, check_bias_distance,
                                   check_bias_kind, check_t5_stack, check_offset, rope_partial_by_distance,
                                   t5_by_distance, check_positions, check_sinusoid_size,
                                   check_start, cosine_similarity, layer_rope_frequencies,
                                   pe_shift_check, permutation_check, position_table, rope_scores,
                                   score_bias_by_distance, sinusoidal)
from ui.services.text import encode
from ui.views import export
from ui.views.export import named
from ui.services.learn import positions as learned_positions
from ui.views.learn.positions import shuffle_chart

MAX_LEARNED_CELLS = 200_000  # learned-position heatmap: positions × d cells sent to the browser
NOT_DRAWN = "Not drawn: the note below says why."


def sinusoid_figures(n: int, d: int, data: dict | None = None):
    """The heatmap of eq. 4.1 with n positions and d dimensions, and its cosine similarity; `data`, when given,
    receives the matrices behind them (for the export)."""
    pe = sinusoidal(n, d)  # [n, d]
    heat = matrix_heatmap(
        pe, f"Sinusoidal encoding, eq. 4.1 (n = {n}, d = {d})", "dimension", "position", value_name="PE"
    )
    sim = pe @ pe.T / (d / 2)  # |PE(p)|² = d/2, so this is the cosine
    sim_fig = matrix_heatmap(
        sim,
        "Cosine similarity PE(p)·PE(q) / (d/2): near positions look alike",
        "position q",
        "position p",
        value_name="cosine",
    )
    if data is not None:
        data["sinusoidal_pe"] = (pe, [str(i) for i in range(n)], [str(j) for j in range(d)], "position \\ dimension")
        data["sinusoidal_similarity"] = (sim, [str(i) for i in range(n)], [str(i) for i in range(n)], "p \\ q")
    return heat, sim_fig


def dot_figure(n: int, d: int, p: int, data: dict | None = None):
    """PE(p)·PE(p+k) against the offset k (and PE(0)·PE(k) beside it when p ≠ 0)."""
    pe = sinusoidal(n, d)  # [n, d]
    offsets = np.arange(0, n - p)
    dots = {f"PE({p})·PE({p}+k)": (pe[p] * pe[p + offsets]).sum(-1)}
    if p != 0:
        dots["PE(0)·PE(k)"] = (pe[0] * pe[offsets]).sum(-1)
    if data is not None:
        data["sinusoidal_dot_vs_offset"] = (np.stack(list(dots.values()), 1), [str(o) for o in offsets], list(dots),
                                            "offset k")
    return line_figure(
        offsets,
        dots,
        "Dot product against offset k: it depends on k only, not on where you start",
        "offset k",
        "dot product",
        reference={"d/2 (k = 0)": d / 2},
    )


def rotation_text(n: int, d: int, k: int) -> str:
    """The rotation check of eq. 4.1 at offset k, in words with its measured errors."""
    check = pe_shift_check(sinusoidal(n, d), d, k)
    return (
        f"**PE(p + {k}) is a rotation of PE(p)**, checked on all {check['pairs']} positions p: each "
        f"(sin, cos) pair i turns by "
        f"the angle k·ω_i with ω_i = 1/10000^(2i/d).  \n"
        f"max |PE(p+k) − R_k·PE(p)| = {check['analytic_max_error']:.1e} (R_k built from the formula; "
        f"max |R_k·R_kᵀ − I| = {check['rotation_orthogonality']:.1e}, so R_k is a rotation).  \n"
        f"Fitting one matrix by least squares to all pairs (PE(p), PE(p+k)), without the formula, leaves a residual of "
        f"{check['fit_max_error']:.1e}: one linear map serves every position."
    )


def no_table_reason(cfg) -> str:
    """Why a model has no learned position table, in words."""
    if cfg.positional == "sinusoidal":
        return f"{cfg.family} adds the fixed sinusoids shown above: it has no learned position table."
    if cfg.score_bias != "none":
        return (f"{cfg.family} adds no positions to its embeddings: its positions are a bias on the scores "
                f"({bias_words(cfg)}), drawn under 'Score vs distance' below.")
    return f"{cfg.family} uses {cfg.positional} positions: it has no learned position table."


def bias_words(cfg) -> str:
    return ("ALiBi: −m_h·(i − j), a fixed slope per head" if cfg.score_bias == "alibi"
            else "T5's learned value per head for each bucket of relative distance")


def learned_figures(model, n: int, data: dict | None = None):
    table, offset = position_table(model)
    if table is None:
        reason = no_table_reason(model.config)  # said under the figures too where positions are elsewhere
        return empty_figure(reason), empty_figure(reason), reason if model.config.score_bias != "none" else ""
    rows = min(table.shape[0], max(2, n), max(2, MAX_LEARNED_CELLS // table.shape[1]))
    shown = table[:rows]
    if data is not None:
        data["learned_positions"] = (shown, [str(i) for i in range(rows)], [str(j) for j in range(shown.shape[1])],
                                     "position \\ dimension")
        data["learned_similarity"] = (cosine_similarity(shown), [str(i) for i in range(rows)],
                                      [str(i) for i in range(rows)], "p \\ q")
    heat = matrix_heatmap(
        shown,
        f"This model's learned position embeddings (first {rows} of {table.shape[0]}; colours clipped at the 99th "
        "percentile)" + (f"; position p is row p + {offset} of its table" if offset else ""),
        "dimension",
        "position",
        value_name="value",
        clip_quantile=0.99,
    )
    sim = matrix_heatmap(
        cosine_similarity(shown),
        "Cosine similarity of the learned positions",
        "position q",
        "position p",
        value_name="cosine",
    )
    note = (f"{model.config.family} reads position p at row p + {offset} of its table (rows 0–{offset - 1} are "
            "never used), so the rows are shown from there." if offset else "")
    return heat, sim, note


def score_bias_figures(model, n: int, data: dict | None = None):
    """For a model whose positions are a bias on the scores (ALiBi, T5): why there are no RoPE angles, the bias
    of every head against distance, and a note."""
    cfg = model.config
    distances, bias = score_bias_by_distance(model, n)                     # [D], [H, D]
    stack = "its encoder's " if cfg.is_encoder_decoder else ""
    reason = f"{cfg.family} does not rotate queries and keys: its positions are a bias on the scores."
    if data is not None:
        data["score_bias"] = (bias.T, [str(x) for x in distances], [f"head {h}" for h in range(len(bias))],
                              "distance i − j \\ head")
    figure = score_bias_figure(
        distances, bias,
        f"{'ALiBi' if cfg.score_bias == 'alibi' else 'Relative-position'} bias on {stack}scores vs distance i − j")
    if cfg.score_bias == "alibi":
        slopes = -bias[:, 1] if len(distances) > 1 else np.zeros(len(bias))
        text = (f"{cfg.family} adds no positions to its embeddings: its positions are a bias on the scores, "
                f"−m_h·(i − j), added before the softmax. Each head's line falls with a fixed slope m_h (here "
                f"{', '.join(f'{m:.3g}' for m in slopes)}), so far keys are penalised in proportion to their distance: "
                "steep heads look near, shallow heads far.")
    else:
        text = (f"{cfg.family} adds no positions to its embeddings: its positions are a bias on the scores, a learned "
                f"value per head for each of {cfg.relative_buckets} buckets of relative distance j − i (exact for near "
                f"keys, logarithmic further out, shared past {cfg.relative_max_distance}), added before the softmax. "
                f"Drawn for {stack or 'the '}stack the other tabs read; every layer of it shares the one table.")
    return empty_figure(reason), figure, text


def rope_figures(model, text: str, layer: int, head: int, n: int, data: dict | None = None):
    cfg = model.config
    inv_freq = layer_rope_frequencies(model, layer)
    if inv_freq is None and cfg.score_bias != "none":
        return score_bias_figures(model, n, data)
    if inv_freq is None:
        reason = f"{cfg.family} uses {cfg.positional} positions, not RoPE."
        return empty_figure(reason), empty_figure(reason), reason
    freqs = inv_freq.double().cpu().numpy()  # θ_i, [rotary_dim/2]
    positions = np.arange(n)
    angles = np.mod(freqs[:, None] * positions[None, :], 2 * np.pi)  # [pairs, n]
    rotary = 2 * len(freqs)  # the dims turned: one pair per frequency (rotary_dim rounded up to even)
    exponent = cfg.rotary_dim or cfg.head_dim
    dims = f"d_k = {cfg.head_dim}" if rotary == cfg.head_dim else f"the first {rotary} of d_k = {cfg.head_dim} rotated"
    angle_fig = matrix_heatmap(
        angles,
        f"RoPE rotation angle m·θ_i mod 2π (layer {layer}: θ_i = {cfg.layer_rope_theta(layer):g}^(−2i/{exponent}), "
        f"{dims})",
        "position m",
        "frequency pair i",
        colorscale="Twilight",
        symmetric=False,
        value_name="angle (rad)",
    )
    tokens = encode(model, text, max_tokens=256)
    if len(tokens.ids) < 2:
        raise UserError("The RoPE text needs at least 2 tokens.")
    query_pos, key_pos = len(tokens.ids) - 1, 0
    distances = np.arange(0, n)
    offsets = [0, 100, 1000]
    curves = rope_scores(model, tokens.ids, layer, head, query_pos, key_pos, distances, offsets)
    series = {f"key at position {m}, query at {m}+Δ": curves[m] for m in offsets}
    if data is not None:
        data["rope_angles"] = (angles, [str(i) for i in range(len(freqs))], [str(m) for m in positions],
                               "frequency pair \\ position")
        data[f"rope_scores_L{layer}_H{head}"] = (np.stack(list(series.values()), 1), [str(x) for x in distances],
                                                 list(series), "distance")
    score_fig = line_figure(
        distances,
        series,
        f"Score {score_formula(cfg).replace('QKᵀ', 'q·k')} vs distance Δ (layer {layer}, head {head}; q of "
        f"'{tokens.labels[query_pos]}', k of '{tokens.labels[key_pos]}')",
        "relative distance Δ (tokens)",
        "score",
    )
    spread = max(float(np.abs(curves[m] - curves[0]).max()) for m in offsets)
    text_out = (
        f"The three curves put the same query and key at different absolute positions; they differ by at most "
        f"{spread:.1e}, so with RoPE the score depends only on the distance Δ."
    )
    if rotary < cfg.head_dim:
        text_out += (f" RoPE turns only the first {rotary} of its {cfg.head_dim} dimensions of each head; the other "
                     f"{cfg.head_dim - rotary} pass unrotated, so their part of every score ignores position.")
    if cfg.attn_softcap is not None:
        text_out += f" The scores are drawn before the soft-cap {cfg.attn_softcap:g}·tanh(S / {cfg.attn_softcap:g})."
    return angle_fig, score_fig, text_out


def drawn(draw, figures: int) -> tuple:
    """One part of the tab: draw() → its `figures` figures, then its text when it has one. When draw refuses one of
    the inputs it reads, as many figures that say so, and the refusal as the text under them."""
    try:
        out = draw()
    except UserError as exc:
        return (*[empty_figure(NOT_DRAWN)] * figures, escaped(public_text(str(exc))))
    out = out if isinstance(out, tuple) else (out,)
    return out if len(out) > figures else (*out, "")


def positional_view(services: Services, model_name, n_positions, d_model, start_position, offset, layer_index,
                    head_index, text_value, progress=None, data: dict | None = None):
    """All figures of the tab; the body of the `positional_encoding` endpoint. Each part checks only the inputs it
    reads and, when one is refused, says why in the note under it while the other parts are drawn. `data`, when
    given, receives every matrix behind them: name → (matrix, row labels, column labels, corner).

    Returns (PE heatmap, dot product vs offset, similarity, rotation check, learned positions, learned similarity,
    RoPE angles, RoPE scores, RoPE note, sinusoid note, dot-product note, learned note)."""
    name, text = model_name, text_value
    where = {}  # the RoPE head, once checked, for the figure's file name

    def dots():
        n, d = check_sinusoid_size(n_positions, d_model)
        return dot_figure(n, d, check_start(start_position, n), data)

    def rotation():
        n, d = check_sinusoid_size(n_positions, d_model)
        return rotation_text(n, d, check_offset(offset, n))

    def rope():
        model = services.models.get(name, progress)
        cfg = model.config
        layer = check_range("Layer", layer_index, 0, cfg.n_layers - 1)
        where.update(layer=layer, head=parse_head(head_index, cfg.n_heads, allow_mean=False))
        return rope_figures(model, text, where["layer"], where["head"], check_positions(n_positions), data)

    heat, sim_fig, sinusoid_note = drawn(lambda: sinusoid_figures(*check_sinusoid_size(n_positions, d_model), data), 2)
    dot_fig, dot_note = drawn(dots, 1)
    (check_text,) = drawn(rotation, 0)
    learned_heat, learned_sim, learned_note = drawn(
        lambda: learned_figures(services.models.get(name, progress), check_positions(n_positions), data), 2)
    angle_fig, score_fig, rope_text = drawn(rope, 2)
    figures = zip((heat, dot_fig, sim_fig, learned_heat, learned_sim, angle_fig),
                  ("pe", "pe-dots", "pe-similarity", "learned-positions", "learned-similarity", "rope-angles"))
    heat, dot_fig, sim_fig, learned_heat, learned_sim, angle_fig = (named(f, export.filename(name, view))
                                                                     for f, view in figures)
    score_fig = named(score_fig, export.filename(name, "rope-scores", where.get("layer"), where.get("head")))
    return (heat, dot_fig, sim_fig, check_text, learned_heat, learned_sim, angle_fig, score_fig, rope_text,
            sinusoid_note, dot_note, learned_note)


OWN, FORMULA = "this model's own", "the formula, not this model"


def alibi_view(model, max_distance: int):
    """ALiBi's slopes per head and each head's bias against distance (eq. 6.3)."""
    cfg, out = model.config, alibi_by_distance(model, max_distance)
    whose = OWN if out["own"] else f"{FORMULA} ({cfg.n_heads} heads)"
    heads = [f"head {h}" for h in range(len(out["slopes"]))]
    slopes = bar_figure(heads, {"m_h": out["slopes"]}, "ALiBi slopes m_h (eq. 6.3)", "slope m_h", text_format=".3g",
                        subtitle=whose)
    bias = score_bias_figure(out["distances"], out["bias"], "ALiBi bias −m_h·(i − j) (eq. 6.3)",
                             subtitle=f"{whose}, every layer")
    source = "This model's own ALiBi" if out["own"] else "The formula, not this model"
    note = (f"**{source}** (eq. 6.3): each of the {len(heads)} heads adds −m_h·(i − j) to a score, its slopes "
            f"{alibi_rule(len(heads))} ({', '.join(f'{m:.3g}' for m in out['slopes'])}), for distances "
            f"0–{max_distance}. Steep heads look near, shallow heads far." + ("" if out["own"] else f" {cfg.family} adds no ALiBi to its "
                                                     "scores: these are the slopes ALiBi would give its head count."))
    return slopes, bias, note


def alibi_rule(n: int) -> str:
    """The rule core.layers.alibi_slopes follows for n heads, in words: 2^(−8h/n) for a power of two; otherwise that
    sequence for the power of two p below n, then every other slope of the sequence for 2p."""
    p = 2 ** (n.bit_length() - 1)
    if p == n:
        return f"2^(−8h/n), h = 1…{n}"
    odd = list(range(1, 2 * (n - p), 2))
    which = ", ".join(map(str, odd)) if len(odd) <= 3 else f"1, 3, …, {odd[-1]}"
    return (f"2^(−8h/{p}) for h = 1…{p} ({n} is not a power of two, so the sequence is that of the power of two "
            f"below it, {p}), then every other slope of the sequence for {2 * p} heads, 2^(−8h/{2 * p}) for "
            f"h = {which}")


def t5_view(model, stack: str, max_distance: int):
    """T5's bucket of each relative distance, encoder and decoder, and the stack's learned bias per head (eq. 6.4)."""
    cfg, out = model.config, t5_by_distance(model, stack, max_distance)
    series = {"encoder": out["buckets"]["encoder"], "decoder": out["buckets"]["decoder"]}
    buckets = line_figure(out["relative"], series, "T5 bucket of j − i (eq. 6.4)", "j − i (key minus query)",
                          f"bucket (of {out['n_buckets']})", subtitle=f"{OWN} buckets" if out["own"] else FORMULA)
    source = "This model's own buckets and learned bias" if out["own"] else "The formula, not this model"
    words = (f"**{source}** (eq. 6.4): {out['n_buckets']} buckets, exact for near keys, logarithmic out to "
             f"{out['max_far']}, one bucket past it; the encoder (bidirectional) splits them between keys before and "
             "after the query, the decoder (causal) gives all of them to keys at or before it (its later keys are "
             "masked, so their bucket 0 is never read).")
    if out["bias"] is None:
        reason = f"{cfg.family} has no T5 bias table: there is no learned bias to draw, only the buckets."
        return buckets, empty_figure(f"{cfg.family}: no T5 bias table"), f"{words} {reason}"
    bias = score_bias_figure(-out["bias_relative"], out["bias"], f"T5 learned bias, {stack} (eq. 6.4)",
                             subtitle=f"{OWN} table, every layer")
    return buckets, bias, f"{words} The bias is the {stack}'s own table, one learned value per head and bucket."


def rope_partial_view(model, max_distance: int):
    """Full against partial rotary (eq. 6.2): each dimension's angle per token, and a fixed pair's score by distance."""
    cfg, out = model.config, rope_partial_by_distance(model, max_distance)
    d_k, own, r = out["head_dim"], out["own"], out["partial_dims"]
    label = {kind: f"{kind} ({out[kind + '_dims']} of {d_k} dims)" for kind in ("full", "partial")}
    other = "partial" if own == "full" else "full"
    whose = f"{own}: {OWN}; {other}: the formula" if own else FORMULA
    angles = line_figure(np.arange(d_k), {label[k]: out[f"{k}_angle"] for k in label},
                         "RoPE angle per token θ (eq. 6.2)", "dimension (i and i + r/2 turn together)", "θ (rad)",
                         subtitle=whose)
    scores = line_figure(out["distances"], {label[k]: out[f"{k}_score"] for k in label},
                         "Score q·R(Δ)k, q = k = 1/√d_k (eq. 6.2)", "distance Δ (tokens)", "score",
                         reference={"unrotated share": 1 - r / d_k}, subtitle=whose)
    source = (f"**This model's own {own} rotary** (eq. 6.2; its inv_freq, {out[own + '_dims']} dims) beside the formula's "
              f"{other} rotary at its base {out['base']:g}" if own else
              f"**The formula, not this model**: {cfg.family} does not rotate queries and keys, so both are eq. 6.2 at "
              f"base {out['base']:g} for its d_k = {d_k}")
    note = (f"{source}. Partial rotary (GPT-NeoX's rotary_pct; {FORMULA_ROTARY_PCT:g} of d_k where the model has "
            f"none) turns the first {r} dims and passes the other {d_k - r} "
            f"unrotated (flat at 0): their part of a score ignores distance, {1 - r / d_k:.3g} of it, so the partial "
            f"curve never falls below {1 - 2 * r / d_k:.3g}. {partial_range(out)} Under full rotary every dim turns "
            f"and nothing holds the score up (here it falls to {out['full_score'].min():.3g}).")
    if own and cfg.rope_local_theta and cfg.rope_local_theta != cfg.rope_theta:
        note += (f" These are the global layers' angles (base {cfg.rope_theta:g}); this model's sliding-window layers "
                 f"rotate at base {cfg.rope_local_theta:g}, as the positional-encoding view of such a layer shows.")
    return angles, scores, note


def partial_range(out: dict) -> str:
    """Where the partial curve stays past distance 0, read from the curve, and why it stays above the unrotated
    share: the slow pairs' cos(θΔ) is still near 1 over these distances, so the rotated part has not averaged to 0."""
    far = np.asarray(out["distances"]) > 0
    low, high = float(out["partial_score"][far].min()), float(out["partial_score"][far].max())
    share = 1 - out["partial_dims"] / out["head_dim"]
    where = ("above" if low > share else "around")
    return (f"Over distances 1–{int(np.asarray(out['distances']).max())} it stays between {low:.3g} and {high:.3g}, "
            f"{where} that share: " + ("the slowest rotated pairs turn so little over these distances that their "
                                       "cosines are still near 1." if low > share else
                                       "its rotated pairs have turned through whole cycles, so their part averages "
                                       "about 0."))


def position_bias_view(services: Services, model_name, kind, stack, max_distance, progress=None):
    """ALiBi, T5's buckets or partial rotary on the loaded model (its own numbers where it has them, else the
    formula's); the body of the `position_bias` endpoint. Returns (figure, figure, note)."""
    kind, stack = check_bias_kind(kind), check_t5_stack(stack)
    max_distance = check_bias_distance(max_distance)
    model = services.models.get(model_name, progress)
    first, second, note = (alibi_view(model, max_distance) if kind == "alibi" else
                           t5_view(model, stack, max_distance) if kind == "t5" else
                           rope_partial_view(model, max_distance))
    views = {"alibi": ("alibi-slopes", "alibi-bias"), "t5": ("t5-buckets", f"t5-bias-{stack}"),
             "rope-partial": ("rope-partial-angles", "rope-partial-scores")}[kind]
    return (named(first, export.filename(model_name, views[0])), named(second, export.filename(model_name, views[1])),
            note)


def permutation_view(services: Services, model_name, text_value, progress=None) -> str:
    """The permutation check on the text, positions off; the body of the `permutation_check` endpoint."""
    model = services.models.get(model_name, progress)
    tokens = encode(model, text_value, PERMUTATION_TOKENS)
    return permutation_check(model, tokens.ids).sentence()


def shuffle_view(services: Services, model_name, text_value, progress=None):
    """The text's first tokens shuffled through the first attention layer, its outputs put back in order, under
    each switch: no positions and no mask (the same up to rounding), the model's own positions, the causal mask
    alone. The course's lesson on positions measures the same (ui.services.learn.positions.shuffle_checks)."""
    model = services.models.get(model_name, progress)
    ids = encode(model, text_value, learned_positions.lesson_tokens(model)).ids
    if len(ids) < 3:
        raise UserError("The shuffle check needs at least 3 tokens of text.")
    values = learned_positions.shuffle_values(learned_positions.shuffle_checks(model, ids), len(ids))
    return named(shuffle_chart(values), export.filename(model_name, "shuffled"))


def first_view(services: Services, model_name, n_positions, d_model, start_position, offset, layer_index, head_index,
               text_value, progress=None):
    """The tab's figures and its permutation check together: what the tab opens on."""
    figures = positional_view(services, model_name, n_positions, d_model, start_position, offset, layer_index,
                              head_index, text_value, progress)
    (permutation,) = drawn(lambda: permutation_view(services, model_name, text_value, progress), 0)
    return *figures, permutation


def export_data(services: Services, model_name, n_positions, d_model, start_position, offset, layer_index,
                head_index, text_value, progress=None) -> tuple[str, str]:
    """Every matrix of the tab as CSV in one .zip; the body of the `export_positions` endpoint. Unlike the figures,
    which are drawn where they can be, the export refuses any bad input: a .zip is all the matrices or none."""
    n, _ = check_sinusoid_size(n_positions, d_model)
    check_start(start_position, n)
    check_offset(offset, n)
    cfg = services.models.get(model_name, progress).config
    check_range("Layer", layer_index, 0, cfg.n_layers - 1)
    parse_head(head_index, cfg.n_heads, allow_mean=False)
    data: dict = {}
    positional_view(services, model_name, n_positions, d_model, start_position, offset, layer_index, head_index,
                    text_value, progress, data)
    name, n, d, p = model_name, n_positions, d_model, start_position
    files = {f"{key}.csv": export.matrix_csv(matrix, rows, cols, corner, [f"{name}: {key.replace('_', ' ')}"])
             for key, (matrix, rows, cols, corner) in data.items()}
    readme = (f"Positional encodings for {name}, n = {index_of(n)}, d = {index_of(d)}:\n"
              "sinusoidal_pe: eq. 4.1, PE(position, dimension)\n"
              "sinusoidal_similarity: PE(p)·PE(q) / (d/2)\n"
              f"sinusoidal_dot_vs_offset: PE(p)·PE(p+k) against k (p = {index_of(p)})\n"
              "learned_positions, learned_similarity: the model's own position table (GPT-2, BERT), when it has one\n"
              "rope_angles: m·θ_i mod 2π; rope_scores_*: q·k × scale against distance at three offsets (RoPE models)\n"
              "score_bias: the bias on the scores per head against distance i − j (ALiBi, T5)\n"
              "Nothing is pooled.\n")
    path = export.write(export.zip_of(files, readme), export.filename(name, "positions") + ".zip")
    return str(path), f"{len(files)} matrices as CSV: {', '.join(sorted(files))}."

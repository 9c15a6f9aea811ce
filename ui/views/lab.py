"""The Lab tab's views: a job's training curves and attention snapshots, a trained run's attention on any source,
and the session's runs as JSON; the bodies of the Lab's endpoints that draw."""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import asdict

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.heads import composition_figure, sink_maps
from ui.plots.lab import HeadPanel, KindLine, attention_panels, extrapolation_accuracy, heatmap_grid, training_curves
from ui.plots.text import escaped
from ui.services.checks import UserError
from ui.services.lab import extrapolation as extra
from ui.services.lab import induction
from ui.services.lab import sinks
from ui.services.lab.runs import Lab
from ui.views import UNCHANGED, export

SHOWN_EVERY_S = 0.5  # a live run's status reaches the page at most this often


def snapshot_count(job) -> int:
    run = job.records[0].run
    return len(run.snapshots) if run is not None else 0


def snapshot_figure(lab: Lab, record):
    snap = lab.snapshots(record)
    if snap is None:
        return empty_figure("No snapshot yet: they are taken after the snapshot steps.")
    axes = ("output", "source") if snap.kind.startswith("cross") else ("query", "key")
    return heatmap_grid(snap.maps, [f"step {s}" for s in snap.steps],
                                  [f"layer {i}" for i in range(snap.maps.shape[1])], snap.query_tokens,
                                  snap.key_tokens, f"{record.id}: {snap.kind} on a held-out example", *axes)


def runs_export(lab: Lab, key: str | None) -> tuple[str, str]:
    """Every run of the session (config, status, summary, curves) and the comparisons' findings as JSON; the body
    of the `export_lab` endpoint. NaN losses (a diverged run) are null. Returns (path, note)."""
    runs = []
    for record in lab.runs(key):
        curve = record.curve()
        runs.append(dict(run=record.id, label=record.label, status=record.status, config=asdict(record.lab),
                         summary=asdict(record.summary()),
                         curves=dict(steps=curve.steps, train_loss=curve.train_loss, eval_steps=curve.eval_steps,
                                     held_loss=curve.held_loss, exact_match=curve.exact_match)))
    if not runs:
        raise UserError("No run yet in this session: train one, then export it.")
    body = export.json_bytes(dict(runs=runs, findings=lab.findings(key)))
    path = export.write(body, "lab-runs.json")
    return str(path), f"{len(runs)} run(s): {', '.join(r['run'] for r in runs)}, their curves and findings."


def job_curves(lab: Lab, job):
    """The training curves of a job's runs, overlaid."""
    title = f"{job.records[0].lab.task}: " + " vs ".join(r.id for r in job.records)
    return training_curves(lab.curves(job), title, max(r.lab.steps for r in job.records))


def run_attention(lab: Lab, key: str | None, run_id, source_text):
    """A trained run's attention on one source: (note, encoder, decoder, cross-attention figures)."""
    v = lab.attention(key, run_id, source_text)
    layers = lambda m: [f"layer {i}" for i in range(m.shape[0])]  # noqa: E731
    heads = lambda m: [f"head {h}" for h in range(m.shape[1])]  # noqa: E731
    enc = crs = None
    if v.cross is not None:
        crs = heatmap_grid(v.cross, layers(v.cross), heads(v.cross), v.target_tokens, v.source_tokens,
                           "Cross-attention: decoder position (predicting the next output) × source", "output", "source")
        enc = heatmap_grid(v.encoder, layers(v.encoder), heads(v.encoder), v.source_tokens, v.source_tokens,
                           "Encoder self-attention (bidirectional)")
    dec = heatmap_grid(v.decoder, layers(v.decoder), heads(v.decoder), v.target_tokens, v.target_tokens,
                       "Decoder self-attention (causal)" if v.cross is not None else
                       escaped("Decoder self-attention over <bos> source <sep> answer (causal)"))
    return v.note, enc, dec, crs


# ---- positions past the trained length ----

def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def extrapolation_table(result) -> str:
    """Per kind: accuracy and whole copies at each tested length, and the copy head's weight on its symbol."""
    lengths = result.config.test_lengths
    lines = ["| positions | " + " | ".join(f"accuracy, {n}" for n in lengths) + " | " +
             " | ".join(f"whole copies, {n}" for n in lengths) + " | copy head | " +
             " | ".join(f"its weight, {n}" for n in lengths) + " |",
             "|---|" + "---:|" * (3 * len(lengths) + 1)]
    for k in result.kinds:
        cells = [_pct(k.accuracy.get(n)) for n in lengths] + [_pct(k.exact.get(n)) for n in lengths]
        weights = [f"{k.copy_weight[n]:.2f}" if n in k.copy_weight else "—" for n in lengths]
        lines.append(f"| **{k.kind}** | " + " | ".join(cells) + f" | L{k.head[0]} H{k.head[1]} | " +
                     " | ".join(weights) + " |")
    return "\n".join(lines)


def extrapolation_finding(result) -> str:
    """What the numbers show, read from them: the longest length, who holds best there, who copies whole."""
    config, kinds = result.config, result.kinds
    trained, longest = config.train_longest, max(config.test_lengths)
    within = [k for k in kinds if k.accuracy.get(trained) is not None]
    past = [k for k in kinds if k.accuracy.get(longest) is not None]
    parts = []
    if within:
        low = min(within, key=lambda k: k.accuracy[trained])
        parts.append(f"At {trained} symbols, the longest trained, every kind copies at least "
                     f"{_pct(low.accuracy[trained])} of the tokens ({low.kind} lowest).")
    if past:
        best = max(past, key=lambda k: k.accuracy[longest])
        whole = [k.kind for k in past if k.exact[longest] > 0]
        parts.append(f"At {longest}, the most accurate is **{best.kind}** ({_pct(best.accuracy[longest])}); "
                     + (f"{', '.join(whole)} copy some texts whole." if whole else
                        f"no kind copies a {longest}-symbol text whole."))
    refused = [k.kind for k in kinds if k.refused]
    if refused:
        parts.append(f"{', '.join(refused)} cannot read past its table at all.")
    if parts:   # the caveat goes wherever the result is shown
        parts.append(f"Each kind trained once (seed {config.seed}, {config.steps:,} steps) on one task, copying: a "
                     "gap of a few points between kinds may not hold for another seed or task.")
    return " ".join(parts)


def by_length(values: dict) -> dict:
    return {str(n): v for n, v in values.items()}  # JSON keys are strings


def extrapolation_outputs(result, source: str):
    """(note, accuracy figure, attention figure, numbers) of a result, saved or computed here."""
    config = result.config
    lengths, trained = config.test_lengths, config.train_longest
    lines = [KindLine(k.kind, [k.accuracy.get(n) for n in lengths], k.by_index) for k in result.kinds]
    title = (f"Copying past the trained length ({trained} symbols): {config.steps:,} steps per kind, seed {config.seed}, "
             f"{config.test_examples} held-out texts per length")
    accuracy = extrapolation_accuracy(lines, lengths, trained, extra.CHANCE, title)
    panels = []
    for k in result.kinds:
        if k.attention is None:
            panels.append(HeadPanel(f"{k.kind}: no map", None, []))
            continue
        weight = k.copy_weight.get(k.attention_symbols)
        panels.append(HeadPanel(f"{k.kind}: L{k.head[0]} H{k.head[1]}, {k.attention_symbols} symbols"
                                + (f", {weight:.2f} on the symbol" if weight is not None else ""),
                                k.attention, k.tokens))
    heads = attention_panels(panels, "The copy head of each kind on one held-out text (chosen at "
                                     f"{trained} symbols: the most weight on the symbol to copy)")
    refusals = [f"- **{k.kind}** at {n} symbols: {why}." for k in result.kinds for n, why in k.refused.items()]
    words = [f"- **{k.kind}**: {extra.KIND_WORDS[k.kind]}" for k in result.kinds]
    note = (f"{source}\n\n{extrapolation_finding(result)}\n\n"
            f"Every kind trains the same decoder ({config.n_layers} layers, d_model {config.d_model}, {config.n_heads} "
            f"heads, Pre-LN with RMSNorm and SwiGLU) from the same seed on the same batches of {config.batch} texts, "
            f"copying 1 to {trained} of 62 letters and digits; only the positions differ. **Accuracy** is the share of "
            "target tokens (the symbols and `<eos>`) predicted right after the right prefix (chance: "
            f"{100 * extra.CHANCE:.1f} %); **whole copies** the share of texts with every token right, which is what "
            "greedy decoding copies exactly.\n\n" + "\n".join(words) + "\n\n" + extrapolation_table(result) +
            ("\n\n" + "\n".join(refusals) if refusals else ""))
    numbers = dict(config=dict(kinds=list(config.kinds), steps=config.steps, seed=config.seed,
                               train_longest=trained, test_lengths=list(lengths), test_examples=config.test_examples),
                   kinds=[dict(kind=k.kind, accuracy=by_length(k.accuracy), whole_copies=by_length(k.exact),
                               copy_head=list(k.head), copy_weight=by_length(k.copy_weight),
                               refused=by_length(k.refused), steps=k.steps,
                               train_loss=round(k.train_loss, 5), seconds=k.seconds) for k in result.kinds])
    return (note, export.named(accuracy, "extrapolation-accuracy"), export.named(heads, "extrapolation-heads"),
            numbers)


def saved_extrapolation():
    """The Lab's first screen: the shipped result, or a line saying how to make it."""
    result = extra.saved()
    if result is None:
        return (f"No saved result in this copy: `{extra.SAVED_COMMAND}` makes it; or press *Train and test*.",
                empty_figure("No saved result: press Train and test."), empty_figure("No saved result: press Train and test."), {})
    threads = f" on {result.threads} thread{'s' if result.threads > 1 else ''}" if result.threads else ""
    source = (f"**Saved result**, computed on {result.date} by `{extra.SAVED_COMMAND}`{threads}; press *Train and "
              "test* to compute it again here.")
    return extrapolation_outputs(result, source)


def saved_headline() -> str:
    """The saved result's finding, for the Lab's first screen (the full result is further down the tab)."""
    result = extra.saved()
    if result is None:
        return "**Positions past the trained length**: see the section at the end of this tab."
    return (f"**Positions past the trained length** (saved result, at the end of this tab): "
            f"{extrapolation_finding(result)}")


def extrapolation_view(services, kinds, steps, seed, progress=None):
    """The body of the `extrapolation` endpoint: train and test each kind, yielding (status, note, accuracy
    figure, attention figure, numbers) as each kind finishes, and the progress bar at every step."""
    config = extra.make_config(kinds, steps, seed, services.lab.settings.max_steps)
    started = time.perf_counter()
    shown = -1
    for job in extra.run(config, max_seconds=services.settings.corpus_max_seconds):
        n, total = len(job.results), len(config.kinds)
        if progress is not None and not job.done.is_set():
            progress(job.fraction, f"{job.kind or config.kinds[0]}: step {job.step:,} of {config.steps:,} "
                                   f"({n} of {total} kinds done)")
        if job.error:
            raise UserError(f"The run failed after {n} of {total} kinds: {job.error}")
        elapsed = time.perf_counter() - started
        if job.done.is_set():   # the time cap's words, where it stopped the run or the run passed it
            status = job.cap.words(f"{n} of {total} kinds") or f"Done: {total} kind{'s' if total > 1 else ''} in " \
                                                                  f"{elapsed:,.0f} s."
        else:
            status = (f"Training **{job.kind or config.kinds[0]}**: step {job.step:,} of {config.steps:,}; {n} of "
                      f"{total} kinds done, {elapsed:,.0f} s.")
        if n == shown and not job.done.is_set():
            yield (status,) + (UNCHANGED,) * 4
            continue
        shown = n
        if n == 0:
            yield (status,) + (UNCHANGED,) * 4
            continue
        rest = "; the time cap stopped the rest." if job.done.is_set() else "; the rest are training."
        source = f"**Computed here, now**: {n} of {total} kinds, {elapsed:,.0f} s" + ("." if n == total else rest)
        yield (status, *extrapolation_outputs(job.result(), source))


# ---- attention sinks: softmax against a learned sink ----

SINKS_LEAD = """### Attention sinks: softmax against a learned sink
Softmax makes every head's weights sum to 1, so a head with nothing to fetch must still put its weight somewhere;
trained models put it on the first token, an **attention sink**, and then need that token kept: read through a
window of recent keys alone, they lose it (the Heads tab measures this on the loaded model). One button trains
this Lab's small decoder twice on the same task, with softmax and with a **learned sink** (one more entry per
head in each softmax's denominator, with no value), then measures where each head's weight goes and the
perplexity with full attention, with a window of keys, and with the window and the first token."""


def sinks_table(result) -> str:
    """Per kind: the perplexity of the held-out sequences read each way, over all predictions and past the window."""
    window = result.config.window
    lines = ["| softmax of | " + " | ".join(sinks.READS) + " | " +
             " | ".join(f"{read}, queries ≥ {window - 1}" for read in sinks.READS) + " |",
             "|---|" + "---:|" * (2 * len(sinks.READS))]
    for row in sinks.perplexity_rows(result):
        lines.append(f"| **{row[0]}** | " + " | ".join(row[1:]) + " |")
    return "\n".join(lines)


def sinks_outputs(result, source: str):
    """(note, figure, numbers) of a result, saved or computed here."""
    soft, sink = result.kind("softmax"), result.kind("sink")
    if soft is None or sink is None:
        return (f"{source} {sinks.finding(result)}", empty_figure("Both kinds are needed: press Train both."), {})
    maps = {"softmax: weight on <bos>": soft.first, "learned sink: weight on <bos>": sink.first,
            "learned sink: the sink's own weight": sink.learned}
    maps = {name: np.asarray(values, dtype=np.float32) for name, values in maps.items()}
    figure = sink_maps(maps, {name: sinks.sink_heads(values) for name, values in maps.items()}, sinks.EPSILON,
                       f"Each head's mean weight on <bos> (queries 1–{result.config.context - 1}, {result.config.test_texts}"
                       f" held-out sequences), ringed above ε = {sinks.EPSILON:g}; right: what the learned sink takes")
    note = escaped("\n\n".join([   # escaped: the words name <bos>, which Markdown would take for a tag
        f"{source} {sinks.finding(result)}",
        "Perplexity of the held-out sequences, read with full attention, with each query's last "
        f"{result.config.window} keys only, and with those and <bos>:", sinks_table(result),
        sinks.caveat(result),
        "The learned sink is one more entry in each row's denominator, with no value: a key k_s per head that "
        "each query scores as it scores a key, P = exp(S) / (Σ exp(S) + exp(q·k_s/√d_k)) (a key-only sink token, "
        "as Gu et al., ICLR 2025, train one). A head's weights then sum to 1 minus what its sink takes."]))
    numbers = {"config": asdict(result.config), "kinds": [asdict(k) for k in result.kinds], "date": result.date,
               "threads": result.threads}
    return note, export.named(figure, "sinks-lab"), numbers


def saved_sinks():
    """The Lab's first screen: the shipped result, or a line saying how to make it."""
    result = sinks.saved()
    if result is None:
        return (f"No saved result in this copy: `{sinks.SAVED_COMMAND}` makes it; or press *Train both*.",
                empty_figure("No saved result: press Train both."), {})
    source = (f"**Saved result**, computed on {result.date} by `{sinks.SAVED_COMMAND}`; press *Train both* to "
              "compute it again here.")
    return sinks_outputs(result, source)


def sinks_headline() -> str:
    """The saved result's finding, for the Lab's first screen (the full result is at the end of the tab)."""
    result = sinks.saved()
    if result is None:
        return "**Attention sinks, softmax against a learned sink**: see the section at the end of this tab."
    # escaped: the words name <bos>, which Markdown would otherwise take for a tag and drop with what follows
    return ("**Attention sinks, softmax against a learned sink** (saved result, at the end of this tab): "
            + escaped(sinks.finding(result)))


def sinks_view(services, steps, seed, window, progress=None):
    """The body of the `lab_sinks` endpoint: train both kinds and measure them, yielding (status, note, figure,
    numbers) as the run moves and once it is done."""
    config = sinks.make_config(steps, seed, window, services.lab.settings.max_steps)
    shown = 0.0
    with closing(sinks.run(config, max_seconds=services.settings.corpus_max_seconds)) as updates:
        for update in updates:
            if update.finished:
                source = f"**Computed here, now**, in {update.seconds:,.0f} s."
                yield (f"Done: both kinds in {update.seconds:,.0f} s.", *sinks_outputs(update.result, source))
                return
            kind = sinks.engine.KINDS[min(1, update.done // max(1, config.steps))]
            words = f"{kind}: step {update.done % config.steps or (config.steps if update.done else 0):,} of " \
                    f"{config.steps:,}"
            if progress is not None:
                progress(update.done / max(1, update.total), words)
            if update.seconds - shown >= SHOWN_EVERY_S or update.done == 0:
                shown = update.seconds
                yield (f"Training **{words}** (softmax first, then the learned sink), {update.seconds:,.0f} s.",
                       UNCHANGED, UNCHANGED, UNCHANGED)


# ---- the induction circuit: a previous-token head feeding an induction head ----

INDUCTION_LEAD = """Copy-62's second copy can only be predicted by looking back: at a character, find it in the first
copy and read the one after. A two-layer **attention-only** decoder (no MLPs, as Olsson et al. 2022 train) learns
it with two heads: a layer-0 **previous-token head** writes each position's previous character into it, and a
layer-1 **induction head**'s keys read that. *Trace* measures both heads and asks, with the Heads tab's *What feeds a
head*, which earlier component writes the induction head's keys. The saved run took 75 s on one thread
(`assets/lessons/induction/README.md` has its command); *Train one like it* trains the same config here. Another
seed may learn the task another way, or not in its steps: the trace says what that run learned (docs/core.md has
the seeds tried)."""


def induction_outputs(found) -> tuple[str, object, object]:
    """(note, the two heads' maps, what feeds the induction head's keys) of an induction.Traced: a circuit is named
    only where the one rule (core.analysis.circuits) finds it; otherwise the note says no circuit formed, with the
    scores, and the maps name no head."""
    finding = found.finding
    p, i = f"L0 H{found.previous_head}", f"L1 H{found.induction_head}"
    length = (len(found.tokens) - 2) // 2
    allowed = int(np.argmax(found.weights[0]))
    rule = (f"A circuit is named only where the induction score is at least {induction.INDUCTION_MIN:g} and the "
            f"earlier head feeding its keys most is a previous-token head (score at least {induction.PREVIOUS_MIN:g}), "
            "the Heads tab's thresholds.")
    lead = (f"**{escaped(found.run_id)}**: on {found.n} fresh texts ({length} random letters and digits, repeated "
            f"after `<sep>`), ")
    if finding.found:
        source = str(finding.source)
        at = found.labels.index(source) if source in found.labels else None
        interval = ("" if at is None or not np.isfinite(found.low[at])
                    else f" [{found.low[at]:.2f}, {found.high[at]:.2f}]")
        finding_words = (f"**{source}** is a previous-token head (mean weight {finding.source_previous:.2f} on the key "
                         f"just before the query) and **{i}** an induction head (mean weight "
                         f"{finding.induction_score:.2f} from each character of the second copy to the character "
                         f"after its first copy); {source} feeds {i}'s keys more than any other earlier head (share "
                         f"{finding.source_share:+.2f}{interval} of the relative score): {induction.OLSSON}.")
        titles = (f"{p}: previous-token head", f"{i}: induction head")
    else:
        finding_words = f"{escaped(finding.words())}."
        titles = (f"{p}: layer 0's largest previous-token score ({found.previous[found.previous_head]:.2f})",
                  f"{i}: layer 1's largest induction score ({found.induction[found.induction_head]:.2f})")
    note = (lead + finding_words + f" {rule} The weights alone (K-composition, no text) rank L0 H{allowed} first "
            f"({found.weights[0, allowed]:.2f}). Pairs: {found.pairs}.")
    heads = attention_panels([HeadPanel(titles[0], found.previous_map, found.tokens),
                              HeadPanel(titles[1], found.induction_map, found.tokens)],
                             escaped(f"{found.run_id}: the two heads on <bos> s <sep> s"), columns=2)
    feeds = composition_figure(found.labels, found.mean, found.low, found.high, found.weights, "key",
                               f"What feeds {i}'s keys, over {found.n} texts")
    return note, heads, feeds


def saved_induction() -> tuple[str, object, object]:
    found = induction.trace_saved()
    if found is None:
        missing = ("The saved induction run is missing from this copy (assets/lessons/induction; its README.md "
                   "gives the command that makes it).")
        return missing, empty_figure(missing), empty_figure(missing)
    return induction_outputs(found)


def induction_view(lab: Lab, key: str | None, run_id):
    run_id, config, model = lab.trained(key, run_id)
    return induction_outputs(induction.trace(model, run_id, config))

"""Across texts tab: how typical is what one text shows? A corpus (built in, or uploaded), an analysis (head
scores, logit attribution, patching, the shortcuts against patching, each head's ablation) run over every item, and its mean map with the 95 %
interval, plus one cell's value item by item; for one head, its top examples and its query/key plane. Each job is
heavy (one per session), shows its progress and has a time cap stated beside Stop; Stop, or the cap, keeps the
summary of the items finished before it. A job is saved for its page (ui/services/corpus/pages.py: on a shared server a
folder of the page's own), and a model change clears the tab's results."""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

import gradio as gr

from ui.services.corpus.ablation import ABLATION_TEXTS
from ui.services.corpus.examples import MAX_EXAMPLES
from ui.services.corpus.over import CORPORA, DEFAULT_N, KINDS, MAX_PAIRS, MAX_TEXTS
from ui.services.kept import keeping
from ui.tabs.events import ON_ANALYSIS, ON_HEAVY, handler, session_of, user_errors
from ui.tabs.widgets import click_bridge
from ui.views.corpus import across as views
from ui.views.corpus.qk import qk_view

LEAD = """**How typical is this?** One text is an anecdote. Run an analysis over many texts (or prompt pairs) and
see each head's mean with its 95 % confidence interval, and every item's own value for one cell."""

EMPTY = ("Nothing is computed on this page yet: choose a corpus and run one of the analyses on the left; its "
         "mean map, the chosen cell's strip and the query/key plane appear here.")

HOW_TO_READ = """Each cell of the map is the **mean over the corpus**; hover it for the interval [low, high] (the
95 % confidence interval of the mean over items: a seeded percentile bootstrap for a quantity with a range, such
as an attention share in [0, 1], so the interval never leaves it; Student's t, mean ± t · s/√n, for one without;
none below 5 items) and n; the line under each figure names which. The strip under it shows
the chosen cell item by item: a dot per text or pair, the mean as a line, the interval as a band. A narrow
interval with the dots close together is a typical behaviour; a wide one, a mean over very different items."""

UPLOAD_WORDS = """**Upload**: texts as `.txt` (one a line, or blank-line separated), `.jsonl` (a `text` field) or
`.csv` (a `text` column); pairs (attribution, patching) as `.jsonl` or `.csv` with `clean`, `corrupted`, `answer`,
`foil`, the answer and foil one token each (e.g. `" Mary"`, its space kept), both prompts of one token count."""

SHORTCUTS_WORDS = """Exact patching of every head and of the residual stream on each pair, beside each cheap
estimate of it (AtP, AtP\\*, EAP-IG, the flow graph): the map is each method's Spearman ρ with the exact sweep,
the note every measure with its interval and each method's cost. A pair is two exact sweeps and seven estimates:
the slowest job of this tab."""

CORPUS_KEPT = ("corpus",)   # the key of a session's last corpus result in the server-wide KeptStore
# a click on a cell of the mean map reads "row.column"
CELL_READ = "return point.x === undefined || point.y === undefined ? null : `${point.y}.${point.x}`;"
SITE_CHOICES = [("each head (layer × head)", "z"), ("residual stream (layer × position)", "resid_pre"),
                ("attention output (layer × position)", "attn_out"), ("MLP output (layer × position)", "mlp_out"),
                ("one layer's heads (head × position)", "z_by_position")]


def build(services, picker, initial) -> SimpleNamespace:
    """The tab; returns what the other tabs' buttons that ask how typical a result is set and run (ui/page.py)."""
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            corpus = gr.Dropdown(list(CORPORA), value=CORPORA[0], label="Corpus", elem_id="corpus-source")
            n = gr.Number(DEFAULT_N, label=f"Items (n): texts up to {MAX_TEXTS}, pairs up to {MAX_PAIRS}",
                          precision=0, elem_id="corpus-n")
            with gr.Accordion("Head scores (texts)", open=True, elem_id="corpus-heads-box"):
                kind = gr.Dropdown(list(KINDS), value="induction", label="Score", elem_id="corpus-kind")
                heads_run = gr.Button(views.RUN_BUTTONS[0], variant="primary", elem_id="corpus-heads-run")
            with gr.Accordion("Logit attribution (pairs)", open=True, elem_id="corpus-attribution-box"):
                attribution_run = gr.Button(views.RUN_BUTTONS[1], variant="primary",
                                            elem_id="corpus-attribution-run")
            with gr.Accordion("Patching (pairs)", open=False, elem_id="corpus-patch-box"):
                site = gr.Dropdown(SITE_CHOICES, value="z", label="What to patch", elem_id="corpus-site")
                mode = gr.Radio(["denoise", "noise"], value="denoise", label="Direction", elem_id="corpus-mode")
                layer = gr.Number(0, label="Layer (for one layer's heads)", precision=0, elem_id="corpus-layer")
                patch_run = gr.Button(views.RUN_BUTTONS[2], variant="primary", elem_id="corpus-patch-run")
            shortcut_mode, shortcuts_run = shortcuts_box()
            examples = examples_box()
            plane = plane_box()
            ablation, ablation_run = ablation_box()
            # below the analyses, so that the first run's button stays in view: the cell the strip shows (a click
            # on the map sets it), and a corpus of one's own (the built-in corpora need no file)
            with gr.Row():
                row = gr.Number(0, label="Cell: layer (head, for one layer's heads)", precision=0,
                                elem_id="corpus-row", min_width=120)
                col = gr.Number(0, label="Cell: head (or position)", precision=0, elem_id="corpus-col",
                                min_width=120)
            upload = gr.File(label="Your corpus (.txt, .jsonl, .csv)", file_types=[".txt", ".jsonl", ".csv"],
                             type="filepath", elem_id="corpus-upload")
            gr.Markdown(UPLOAD_WORDS, elem_classes=["field-note"])
            stop = gr.Button("Stop", variant="stop", elem_id="corpus-stop")
            gr.Markdown(cap_words(services.settings.corpus_max_seconds), elem_classes=["field-note"],
                        elem_id="corpus-cap")
        with gr.Column(scale=3, min_width=340):
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            note = gr.Markdown(EMPTY, elem_id="corpus-note")
            # hidden until a job draws them: the tab opens on its empty state in words, not on empty boxes
            mean_fig = gr.Plot(label="The mean over the corpus (click a cell for its items)", elem_id="corpus-map",
                               visible=False)
            cell_note = gr.Markdown(elem_id="corpus-cell-note")
            strip_fig = gr.Plot(label="The chosen cell, item by item", elem_id="corpus-strip", visible=False)
            with gr.Row():
                export_button = gr.Button("Export the finished job (CSV, .npz)", size="sm", elem_id="corpus-export",
                                          scale=0, min_width=220)
                export_files = gr.File(label="The job's cells, items and result", file_count="multiple",
                                       interactive=False, elem_id="corpus-export-files", visible=False)
            examples_note = gr.Markdown(elem_id="corpus-examples-note")
            examples_table = gr.HTML(elem_id="corpus-examples")
            plane_note = gr.Markdown(elem_id="corpus-qk-note")
            plane_fig = gr.Plot(label="One head's queries and keys over the corpus", elem_id="corpus-qk",
                                visible=False)
    kept = gr.State(None, time_to_live=1800)   # a KeptRef: the ticket of the session's last result
    outputs = [note, mean_fig, strip_fig, kept]
    common = [picker.model, corpus, n, upload]

    def job(view, name: str, what: str, inputs: list) -> dict:
        return dict(fn=for_its_page(handler(keeping(view, services.kept, CORPUS_KEPT), services, name, heavy=what)),
                    inputs=inputs, outputs=outputs, **ON_HEAVY)

    runs = dict(heads=job(views.heads_view, "corpus_heads", "A head-score job over a corpus",
                          [*common, kind, row, col, kept]),
                patch=job(views.patch_view, "corpus_patch", "A patching job over a corpus",
                          [*common, site, mode, layer, row, col, kept]),
                shortcuts=job(views.shortcuts_view, "corpus_shortcuts", "A shortcuts job over a corpus",
                              [*common, shortcut_mode, row, col, kept]),
                ablation=job(views.ablation_view, "corpus_ablation", "An ablation job over a corpus",
                             [*common, ablation, row, col, kept]))
    show_map = shown([mean_fig, strip_fig])
    events = [
        heads_run.click(**show_map).then(**runs["heads"], api_name="corpus_heads"),
        attribution_run.click(**show_map).then(**job(views.attribution_view, "corpus_attribution", "An attribution job over a corpus",
                                    [*common, row, col, kept]), api_name="corpus_attribution"),
        patch_run.click(**show_map).then(**runs["patch"], api_name="corpus_patch"),
        shortcuts_run.click(**show_map).then(**runs["shortcuts"], api_name="corpus_shortcuts"),
        examples.run.click(handler(views.examples_view, services, "corpus_examples", heavy="A top-examples job"),
                           [*common, examples.layer, examples.head, examples.k], [examples_note, examples_table],
                           api_name="corpus_examples", **ON_HEAVY),
        plane.run.click(**shown([plane_fig])).then(
                        handler(qk_view, services, "corpus_qk", heavy="A query/key plane over a corpus"),
                        [*common, plane.layer, plane.head], [plane_note, plane_fig], api_name="corpus_qk",
                        **ON_HEAVY),
        ablation_run.click(**show_map).then(**runs["ablation"], api_name="corpus_ablation"),
    ]
    # cancel first, then relabel: the figures keep the last summary the job sent
    stop.click(None, None, None, cancels=events, api_visibility="private").then(
        views.mark_stopped, note, note, api_visibility="private", queue=False)
    wire_cells(services, row, col, kept, [cell_note, mean_fig, strip_fig])
    exporting = handler(keeping(views.export_view, services.kept, CORPUS_KEPT), services, "corpus_export",
                        progress=False)
    export_button.click(lambda: gr.File(visible=True), None, export_files, api_visibility="private",
                        queue=False).then(exporting, kept, [export_files, kept], api_visibility="private")
    wire_switch(picker, events, [note, mean_fig, cell_note, strip_fig, kept, export_files, examples_note,
                                 examples_table, plane_note, plane_fig])
    return SimpleNamespace(corpus=corpus, n=n, kind=kind, site=site, mode=mode, shortcut_mode=shortcut_mode, row=row,
                           col=col, runs=runs,
                           stop=stop, note=note, show_map=show_map)


def cap_words(max_seconds: float) -> str:
    return (f"One job runs at most **{max_seconds:g} s** on this server. A map's job stopped (by Stop or the cap) "
            "keeps the summary of the items finished by then, and a saved job run again goes on from them.")


def examples_box() -> SimpleNamespace:
    """The top examples' box: one head (layer, head), how many examples, and its button; the corpus is the tab's."""
    with gr.Accordion("Top examples of one head (texts)", open=False, elem_id="corpus-examples-box"):
        with gr.Row():
            layer = gr.Number(0, label="Layer", precision=0, elem_id="corpus-ex-layer", min_width=90)
            head = gr.Number(0, label="Head", precision=0, elem_id="corpus-ex-head", min_width=90)
            k = gr.Number(10, label=f"Examples (k, up to {MAX_EXAMPLES})", precision=0, elem_id="corpus-ex-k",
                          min_width=90)
        run = gr.Button(views.EXAMPLES_BUTTON, variant="primary", elem_id="corpus-examples-run")
    return SimpleNamespace(layer=layer, head=head, k=k, run=run)


def plane_box() -> SimpleNamespace:
    """The query/key plane's box: one head (layer, head) and its button; the corpus is the tab's."""
    with gr.Accordion("Query/key plane of one head (texts)", open=False, elem_id="corpus-qk-box"):
        gr.Markdown("Every token's query and key of one head, in the plane of their first two principal "
                    "components (the keys shifted onto the queries' mean), as AttentionViz draws them.",
                    elem_classes=["field-note"])
        with gr.Row():
            layer = gr.Number(0, label="Layer", precision=0, elem_id="corpus-qk-layer", min_width=90)
            head = gr.Number(0, label="Head", precision=0, elem_id="corpus-qk-head", min_width=90)
        run = gr.Button(views.PLANE_BUTTON, variant="primary", elem_id="corpus-qk-run")
    return SimpleNamespace(layer=layer, head=head, run=run)


def shortcuts_box():
    """The shortcuts' box: the direction, and its button; the map and strip are the tab's."""
    with gr.Accordion("Shortcuts against exact patching (pairs)", open=False, elem_id="corpus-shortcuts-box"):
        gr.Markdown(SHORTCUTS_WORDS, elem_classes=["field-note"])
        mode = gr.Radio(["denoise", "noise"], value="denoise", label="Direction", elem_id="corpus-shortcut-mode")
        run = gr.Button(views.RUN_BUTTONS[3], variant="primary", elem_id="corpus-shortcuts-run")
    return mode, run


def ablation_box():
    """The ablation's box: zero or mean ablation, and its button; the map and strip are the tab's."""
    with gr.Accordion("Ablation of each head (texts)", open=False, elem_id="corpus-ablation-box"):
        gr.Markdown(f"The loss increase when each head alone is removed. A sweep runs the model once per head and "
                    f"text, so only the **first {ABLATION_TEXTS} texts** are swept (the note says how many of how "
                    "many).", elem_classes=["field-note"])
        kind = gr.Radio(["zero", "mean"], value="zero", label="Ablation", elem_id="corpus-ablation-kind")
        run = gr.Button(views.RUN_BUTTONS[4], variant="primary", elem_id="corpus-ablation-run")
    return kind, run


def wire_cells(services, row, col, kept, outputs) -> None:
    """A click on a cell of the map (or a cell typed, then Enter) redraws its strip from the kept result."""
    cell = dict(fn=handler(keeping(views.cell_view, services.kept, CORPUS_KEPT), services, "corpus_cell",
                           progress=False),
                inputs=[row, col, kept], outputs=[*outputs, kept], api_visibility="private", **ON_ANALYSIS)
    picked = click_bridge("corpus-cell-bridge", ["corpus-map"], CELL_READ)

    @user_errors
    def chosen(value: str):
        r, _, c = str(value).partition(".")
        return int(r), int(c)

    picked.click(chosen, picked, [row, col], api_visibility="private", queue=False).then(**cell)
    for field in (row, col):
        field.submit(**cell)


def shown(figures: list) -> dict:
    """The event that shows `figures` (hidden until a first job) before the job that draws them runs."""
    def show():
        return [gr.Plot(visible=True) for _ in figures] if len(figures) > 1 else gr.Plot(visible=True)

    return dict(fn=show, inputs=None, outputs=figures, api_visibility="private", queue=False)


def for_its_page(event):
    """A handler's event whose view takes `page` (the session it saves jobs for), as Gradio calls it: the same
    parameters without `page`, which comes from the request (gr.Request, which Gradio fills; the API's inputs are
    unchanged)."""
    full = inspect.signature(event)
    signature = full.replace(parameters=[p for p in full.parameters.values() if p.name != "page"])

    def given(args, kwargs) -> dict:
        values = signature.bind(*args, **kwargs).arguments
        return {**values, "page": session_of(values.get("request"))}

    if inspect.isgeneratorfunction(event):
        @functools.wraps(event)
        def run(*args, **kwargs):
            yield from event(**given(args, kwargs))
    else:
        @functools.wraps(event)
        def run(*args, **kwargs):
            return event(**given(args, kwargs))
    run.__signature__ = signature
    return run


def wire_switch(picker, jobs: list, outputs: list) -> None:
    """After a model change: a job of the old model still running is stopped (its items stay saved), and the
    results (note, map, cell note, strip, the kept result, the export, the top examples, the q/k plane) are
    cleared, the notes
    saying which button computes them for the new model. outputs in that order."""
    def switch(model_name):
        note, examples_note, plane_note = views.switched(model_name)
        hidden = gr.update(value=None, visible=False)
        return (note, hidden, "", hidden, None, gr.File(value=None, visible=False), examples_note, "", plane_note,
                hidden)

    switch.__name__ = switch.__qualname__ = "switch_corpus"   # as ui/page.py names each tab's
    # the cancel on the change itself: Gradio never fires the cancel of a .success (it has no event of its own)
    picker.model.change(None, None, None, cancels=jobs, api_visibility="private", queue=False)
    picker.after.add(switch, [picker.model], outputs)

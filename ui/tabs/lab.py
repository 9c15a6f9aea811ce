"""Lab tab: train a small Transformer from scratch on a toy task, watch its curves and its attention form, break
it on purpose side by side, and keep a run as a model of the weight store.

build() opens its own gr.Tab, so the page adds the tab with one call inside its gr.Tabs.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from core.lab import sinks as engine_sinks, train as engine
from ui.plots.lab import training_curves
from ui.services.checks import UserError, public_text
from ui.services.lab import extrapolation as extra
from ui.services.lab import induction
from ui.services.lab import saved as shipped
from ui.services.lab import sinks
from ui.services.lab.configs import (DEFAULT_FIELDS, DEFAULT_SNAPSHOT_STEPS, EXPERIMENTS, FAMILIES, NORMS,
                                     POSITIONS, TABLE_COLUMNS, experiment_pair, make_config)

from ui.tabs.events import LAB, ON_HEAVY, handler, progress_callback, user_errors
from ui.tabs.widgets import Tab, file_box
from ui.views.card import FAMILY_WORDS
from ui.views.learn.recurrence import lab_recurrence
from ui.views.lab import (INDUCTION_LEAD, SINKS_LEAD, extrapolation_view, induction_view, job_curves, run_attention,
                          runs_export, saved_extrapolation, saved_headline, saved_induction, saved_sinks,
                          sinks_headline, sinks_view, snapshot_count, snapshot_figure)

ATTENTION_LIMIT = 2
RUN_COLUMN_WIDTHS = {"run": "56px", "label": "130px", "task": "84px", "model": "210px", "steps": "64px",
                     "status": "76px"}  # the runs table's text columns; the numbers take NUMBER_COLUMN_WIDTH
NUMBER_COLUMN_WIDTH = "92px"  # "training", "tokens/s" on a line of their own, never cut inside a word

LEAD = """**Why each part is there, by training without it**: the original encoder-decoder of the theory (Post-LN
blocks, eqs. 5.1–5.4; eq. 4.1's sinusoids; a causal decoder with cross-attention) or a Llama-style decoder,
trained here, then with one switch of eq. 2.1 or 4.1 turned off."""

INTRO = """Train a small Transformer **from scratch** on a toy task (characters in, characters out), here, in a
few seconds to a minute. The curves stream as it learns: training loss every step, and every tenth of the run
the held-out loss and **exact match** (the model writes whole answers on its own, greedily, for examples it never
trained on). Snapshot steps keep its attention as it forms. Then break it on purpose: *Compare* trains the same
config twice, differing in one switch, and says what the numbers show. The default family, **marian**, is """ + \
    FAMILY_WORDS["marian"] + """; **llama** is a decoder alone, as in Llama."""

TASK_HELP = {
    "copy": "abcdef → abcdef",
    "reverse": "abcdef → fedcba",
    "sort": "3141592 → 1123459",
    "add": "123+4567 → 4690",
    "dates": "1999-03-05 → 5 March 1999",
    "copy-62": "a7Qz0 → a7Qz0 (62 letters and digits)",
}
EXAMPLE_SOURCE = {"copy": "transformer", "reverse": "abcdefghij", "sort": "31415926", "add": "1234+987",
                  "dates": "1999-03-05"}


def session_key(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None)


def build(services, picker, initial=None) -> Tab:
    """The Lab tab inside the caller's gr.Tabs (it opens its own gr.Tab)."""
    with gr.Tab("Lab", id="lab"):
        gr.Markdown(LEAD, elem_classes=["tab-lead"])
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=300, elem_classes=["tab-controls"]):
                c = controls(services.lab.settings)
            with gr.Column(scale=3, min_width=340):
                gr.Markdown(INTRO)
                saved = saved_extrapolation()
                gr.Markdown(saved_headline(), elem_id="lab-extra-headline")
                gr.Markdown(sinks_headline(), elem_id="lab-sinks-headline")
                recurrence_section()
                shown = SimpleNamespace(**vars(progress_section()))
        for section in (stream_section, runs_section, attention_section):
            shown.__dict__.update(vars(section()))
        circuit = induction_section(services.lab.settings)
        extrapolation = extrapolation_section(services.lab.settings, saved)
        sinks_run = sinks_section(services.lab.settings)
        lab = services.lab
        shown.__dict__.update(vars(keep_section(None if lab.private is None else lab.settings.private_ttl_s / 60)))
    attention = wire(services.lab, picker, c, shown)
    wire_extrapolation(services, extrapolation)
    wire_sinks(services, sinks_run)
    wire_induction(services.lab, circuit, shown.pick)
    # what a lesson's "Try it" sets (a shipped run and a source) and runs: that run's attention, drawn
    return Tab(settings={"lab_run": shown.pick, "source": shown.source}, run_event=attention,
               reveal=[shown.cross, shown.encoder, shown.decoder])


def recurrence_section() -> None:
    """The saved GRU-beside-attention result on the first screen: its words, then its two figures."""
    words, accuracy, gradient = lab_recurrence()
    with gr.Accordion("Recurrence beside attention: a GRU and this Lab's decoder on the same copy task (saved "
                      "result)", open=True, elem_id="lab-recurrence"):
        gr.Markdown(words, elem_id="lab-recurrence-note")
        with gr.Row(equal_height=False):
            gr.Plot(accuracy, show_label=False, elem_id="lab-recurrence-accuracy", min_width=300)
            gr.Plot(gradient, show_label=False, elem_id="lab-recurrence-gradient", min_width=300)


def controls(cap) -> SimpleNamespace:
    """The run's config (task and steps on top, the rest in a closed section), the Train and Stop buttons, and
    the comparison."""
    free = dict(allow_custom_value=True)  # API values outside the choices reach make_config, which names them
    d = DEFAULT_FIELDS
    with gr.Row():
        task = gr.Dropdown([(f"{t}: {h}", t) for t, h in TASK_HELP.items()], value=d["task"],
                           label="Task", **free, elem_id="lab-task", min_width=180, scale=2)
        steps = gr.Number(d["steps"], label=f"Steps (at most {cap.max_steps})", precision=0,
                          elem_id="lab-steps", min_width=110, scale=1)
    with gr.Row():
        train = gr.Button("Train", variant="primary", elem_id="lab-train")
        stop = gr.Button("Stop", variant="stop", elem_id="lab-stop")
    with gr.Accordion("Model, training and snapshot settings", open=False, elem_id="lab-settings"):
        family = gr.Dropdown([(f"{f}: {what}", f) for f, what in FAMILIES.items()], value=d["family"],
                             label="Model family", **free, elem_id="lab-family",
                             info=f"marian: {FAMILY_WORDS['marian']}; llama: a decoder alone, as in Llama")
        with gr.Row():
            n_layers = gr.Number(d["n_layers"], label="Layers (1–4)", precision=0, elem_id="lab-layers")
            d_model = gr.Number(d["d_model"], label="d_model (32–256)", precision=0, elem_id="lab-d-model")
            n_heads = gr.Number(d["n_heads"], label="Heads (1–8, dividing d_model)", precision=0,
                                elem_id="lab-heads")
            d_ff = gr.Number(d["d_ff"], label="d_ff", precision=0, elem_id="lab-d-ff")
        with gr.Row():
            positions = gr.Dropdown(list(POSITIONS), value=d["positions"], label="Positions", **free,
                                    info="default: sinusoidal (marian), rotary (llama)")
            norm = gr.Dropdown(list(NORMS), value=d["norm"], label="LayerNorm placement", **free,
                               info="default: post (marian), pre (llama)")
        dropout = gr.Slider(0.0, 0.5, value=d["dropout"], step=0.05, label="Dropout (0–0.5)")
        with gr.Row():
            causal = gr.Checkbox(d["causal_mask"], label="Causal mask in the decoder", elem_id="lab-causal")
            scale = gr.Checkbox(d["scale"], label="Scale scores by 1/√d_k", elem_id="lab-scale")
        with gr.Row():
            seed = gr.Number(d["seed"], label="Seed", precision=0, elem_id="lab-seed")
            lr = gr.Number(d["lr"], label="Learning rate", elem_id="lab-lr")
        snapshot_steps = gr.Textbox(DEFAULT_SNAPSHOT_STEPS, label="Snapshot steps (keep the attention after these)",
                                    elem_id="lab-snapshot-steps")
    with gr.Row():
        experiment = gr.Dropdown([(e.label, k) for k, e in EXPERIMENTS.items()], value="causal_mask",
                                 label="Break it on purpose: compare with one switch off", **free,
                                 elem_id="lab-experiment", min_width=200, scale=3)
        compare = gr.Button("Compare", elem_id="lab-compare", min_width=100, scale=1)
    gr.Markdown(f"Each run stops after {cap.max_seconds:g} s at most; the server trains at most "
                f"{cap.max_jobs} jobs at once, one per session.")
    return SimpleNamespace(task=task, family=family, n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
        positions=positions, norm=norm, dropout=dropout, causal=causal, scale=scale, seed=seed, steps=steps, lr=lr,
        snapshot_steps=snapshot_steps, train=train, stop=stop, experiment=experiment, compare=compare)


def progress_section() -> SimpleNamespace:
    status = gr.Markdown("No run yet.", label="status", elem_id="lab-status")
    curves = gr.Plot(training_curves([], ""), label="Training curves", elem_id="lab-curves", visible=False)
    run_id = gr.Textbox(label="Run id(s)", interactive=False, elem_id="lab-run-id")
    return SimpleNamespace(status=status, curves=curves, run_id=run_id)


def stream_section() -> SimpleNamespace:
    snapshots = gr.Plot(label="Attention as it formed (snapshot steps × layers, mean of heads)",
                        elem_id="lab-snapshots", visible=False)
    with gr.Accordion("Raw numbers of the stream", open=False):
        latest = gr.JSON(label="latest", elem_id="lab-latest")
    return SimpleNamespace(snapshots=snapshots, latest=latest)


def runs_section() -> SimpleNamespace:
    gr.Markdown("### Runs of this session")
    with gr.Row():
        refresh = gr.Button("Refresh", size="sm", elem_id="lab-refresh")
    # widths that fit the 1,400 px page; a narrower screen scrolls the table inside its own box
    widths = [RUN_COLUMN_WIDTHS.get(column, NUMBER_COLUMN_WIDTH) for column in TABLE_COLUMNS]
    table = gr.Dataframe(headers=list(TABLE_COLUMNS), label="runs", interactive=False, wrap=True,
                         column_widths=widths, elem_id="lab-runs")
    findings = gr.Markdown(label="findings", elem_id="lab-findings")
    with gr.Row():
        export_button = gr.Button("Export the runs: curves and results (JSON)", size="sm", elem_id="lab-export")
        with gr.Column(visible=False, min_width=200) as export_box:  # shown once it holds a file
            export_file = file_box("lab-export-file", "Runs of this session")
    export_note = gr.Markdown(elem_id="lab-export-note")
    return SimpleNamespace(refresh=refresh, table=table, findings=findings, export_button=export_button,
        export_box=export_box, export_file=export_file, export_note=export_note)


def attention_section() -> SimpleNamespace:
    gr.Markdown("### Attention of a trained run\nType any source the task could have made (its characters: "
                f"`{''.join(engine.CHARS)}`). The model writes its own answer, and every layer and head is drawn.")
    with gr.Row():
        # the runs the project ships come first, so a trained run can be read before training one
        pick = gr.Dropdown(list(shipped.SAVED_RUNS), value=shipped.REVERSE, label="Run", allow_custom_value=True,
                           elem_id="lab-pick")
        source = gr.Textbox(EXAMPLE_SOURCE["reverse"], label="Source", elem_id="lab-source")
        show = gr.Button("Show attention", elem_id="lab-attn-run")
    attn_note = gr.Markdown(label="attention note", elem_id="lab-attn-note")
    cross = gr.Plot(label="Cross-attention: each output token over the source (layers × heads)",
                    elem_id="lab-cross", visible=False)
    with gr.Row():
        encoder = gr.Plot(label="Encoder self-attention", elem_id="lab-encoder", visible=False)
        decoder = gr.Plot(label="Decoder self-attention", elem_id="lab-decoder", visible=False)
    return SimpleNamespace(pick=pick, source=source, show=show, attn_note=attn_note, cross=cross, encoder=encoder,
        decoder=decoder)


def keep_section(private_minutes: float | None = None) -> SimpleNamespace:
    """private_minutes: on a shared server, how long a saved run is kept (for this session alone)."""
    where = ("Saved under `weights/NAME`, it appears in the model picker above" if private_minutes is None else
             f"On this shared server a saved run is yours alone: it appears in your model picker above, no one "
             f"else's, and is deleted {private_minutes:g} minutes after saving")
    gr.Markdown(f"### Keep a run\n{where}, with a manifest that says it was trained here, on which task and seed.")
    with gr.Row():
        name = gr.Textbox(label="Name (letters, digits, - and _)", elem_id="lab-name")
        save = gr.Button("Save run", elem_id="lab-save")
    saved = gr.Markdown(label="saved", elem_id="lab-saved")
    return SimpleNamespace(name=name, save=save, saved=saved)


def lab_events(lab) -> SimpleNamespace:
    """The Lab's event functions; their parameters are named as the API shows them."""
    cap = lab.settings

    def view(job, snapshots_shown: int | None = None, count: int = 0):
        """A job's state as the outputs: status, curves, snapshots, raw numbers, run ids (once done). The snapshot
        figure is drawn again only when a snapshot was added since `snapshots_shown`; None: no snapshots."""
        figure = job_curves(lab, job)
        shots = gr.skip()
        if snapshots_shown is not None and snapshots_shown != count:
            shots = snapshot_figure(lab, job.records[0])
        return lab.status(job), figure, shots, lab.latest(job), "" if job.alive else job.run_ids()

    def stream(job, with_snapshots: bool):
        shown = -1 if with_snapshots else None
        try:
            for current in lab.follow(job):
                count = snapshot_count(current)
                outputs = view(current, shown, count)
                shown = count if with_snapshots else None
                yield outputs
        finally:
            job.stop()  # Stop cancelled this event, or the page went away: end the thread too (no-op when done)

    @user_errors
    def run_train(task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm, causal_mask, scale, seed,
                  steps, lr, snapshot_steps, request: gr.Request):
        # parameters named as the API shows them; they shadow the components only inside this function
        config = make_config(cap, task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm,
                             causal_mask, scale, seed, steps, lr, snapshot_steps)
        yield from stream(lab.train(session_key(request), config), True)

    @user_errors
    def run_compare(task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm, causal_mask, scale,
                    seed, steps, lr, experiment, request: gr.Request):
        config = make_config(cap, task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm,
                             causal_mask, scale, seed, steps, lr)
        for outputs in stream(lab.compare(session_key(request), config, experiment), False):
            yield outputs[:2] + outputs[3:]

    @user_errors
    def request_stop(request: gr.Request):
        job = lab.stop(session_key(request))
        return "Stopping…" if job is not None and job.alive else "Nothing is training in this session."

    @user_errors
    def after_stop(request: gr.Request):
        job = lab.stop(session_key(request), wait=30.0)
        if job is None:
            return (gr.skip(),) * 5
        return view(job, -1 if job.experiment is None else None, snapshot_count(job))

    @user_errors
    def list_runs(request: gr.Request):
        key = session_key(request)
        notes = lab.findings(key)
        return lab.table(key), "\n\n".join(f"- {n}" for n in reversed(notes)) if notes else ""

    @user_errors
    def run_choices(request: gr.Request):
        ids = lab.run_ids(session_key(request))
        return gr.Dropdown(choices=ids, value=ids[-1] if ids else None)

    @user_errors
    def attention(run_id, source_text, request: gr.Request):
        return run_attention(lab, session_key(request), run_id, source_text)

    @user_errors
    def attention_shown(run_id, source_text, request: gr.Request):
        """attention for the paths that skip Show's reveal (Try it): a decoder-only run's empty boxes hidden"""
        note, enc, dec, crs = run_attention(lab, session_key(request), run_id, source_text)
        return note, gr.Plot(enc, visible=enc is not None), dec, gr.Plot(crs, visible=crs is not None)

    @user_errors
    def save_run(run_id, model_name, request: gr.Request, progress=gr.Progress()):
        key = session_key(request)
        folder = lab.save(key, run_id, model_name, progress_callback(progress))
        if lab.private is None:
            return f"Saved **{folder.name}** to `{public_text(str(folder))}`; choose it in the model picker above."
        minutes = lab.settings.private_ttl_s / 60
        return (f"Saved **{folder.name}** for this page only: the model picker above lists it as "
                f"`{lab.picker_name(key, folder)}`, no other visitor sees it, and it is deleted {minutes:g} minutes "
                "after saving (this server is shared).")

    @user_errors
    def export_lab(request: gr.Request):
        return runs_export(lab, session_key(request))

    return SimpleNamespace(stream=stream, run_train=run_train, run_compare=run_compare, request_stop=request_stop,
                           after_stop=after_stop, list_runs=list_runs, run_choices=run_choices, attention=attention,
                           attention_shown=attention_shown, save_run=save_run, export_lab=export_lab)


def figure_reveals(lab) -> SimpleNamespace:
    """Non-queued steps that show figure boxes just before their event fills them (the figures start hidden, so
    the first screen holds no empty box). A config that will be refused, or a run that is not there, shows none:
    the event says what is wrong, since a non-queued step's error reaches no toast."""
    cap = lab.settings

    def reveal_train(*fields):  # run_train's fields
        try:
            make_config(cap, *fields)
        except UserError:
            return gr.skip(), gr.skip()
        return gr.Plot(visible=True), gr.Plot(visible=True)

    def reveal_compare(*fields):  # run_compare's
        *config, experiment = fields
        try:
            experiment_pair(make_config(cap, *config), experiment)
        except UserError:
            return gr.skip()
        return gr.Plot(visible=True)

    def reveal_attention(run_id, request: gr.Request):
        """Cross-attention, encoder, decoder: a decoder-only run has only the last."""
        try:
            seq2seq = lab.trained(session_key(request), run_id)[1].family == "marian"
        except UserError:
            return gr.skip(), gr.skip(), gr.skip()
        return gr.Plot(visible=seq2seq), gr.Plot(visible=seq2seq), gr.Plot(visible=True)

    # named apart from the endpoints, whose names Gradio would otherwise give these private steps
    return SimpleNamespace(train=reveal_train, compare=reveal_compare, attention=reveal_attention)


def wire(lab, picker, c, shown) -> dict:
    """The tab's events; returns the attention view's (the event a lesson's "Try it" runs)."""
    e, show = lab_events(lab), figure_reveals(lab)
    fields = [c.task, c.family, c.n_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.positions, c.norm, c.causal,
              c.scale, c.seed, c.steps, c.lr]
    progress = [shown.status, shown.curves, shown.snapshots, shown.latest, shown.run_id]
    stream_args = dict(concurrency_id=LAB, concurrency_limit=lab.settings.max_jobs + 2)
    reveal = dict(api_visibility="private", queue=False)  # the figure boxes open as their event starts
    train_event = c.train.click(show.train, fields + [c.snapshot_steps], [shown.curves, shown.snapshots],
                                **reveal).then(e.run_train, fields + [c.snapshot_steps], progress,
                                               api_name="train", **stream_args)
    compare_event = c.compare.click(show.compare, fields + [c.experiment], shown.curves, **reveal).then(
        e.run_compare, fields + [c.experiment], [shown.status, shown.curves, shown.latest, shown.run_id],
        api_name="compare", **stream_args)
    refresh_args = dict(fn=e.list_runs, inputs=None, outputs=[shown.table, shown.findings], api_visibility="private")
    choices = dict(fn=e.run_choices, inputs=None, outputs=shown.pick, api_visibility="private")
    for event in (train_event, compare_event):
        event.then(**refresh_args).then(**choices)
    # cancel the stream, then show the run as it ended (the job evaluates what it has before it stops)
    c.stop.click(e.request_stop, None, shown.status, api_name="stop_training", cancels=[train_event, compare_event]
                 ).then(e.after_stop, None, progress, api_visibility="private").then(**refresh_args).then(**choices)
    shown.refresh.click(e.list_runs, None, [shown.table, shown.findings], api_name="lab_runs").then(**choices)
    attention = dict(fn=e.attention, inputs=[shown.pick, shown.source],
                     outputs=[shown.attn_note, shown.encoder, shown.decoder, shown.cross],
                     concurrency_limit=ATTENTION_LIMIT)
    shown.show.click(show.attention, shown.pick, [shown.cross, shown.encoder, shown.decoder], **reveal).then(
        **attention, api_name="lab_attention")
    shown.save.click(e.save_run, [shown.pick, shown.name], shown.saved, api_name="save_run").success(
        picker.choices, None, picker.model, api_visibility="private")
    exported = shown.export_button.click(e.export_lab, None, [shown.export_file, shown.export_note],
                                         api_name="export_lab")
    exported.success(lambda: gr.Column(visible=True), None, shown.export_box, api_visibility="private", queue=False)
    c.task.change(lambda t: EXAMPLE_SOURCE.get(t, ""), c.task, shown.source, api_visibility="private", queue=False)
    return {**attention, "fn": e.attention_shown, "api_visibility": "private"}


# ---- positions past the trained length: six kinds trained on one copy task, tested on longer texts ----

EXTRA_LEAD = """### Positions past the trained length
Self-attention without positions reads a set, not a sequence (it is permutation-equivariant), so each model adds
them one way or another. Which way still works on a text **longer than any it trained on**? One button trains
the same small decoder with each kind (sinusoidal, learned, RoPE, ALiBi, T5's relative buckets and none), on the
same task (copy 1 to 12 letters and digits), for the same steps from the same seed, then tests each on 12, 24 and
48 symbols. The learned table has one row per position of the longest training text, so past it there is no
row to read, and the page says so rather than read untrained rows. A run streams each kind as it finishes;
Stop keeps the kinds already done."""


def extrapolation_section(cap, saved) -> SimpleNamespace:
    note, accuracy_fig, heads_fig, numbers = saved
    gr.Markdown(EXTRA_LEAD, elem_id="lab-extra-lead")
    with gr.Row(equal_height=False):
        kinds = gr.CheckboxGroup(list(extra.engine.KINDS), value=list(extra.engine.KINDS), label="Kinds of position",
                                 elem_id="lab-extra-kinds", scale=3, min_width=280)
        steps = gr.Number(extra.engine.ExtrapolationConfig.steps, label=f"Steps per kind ({extra.MIN_STEPS}–"
                          f"{cap.max_steps})", precision=0, elem_id="lab-extra-steps", min_width=120, scale=1)
        seed = gr.Number(0, label="Seed", precision=0, elem_id="lab-extra-seed", min_width=100, scale=1)
    with gr.Row():
        run = gr.Button("Train and test", variant="primary", elem_id="lab-extra-run")
        stop = gr.Button("Stop", variant="stop", elem_id="lab-extra-stop")
    status = gr.Markdown(elem_id="lab-extra-status")
    accuracy = gr.Plot(accuracy_fig, label="Accuracy past the trained length", elem_id="lab-extra-accuracy")
    heads = gr.Plot(heads_fig, label="Each kind's copy head", elem_id="lab-extra-heads")
    shown_note = gr.Markdown(note, elem_id="lab-extra-note")
    with gr.Accordion("Raw numbers", open=False):
        data = gr.JSON(numbers, label="numbers", elem_id="lab-extra-data")
    return SimpleNamespace(kinds=kinds, steps=steps, seed=seed, run=run, stop=stop, status=status,
                           accuracy=accuracy, heads=heads, note=shown_note, data=data)


def wire_extrapolation(services, x) -> None:
    run = handler(extrapolation_view, services, "extrapolation", heavy="The extrapolation run")
    event = x.run.click(run, [x.kinds, x.steps, x.seed], [x.status, x.note, x.accuracy, x.heads, x.data],
                        api_name="extrapolation", **ON_HEAVY)
    x.stop.click(lambda: "Stopped: the kinds finished before the stop are shown.", None, x.status,
                 cancels=[event], api_visibility="private", queue=False)


# ---- attention sinks: the same small decoder with softmax and with a learned sink ----

def sinks_section(cap) -> SimpleNamespace:
    note, figure, numbers = saved_sinks()
    gr.Markdown(SINKS_LEAD, elem_id="lab-sinks-lead")
    with gr.Row(equal_height=False):
        steps = gr.Number(engine_sinks.SinksLabConfig.steps, label=f"Steps per kind ({sinks.MIN_STEPS}–"
                          f"{cap.max_steps})", precision=0, elem_id="lab-sinks-steps", min_width=120)
        seed = gr.Number(0, label="Seed", precision=0, elem_id="lab-sinks-seed", min_width=100)
        window = gr.Number(engine_sinks.SinksLabConfig.window, label="Window (keys each query reads)", precision=0,
                           elem_id="lab-sinks-window", min_width=120)
    with gr.Row():
        run = gr.Button("Train both", variant="primary", elem_id="lab-sinks-run")
        stop = gr.Button("Stop", variant="stop", elem_id="lab-sinks-stop")
    status = gr.Markdown(elem_id="lab-sinks-status")
    plot = gr.Plot(figure, label="Where each head's weight goes", elem_id="lab-sinks-maps")
    shown_note = gr.Markdown(note, elem_id="lab-sinks-note")
    with gr.Accordion("Raw numbers", open=False):
        data = gr.JSON(numbers, label="numbers", elem_id="lab-sinks-data")
    return SimpleNamespace(steps=steps, seed=seed, window=window, run=run, stop=stop, status=status, plot=plot,
                           note=shown_note, data=data)


def wire_sinks(services, x) -> None:
    run = handler(sinks_view, services, "lab_sinks", heavy="The sinks run")
    event = x.run.click(run, [x.steps, x.seed, x.window], [x.status, x.note, x.plot, x.data], api_name="lab_sinks",
                        **ON_HEAVY)
    x.stop.click(lambda: "Stopped: nothing is kept (one kind alone compares nothing).", None, x.status,
                 cancels=[event], api_visibility="private", queue=False)


# ---- the induction circuit, traced on a run trained to need it ----

def induction_section(cap) -> SimpleNamespace:
    note, heads, feeds = saved_induction()
    with gr.Accordion("The induction circuit: a previous-token head feeding an induction head", open=False,
                      elem_id="lab-induction"):
        gr.Markdown(INDUCTION_LEAD)
        with gr.Row(equal_height=False):
            pick = gr.Dropdown(list(shipped.SAVED_RUNS), value=induction.RUN, label="Run", allow_custom_value=True,
                               elem_id="lab-induction-pick", min_width=160)
            trace = gr.Button("Trace", elem_id="lab-induction-trace", min_width=90)
            seed = gr.Number(0, label="Seed", precision=0, elem_id="lab-induction-seed", min_width=90)
            steps = gr.Number(2000, label=f"Steps ({induction.MIN_STEPS}–{cap.max_steps})", precision=0,
                              elem_id="lab-induction-steps", min_width=110)
            train = gr.Button("Train one like it", elem_id="lab-induction-train", min_width=140)
        shown = gr.Markdown(note, elem_id="lab-induction-note")
        with gr.Row(equal_height=False):
            heads = gr.Plot(heads, show_label=False, elem_id="lab-induction-heads", min_width=300)
            feeds = gr.Plot(feeds, show_label=False, elem_id="lab-induction-feeds", min_width=300)
    return SimpleNamespace(pick=pick, trace=trace, seed=seed, steps=steps, train=train, note=shown, heads=heads,
                           feeds=feeds)


def wire_induction(lab, x, attention_pick) -> None:
    @user_errors
    def trace_run(run_id, request: gr.Request):
        return induction_view(lab, session_key(request), run_id)

    @user_errors
    def train_run(seed, steps, request: gr.Request):
        key = session_key(request)
        job = lab.train(key, induction.preset(seed, steps, lab.settings.max_steps))
        try:
            for current in lab.follow(job):
                yield lab.status(current), gr.skip(), gr.skip(), gr.skip()
        finally:
            job.stop()
        yield (*induction_view(lab, key, job.run_ids()), job.run_ids())

    def run_choices(run_id, request: gr.Request):
        return gr.Dropdown(choices=lab.run_ids(session_key(request)), value=run_id), gr.Dropdown(
            choices=lab.run_ids(session_key(request)))

    outputs = [x.note, x.heads, x.feeds]
    x.trace.click(trace_run, x.pick, outputs, api_name="lab_induction", concurrency_limit=ATTENTION_LIMIT)
    x.train.click(train_run, [x.seed, x.steps], outputs + [x.pick], api_name="lab_induction_train",
                  concurrency_id=LAB, concurrency_limit=lab.settings.max_jobs + 2).success(
        run_choices, x.pick, [x.pick, attention_pick], api_visibility="private")

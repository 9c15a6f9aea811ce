"""Lab tab: train a small Transformer from scratch on a toy task, watch its curves and its attention form, break
it on purpose side by side, and keep a run as a model of the weight store.

build() opens its own gr.Tab, so app.py adds the tab with one call inside its gr.Tabs.
"""

from __future__ import annotations

import gradio as gr

from core import train as engine
from ui import downloads, export, lab_plots, plots
from ui.common import progress_callback, user_errors
from ui.lab import EXPERIMENTS, FAMILIES, NORMS, POSITIONS, TABLE_COLUMNS, Lab, LabSettings, make_config
from ui.model_picker import Picker
from ui.service import ModelStore, UserError

LAB = "lab"  # concurrency group of the training streams; the server-wide job cap is the Lab's own
ATTENTION_LIMIT = 2

LEAD = """**Why each part is there, by training without it**: the original encoder-decoder of the theory (Post-LN
blocks, eqs. 5.1–5.4; eq. 4.1's sinusoids; a causal decoder with cross-attention) or a Llama-style decoder,
trained here, then with one switch of eq. 2.1 or 4.1 turned off."""

INTRO = """Train a small Transformer **from scratch** on a toy task (characters in, characters out), here, in a
few seconds to a minute. The curves stream as it learns: training loss every step, and every tenth of the run
the held-out loss and **exact match** (the model writes whole answers on its own, greedily, for examples it never
trained on). Snapshot steps keep its attention as it forms. Then break it on purpose: *Compare* trains the same
config twice, differing in one switch, and says what the numbers show."""

TASK_HELP = {
    "copy": "abcdef → abcdef",
    "reverse": "abcdef → fedcba",
    "sort": "3141592 → 1123459",
    "add": "123+4567 → 4690",
    "dates": "1999-03-05 → 5 March 1999",
}
EXAMPLE_SOURCE = {"copy": "transformer", "reverse": "abcdefghij", "sort": "31415926", "add": "1234+987",
                  "dates": "1999-03-05"}


def session_key(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None)


def snapshot_count(job) -> int:
    run = job.records[0].run
    return len(run.snapshots) if run is not None else 0


def snapshot_figure(lab: Lab, record):
    snap = lab.snapshots(record)
    if snap is None:
        return plots.empty_figure("No snapshot yet: they are taken after the snapshot steps.")
    axes = ("output", "source") if snap.kind.startswith("cross") else ("query", "key")
    return lab_plots.heatmap_grid(snap.maps, [f"step {s}" for s in snap.steps],
                                  [f"layer {i}" for i in range(snap.maps.shape[1])], snap.query_tokens,
                                  snap.key_tokens, f"{record.id}: {snap.kind} on a held-out example", *axes)


def runs_export(lab: Lab, key: str | None) -> tuple[str, str]:
    """Every run of the session (config, status, summary, curves) and the comparisons' findings as JSON; the body
    of the `export_lab` endpoint. NaN losses (a diverged run) are null. Returns (path, note)."""
    from dataclasses import asdict  # noqa: PLC0415

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


def build(store: ModelStore, picker: Picker, settings: LabSettings | None = None) -> Lab:
    """The Lab tab inside the caller's gr.Tabs; returns the Lab service (one per server) for tests."""
    lab = Lab(settings or LabSettings.from_env())
    cap = lab.settings
    free = dict(allow_custom_value=True)  # API values outside the choices reach make_config, which names them
    with gr.Tab("Lab", id="lab"):
        gr.Markdown(LEAD, elem_classes=["tab-lead"])
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=2):
                with gr.Row():
                    task = gr.Dropdown([(f"{t}: {h}", t) for t, h in TASK_HELP.items()], value="reverse",
                                       label="Task", **free, elem_id="lab-task")
                    family = gr.Dropdown([(f"{f}: {d}", f) for f, d in FAMILIES.items()], value="marian",
                                         label="Model family", **free, elem_id="lab-family")
                with gr.Row():
                    n_layers = gr.Number(2, label="Layers (1–4)", precision=0, elem_id="lab-layers")
                    d_model = gr.Number(128, label="d_model (32–256)", precision=0, elem_id="lab-d-model")
                    n_heads = gr.Number(4, label="Heads (1–8, dividing d_model)", precision=0, elem_id="lab-heads")
                    d_ff = gr.Number(256, label="d_ff", precision=0, elem_id="lab-d-ff")
                with gr.Row():
                    positions = gr.Dropdown(list(POSITIONS), value="default", label="Positions", **free,
                                            info="default: sinusoidal (marian), rotary (llama)")
                    norm = gr.Dropdown(list(NORMS), value="default", label="LayerNorm placement", **free,
                                       info="default: post (marian), pre (llama)")
                    dropout = gr.Slider(0.0, 0.5, value=0.0, step=0.05, label="Dropout")
                with gr.Row():
                    causal = gr.Checkbox(True, label="Causal mask in the decoder", elem_id="lab-causal")
                    scale = gr.Checkbox(True, label="Scale scores by 1/√d_k", elem_id="lab-scale")
                with gr.Row():
                    seed = gr.Number(0, label="Seed", precision=0, elem_id="lab-seed")
                    steps = gr.Number(600, label=f"Steps (at most {cap.max_steps})", precision=0,
                                      elem_id="lab-steps")
                    lr = gr.Number(1e-3, label="Learning rate", elem_id="lab-lr")
                snapshot_steps = gr.Textbox("50, 150, 600", label="Snapshot steps (keep the attention after these)",
                                            elem_id="lab-snapshot-steps")
                with gr.Row():
                    train = gr.Button("Train", variant="primary", elem_id="lab-train")
                    stop = gr.Button("Stop", variant="stop", elem_id="lab-stop")
                with gr.Row():
                    experiment = gr.Dropdown([(e.label, k) for k, e in EXPERIMENTS.items()], value="causal_mask",
                                             label="Break it on purpose: compare with one switch off", **free,
                                             elem_id="lab-experiment")
                    compare = gr.Button("Compare", elem_id="lab-compare")
                gr.Markdown(f"Each run stops after {cap.max_seconds:g} s at most; the server trains at most "
                            f"{cap.max_jobs} jobs at once, one per session.")
            with gr.Column(scale=3):
                status = gr.Markdown("No run yet.", label="status", elem_id="lab-status")
                curves = gr.Plot(lab_plots.training_curves([], ""), label="Training curves", elem_id="lab-curves")
                run_id = gr.Textbox(label="Run id(s)", interactive=False, elem_id="lab-run-id")
        snapshots = gr.Plot(label="Attention as it formed (snapshot steps × layers, mean of heads)",
                            elem_id="lab-snapshots")
        with gr.Accordion("Raw numbers of the stream", open=False):
            latest = gr.JSON(label="latest", elem_id="lab-latest")

        gr.Markdown("### Runs of this session")
        with gr.Row():
            refresh = gr.Button("Refresh", size="sm", elem_id="lab-refresh")
        table = gr.Dataframe(headers=list(TABLE_COLUMNS), label="runs", interactive=False, wrap=True,
                             elem_id="lab-runs")
        findings = gr.Markdown(label="findings", elem_id="lab-findings")
        with gr.Row():
            export_button = gr.Button("Export the runs: curves and results (JSON)", size="sm", elem_id="lab-export")
            export_file = downloads.file_box("lab-export-file", "Runs of this session")
        export_note = gr.Markdown(elem_id="lab-export-note")

        gr.Markdown("### Attention of a trained run\nType any source the task could have made (its characters: "
                    f"`{''.join(engine.CHARS)}`). The model writes its own answer, and every layer and head is drawn.")
        with gr.Row():
            pick = gr.Dropdown([], label="Run", allow_custom_value=True, elem_id="lab-pick")
            source = gr.Textbox(EXAMPLE_SOURCE["reverse"], label="Source", elem_id="lab-source")
            show = gr.Button("Show attention", elem_id="lab-attn-run")
        attn_note = gr.Markdown(label="attention note", elem_id="lab-attn-note")
        cross = gr.Plot(label="Cross-attention: each output token over the source (layers × heads)",
                        elem_id="lab-cross")
        with gr.Row():
            encoder = gr.Plot(label="Encoder self-attention", elem_id="lab-encoder")
            decoder = gr.Plot(label="Decoder self-attention", elem_id="lab-decoder")

        gr.Markdown("### Keep a run\nSaved under `weights/NAME`, it appears in the model picker above, with a manifest "
                    "that says it was trained here, on which task and seed.")
        with gr.Row():
            name = gr.Textbox(label="Name (letters, digits, - and _)", elem_id="lab-name")
            save = gr.Button("Save run", elem_id="lab-save")
        saved = gr.Markdown(label="saved", elem_id="lab-saved")

    fields = [task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm, causal, scale, seed, steps,
              lr]

    def view(job, snapshots_shown: int | None = None, count: int = 0):
        """A job's state as the outputs: status, curves, snapshots, raw numbers, run ids (once done). The snapshot
        figure is drawn again only when a snapshot was added since `snapshots_shown`; None: no snapshots."""
        title = f"{job.records[0].lab.task}: " + " vs ".join(r.id for r in job.records)
        figure = lab_plots.training_curves(lab.curves(job), title, max(r.lab.steps for r in job.records))
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
        ids = [r.id for r in lab.runs(session_key(request)) if r.finished and r.run is not None]
        return gr.Dropdown(choices=ids, value=ids[-1] if ids else None)

    @user_errors
    def attention(run_id, source_text, request: gr.Request):
        v = lab.attention(session_key(request), run_id, source_text)
        layers = lambda m: [f"layer {i}" for i in range(m.shape[0])]  # noqa: E731
        heads = lambda m: [f"head {h}" for h in range(m.shape[1])]  # noqa: E731
        enc = dec = crs = None
        if v.cross is not None:
            crs = lab_plots.heatmap_grid(v.cross, layers(v.cross), heads(v.cross), v.target_tokens, v.source_tokens,
                                         "Cross-attention: decoder position (predicting the next output) × source",
                                         "output", "source")
            enc = lab_plots.heatmap_grid(v.encoder, layers(v.encoder), heads(v.encoder), v.source_tokens,
                                         v.source_tokens, "Encoder self-attention (bidirectional)")
        dec = lab_plots.heatmap_grid(v.decoder, layers(v.decoder), heads(v.decoder), v.target_tokens,
                                     v.target_tokens, "Decoder self-attention (causal)" if v.cross is not None else
                                     "Decoder self-attention over <bos> source <sep> answer (causal)")
        return v.note, enc, dec, crs

    @user_errors
    def save_run(run_id, model_name, request: gr.Request, progress=gr.Progress()):
        folder = lab.save(session_key(request), run_id, model_name, progress_callback(progress))
        return f"Saved **{folder.name}** to `{folder}`; choose it in the model picker above."

    @user_errors
    def export_lab(request: gr.Request):
        return runs_export(lab, session_key(request))

    stream_args = dict(concurrency_id=LAB, concurrency_limit=cap.max_jobs + 2)
    train_event = train.click(run_train, fields + [snapshot_steps], [status, curves, snapshots, latest, run_id],
                              api_name="train", **stream_args)
    compare_event = compare.click(run_compare, fields + [experiment], [status, curves, latest, run_id],
                                  api_name="compare", **stream_args)
    refresh_args = dict(fn=list_runs, inputs=None, outputs=[table, findings], api_visibility="private")
    for event in (train_event, compare_event):
        event.then(**refresh_args).then(run_choices, None, pick, api_visibility="private")
    # cancel the stream, then show the run as it ended (the job evaluates what it has before it stops)
    stop.click(request_stop, None, status, api_name="stop_training", cancels=[train_event, compare_event]).then(
        after_stop, None, [status, curves, snapshots, latest, run_id], api_visibility="private"
    ).then(**refresh_args).then(run_choices, None, pick, api_visibility="private")
    refresh.click(list_runs, None, [table, findings], api_name="lab_runs").then(
        run_choices, None, pick, api_visibility="private")
    show.click(attention, [pick, source], [attn_note, encoder, decoder, cross], api_name="lab_attention",
               concurrency_limit=ATTENTION_LIMIT)
    save.click(save_run, [pick, name], saved, api_name="save_run").success(
        picker.choices, None, picker.model, api_visibility="private")
    export_button.click(export_lab, None, [export_file, export_note], api_name="export_lab")
    task.change(lambda t: EXAMPLE_SOURCE.get(t, ""), task, source, api_visibility="private", queue=False)
    return lab

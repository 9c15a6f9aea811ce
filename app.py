"""The attention explorer: a Gradio app over this repository's own Transformer core.

    python app.py                       # SmolLM2-135M-Instruct on http://127.0.0.1:7860
    python app.py --model minilm-l6     # a BERT encoder: bidirectional attention

This file only builds the page from the tab modules in ui/ and launches it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from ui import backend as model_backend  # noqa: E402
from ui import (  # noqa: E402
    downloads,
    links,
    model_picker,
    service,
    spaces,
    tab_attention,
    tab_generate,
    tab_heads,
    tab_lab,
    tab_masks,
    tab_positions,
)
from ui.common import ANALYSIS, ANALYSIS_LIMIT, checked_inputs, user_errors  # noqa: E402

ROOT = Path(__file__).resolve().parent
CSS = ROOT / "assets" / "app.css"
TITLE = "The attention explorer"
QUEUE_SIZE = 32
SESSIONS_SETTING = "ATTN_SESSIONS"  # sessions whose state Gradio keeps; the oldest is dropped beyond it
SESSIONS = 500


LINK_JS = """(...args) => { args[args.length - 1] = window.location.href; return args; }"""  # the page's own URL
COPY_JS = """(link) => { if (link && navigator.clipboard) navigator.clipboard.writeText(link).catch(() => {}); }"""


def finished(build):
    """What every page gets once built: each input answered in words (ui.common.checked_inputs); with a backend
    other than this process (`backend=`, ui/backend.py), the events that run a model sent to it; otherwise, on a
    ZeroGPU Space, those events decorated with spaces.GPU (ui/spaces.py)."""

    @functools.wraps(build)
    def build_and_finish(store: service.ModelStore, default_model: str, backend=None) -> gr.Blocks:
        demo = checked_inputs(build(store, default_model))
        if backend is not None:
            routed = model_backend.route(demo, backend, default_model)
            logging.getLogger(__name__).info("%d events run on %s", len(routed), type(backend).__name__)
            return demo
        decorated = spaces.on_gpu(demo, (ANALYSIS, tab_generate.GENERATE))
        if decorated:
            logging.getLogger(__name__).info("ZeroGPU: %d events run on the GPU", len(decorated))
        return demo

    return build_and_finish


@finished
def build_demo(store: service.ModelStore, default_model: str) -> gr.Blocks:
    """The whole page: model picker (with the link to share) and the card, closed, then the tabs. The default model
    must be loadable. A page opened with query parameters (ui/links.py) starts on that model, tab, layer and head."""
    initial = store.get(default_model)
    # uploaded files are deleted an hour after upload: a public Space must not collect users' texts
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(
            f"# {TITLE}\nA small Transformer written from scratch in PyTorch, loaded with real weights: "
            "look at its attention head by head, its positional encodings, what its masks do, and what each head "
            "does and whether it matters."
        )
        share = {}

        def link_controls():
            with gr.Row():
                share["button"] = gr.Button("Copy a link to this view", size="sm", elem_id="copy-link", scale=0,
                                            min_width=160)
                share["link"] = gr.Textbox(label="Link (model, tab, layer, head, and the text when short)",
                                           interactive=False, buttons=["copy"], elem_id="share-link", scale=3)
            share["note"] = gr.Markdown(elem_id="share-note")

        picker = model_picker.build(store, default_model, beside=link_controls)
        current_tab = gr.State("attention")
        with gr.Tabs(selected="attention") as tabs:
            with gr.Tab("Generate", id="generate"):
                generate = tab_generate.build(store, picker, initial)
            with gr.Tab("Attention", id="attention"):
                attention = tab_attention.build(store, picker, initial)
            with gr.Tab("Positional encoding", id="positions"):
                positions = tab_positions.build(store, picker, initial)
            with gr.Tab("Masks", id="masks"):
                masks = tab_masks.build(store, picker, initial)
            with gr.Tab("Heads", id="heads"):
                heads = tab_heads.build(store, picker, initial)
            tab_lab.build(store, picker)  # its own gr.Tab: train a Transformer from scratch
        controls = {
            "attention": links.TabControls(attention.text, attention.layer, attention.head),
            "positions": positions,
            "masks": masks,
            "heads": heads,
        }
        tab_ids = {"Generate": "generate", "Attention": "attention", "Positional encoding": "positions",
                   "Masks": "masks", "Heads": "heads", "Lab": "lab"}

        def send_to_attention(text: str):
            if not text:
                raise gr.Error("Generate something first; then it can be sent to the Attention tab.")
            return text, gr.Tabs(selected="attention"), "attention"

        generate.send.click(
            send_to_attention, generate.sent, [attention.text, tabs, current_tab], api_visibility="private"
        ).then(**attention.run_event)

        def remember_tab(evt: gr.SelectData):
            return tab_ids.get(str(evt.value), "attention")

        tabs.select(remember_tab, None, current_tab, api_visibility="private", queue=False)

        # ---- deep links: read on load, written by the button
        def shape(name: str) -> tuple[int, int]:
            cfg = store.get(name).config
            return cfg.n_layers, cfg.n_heads

        link_outputs = [picker.model, tabs, current_tab]
        for tab_controls in controls.values():
            link_outputs += [tab_controls.text, tab_controls.layer, tab_controls.head]
        linked = gr.State(False)

        @user_errors
        def open_link(request: gr.Request):
            """The page as the link asks; the picker's choices as the store has them now (new models included)."""
            params = dict(request.query_params) if request is not None else {}
            link = links.parse(params, store.names_ready(), shape, default_model)
            for message in link.messages:
                gr.Warning(message)
            tab = link.tab or "attention"
            chosen = tab if tab in controls else "attention"
            values = [gr.Dropdown(choices=store.names(), value=link.model) if link.model else picker.choices(),
                      gr.Tabs(selected=tab) if link.tab else gr.skip(), tab]
            for name in controls:
                here = name == chosen
                values.append(link.text if here and link.text else gr.skip())
                values.append(link.layer if here and link.layer is not None else gr.skip())
                if not here or link.head is None or (link.head == "mean" and name != "attention"):
                    values.append(gr.skip())
                else:
                    values.append("mean of heads" if link.head == "mean" else link.head if name != "attention"
                                  else str(link.head))
            return *values, link.given and chosen == "attention"

        @user_errors
        def show_linked(flag, *args):
            if not flag:
                return (gr.skip(),) * len(attention.run_event["outputs"])
            return attention.run_event["fn"](*args)

        demo.load(None, js=downloads.SVG_BUTTON_JS)
        demo.load(open_link, None, [*link_outputs, linked], api_visibility="private").then(
            show_linked, [linked, *attention.run_event["inputs"]], attention.run_event["outputs"],
            api_visibility="private", concurrency_id=ANALYSIS, concurrency_limit=ANALYSIS_LIMIT,
        )
        demo.load(picker.load_card, picker.model, picker.card, api_visibility="private")

        @user_errors
        def share_link(model_name, tab, *values):
            *tab_values, page_url = values
            by_tab = dict(zip(controls, zip(*[iter(tab_values)] * 3)))
            text, layer, head = by_tab.get(tab, by_tab["attention"])
            link, note = links.make(page_url, model_name, tab, layer, head, text)
            return link, note

        share_inputs = [picker.model, current_tab]
        for tab_controls in controls.values():
            share_inputs += [tab_controls.text, tab_controls.layer, tab_controls.head]
        page_url = gr.Textbox(visible=False)
        share["button"].click(share_link, [*share_inputs, page_url], [share["link"], share["note"]], js=LINK_JS,
                              api_visibility="private", queue=False).then(
            None, share["link"], None, js=COPY_JS)
    return demo


def launch_options(args: argparse.Namespace) -> dict:
    """Safe defaults: loopback only, no share link unless asked, uploads capped, no server-side rendering, and
    a bounded number of sessions whose state (Gradio's copies of inputs and figures) stays in memory."""
    return dict(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        # Gradio refuses uploads over twice the text cap outright; those between get service.read_upload's
        # message, which names the cap and the setting that raises it
        max_file_size=2 * service.MAX_TEXT_BYTES,
        state_session_capacity=service.env_number(SESSIONS_SETTING, SESSIONS, 1, int, strict=True),
        ssr_mode=False,
        show_error=False,
        css_paths=[CSS] if CSS.is_file() else None,
        theme=gr.themes.Soft(),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument(
        "--model",
        default=service.DEFAULT_MODEL,
        help=f"registry name (python -m core.store list) or a model folder; default {service.DEFAULT_MODEL}",
    )
    # Hugging Face Spaces (and docker setups) say where to listen through Gradio's own variables
    parser.add_argument(
        "--host",
        default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        help="address to bind (default 127.0.0.1, or $GRADIO_SERVER_NAME); 0.0.0.0 exposes the app to the network",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        help="port (default 7860, or $GRADIO_SERVER_PORT)",
    )
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument(
        "--device", default=None, help="cpu or cuda; default: cuda (bfloat16) when there is a GPU, else cpu (float32)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=service.MAX_ATTENTION_TOKENS,
        help=f"longest text the Attention tab reads (default {service.MAX_ATTENTION_TOKENS}; the model's context "
        "caps it too); raise it on a GPU",
    )
    scale = parser.add_argument_group("scaling out: the model work on Ray Serve (pip install -r requirements-scale.txt)")
    scale.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="where the events that run a model run: in this process (default), or on Ray Serve, one "
                       "deployment per model, this process only serving the page")
    scale.add_argument("--ray-address", default=None,
                       help="the Ray cluster to join (auto, HOST:6379, ray://HOST:10001); default: start a local one")
    scale.add_argument("--replicas", type=int, default=None, help="replicas per model's deployment (default 1)")
    scale.add_argument("--num-cpus", type=float, default=None, help="CPUs each replica reserves")
    scale.add_argument("--num-gpus", type=float, default=None, help="GPUs each replica reserves (fractions share one)")
    scale.add_argument("--serve-config", default=None, metavar="FILE",
                       help="YAML of Serve deployment options for every model, and per model under 'models:'; "
                       "--replicas, --num-cpus and --num-gpus override it")
    args = parser.parse_args(argv)
    ray_only = [flag for flag, value in (("--ray-address", args.ray_address), ("--replicas", args.replicas),
                                         ("--num-cpus", args.num_cpus), ("--num-gpus", args.num_gpus),
                                         ("--serve-config", args.serve_config)) if value is not None]
    if ray_only and args.backend != "ray":
        parser.error(f"{', '.join(ray_only)} need --backend ray")
    if args.replicas is not None and args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    return args


def ray_backend(args: argparse.Namespace):
    """The Ray Serve backend, connected and with the default model deployed; Ray is imported only here."""
    try:
        from ui import ray_backend as serving
    except ImportError as exc:
        raise service.UserError(f"--backend ray needs Ray Serve: pip install -r requirements-scale.txt ({exc})")
    try:
        options = serving.ServeOptions.from_args(args.replicas, args.num_cpus, args.num_gpus, args.serve_config)
    except ValueError as exc:
        raise service.UserError(str(exc)) from None
    backend = None
    try:
        serving.connect(args.ray_address)
        backend = serving.RayBackend(options, device=args.device, max_tokens=args.max_tokens)
        backend.deploy(args.model)  # the replicas load the model before the page opens
    except Exception as exc:  # noqa: BLE001 - a cluster that cannot be reached or deployed to is the user's to fix
        if backend is not None:
            backend.close()
        where = args.ray_address or "a local Ray instance"
        raise service.UserError(f"Ray Serve on {where} could not serve {args.model}: {type(exc).__name__}: "
                                f"{str(exc)[:300]}") from None
    return backend


def model_store(args: argparse.Namespace) -> service.ModelStore:
    """The page's models. With Ray the replicas hold the weights, and this process keeps the models on the meta
    device: config and tokenizer (the page's labels and limits), no weights in memory."""
    device = "meta" if args.backend == "ray" else args.device
    return service.ModelStore(extra_names=[args.model], device=device, max_attention_tokens=args.max_tokens)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.max_tokens < 2:
        print(f"error: --max-tokens must be at least 2, got {args.max_tokens}", file=sys.stderr)
        return 2
    spaces.use_persistent_storage()
    service.clean_weight_store()
    store = model_store(args)
    bar = service.terminal_progress()
    try:
        # the first start pulls the default model here, with a progress bar in the terminal
        store.get(args.model, bar)
    except service.UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    backend = None
    try:
        if args.backend == "ray":
            backend = ray_backend(args)
        demo = build_demo(store, args.model, backend=backend)
        demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
        demo.launch(**launch_options(args))
    except service.UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if backend is not None:
            backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

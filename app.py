"""The attention explorer: a Gradio app over this repository's own Transformer core.

    python app.py                       # SmolLM2-135M-Instruct on http://127.0.0.1:7860
    python app.py --model minilm-l6     # a BERT encoder: bidirectional attention

This file is the command line only: it reads the arguments and the settings, builds the services and the page
(ui/page.py), and launches it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import closing
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from core.store import TerminalProgress  # noqa: E402
from ui import spaces  # noqa: E402
from ui.backend.routing import route  # noqa: E402
from ui.page import TITLE, build_page  # noqa: E402
from ui.services import Services  # noqa: E402
from ui.services.checks import UserError  # noqa: E402
from ui.services.models import DEFAULT_MODEL, clean_weight_store  # noqa: E402
from ui.settings import MAX_ATTENTION_TOKENS, AppSettings, SettingError  # noqa: E402

CSS = Path(__file__).resolve().parent / "assets" / "app.css"
QUEUE_SIZE = 32


def launch_options(args: argparse.Namespace, settings: AppSettings) -> dict:
    """Safe defaults: loopback only, no share link unless asked, uploads capped, no server-side rendering, and
    a bounded number of sessions whose state (Gradio's copies of inputs and figures) stays in memory."""
    return dict(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        # Gradio refuses uploads over twice the text cap outright; those between get read_upload's message,
        # which names the cap and the setting that raises it
        max_file_size=2 * settings.text_cap_bytes,
        state_session_capacity=settings.sessions,
        ssr_mode=False,
        show_error=False,
        css_paths=[CSS] if CSS.is_file() else None,
        theme=gr.themes.Soft(),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"registry name (python -m core.store list) or a model folder; default {DEFAULT_MODEL}")
    # Hugging Face Spaces (and docker setups) say where to listen through Gradio's own variables
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to bind (default 127.0.0.1, or $GRADIO_SERVER_NAME); 0.0.0.0 exposes the app to "
                        "the network")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                        help="port (default 7860, or $GRADIO_SERVER_PORT)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument("--public", action="store_true", help="a server shared by strangers, as a Space always is: "
                        "saved Lab runs stay private to their page, deleted after ATTN_PRIVATE_RUN_MINUTES (60)")
    parser.add_argument("--device", default=None,
                        help="cpu or cuda; default: cuda (bfloat16) when there is a GPU, else cpu (float32)")
    parser.add_argument("--max-tokens", type=int, default=MAX_ATTENTION_TOKENS,
                        help=f"longest text the Attention tab reads (default {MAX_ATTENTION_TOKENS}; the model's "
                        "context caps it too); raise it on a GPU")
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


def app_settings(args: argparse.Namespace) -> AppSettings:
    """The environment's settings with the command line's on top. With Ray the replicas hold the weights, and this
    process keeps the models on the meta device: config and tokenizer (the page's labels and limits)."""
    device = "meta" if args.backend == "ray" else args.device
    return AppSettings.from_env(public=args.public, max_attention_tokens=args.max_tokens, device=device)


def ray_backend(args: argparse.Namespace):
    """The Ray Serve backend, connected and with the default model deployed; Ray is imported only here."""
    try:
        from ui.backend import ray_serve
    except ImportError as exc:
        raise UserError(f"--backend ray needs Ray Serve: pip install -r requirements-scale.txt ({exc})")
    try:
        options = ray_serve.ServeOptions.from_args(args.replicas, args.num_cpus, args.num_gpus, args.serve_config)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return ray_serve.start(args.model, args.ray_address, options, args.device, args.max_tokens)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from ui import memory  # noqa: PLC0415 - the allocator's bound comes before any thread allocates

    memory.configure()
    args = parse_args(argv)
    if args.max_tokens < 2:
        print(f"error: --max-tokens must be at least 2, got {args.max_tokens}", file=sys.stderr)
        return 2
    spaces.use_persistent_storage()
    clean_weight_store()
    backend = None
    try:
        services = Services.create(app_settings(args), default_model=args.model)
        if services.lab.private is not None:  # an earlier process's private runs: no alias reaches them now
            services.lab.private.clear()
        with closing(TerminalProgress()) as bar:  # the first start pulls the default model here, with a progress bar
            services.models.get(args.model, bar)
        if args.backend == "ray":
            backend = ray_backend(args)
        demo = build_page(services, args.model)
        if backend is not None:
            logging.getLogger(__name__).info("%d events run on Ray Serve", len(route(demo, backend, args.model)))
        demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
        demo.launch(**launch_options(args, services.settings))
    except (UserError, SettingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if backend is not None:
            backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The attention explorer: a Gradio app over this repository's own Transformer core.

    python app.py                       # SmolLM2-135M-Instruct on http://127.0.0.1:7860
    python app.py --model minilm-l6     # a BERT encoder: bidirectional attention

This file only builds the page from the tab modules in ui/ and launches it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from ui import model_picker, service, tab_attention, tab_generate, tab_heads, tab_masks, tab_positions  # noqa: E402
from ui import tab_lab  # noqa: E402

ROOT = Path(__file__).resolve().parent
CSS = ROOT / "assets" / "app.css"
TITLE = "The attention explorer"
QUEUE_SIZE = 32


def build_demo(store: service.ModelStore, default_model: str) -> gr.Blocks:
    """The whole page: model picker and card, then the five tabs. The default model must be loadable."""
    initial = store.get(default_model)
    # uploaded files are deleted an hour after upload: a public Space must not collect users' texts
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(
            f"# {TITLE}\nA small Transformer written from scratch in PyTorch, loaded with real weights: "
            "look at its attention head by head, its positional encodings, what its masks do, and what each head "
            "does and whether it matters."
        )
        picker = model_picker.build(store, default_model)
        with gr.Tabs(selected="attention") as tabs:
            with gr.Tab("Generate", id="generate"):
                generate = tab_generate.build(store, picker, initial)
            with gr.Tab("Attention", id="attention"):
                attention = tab_attention.build(store, picker, initial)
            with gr.Tab("Positional encoding", id="positions"):
                tab_positions.build(store, picker, initial)
            with gr.Tab("Masks", id="masks"):
                tab_masks.build(store, picker, initial)
            with gr.Tab("Heads", id="heads"):
                tab_heads.build(store, picker, initial)
            tab_lab.build(store, picker)  # its own gr.Tab: train a Transformer from scratch

        def send_to_attention(text: str):
            if not text:
                raise gr.Error("Generate something first; then it can be sent to the Attention tab.")
            return text, gr.Tabs(selected="attention")

        generate.send.click(send_to_attention, generate.sent, [attention.text, tabs], api_visibility="private").then(
            **attention.run_event
        )
        demo.load(picker.load_card, picker.model, picker.card, api_visibility="private")
    return demo


def launch_options(args: argparse.Namespace) -> dict:
    """Safe defaults: loopback only, no share link unless asked, uploads capped, no server-side rendering."""
    return dict(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        max_file_size=f"{service.MAX_UPLOAD_BYTES // 1_000_000}mb",
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.max_tokens < 2:
        print(f"error: --max-tokens must be at least 2, got {args.max_tokens}", file=sys.stderr)
        return 2
    store = service.ModelStore(extra_names=[args.model], device=args.device, max_attention_tokens=args.max_tokens)
    bar = service.terminal_progress()
    try:
        # the first start pulls the default model here, with a progress bar in the terminal
        store.get(args.model, bar)
    except service.UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    demo = build_demo(store, args.model)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    demo.launch(**launch_options(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

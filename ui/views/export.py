"""The files behind each tab's figures: CSV, .npz, .zip of CSVs, JSON; and the image settings of every figure's
modebar (PNG and SVG at slide size, with a filename that says model, layer, head and view).

Plain functions of numpy arrays and strings, no gradio. Each builder returns the file's bytes and the
caller decides where they go (`write` puts them in a folder Gradio can serve). Every file stays under
MAX_EXPORT_BYTES: matrices of long texts are pooled (ui.services.attention.pool_attention: block means whose rows still sum to
1), and the file says what was pooled.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ui.services.attention import pool_attention, pool_edges

MAX_EXPORT_BYTES = 50_000_000
CSV_CELL_BYTES = 9  # "0.012345," : a weight written with 6 decimals and its comma
IMAGE_WIDTH, IMAGE_HEIGHT, IMAGE_SCALE = 1600, 900, 2  # 16:9, sharp on a projector (3200 × 1800 pixels)
EXPORT_DIR_PREFIX = "attn-export-"
EXPORT_TTL_S = 3600  # files written by `write` are removed an hour later, like the uploads


def slug(text) -> str:
    """A piece of a filename: letters, digits, '.', '-' and '_' only (a model folder becomes its last part)."""
    text = str(text).rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def filename(model: str, view: str, layer: int | None = None, head: int | str | None = None) -> str:
    """model_L3_H2_view (head None: the mean of the layer's heads), without extension."""
    parts = [slug(model)]
    if layer is not None:
        parts.append(f"L{layer}")
        parts.append("Hmean" if head is None or head in ("mean", "mean of heads") else f"H{head}")
    parts.append(slug(view))
    return "_".join(parts)


def image_config(name: str) -> dict:
    """Plotly's config for the modebar's camera button: PNG at slide size under `name`. The page adds an SVG button
    that reads the same settings (ui/tabs/widgets.py SVG_BUTTON_JS)."""
    return {
        "toImageButtonOptions": {
            "format": "png",
            "filename": name,
            "width": IMAGE_WIDTH,
            "height": IMAGE_HEIGHT,
            "scale": IMAGE_SCALE,
        },
        "displaylogo": False,
    }


def figure_json(fig, name: str) -> str:
    """The figure's JSON with Plotly's `config` beside `data` and `layout` (Gradio's plot hands that key to
    Plotly.react; a Figure object has no place for it)."""
    body = fig.to_json()
    assert body.endswith("}"), "plotly figure JSON is an object"
    return body[:-1] + ',"config":' + json.dumps(image_config(name)) + "}"


IMAGE_NAME = "image_name"  # a figure's download name rides in its layout's meta until the page sends it


def named(fig, name: str):
    """The figure, carrying its download name (model, view, layer, head) for the page's modebar buttons."""
    if fig is not None and hasattr(fig, "layout"):
        meta = fig.layout.meta
        fig.layout.meta = {**(meta if isinstance(meta, dict) else {}), IMAGE_NAME: name}
    return fig


def image_name(fig) -> str | None:
    """The download name `named` gave the figure, taken off it (so it is not sent twice), or None."""
    meta = fig.layout.meta
    if not isinstance(meta, dict) or IMAGE_NAME not in meta:
        return None
    rest = {key: value for key, value in meta.items() if key != IMAGE_NAME}
    fig.layout.meta = rest or None
    return meta[IMAGE_NAME]


# ---------------------------------------------------------------- CSV


def csv_text(rows: Sequence[Sequence], header: Sequence[str] | None = None) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header is not None:
        writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _cell(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"


def matrix_csv(matrix: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], corner: str,
               comments: Sequence[str] = ()) -> str:
    """A matrix as CSV: a header of column labels, then one row per label. Comment lines (# …) come first;
    NaN and ±inf (masked cells) are written as empty cells."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix_csv: shape {matrix.shape} does not match {len(row_labels)} × {len(col_labels)} labels")
    out = io.StringIO()
    for line in comments:
        out.write(f"# {line}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([corner, *col_labels])
    for label, row in zip(row_labels, matrix):
        writer.writerow([label, *(_cell(v) for v in row.tolist())])
    return out.getvalue()


def csv_side_limit(budget: int = MAX_EXPORT_BYTES) -> int:
    """The longest side of a square matrix whose CSV stays within budget (labels take the rest)."""
    return int(math.sqrt(budget * 0.9 / CSV_CELL_BYTES))


def block_labels(labels: Sequence[str], edges: np.ndarray) -> list[str]:
    return [labels[a] if b - a == 1 else f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:])]


def attention_csv(matrix: np.ndarray, labels_q: Sequence[str], labels_k: Sequence[str], what: str,
                  model: str) -> tuple[str, str]:
    """One head's (or window's) attention as CSV, pooled when its CSV would pass MAX_EXPORT_BYTES.
    Returns (csv text, a sentence on what was pooled, or '')."""
    side = csv_side_limit()
    n_q, n_k = matrix.shape
    pooled = ""
    if max(n_q, n_k) > side:
        q_edges, k_edges = pool_edges(n_q, side), pool_edges(n_k, side)
        matrix = pool_attention(np.asarray(matrix, dtype=np.float32), q_edges, k_edges)
        labels_q, labels_k = block_labels(labels_q, q_edges), block_labels(labels_k, k_edges)
        pooled = (f"{n_q:,} × {n_k:,} tokens pooled to {len(q_edges) - 1} × {len(k_edges) - 1} blocks (each cell: "
                  "the mean over a block of queries of the weight they put on a block of keys; rows sum to 1)")
    comments = [f"{model}: {what}", "rows: query tokens (position token); columns: key tokens; cells: attention weight"]
    if pooled:
        comments.append(pooled)
    return matrix_csv(matrix, labels_q, labels_k, "query \\ key", comments), pooled


# ---------------------------------------------------------------- .npz


def npz_side_limit(n_maps: int, budget: int = MAX_EXPORT_BYTES) -> int:
    """The side S of n_maps float16 S × S maps that fit in budget (tokens and notes take the rest)."""
    return max(1, int(math.sqrt(budget * 0.95 / (2 * max(1, n_maps)))))


def adaptive_bins(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges [start, end) of adaptive average pooling of n positions to `size` bins (core.analysis.capture's
    pooling: bin j covers floor(j·n/size) .. ceil((j+1)·n/size) − 1; neighbouring bins may share a token)."""
    if n <= size:
        return np.arange(n), np.arange(1, n + 1)
    j = np.arange(size)
    return (j * n) // size, ((j + 1) * n + size - 1) // size


def attention_npz(maps: np.ndarray, tokens: Sequence[str], model: str, note: str) -> bytes:
    """Every layer × head map [L, H, S, S] as float16 in an .npz with the token strings, the model's name, the token
    range each row/column covers (bin_start, bin_end: S = the number of tokens means none was pooled) and a note
    saying what was pooled."""
    maps = np.asarray(maps, dtype=np.float16)
    starts, ends = adaptive_bins(len(tokens), maps.shape[-1])
    out = io.BytesIO()
    np.savez_compressed(out, attention=maps, tokens=np.array(list(tokens), dtype=str), model=np.array(model),
                        bin_start=starts.astype(np.int64), bin_end=ends.astype(np.int64), note=np.array(note))
    data = out.getvalue()
    if len(data) > MAX_EXPORT_BYTES:
        raise ValueError(f"attention_npz: {len(data):,} bytes is over {MAX_EXPORT_BYTES:,}; pool further")
    return data


# ---------------------------------------------------------------- zip, JSON


def zip_of(files: Mapping[str, str], readme: str) -> bytes:
    """A .zip of text files (CSV) with a README.txt saying what each one holds."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("README.txt", readme)
        for name, text in files.items():
            archive.writestr(name, text)
    return out.getvalue()


def _plain(value):
    """JSON has no NaN or numpy types: NaN and ±inf become null, arrays lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def json_bytes(value) -> bytes:
    return json.dumps(_plain(value), indent=1, ensure_ascii=False, allow_nan=False).encode("utf-8")


# ---------------------------------------------------------------- files on disk


def write(data: bytes | str, name: str, root: Path | None = None) -> Path:
    """Write an export into a fresh folder under the system's temporary directory (Gradio serves files from
    there) and remove exports older than EXPORT_TTL_S. Returns the file's path."""
    base = Path(root or tempfile.gettempdir())
    cutoff = time.time() - EXPORT_TTL_S
    for old in base.glob(f"{EXPORT_DIR_PREFIX}*"):
        try:
            if old.stat().st_mtime < cutoff:
                for f in old.iterdir():
                    f.unlink()
                old.rmdir()
        except OSError:
            pass  # another request is cleaning it up
    folder = Path(tempfile.mkdtemp(prefix=EXPORT_DIR_PREFIX, dir=base))
    path = folder / name
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_EXPORT_BYTES:
        raise ValueError(f"export {name}: {len(data):,} bytes is over {MAX_EXPORT_BYTES:,}")
    path.write_bytes(data)
    return path

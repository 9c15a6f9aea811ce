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


class RollingKVCache(KVCache):
    """A KVCache whose windowed layers keep a ring of `sinks + window` entries instead of one per position.

    A windowed layer's query at position s reads keys j with s − j < window, or j < sinks (attention sinks, kept
    for good); nothing older is ever read again, so the ring overwrites it. Entries 0..sinks−1 hold positions
    0..sinks−1; entry sinks + m holds the latest position t ≥ sinks with (t − sinks) mod window = m. Keys are
    stored already rotated at their own position (RoPE), so the ring's order does not matter: attention is a sum
    over keys, and ring_allowed() says which entries are live for the current query. Other layers keep the full
    [B, H_kv, max_len, d_k] cache. `windowed[layer]` says which layers roll.

    Writes: a prompt chunk only while it fits without wrapping (length + T ≤ window: a window that hides nothing
    yet); after that one token at a time at the device-side `slot`, as KVCache's static decode step does. A longer
    prompt is prefilled into a full KVCache and taken over (take_prefill).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, windowed: tuple[bool, ...], window: int,
                 sinks: int = 0):
        if len(windowed) != n_layers:
            raise ValueError(f"windowed names {len(windowed)} layers; the model has {n_layers}")
        if window < 1 or sinks < 0:
            raise ValueError(f"window={window}, sinks={sinks}: a rolling cache needs window ≥ 1 and sinks ≥ 0")
        super().__init__(0, batch, n_kv_heads, max_len, head_dim, dtype, device)  # no tensors yet
        ring = (batch, n_kv_heads, sinks + window, head_dim)
        full = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(ring if w else full, dtype=dtype, device=device) for w in windowed]
        self.values = [torch.zeros(ring if w else full, dtype=dtype, device=device) for w in windowed]
        self.cross = [None] * n_layers
        self.windowed, self.window, self.sinks = tuple(windowed), window, sinks

    def ring_index(self, position: Tensor) -> Tensor:
        """The ring entry a position is stored in: itself for a sink, else sinks + (t − sinks) mod window."""
        return torch.where(position < self.sinks, position,
                           self.sinks + torch.remainder(position - self.sinks, self.window))

    def write(self, layer: int, k: Tensor, v: Tensor, slot: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if not self.windowed[layer]:
            return super().write(layer, k, v, slot)
        keys, values = self.keys[layer], self.values[layer]
        if slot is not None:
            entry = self.ring_index(slot)
            keys.index_copy_(2, entry, k)
            values.index_copy_(2, entry, v)
            return keys, values
        end = self.length + k.shape[2]
        if end > self.window:
            raise ValueError(f"a rolling cache takes a prompt chunk only while it fits its window ({self.window} "
                             f"tokens; this one ends at {end}): feed the rest one token at a time")
        keys[:, :, self.length:end] = k
        values[:, :, self.length:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def take_prefill(self, full: KVCache) -> None:
        """Take over an empty rolling cache from a full cache filled by a prefill of n tokens: the windowed layers
        keep the sinks and the last `window` positions in their ring entries, the others all n positions."""
        n = full.length
        if self.length or n > self.max_len:
            raise ValueError(f"take_prefill needs an empty rolling cache of at least {n} positions")
        device = self.slot.device
        kept = torch.cat([torch.arange(min(self.sinks, n), device=device),
                          torch.arange(max(self.sinks, n - self.window), n, device=device)])
        entries = self.ring_index(kept)
        for layer, windowed in enumerate(self.windowed):
            for mine, theirs in ((self.keys[layer], full.keys[layer]), (self.values[layer], full.values[layer])):
                if windowed:
                    mine[:, :, entries] = theirs[:, :, kept]
                else:
                    mine[:, :, :n] = theirs[:, :, :n]
        self.key_mask[:, :n] = full.key_mask[:, :n]
        self.advance(n)

    def ring_allowed(self) -> Tensor:
        """bool [B, 1, 1, sinks + window]: the ring entries the query at `slot` may read (its own included, as
        it is written before attention reads). Entry sinks + m holds t = s − ((s − sinks − m) mod window)."""
        s, device = self.slot, self.slot.device
        entries = torch.arange(self.sinks + self.window, device=device)
        offset = (entries - self.sinks).clamp(min=0)
        held = torch.where(entries < self.sinks, entries, s - torch.remainder(s - self.sinks - offset, self.window))
        live = (held <= s) & ((entries < self.sinks) | (held >= self.sinks))
        real = self.key_mask.gather(1, held.clamp(0, self.max_len - 1).expand(self.key_mask.shape[0], -1))
        return (live & real)[:, None, None, :]

"""One head's queries and keys in one plane, the one definition the single-text view (anatomy.qk_geometry) and the
corpus view (core/corpus/heads.py qk_over) both draw: AttentionViz's translation (Yeh et al. 2023, "AttentionViz:
A Global View of Transformer Attention"), then a joint PCA.

The keys are shifted by mean(q) − mean(k) so the two clouds share a mean: a constant added to every key changes
each query's scores by one constant, which the softmax ignores, so the shift keeps what attention sees and puts
the two clouds on top of each other. AttentionViz also rescales the two clouds to one mean norm; this plane does
not, so its coordinates stay those of the vectors the score dots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# the words both views put under the figure, so each names the plane's definition the same way
DEFINITION = "keys shifted by mean(q) − mean(k), then PCA of both (AttentionViz's translation, Yeh et al. 2023)"


@dataclass
class Plane:
    """N queries and N keys projected together: points [2N, 2] the N queries then the N keys."""
    points: Tensor          # [2N, 2]
    shift: Tensor           # [d] mean(q) − mean(k), added to every key
    mean: Tensor            # [d] the union's mean after the shift (= mean(q)), taken off before projecting
    components: Tensor      # [2, d] the axes, orthonormal, each signed so its largest-magnitude loading is positive
    explained: Tensor       # [2] each axis's share of the union's variance (NaN: no points)


def joint_plane(queries: Tensor, keys: Tensor) -> Plane:
    """AttentionViz's plane of queries [N, d] and keys [N, d]: union = [q; k + shift] with shift = mean(q) − mean(k),
    centred, torch.linalg.svd in float64, the first two right singular vectors. PCA axes are defined up to sign,
    so each is turned to make its largest-magnitude loading positive: the same vectors give the same points
    whichever view asks. float32 out."""
    if queries.ndim != 2 or queries.shape != keys.shape:
        raise ValueError(f"queries and keys must both be [N, d], got {tuple(queries.shape)} and {tuple(keys.shape)}")
    n, d = queries.shape
    if n == 0:
        return Plane(torch.empty(0, 2), torch.zeros(d), torch.zeros(d), torch.zeros(2, d),
                     torch.full((2,), float("nan")))
    q, k = queries.double(), keys.double()
    shift = q.mean(0) - k.mean(0)
    union = torch.cat([q, k + shift])                                                  # [2N, d]
    mean = union.mean(0)
    centred = union - mean
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    components = torch.zeros(2, d, dtype=torch.float64)
    components[:min(2, len(vh))] = vh[:2]
    sign = components.gather(1, components.abs().argmax(1, keepdim=True)).sign()
    components = components * torch.where(sign == 0, 1.0, sign)
    variance = s.square()
    explained = torch.zeros(2, dtype=torch.float64)
    explained[:min(2, len(s))] = variance[:2] / variance.sum().clamp_min(torch.finfo(torch.float64).tiny)
    return Plane((centred @ components.T).float(), shift.float(), mean.float(), components.float(), explained.float())

"""Token-level cross-entropy for ConvS2S, summed over non-padding target tokens.

The paper (§3.4, §4) normalizes gradients by the number of non-padding target tokens; the
training loop divides the *sum* returned here by the token count of the whole update (all
micro-batches on all ranks), so that a data-parallel update equals the single-process update on
the union of the batches. Optional label smoothing follows the reference implementation:

    loss = (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum_v(-log p_v)

    loss_sum, nll_sum = sequence_loss(logits, target, label_smoothing=0.1)  # float32 scalars

Computed in float32 whatever the autocast dtype of the logits (bf16 log-probabilities lose the
small differences the loss is made of).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convs2s.config import PAD


def sequence_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                  pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """logits B x T x V, target B x T -> (training loss sum, nll sum), float32 scalars.

    Both are sums over the non-pad target tokens; with label_smoothing=0 they are equal.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    with torch.autocast(device_type=logits.device.type, enabled=False):
        flat_logits = logits.reshape(-1, logits.size(-1)).float()  # (B*T) x V
        flat_target = target.reshape(-1)  # B*T
        if label_smoothing == 0.0:
            # Fused log-softmax + gather: no B*T x V log-probability tensor is kept.
            nll = F.cross_entropy(flat_logits, flat_target, ignore_index=pad, reduction="sum")
            return nll, nll.detach()
        lprobs = F.log_softmax(flat_logits, dim=-1)  # (B*T) x V
        keep = flat_target != pad  # B*T
        nll = -lprobs.gather(1, flat_target.unsqueeze(1)).squeeze(1)[keep].sum()
        smooth = -lprobs.sum(dim=-1)[keep].sum()
        eps_i = label_smoothing / (lprobs.size(-1) - 1)
        loss = (1.0 - label_smoothing - eps_i) * nll + eps_i * smooth
        return loss, nll.detach()

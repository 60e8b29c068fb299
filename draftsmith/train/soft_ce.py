"""LM head fused with a soft cross-entropy, chunked over rows: the loss every drafter trains with.

    loss = sum_i -p_i . log_softmax(x_i W^T)

d loss / d logits = softmax(logits) - p (p sums to 1), so the gradients for x and W are two matrix
products per chunk, computed in the forward. Keeping them ([n, H] and [V, H]) instead of the
[n, V] log-probs is what bounds memory on a CPU with a large vocabulary and several unrolled steps.
When W is frozen (a head shared with the target) its gradient is not computed at all.

The target distribution comes either as probabilities `p` [n, V] or as logits `p_logits` [n, V],
softmaxed chunk by chunk, so that a full-vocabulary target never needs an [n, V] float32 copy.
"""

from __future__ import annotations

import torch

CHUNK = 1024
# A GPU runs a [c, V] chunk in microseconds, so small chunks leave it waiting on kernel launches;
# 8x the rows there is still a few GB at a 49k vocabulary.
GPU_CHUNK_FACTOR = 8


def chunk_rows(x: torch.Tensor, rows: int) -> int:
    """Rows per chunk for `x`'s device: `rows` on a CPU, GPU_CHUNK_FACTOR times that on a GPU."""
    return rows * GPU_CHUNK_FACTOR if x.is_cuda else rows


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, is_logits: bool):
        # The products run in the autocast dtype (bf16) when autocast is on, as the LM head would;
        # casting W once here instead of per product saves as much time as a product.
        dev = x.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype
        w, xs = weight.to(dtype), x.to(dtype)
        want_w = weight.requires_grad
        n = x.shape[0]
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        gx = torch.empty(n, x.shape[1], dtype=torch.float32, device=x.device)
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if want_w else None
        argmax = torch.empty(n, dtype=torch.long, device=x.device)
        with torch.autocast(dev, enabled=False):
            step = chunk_rows(x, CHUNK)
            for i in range(0, n, step):
                j = min(i + step, n)
                p = torch.softmax(target[i:j].float(), -1) if is_logits else target[i:j].float()
                # Few passes over [c, V]: on a CPU they, not the products, take most of the time.
                z = (xs[i:j] @ w.t()).float()  # [c, V] logits
                zmax, top = z.max(-1)
                q = torch.softmax(z, -1)
                lse = zmax - q.gather(1, top[:, None]).squeeze(1).log()  # q[top] >= 1/V: no underflow
                loss += (lse - torch.linalg.vecdot(p, z)).sum()  # -p . log_softmax(z), p sums to 1
                argmax[i:j] = top
                del z
                g = q.sub_(p).to(dtype)  # [c, V] softmax - p = d loss / d z
                gx[i:j] = g @ w
                if gw is not None:
                    gw += g.t() @ xs[i:j]
        saved = [gx.to(x.dtype)] + ([gw.to(weight.dtype)] if gw is not None else [])
        ctx.save_for_backward(*saved)
        ctx.want_w = want_w
        ctx.mark_non_differentiable(argmax)
        return loss, argmax

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_argmax):
        saved = ctx.saved_tensors
        gw = grad_loss * saved[1] if ctx.want_w else None
        return grad_loss * saved[0], gw, None, None


def soft_cross_entropy(
    x: torch.Tensor,  # [n, H] normed hidden states
    weight: torch.Tensor,  # [V, H] LM head (frozen when requires_grad is False)
    p: torch.Tensor | None = None,  # [n, V] target probabilities
    *,
    p_logits: torch.Tensor | None = None,  # [n, V] target logits instead of probabilities
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, argmax of x W^T per row); the loss is differentiable in x and W."""
    if (p is None) == (p_logits is None):
        raise ValueError("give exactly one of p and p_logits")
    target = p if p is not None else p_logits
    return _SoftCrossEntropy.apply(x, weight, target, p is None)

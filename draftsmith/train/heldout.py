"""Held-out teacher-forced accuracy: the training objective's per-position accuracy, scored on
conversations no step trains on (`train ... --eval-data FILE`).

Why: the engine's held-out tau on a handful of prompts x 64 tokens moves by several hundredths
between evaluations of the same weights' neighbours, too noisy to select a checkpoint or to see a
recipe help; teacher-forced accuracy over thousands of positions is steady, and its first position
tracks the engine's a1 (the engine verifies exactly the draft's first token after a committed
prefix). EAGLE-3 and MTP report their unrolled steps, DFlash its block slots (on anchors drawn once,
so every evaluation scores the same blocks).

Only the main rank scores, with online target features and local normalisation: no collective runs,
so the other ranks need not wait in step. This module knows how to batch and sum; the losses are the
methods' own (`forward_backward(..., train=False)`).
"""

from __future__ import annotations

import torch

from draftsmith.train.data import plan_batches

HELDOUT_STEP = 1 << 30  # the anchor-seed step of every held-out evaluation: the same blocks each time


def heldout_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Example indices in batches of about `batch_tokens`, in a fixed order (one pass, seed 0)."""
    return [list(b.examples) for b in plan_batches(lengths, batch_tokens, epochs=1, seed=0)]


@torch.no_grad()
def score(method, examples, batches: list[list[int]], positions: int, autocast) -> dict:
    """{"heldout_loss": mean loss per counted position, "heldout_acc": [S] accuracy per position}."""
    model = method.model
    was_training = model.training
    model.eval()
    correct = torch.zeros(positions, dtype=torch.float64)
    counts = torch.zeros(positions, dtype=torch.float64)
    loss_sum = 0.0
    try:
        for ids in batches:
            # [loss, step_loss x S, correct x S, counts x S, tokens]; the loss is normalised by this
            # batch's counts, so batches are weighted by them.
            parts = method.forward_backward(
                [examples[i] for i in ids], ids, HELDOUT_STEP, autocast, train=False
            )
            S = positions
            c, n = parts[1 + S : 1 + 2 * S], parts[1 + 2 * S : 1 + 3 * S]
            correct += c
            counts += n
            loss_sum += float(parts[0]) * float(n.sum())
    finally:
        model.train(was_training)
    total = float(counts.sum())
    return {
        "heldout_loss": round(loss_sum / total, 6) if total else None,
        "heldout_acc": [
            round(float(c / n), 6) if n > 0 else None for c, n in zip(correct, counts, strict=True)
        ],
    }

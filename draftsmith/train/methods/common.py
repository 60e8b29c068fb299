"""What the methods share: per-position loss parts, an idle rank's zeros, the offline feature
store, target features of a packed batch, and the shape check of a speculator to continue from."""

from __future__ import annotations

import torch

from draftsmith.errors import UserError
from draftsmith.target.model import FINAL_HIDDEN
from draftsmith.train import distributed
from draftsmith.train.config import TrainConfig
from draftsmith.train.data import pack
from draftsmith.train.target_pass import can_pack, packed_forward, stored_pass, target_pass


def loss_parts(res, num_tokens: int) -> torch.Tensor:
    """[loss, step_loss x S, correct x S, counts x S, tokens]: what ranks all-reduce per step."""
    parts = [res.loss.detach().reshape(1), res.step_loss, res.correct, res.counts, torch.tensor([num_tokens])]
    return torch.cat([p.double().cpu() for p in parts])


def idle_parts(world, S: int) -> torch.Tensor:
    """A global batch smaller than the world: this rank only joins the collectives."""
    distributed.all_sum(world, torch.zeros(S, dtype=torch.long))
    return torch.zeros(2 + 3 * S, dtype=torch.float64)


def check_init_shape(path: str, have: dict, want: dict, fix: str) -> None:
    """One line naming every way the `--init` speculator differs from what this run builds."""
    diff = [f"{k} {have[k]} (this run: {want[k]})" for k in want if have[k] != want[k]]
    if diff:
        raise UserError(
            f"--init {path}: the speculator there differs from this run: {'; '.join(diff)}; "
            f"{fix}, or use a speculator made for this target"
        )


def open_store(cfg: TrainConfig, examples, layers: list[int]):
    """The offline feature store for these examples and layers, or None to compute them online."""
    if cfg.features is None:
        return None
    from draftsmith.data.features import FeatureStore

    # Every store holds the final hidden state; only real layer ids must be among its layers.
    return FeatureStore.open(cfg.features, examples, [i for i in layers if i != FINAL_HIDDEN])


def packed_signal(method, examples, ids: list[int], train: bool):
    """(batch, features [b, T, K, H], logits [b, T, V]) of this rank's examples: packed rows on
    the method's device, the target's signal from the feature store while training, else from a
    target pass (held-out scoring always runs the target, as its examples are not in the store)."""
    batch = pack(examples, method.cfg.max_len, packing=can_pack(method.target)).to(method.world.device)
    if method.store is None or not train:
        features, logits = target_pass(method.target, batch, method.layers)
    else:
        features, logits = stored_pass(method.target, method.store, batch, ids, method.layers)
    return batch, features, logits


def batch_features(target, batch, layers: list[int]) -> torch.Tensor:
    """[b, T, K, H] features of packed rows from the target's decoder alone (DFlash needs no target
    logits, so the LM head over the whole vocabulary is skipped)."""
    with torch.inference_mode():
        out = packed_forward(target, target.base, batch)
        feats = torch.stack(
            [out.last_hidden_state if i == FINAL_HIDDEN else out.hidden_states[i + 1] for i in layers], dim=2
        )
    return feats.clone()  # out of inference mode: `fc` saves its input for backward

"""MTP training: the target's own next-next-token head (Qwen3.5/3.6's `mtp.*`), trained or
fine-tuned on regenerated data (`train/mtp_objective.py`)."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.drafters.mtp import build_head, load_head, save_head
from draftsmith.errors import UserError
from draftsmith.target.model import FINAL_HIDDEN
from draftsmith.train import distributed
from draftsmith.train.config import MTP_INITS, TrainConfig
from draftsmith.train.methods.common import idle_parts, loss_parts, open_store, packed_signal
from draftsmith.train.mtp_objective import count_positions as mtp_count_positions
from draftsmith.train.mtp_objective import mtp_loss


class MTPMethod:
    """The head reads the target's final-normed hidden state and is scored against its logits; both
    come from one target pass (or the feature store's `hidden`, through the LM head)."""

    # Settings that define a run: a checkpoint resumes only under the same ones.
    fingerprint = (
        "method", "target", "epochs", "lr", "batch_tokens", "max_len", "ttt_steps", "init",
        "warmup_ratio", "grad_clip", "seed",
    )  # fmt: skip
    drafter = "mtp"  # the registry name that loads the saved folder
    init_is_folder = False  # `--init` is also random, last_layer or native; it is in the fingerprint

    @staticmethod
    def positions(cfg: TrainConfig) -> int:
        """Per-position metrics: one per unrolled step."""
        return cfg.settings.ttt_steps

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """This method's user errors, before any work."""
        if cfg.init not in MTP_INITS and not Path(cfg.init).is_dir():
            raise UserError(
                f"--init {cfg.init}: give random, last_layer, native, or a folder holding an MTP head "
                "(mtp.* tensors)"
            )
        if not cfg.settings.ttt_steps > 0:
            raise UserError(f"--ttt-steps {cfg.settings.ttt_steps} must be positive")

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        self.layers = [FINAL_HIDDEN]
        if cfg.init in ("random", "last_layer"):
            head = build_head(target, init=cfg.init, seed=cfg.seed)
        else:  # fine-tuning: the target checkpoint's own head, another Qwen3.5 folder, a head saved here
            head = load_head(target, None if cfg.init == "native" else cfg.init)
        self.model = head.to(world.device, torch.float32).train()
        self.store = open_store(cfg, examples, self.layers)

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        S = self.cfg.settings.ttt_steps
        if not examples:
            return idle_parts(self.world, S)
        batch, features, logits = packed_signal(self, examples, ids, train)
        local = mtp_count_positions(batch.loss_mask, batch.segments, S)
        counts = distributed.all_sum(self.world, local) if train else local
        with autocast:
            res = mtp_loss(
                self.model, batch.input_ids, batch.loss_mask, features[:, :, 0], logits,
                steps=S, segments=batch.segments, positions=batch.positions, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return loss_parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> _SavedHead:
        return _SavedHead(self.model, self.target.config, dtype)

    def info(self) -> dict:
        return {"init": self.cfg.init, "ttt_steps": self.cfg.settings.ttt_steps}


class _SavedHead:
    """An MTP head as `_save` writes it: `save(dir, extra)` puts its tensors in dtype, in Qwen's
    `mtp.*` layout, beside the target's config (`drafters.mtp.save_head`)."""

    def __init__(self, head, target_config, dtype: torch.dtype) -> None:
        self.head, self.target_config, self.dtype = head, target_config, dtype

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(self.dtype) for k, v in self.head.state_dict().items()}

    def save(self, path, extra: dict | None = None) -> None:
        save_head(self, path, self.target_config, extra)

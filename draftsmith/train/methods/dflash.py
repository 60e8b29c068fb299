"""DFlash training: a block of masked slots drafted in one forward from the target's context
features, random anchors per packed row (`train/dflash_objective.py`)."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.drafters import dflash
from draftsmith.errors import UserError
from draftsmith.train import distributed
from draftsmith.train.config import DFlashSettings, TrainConfig
from draftsmith.train.data import pack, token_ranking
from draftsmith.train.dflash_objective import anchor_seed, dflash_loss, sample_blocks
from draftsmith.train.methods.common import (
    batch_features,
    check_init_shape,
    idle_parts,
    loss_parts,
    open_store,
)
from draftsmith.train.target_pass import can_pack, stored_pass


class DFlashMethod:
    # Settings that define a run: a checkpoint resumes only under the same ones.
    fingerprint = (
        "method", "target", "epochs", "lr", "batch_tokens", "max_len", "block_size", "layers",
        "anchors", "gamma", "target_layers", "mask_token_id", "warmup_ratio", "grad_clip", "seed",
    )  # fmt: skip
    drafter = "dflash"  # the registry name that loads the saved folder
    init_is_folder = True  # `--init` other than random names a speculator to continue

    @staticmethod
    def positions(cfg: TrainConfig) -> int:
        """Per-position metrics: one per block slot after the anchor."""
        return cfg.settings.block_size - 1

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """This method's user errors, before any work."""
        if cfg.init != "random" and not Path(cfg.init).is_dir():
            raise UserError(f"--init {cfg.init}: give random or the folder of a trained DFlash speculator")
        s: DFlashSettings = cfg.settings
        if s.block_size < 2:
            raise UserError(f"--block-size {s.block_size} must be at least 2 (one token to draft)")
        for flag, v in {"--layers": s.layers, "--anchors": s.anchors, "--gamma": s.gamma}.items():
            if not v > 0:
                raise UserError(f"{flag} {v} must be positive")

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        s: DFlashSettings = cfg.settings
        self.settings = s
        self.layers = list(s.target_layers or dflash.default_target_layer_ids(target.num_layers))
        if max(self.layers) >= target.num_layers or min(self.layers) < 0:
            raise UserError(
                f"--target-layers {self.layers}: the target has layers 0..{target.num_layers - 1}"
            )
        mask = s.mask_token_id
        if mask is None:
            mask = dflash.default_mask_token_id(target.tokenizer, target.vocab_size)
        if not 0 <= mask < target.vocab_size:
            raise UserError(
                f"--mask-token-id {mask} is outside the target's vocabulary of {target.vocab_size}"
            )
        config = dflash.make_config(
            target.config,
            layers=s.layers,
            block_size=s.block_size,
            mask_token_id=mask,
            target_layer_ids=self.layers,
        )
        embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
        if cfg.init != "random":
            self.model = _dflash_init(cfg.init, config, embed, head).to(world.device, torch.float32)
        else:
            self.model = dflash.DFlashModel(config, embed, head).to(world.device, torch.float32)
            if s.norm_init == "scaled":
                dflash.scale_output_norm(self.model)
        self.store = open_store(cfg, examples, self.layers)
        self.vocab_order = token_ranking(examples, target.vocab_size)  # saved for `dflash:PATH:vocab=N`

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        cfg, s, model = self.cfg, self.settings, self.model
        S = s.block_size - 1
        if not examples:
            return idle_parts(self.world, S)
        batch = pack(examples, cfg.max_len, packing=can_pack(self.target))
        # Anchors are drawn per example from (seed, step, example id): packing and ranks do not matter.
        seeds = {local: anchor_seed(cfg.seed, step, global_id) for local, global_id in enumerate(ids)}
        blocks = sample_blocks(
            batch.input_ids, batch.loss_mask, batch.segments,
            block_size=s.block_size, n_anchors=s.anchors, seeds=seeds,
        ).to(self.world.device)  # fmt: skip
        batch = batch.to(self.world.device)
        if self.store is None or not train:
            features = batch_features(self.target, batch, self.layers)
        else:
            features = stored_pass(self.target, self.store, batch, ids, self.layers, logits=False)[0]
        counts = distributed.all_sum(self.world, blocks.counts()) if train else blocks.counts()
        with autocast:
            res = dflash_loss(
                model, batch.input_ids, features, blocks,
                segments=batch.segments, positions=batch.positions, gamma=s.gamma, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return loss_parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> dflash.DFlashModel:
        m = self.model
        out = dflash.DFlashModel(m.config, m.embed_tokens, m.lm_head)
        out.load_state_dict(m.state_dict())
        out.vocab_order = self.vocab_order
        return out.to(dtype)

    def info(self) -> dict:
        c = self.model.config.dflash_config
        init = {} if self.cfg.init == "random" else {"init": self.cfg.init}
        return {
            "block_size": c["block_size"],
            "mask_token_id": c["mask_token_id"],
            "layers": self.model.config.num_hidden_layers,
        } | init


def _dflash_init(path: str, config, embed, head) -> dflash.DFlashModel:
    """A trained DFlash speculator to continue training from (a longer schedule or new traffic). Its
    shape must be the one this run's flags ask for: a silent switch to the checkpoint's block size
    or layers would make the run's flags lie about what it trained."""
    model = dflash.load_dflash(path, embed, head, torch.float32)

    def shape(c) -> dict:
        d = c.dflash_config
        return {"--layers": c.num_hidden_layers, "--block-size": d["block_size"],
                "--target-layers": d["target_layer_ids"], "--mask-token-id": d["mask_token_id"],
                "hidden size": c.hidden_size}  # fmt: skip

    check_init_shape(path, shape(model.config), shape(config), "pass the flags it was trained with")
    return model.train()

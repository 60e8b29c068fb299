"""EAGLE-3 training: the draft layer over three target features, unrolled `ttt_steps` on its own
outputs (`train/eagle3_objective.py`); `--init` continues a trained speculator with a new vocabulary."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.drafters.eagle3 import Eagle3Model, feature_layers, load_eagle3, make_config
from draftsmith.errors import UserError
from draftsmith.train import distributed
from draftsmith.train.config import EAGLE3Settings, TrainConfig
from draftsmith.train.data import (
    draft_vocab,
    pack,
)
from draftsmith.train.eagle3_init import token_attention, typical_rms
from draftsmith.train.eagle3_objective import TargetSignal, count_positions, ttt_loss
from draftsmith.train.methods.common import (
    check_init_shape,
    idle_parts,
    loss_parts,
    open_store,
    packed_signal,
)
from draftsmith.train.target_pass import can_pack, stored_pass, target_pass


class Eagle3Method:
    # Settings that define a run: a checkpoint resumes only under the same ones.
    fingerprint = (
        "target", "epochs", "lr", "batch_tokens", "max_len", "ttt_steps",
        "draft_vocab", "warmup_ratio", "grad_clip", "seed", "head_init",
    )  # fmt: skip
    drafter = "eagle3"  # the registry name that loads the saved folder
    init_is_folder = True  # `--init` other than random names a speculator to continue

    @staticmethod
    def positions(cfg: TrainConfig) -> int:
        """Per-position metrics: one per unrolled TTT step."""
        return cfg.settings.ttt_steps

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """This method's user errors, before any work."""
        if cfg.init != "random" and not Path(cfg.init).is_dir():
            raise UserError(f"--init {cfg.init}: give random or the folder of a trained EAGLE-3 speculator")
        s: EAGLE3Settings = cfg.settings
        for flag, v in {"--ttt-steps": s.ttt_steps, "--draft-vocab": s.draft_vocab}.items():
            if not v > 0:
                raise UserError(f"{flag} {v} must be positive")

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        self.layers = feature_layers(target.num_layers)
        config = make_config(target.model.config, cfg.settings.draft_vocab, self.layers)
        if cfg.init != "random":
            self.model = _eagle3_init(cfg.init, config, target, examples).to(world.device, torch.float32)
        else:
            self.model = Eagle3Model(config, target.model.get_input_embeddings()).to(
                world.device, torch.float32
            )
            vocab = draft_vocab(examples, config.draft_vocab_size, target.vocab_size)
            self.model.set_vocab_map(vocab.to(world.device))
            if cfg.settings.head_init == "target":
                self.model.init_head_from_target(target.head, getattr(target.base, "norm", None))
        self.store = open_store(cfg, examples, self.layers)
        if cfg.init == "random" and cfg.settings.attn_init == "token":
            token_attention(self.model, self._feature_rms(examples), seed=cfg.seed)

    def _feature_rms(self, examples) -> float:
        """The fused feature's typical RMS at init, on the first examples (about 1k tokens), agreed
        over ranks so that every rank starts from the same weights."""
        ids, used = [], 0
        while len(ids) < len(examples) and (not ids or used + len(examples[len(ids)].input_ids) <= 1024):
            used += len(examples[len(ids)].input_ids)
            ids.append(len(ids))
        batch = pack([examples[i] for i in ids], self.cfg.max_len, packing=can_pack(self.target))
        batch = batch.to(self.world.device)
        if self.store is None:
            features = target_pass(self.target, batch, self.layers)[0]
        else:
            features = stored_pass(self.target, self.store, batch, ids, self.layers, logits=False)[0]
        with torch.no_grad():
            rms = typical_rms(self.model.fuse(features.float())[batch.segments >= 0])
        return (
            float(distributed.all_sum(self.world, torch.tensor([rms], dtype=torch.float64))[0])
            / self.world.size
        )

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        """Loss and gradients on this rank's shard. Returns the all-reduced parts (`loss_parts`).
        `train=False` (held-out scoring, on one rank): online features, local counts, no backward."""
        model, S = self.model, self.cfg.settings.ttt_steps
        if not examples:
            return idle_parts(self.world, S)
        batch, features, logits = packed_signal(self, examples, ids, train)
        signal = TargetSignal.from_logits(model, logits)  # [b, T, Vd] instead of [b, T, V] from here on
        del logits
        # Every rank normalises by the global counts, so summed gradients are the global batch's.
        local = count_positions(model, batch.loss_mask, signal, S, batch.segments)
        counts = distributed.all_sum(self.world, local) if train else local
        with autocast:
            res = ttt_loss(
                model, batch.input_ids, batch.loss_mask, features, signal,
                ttt_steps=S, segments=batch.segments, positions=batch.positions, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return loss_parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> Eagle3Model:
        out = Eagle3Model(self.model.config, self.model.embed_tokens)
        out.load_state_dict(self.model.state_dict())
        return out.to(dtype)

    def info(self) -> dict:
        init = {} if self.cfg.init == "random" else {"init": self.cfg.init}
        return {"draft_vocab_size": self.model.config.draft_vocab_size} | init


def _eagle3_init(path: str, config, target, examples) -> Eagle3Model:
    """A trained EAGLE-3 speculator (any layout `eagle3:PATH` loads) to continue training from: a
    longer schedule or new traffic without starting over.

    Its draft vocabulary is rebuilt from this run's data at this run's `--draft-vocab` (ties go to
    the tokens it already had): carried over unchanged from a first, smaller dataset, it left 13% of
    SmolLM2's held-out chat tokens and 6% of its code tokens undraftable. Head rows of the tokens
    both vocabularies share are kept; new tokens start at zero (a neutral logit) and are learned."""
    old = load_eagle3(path, target.model.get_input_embeddings(), torch.float32)
    want = {"feature layers": config.eagle_config["eagle_aux_hidden_state_layer_ids"],
            "hidden size": config.hidden_size}  # fmt: skip
    have = {"feature layers": old.feature_layers, "hidden size": old.config.hidden_size}
    check_init_shape(path, have, want, "use a speculator made for this target")
    old_ids = old.draft_to_target()
    new_ids = draft_vocab(examples, config.draft_vocab_size, target.vocab_size, prefer=old_ids)
    if torch.equal(new_ids, old_ids):
        return old.train()
    model = Eagle3Model(config, target.model.get_input_embeddings())
    state = {k: v for k, v in old.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    model.load_state_dict(state, strict=False)
    model.set_vocab_map(new_ids)
    row = torch.full((target.vocab_size,), -1, dtype=torch.long)
    row[old_ids] = torch.arange(len(old_ids))
    src = row[new_ids]
    with torch.no_grad():
        model.lm_head.weight.zero_()
        kept = src >= 0
        model.lm_head.weight[kept] = old.lm_head.weight[src[kept]]
    return model.train()

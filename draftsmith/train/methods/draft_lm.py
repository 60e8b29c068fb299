"""Draft-LM training: a small causal LM distilled from the target's distribution
(`train/draft_lm_objective.py`), on the target's frozen embedding and head."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from draftsmith.errors import UserError
from draftsmith.fileio import save_checkpoint_dir
from draftsmith.formats import draft_lm_format
from draftsmith.target.model import FINAL_HIDDEN
from draftsmith.train import distributed
from draftsmith.train.config import DraftLMSettings, TrainConfig
from draftsmith.train.data import (
    token_ranking,
)
from draftsmith.train.draft_lm_objective import counted as draft_lm_counted
from draftsmith.train.draft_lm_objective import draft_lm_loss
from draftsmith.train.methods.common import idle_parts, loss_parts, open_store, packed_signal


class DraftLMMethod:
    """A small causal LM distilled from the target: fresh layers at the target's width, or copies of
    some of its layers (`init_layers`), on the target's own embedding and head, which stay frozen;
    at another width (`hidden`) it has its own embedding, tied to its head and trained."""

    # Settings that define a run: a checkpoint resumes only under the same ones.
    fingerprint = (
        "method", "target", "epochs", "lr", "batch_tokens", "max_len", "layers", "hidden", "init_layers",
        "warmup_ratio", "grad_clip", "seed",
    )  # fmt: skip
    drafter = "draft"  # the registry name that loads the saved folder
    init_is_folder = True  # `--init` other than random names a draft LM to continue

    @staticmethod
    def positions(cfg: TrainConfig) -> int:
        """Per-position metrics: one, the teacher-forced next-token agreement."""
        return 1

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        """This method's user errors, before any work."""
        s: DraftLMSettings = cfg.settings
        if s.init_layers is not None:
            if not s.init_layers or any(i < 0 for i in s.init_layers):
                raise UserError(
                    f"--init-from-target-layers {s.init_layers}: give target layer ids 0, 1, ... "
                    "separated by commas"
                )
        elif s.layers <= 0:
            raise UserError(f"--layers {s.layers} must be positive")
        if s.hidden is not None and s.hidden <= 0:
            raise UserError(f"--hidden {s.hidden} must be positive")
        if s.hidden is not None and s.init_layers:
            raise UserError(
                "--hidden and --init-from-target-layers exclude each other: copied layers have the target's width"
            )

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        self.layers = [FINAL_HIDDEN]  # what the store or the target pass yields: logits come from it
        self.model = DraftLMStudent(_draft_lm(cfg, target)).to(world.device, torch.float32).train()
        self.store = open_store(cfg, examples, self.layers)
        # Saved with the draft, so `draft:PATH:vocab=N` can keep the head rows of the N most frequent.
        self.vocab_order = token_ranking(examples, target.vocab_size)

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        if not examples:
            return idle_parts(self.world, 1)
        batch, _, logits = packed_signal(self, examples, ids, train)
        local = draft_lm_counted(batch.loss_mask, batch.segments).sum().reshape(1).long()
        counts = distributed.all_sum(self.world, local) if train else local
        with autocast:
            res = draft_lm_loss(
                self.model.lm, batch.input_ids, batch.loss_mask, logits,
                segments=batch.segments, positions=batch.positions, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return loss_parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> DraftLMStudent:
        return DraftLMStudent(self.model.lm, dtype, self.vocab_order)

    def info(self) -> dict:
        cfg = self.model.lm.config
        return {
            "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size,
            "init_layers": self.cfg.settings.init_layers,
            **({} if self.cfg.init == "random" else {"init": self.cfg.init}),
            "feature_layers": [],  # it reads token ids only (the target's logits come from its store)
        }


class DraftLMStudent(torch.nn.Module):
    """The draft LM under training; `save` writes the folder `draft:PATH` loads (its layers and
    norm only when it shares the target's embedding, else the whole model) in `dtype`."""

    def __init__(self, lm, dtype: torch.dtype | None = None, vocab_order: torch.Tensor | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.dtype = dtype
        self.vocab_order = vocab_order  # token ids by training-data frequency, saved beside the weights

    def _tied(self) -> bool:
        return self.lm.get_output_embeddings().weight is self.lm.get_input_embeddings().weight

    def state_dict(self, *args, **kwargs) -> dict:
        # A tied head is the embedding: stored once (safetensors refuses shared tensors).
        state = super().state_dict(*args, **kwargs)
        if self._tied():
            state.pop("lm.lm_head.weight", None)
        return state

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):
        missing, unexpected = super().load_state_dict(state, strict=False, assign=assign)
        missing = [m for m in missing if not (m == "lm.lm_head.weight" and self._tied())]
        if strict and (missing or unexpected):
            raise RuntimeError(f"draft LM state: missing {missing}, unexpected {unexpected}")
        return missing, unexpected

    def save(self, path, extra: dict | None = None) -> None:
        dtype = self.dtype or next(self.lm.parameters()).dtype
        extra = {"kind": draft_lm_format.KIND, **(extra or {})}
        if self.lm.get_input_embeddings().weight.requires_grad:  # its own embedding: a full folder
            state = {k.removeprefix("lm."): v.to(dtype) for k, v in self.state_dict().items()}
            config = self.lm.config.to_dict() | {"torch_dtype": str(dtype).removeprefix("torch.")}
            save_checkpoint_dir(path, state, config, extra | {"shares_target_embedding": False})
        else:
            draft_lm_format.save_shared(self.lm, path, extra, dtype)
        if self.vocab_order is not None:
            draft_lm_format.save_vocab_order(path, self.vocab_order)


def _draft_lm(cfg: TrainConfig, target):
    """The student: a copy of the target's config at `layers` depth (and `hidden` width)."""
    from transformers import AutoModelForCausalLM

    if cfg.init != "random":
        return _draft_lm_init(cfg, target)
    s: DraftLMSettings = cfg.settings
    config = copy.deepcopy(target.model.config)
    far = [i for i in s.init_layers or [] if i >= target.num_layers]
    if far:
        raise UserError(
            f"--init-from-target-layers: the target has layers 0-{target.num_layers - 1}, not {far}"
        )
    config.num_hidden_layers = len(s.init_layers) if s.init_layers else s.layers
    if getattr(config, "layer_types", None):
        kinds = config.layer_types
        config.layer_types = [kinds[i] for i in s.init_layers] if s.init_layers else kinds[: s.layers]
    shared = s.hidden is None or s.hidden == config.hidden_size
    if shared:
        lm = draft_lm_format.build_shared(config, target.model, torch.float32)
        lm.get_input_embeddings().weight.requires_grad_(False)
        lm.get_output_embeddings().weight.requires_grad_(False)
    else:
        head_dim = config.hidden_size // config.num_attention_heads
        ratio = config.intermediate_size / config.hidden_size
        config.hidden_size = s.hidden
        config.num_attention_heads = max(1, s.hidden // head_dim)
        config.num_key_value_heads = math.gcd(config.num_attention_heads, config.num_key_value_heads)
        config.head_dim = s.hidden // config.num_attention_heads
        config.intermediate_size = int(round(ratio * s.hidden / 64)) * 64
        config.tie_word_embeddings = True
        torch.manual_seed(cfg.seed)
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if s.init_layers:
        src = target.model.get_decoder()
        with torch.no_grad():
            for j, i in enumerate(s.init_layers):
                lm.model.layers[j].load_state_dict(src.layers[i].state_dict())
            lm.model.norm.load_state_dict(src.norm.state_dict())
    return lm


def _draft_lm_init(cfg: TrainConfig, target):
    """A trained draft LM to continue from (`--init FOLDER`): its architecture, its weights."""
    from transformers import AutoModelForCausalLM

    folder = Path(cfg.init)
    if not (folder / "config.json").is_file():
        raise UserError(f"--init {cfg.init}: no draft LM there (config.json missing); give a draft-lm folder")
    if cfg.settings.init_layers:
        raise UserError("--init and --init-from-target-layers both choose the start: give one of them")
    if draft_lm_format.shares_target_embedding(folder):
        lm = draft_lm_format.load_shared(folder, target.model, torch.float32)
        lm.get_input_embeddings().weight.requires_grad_(False)
        lm.get_output_embeddings().weight.requires_grad_(False)
    else:
        lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        if lm.config.vocab_size != target.model.config.vocab_size:
            raise UserError(
                f"--init {cfg.init}: its vocabulary ({lm.config.vocab_size}) is not the target's "
                f"({target.model.config.vocab_size}); give a draft LM trained for this target"
            )
    return lm.train()

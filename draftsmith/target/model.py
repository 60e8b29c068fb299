"""The target: a Hugging Face causal LM run over a `RaggedCache`, returning logits and, on request,
the hidden states of chosen layers (what EAGLE-3 and DFlash drafters consume).

This module knows how to load a model, build per-row positions and attention masks, and apply the LM
head only where logits are needed. It does not know about drafts, acceptance or sampling.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from draftsmith.errors import UserError
from draftsmith.machine import auto_dtype
from draftsmith.target import attention, lean_decoder
from draftsmith.target.cache import RaggedCache
from draftsmith.target.packed import use_fast_linear
from draftsmith.target.quantize import QUANTIZE

# Feature id of the final-normed hidden state, the tensor the LM head reads (what MTP heads consume).
# Ids >= 0 are decoder-layer outputs.
FINAL_HIDDEN = -1

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def parse_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """`auto` is bfloat16 where the device computes it natively (a GPU, an AMX or AVX512-BF16 CPU)
    and float32 elsewhere, where emulated bf16 products run several times slower."""
    if name == "auto":
        return DTYPES[auto_dtype(device or torch.device("cpu"))]
    if name not in DTYPES:
        raise UserError(f"unknown --dtype '{name}': use auto, bfloat16 or float32")
    return DTYPES[name]


def parse_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise UserError(f"unknown --device '{name}': use cpu, cuda or auto")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is visible: use --device cpu")
    return torch.device(name)


@dataclass
class ForwardOut:
    logits: torch.Tensor  # [b, n, vocab] float32, n = q or the number of selected positions
    features: torch.Tensor | None  # [b, q, n_feature_layers, hidden] or None


class Target:
    """A loaded causal LM plus what the engine needs to know about it."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer,
        name: str,
        gguf_path: str | None = None,
        quantize: str = "none",
    ) -> None:
        self.model = model.eval()
        use_fast_linear(self.model)  # prepacked oneDNN products on a CPU (see target/packed.py)
        self.tokenizer = tokenizer
        self.name = name
        self.gguf_path = gguf_path
        self.config = model.config.get_text_config()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.base = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.num_layers = self.config.num_hidden_layers
        self.vocab_size = self.head.weight.shape[0]
        self.max_context = getattr(self.config, "max_position_embeddings", None) or 1 << 20
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        types = list(getattr(self.config, "layer_types", None) or ["full_attention"] * self.num_layers)
        self.layer_types = types
        self.linear_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.attention_layers = [i for i, t in enumerate(types) if t != "linear_attention"]
        self.sliding_window = getattr(self.config, "sliding_window", None)
        src = inspect.getsource(type(self.base).forward)
        self._mask_dict = "isinstance(causal_mask_mapping := attention_mask, dict)" in src
        if not self._mask_dict and set(types) != {"full_attention"}:
            raise UserError(
                f"target architecture {type(self.base).__name__} mixes layer types we cannot mask"
            )
        self.eos_ids = _eos_ids(model, tokenizer)
        # The fast forward (target/lean_decoder.py) where the architecture allows it; built lazily.
        self.lean_ok = lean_decoder.enabled(self.device) and lean_decoder.supports(model)
        self._lean: lean_decoder.LeanDecoder | None = None
        self._head_rows: torch.Tensor | None = None  # see restrict_head
        if quantize not in QUANTIZE:
            raise UserError(f"unknown --quantize '{quantize}': use {' or '.join(QUANTIZE)}")
        if quantize != "none" and not self.lean_ok:
            raise UserError(
                f"--quantize {quantize} needs the lean CPU forward (a {'/'.join(lean_decoder.ARCHITECTURES)} "
                f"target on --device cpu, DRAFTSMITH_FAST not 0), which {name} does not take: use --quantize none"
            )
        self.quantize = quantize

    @property
    def path(self) -> str:
        """Which forward the engine's steps take: "lean" (compiled or not) or "stock" (transformers)."""
        if not self.lean_ok:
            return "stock"
        path = "lean" if os.environ.get("DRAFTSMITH_COMPILE", "1") == "0" else "lean-compiled"
        return path if self.quantize == "none" else f"{path}-{self.quantize}"

    def lean(self) -> lean_decoder.LeanDecoder:
        if self._lean is None:
            self._lean = lean_decoder.LeanDecoder(self.model, self.quantize)
            if self._head_rows is not None:
                self._lean.restrict_head(self._head_rows)
        return self._lean

    def restrict_head(self, rows: torch.Tensor) -> None:
        """Compute logits for these token ids only, in this order: logit j is token rows[j]'s.

        For a draft model, whose LM head is most of what a draft step reads (SmolLM2's 49,152 x 576
        head is 28M of a 5-layer draft's 46M weights); the engine never restricts a target."""
        full = self.model.get_output_embeddings()
        rows = rows.to(full.weight.device)
        self.head, self._head_rows = linear_rows(full, rows), rows
        if self._lean is not None:
            self._lean.restrict_head(rows)

    # --- cost facts the simulator and reports use -----------------------------------------------

    @property
    def is_hybrid(self) -> bool:
        return bool(self.linear_layers)

    def new_cache(self, batch: int, capacity: int) -> RaggedCache:
        cfg = self.config
        heads = cfg.num_attention_heads
        return RaggedCache(
            batch=batch,
            capacity=capacity,
            attention_layers=self.attention_layers,
            linear_layers=self.linear_layers,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            dtype=self.dtype,
            device=self.device,
        )

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def forward(
        self,
        cache: RaggedCache,
        input_ids: torch.Tensor,  # [b, q]
        rows: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,  # [b] one position per row, or None for all q
        feature_layers: tuple[int, ...] = (),
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,  # (depth [b, q], ancestor-or-self [b, q, q])
    ) -> ForwardOut:
        """Run q new tokens per row at each row's own offset; the cache lengths are not advanced.

        With `tree`, token j of a row sits at position length + depth[j] and attends to the cache and
        to its ancestors only, so a whole draft tree is verified in one forward."""
        b, q = input_ids.shape
        if self.lean_ok and not cache.has_recurrent_state:
            return self._lean_forward(cache, input_ids, rows, logit_index, feature_layers, tree)
        positions = cache.begin(rows, q)
        stock_attention = self.config._attn_implementation
        try:
            if tree is None:
                mask = self._masks(positions, cache._kv_len)
            else:
                mask, positions = self._tree_masks(positions, tree, cache._kv_len)
            if stock_attention in ("sdpa", None):
                self.config._attn_implementation_internal = attention.NAME
            out = self.base(
                input_ids=input_ids.to(self.device),
                position_ids=positions.to(self.device),
                attention_mask=mask,
                cache=cache,
                use_cache=True,
                output_hidden_states=any(i != FINAL_HIDDEN for i in feature_layers),
            )
        finally:
            cache.end()
            self.config._attn_implementation_internal = stock_attention
        hidden = out.last_hidden_state  # [b, q, hidden]
        if logit_index is not None:
            hidden = hidden[torch.arange(b), logit_index.to(self.device)][:, None]
        logits = self.head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        feats = None
        if feature_layers:
            # Layer id i is the output of decoder layer i, i.e. hidden_states[i + 1].
            feats = torch.stack(
                [
                    out.last_hidden_state if i == FINAL_HIDDEN else out.hidden_states[i + 1]
                    for i in feature_layers
                ],
                dim=2,
            )
        return ForwardOut(logits=logits, features=feats)

    def _lean_forward(self, cache, input_ids, rows, logit_index, feature_layers, tree) -> ForwardOut:
        b, q = input_ids.shape
        slots = cache.begin(rows, q)
        try:
            kv_len = cache._kv_len
            if tree is None:
                positions = slots
                mask = self._masks(slots, kv_len)
                if mask is None:
                    mask = torch.ones(1, 1, 1, kv_len, dtype=torch.bool)
            else:
                mask, positions = self._tree_masks(slots, tree, kv_len)
            if isinstance(mask, dict):  # every layer is full attention on this path
                mask = mask["full_attention"]
            layers = [cache.keys[i] for i in self.attention_layers]
            values = [cache.values[i] for i in self.attention_layers]
            keep = tuple(i for i in feature_layers if i != FINAL_HIDDEN)
            # Every row empty and no tree: the mask is the plain causal one, which SDPA need not read.
            causal = tree is None and kv_len == q
            hidden, kept = self.lean().forward(
                layers, values, input_ids, slots, positions, mask, rows, keep, causal=causal
            )
        finally:
            cache.end()
        feats = None
        if feature_layers:
            # As in transformers' hidden_states, the last layer's output is the final-normed one.
            final = (FINAL_HIDDEN, self.num_layers - 1)
            feats = torch.stack([hidden if i in final else kept[i] for i in feature_layers], dim=2)
        if logit_index is not None:
            hidden = hidden[torch.arange(b), logit_index][:, None]
        return ForwardOut(logits=self._lean.logits(hidden), features=feats)

    def _tree_masks(self, slots: torch.Tensor, tree, kv_len: int):
        depth, anc = tree
        if self.sliding_window and "sliding_attention" in self.layer_types:
            raise UserError(
                "tree drafts are not supported on sliding-window targets yet: use a chain drafter"
            )
        mask = _tree_mask_4d(slots, anc, kv_len).to(self.device)
        positions = slots[:, :1] + depth
        if not self._mask_dict:
            return mask, positions
        return {t: mask for t in set(self.layer_types)}, positions

    def _masks(self, positions: torch.Tensor, kv_len: int):
        # Query at absolute position p sees keys 0..p of its own row; nothing past it (rejected or
        # padded positions from earlier forwards sit there until overwritten).
        if positions.shape == (1, 1) and not self._mask_dict:
            return None  # one row, one query: every cached key is visible (and SDPA takes its fast path)
        keys = torch.arange(kv_len)
        pos = positions[:, None, :, None]  # [b, 1, q, 1]
        causal = keys <= pos
        causal_dev = causal.to(self.device)
        if not self._mask_dict:
            return causal_dev
        masks: dict[str, torch.Tensor | None] = {}
        for t in set(self.layer_types):
            if t == "full_attention":
                masks[t] = causal_dev
            elif t == "sliding_attention":
                masks[t] = (causal & (keys > pos - self.sliding_window)).to(self.device)
            elif t == "linear_attention":
                masks[t] = None  # no padding inside a row's real tokens; see RaggedCache on replay
            else:
                raise UserError(f"target layer type '{t}' is not supported yet")
        return masks


def _tree_mask_4d(slots: torch.Tensor, anc: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[b, 1, q, kv_len]: every committed key, plus the tree's own keys that are ancestors-or-self."""
    start = slots[:, :1]  # [b, 1] first slot of this forward = committed length
    keys = torch.arange(kv_len)[None, :]  # [1, kv]
    committed = keys < start  # [b, kv]
    offset = (keys - start).clamp(0, anc.shape[-1] - 1)  # [b, kv] index into the tree window
    in_window = (keys >= start) & (keys < start + anc.shape[-1])
    tree_vis = torch.gather(anc, 2, offset[:, None, :].expand(-1, anc.shape[1], -1))  # [b, q, kv]
    return (committed[:, None, :] | (in_window[:, None, :] & tree_vis))[:, None]


def _eos_ids(model: PreTrainedModel, tokenizer) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is None:
            continue
        ids.update(eos if isinstance(eos, list | tuple) else [eos])
    return ids


def linear_rows(full: torch.nn.Linear, rows: torch.Tensor) -> torch.nn.Linear:
    """A frozen copy of `full` holding only its output rows `rows` (on its device), in that order."""
    head = torch.nn.Linear(full.in_features, len(rows), bias=full.bias is not None)
    head.to(full.weight.device, full.weight.dtype).requires_grad_(False)
    head.weight.data.copy_(full.weight.data[rows])
    if full.bias is not None:
        head.bias.data.copy_(full.bias.data[rows])
    return head


def load_target(spec: str, dtype: str = "auto", device: str = "cpu", quantize: str = "none") -> Target:
    """Resolve `--target` (embedded name, HF folder, hub id, .gguf) and load it."""
    from draftsmith.target.resolve import resolve_target

    resolved = resolve_target(spec)
    hf_logging.disable_progress_bar()  # a load of a converted checkpoint takes a second; no bars
    dev = parse_device(device)
    torch_dtype = parse_dtype(dtype, dev)
    try:
        config = AutoConfig.from_pretrained(resolved.model_path)
        tokenizer = AutoTokenizer.from_pretrained(resolved.model_path)
        model = AutoModelForCausalLM.from_pretrained(resolved.model_path, config=config, dtype=torch_dtype)
    except OSError as e:
        raise UserError(f"cannot load target '{spec}': {str(e).splitlines()[0]}") from None
    return Target(
        model.to(dev), tokenizer, name=resolved.name, gguf_path=resolved.gguf_path, quantize=quantize
    )

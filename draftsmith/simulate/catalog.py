"""Model shapes for the simulator: a catalog of public models and a reader for any HF `config.json`.

Every catalog entry is an excerpt of the model's public `config.json` (the fields the cost model
needs) with the URL it came from, and goes through the same reader as a user's own config, so the
catalog and `--model path/to/config.json` cannot disagree on what a field means.

What it knows: layer counts, widths, attention and KV heads, head dims, dense and expert MLP widths,
experts and active experts, shared experts, the first dense layers of DeepSeek-style MoE,
multi-head latent attention (DeepSeek-V3), Gated DeltaNet linear-attention layers (Qwen3-Next,
Qwen3.5/3.6, read from a nested `text_config` when present), tied embeddings, MTP layers.
What it does not: vision towers (text decoding never runs them), sliding windows (a window is
treated as full attention: an upper bound on KV reads), biases and norms (a rounding error).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import UserError
from draftsmith.formats.kind import read_json_object

_HF = "https://huggingface.co/{}/blob/main/config.json"


@dataclass(frozen=True)
class ModelShape:
    """What one decode step of a model reads and computes, per layer kind."""

    name: str
    source: str  # URL of the public config, or the local path
    num_layers: int
    hidden: int
    vocab: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (0 when every layer is MoE)
    tie_embeddings: bool = False
    attn_output_gate: bool = False  # Qwen3-Next/3.5 gated attention: q_proj also emits a gate
    # Linear attention (Gated DeltaNet): how many layers, and their head layout.
    num_linear_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 4
    # Mixture of experts.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # total width of the always-on shared expert(s)
    num_dense_layers: int = 0  # DeepSeek first_k_dense_replace: leading layers with a dense MLP
    # Multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent per token.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_attention_layers(self) -> int:
        return self.num_layers - self.num_linear_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # --- parameters, per layer kind ----------------------------------------------------------

    @property
    def attention_params(self) -> int:
        """One full-attention layer's projections."""
        h = self.hidden
        if self.is_mla:
            qk = self.qk_nope_dim + self.qk_rope_dim
            q = (
                (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk)
                if self.q_lora_rank
                else h * self.num_heads * qk
            )
            kv = h * (self.kv_lora_rank + self.qk_rope_dim) + self.kv_lora_rank * self.num_heads * (
                self.qk_nope_dim + self.v_head_dim
            )
            return q + kv + self.num_heads * self.v_head_dim * h
        q_out = self.num_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        kv_out = 2 * self.num_kv_heads * self.head_dim
        return h * (q_out + kv_out) + self.num_heads * self.head_dim * h

    @property
    def linear_attention_params(self) -> int:
        """One Gated DeltaNet layer: q/k/v/z and b/a projections, short convolution, output."""
        h = self.hidden
        qk = 2 * self.linear_key_heads * self.linear_key_dim
        v = self.linear_value_heads * self.linear_value_dim
        return h * (qk + 2 * v + 2 * self.linear_value_heads) + (qk + v) * self.linear_conv_kernel + v * h

    @property
    def expert_params(self) -> int:
        """One routed expert of one layer (SwiGLU: gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def always_on_params(self) -> int:
        """Weights every decode step reads whatever the tokens: attention, dense MLPs, shared
        experts, routers and the LM head. The embedding table is not read, only B*q rows of it."""
        attn = self.num_attention_layers * self.attention_params
        attn += self.num_linear_layers * self.linear_attention_params
        if self.is_moe:
            mlp = self.num_dense_layers * self.dense_mlp_params
            moe = self.num_moe_layers * (
                3 * self.hidden * self.shared_intermediate + self.hidden * self.num_experts
            )
        else:
            mlp, moe = self.num_layers * self.dense_mlp_params, 0
        return attn + mlp + moe + self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        routed = self.num_moe_layers * self.num_experts * self.expert_params
        embed = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.always_on_params + routed + embed

    @property
    def active_params(self) -> int:
        """Parameters one token uses (embedding row excluded)."""
        return self.always_on_params + self.num_moe_layers * self.experts_per_token * self.expert_params

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """Cache bytes one context token adds, over all full-attention layers."""
        if self.is_mla:
            per_layer = self.kv_lora_rank + self.qk_rope_dim
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim
        return self.num_attention_layers * per_layer * kv_bytes

    @property
    def linear_state_elems(self) -> int:
        """Recurrent state of one sequence over all linear-attention layers (kept in fp32)."""
        per_layer = self.linear_value_heads * self.linear_key_dim * self.linear_value_dim
        conv = (
            2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim
        ) * (self.linear_conv_kernel - 1)
        return self.num_linear_layers * (per_layer + conv)


# --- reading HF configs ------------------------------------------------------------------------


def _get(cfg: dict, *names: str, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def shape_from_config(cfg: dict, name: str, source: str) -> ModelShape:
    """Build a ModelShape from a HF config dict (a multimodal config's `text_config` is used)."""
    outer = cfg
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"]}
        cfg.setdefault("tie_word_embeddings", outer.get("tie_word_embeddings"))
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"model config {source} lacks {e}: give a decoder LM config.json") from None
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    model_type = str(_get(cfg, "model_type", default=outer.get("model_type", "")))

    types = cfg.get("layer_types")
    if types is None and cfg.get("full_attention_interval"):
        every = int(cfg["full_attention_interval"])
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    n_linear = sum(t == "linear_attention" for t in types) if types else 0

    experts = int(_get(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0))
    shared = int(_get(cfg, "shared_expert_intermediate_size", default=0))
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=0))
    if experts and not shared and cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * moe_inter
    if experts and not moe_inter:  # Mixtral-style: experts as wide as the dense MLP would be
        moe_inter = int(cfg["intermediate_size"])
    dense_layers = int(_get(cfg, "first_k_dense_replace", default=0)) if experts else 0
    dense_inter = int(_get(cfg, "intermediate_size", default=0))
    if experts and model_type.startswith("llama4"):
        # Llama 4: one always-on shared expert as wide as a routed one, and with
        # interleave_moe_layer_step s only every s-th layer is MoE (the rest use intermediate_size_mlp).
        shared = shared or moe_inter
        step = int(_get(cfg, "interleave_moe_layer_step", default=1))
        dense_layers = layers - layers // max(step, 1)
        dense_inter = int(_get(cfg, "intermediate_size_mlp", default=dense_inter))

    return ModelShape(
        name=name,
        source=source,
        num_layers=layers,
        hidden=hidden,
        vocab=vocab,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=dense_inter if (not experts or dense_layers) else 0,
        tie_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
        attn_output_gate=bool(
            _get(cfg, "attn_output_gate", default=model_type.startswith(("qwen3_next", "qwen3_5")))
        ),
        num_linear_layers=n_linear,
        linear_key_heads=int(_get(cfg, "linear_num_key_heads", default=0)) if n_linear else 0,
        linear_value_heads=int(_get(cfg, "linear_num_value_heads", default=0)) if n_linear else 0,
        linear_key_dim=int(_get(cfg, "linear_key_head_dim", default=0)) if n_linear else 0,
        linear_value_dim=int(_get(cfg, "linear_value_head_dim", default=0)) if n_linear else 0,
        linear_conv_kernel=int(_get(cfg, "linear_conv_kernel_dim", default=4)),
        num_experts=experts,
        experts_per_token=int(_get(cfg, "num_experts_per_tok", "num_experts_per_token", default=0)),
        moe_intermediate=moe_inter if experts else 0,
        shared_intermediate=shared,
        num_dense_layers=dense_layers,
        kv_lora_rank=int(_get(cfg, "kv_lora_rank", default=0)),
        q_lora_rank=int(_get(cfg, "q_lora_rank", default=0)),
        qk_nope_dim=int(_get(cfg, "qk_nope_head_dim", default=0)),
        qk_rope_dim=int(_get(cfg, "qk_rope_head_dim", default=0)),
        v_head_dim=int(_get(cfg, "v_head_dim", default=0)),
        mtp_layers=int(
            _get(cfg, "mtp_num_hidden_layers", "num_nextn_predict_layers", "num_mtp_modules", default=0)
        ),
    )


# --- the catalog ---------------------------------------------------------------------------------
# Excerpts of the public configs (only the fields the cost model reads). Qwen3.5/3.6 keep their
# text model under `text_config`, as their configs do; their linear-attention layout comes from
# `full_attention_interval` (every 4th layer is full attention).


def _qwen35(hidden, layers, heads, kv, v_heads, vocab=248320, tie=False, **extra) -> dict:
    text = {
        "model_type": "qwen3_5_moe_text" if "num_experts" in extra else "qwen3_5_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 256,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "vocab_size": vocab,
        "mtp_num_hidden_layers": 1,
        **extra,
    }
    return {
        "model_type": "qwen3_5_moe" if "num_experts" in extra else "qwen3_5",
        "tie_word_embeddings": tie,
        "text_config": text,
    }


def _dense(model_type, hidden, inter, layers, heads, kv, vocab, head_dim=None, tie=False) -> dict:
    cfg = {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": tie,
    }
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


def _deepseek_v3(heads, experts, dense_layers, vocab, nextn, text_type="deepseek_v3") -> dict:
    """DeepSeek-V3's layout (MLA, 61 layers, 7168 wide, 2048-wide experts, one shared expert);
    Kimi K2 / K2.5 / K2.6 keep it with 64 heads, 384 experts and one leading dense layer."""
    return {
        "model_type": text_type,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": dense_layers,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": vocab,
        "num_nextn_predict_layers": nextn,
        "tie_word_embeddings": False,
    }


def _kimi_k25() -> dict:
    # K2.5/K2.6 are multimodal: the language model sits under text_config (a DeepSeek-V3 config).
    return {
        "model_type": "kimi_k25",
        "tie_word_embeddings": False,
        "text_config": _deepseek_v3(64, 384, 1, 163840, 0, text_type="kimi_k2"),
    }


_QWEN35_MOE_35B = dict(
    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512
)

CATALOG: dict[str, tuple[str, dict]] = {
    # name: (hub repo whose config.json this excerpts, config)
    "smollm2-135m": (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        _dense("llama", 576, 1536, 30, 9, 3, 49152, 64, tie=True),
    ),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", _dense("llama", 4096, 14336, 32, 32, 8, 128256)),
    "llama-3.3-70b": ("meta-llama/Llama-3.3-70B-Instruct", _dense("llama", 8192, 28672, 80, 64, 8, 128256)),
    "qwen3-8b": ("Qwen/Qwen3-8B", _dense("qwen3", 4096, 12288, 36, 32, 8, 151936, 128)),
    "qwen3-32b": ("Qwen/Qwen3-32B", _dense("qwen3", 5120, 25600, 64, 64, 8, 151936, 128)),
    "qwen3-30b-a3b": (
        "Qwen/Qwen3-30B-A3B",
        {
            **_dense("qwen3_moe", 2048, 6144, 48, 32, 4, 151936, 128),
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
        },
    ),
    "qwen3.5-4b": ("Qwen/Qwen3.5-4B", _qwen35(2560, 32, 16, 4, 32, tie=True, intermediate_size=9216)),
    "qwen3.5-9b": ("Qwen/Qwen3.5-9B", _qwen35(4096, 32, 16, 4, 32, intermediate_size=12288)),
    "qwen3.5-27b": ("Qwen/Qwen3.5-27B", _qwen35(5120, 64, 24, 4, 48, intermediate_size=17408)),
    "qwen3.5-35b-a3b": ("Qwen/Qwen3.5-35B-A3B", _qwen35(2048, 40, 16, 2, 32, **_QWEN35_MOE_35B)),
    "qwen3.5-122b-a10b": (
        "Qwen/Qwen3.5-122B-A10B",
        _qwen35(
            3072,
            48,
            32,
            2,
            64,
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=1024,
            shared_expert_intermediate_size=1024,
        ),
    ),
    "qwen3.5-397b-a17b": (
        "Qwen/Qwen3.5-397B-A17B",
        _qwen35(
            4096,
            60,
            32,
            2,
            64,
            num_experts=512,
            num_experts_per_tok=10,
            moe_intermediate_size=1024,
            shared_expert_intermediate_size=1024,
        ),
    ),
    "qwen3.6-35b-a3b": ("Qwen/Qwen3.6-35B-A3B", _qwen35(2048, 40, 16, 2, 32, **_QWEN35_MOE_35B)),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", _deepseek_v3(128, 256, 3, 129280, 1)),
    "deepseek-r1": ("deepseek-ai/DeepSeek-R1", _deepseek_v3(128, 256, 3, 129280, 1)),
    "kimi-k2.5": ("moonshotai/Kimi-K2.5", _kimi_k25()),
    "kimi-k2.6": ("moonshotai/Kimi-K2.6", _kimi_k25()),
    "minimax-m2.5": (
        "MiniMaxAI/MiniMax-M2.5",
        {
            # Mixtral-style keys: intermediate_size is each routed expert's width; no shared expert.
            "model_type": "minimax_m2",
            "hidden_size": 3072,
            "intermediate_size": 1536,
            "num_hidden_layers": 62,
            "num_attention_heads": 48,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "num_local_experts": 256,
            "num_experts_per_tok": 8,
            "vocab_size": 200064,
            "num_mtp_modules": 3,
            "tie_word_embeddings": False,
        },
    ),
    "llama-4-scout-17b-16e": (
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        {
            "model_type": "llama4",
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": "llama4_text",
                "hidden_size": 5120,
                "intermediate_size": 8192,
                "intermediate_size_mlp": 16384,
                "num_hidden_layers": 48,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "num_local_experts": 16,
                "num_experts_per_tok": 1,
                "interleave_moe_layer_step": 1,
                "vocab_size": 202048,
            },
        },
    ),
}


def load_model(spec: str) -> ModelShape:
    """A catalog name (case-insensitive), a `config.json` path, or a folder holding one."""
    key = spec.strip().lower()
    if key in CATALOG:
        repo, cfg = CATALOG[key]
        return shape_from_config(cfg, key, _HF.format(repo))
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(
            f"--model '{spec}' is neither a catalog model ({', '.join(CATALOG)}) nor a config.json path"
        )
    cfg = read_json_object(path, "model config ")
    return shape_from_config(cfg, path.parent.name or str(path), str(path))

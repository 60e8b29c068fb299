"""`draftsmith data features`: the target's hidden states for a training set, written once to disk.

Online features (the default in training) run the frozen target on every batch of every epoch;
offline features pay that forward once and let later epochs, learning-rate sweeps and other drafters
read them back. What is stored per token: the hidden states of the chosen feature layers (layer id i
is HF `hidden_states[i+1]`, the output of decoder layer i) and the target's last hidden state after
its final norm, from which the trainer gets the target's logits with the LM head (a [H, V] product,
much cheaper than the forward, and 1/(K+1) of the bytes that storing logits would take).

Layout of OUT: `index.json` (target, layers, data digest, max_len, the shards and the example range
each holds) and `shard-NNNNN.safetensors`, each with `features` [tokens, K, H], `hidden` [tokens, H]
and `offsets` [examples + 1] (where each example's tokens start). Every shard is written to a
temporary name and renamed, so a killed run leaves only whole shards, and rerunning the same command
keeps them and writes the rest. This module knows the target forward and the file layout; it does not
know drafters or losses.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.command import add_dtype_device_args
from draftsmith.errors import UserError

INDEX = "index.json"
FORMAT_VERSION = 1


def bytes_per_token(num_layers: int, hidden: int, dtype: torch.dtype) -> int:
    """K feature layers plus the final hidden state, H values each.

    >>> bytes_per_token(3, 576, torch.bfloat16)
    4608
    """
    return (num_layers + 1) * hidden * torch.empty((), dtype=dtype).element_size()


def examples_digest(examples) -> str:
    """Identifies the tokenised examples, so features are never paired with other tokens."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(len(ex.input_ids).to_bytes(4, "little"))
        h.update(b"".join(int(t).to_bytes(4, "little") for t in ex.input_ids))
    return h.hexdigest()


def plan_shards(lengths: list[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive example ranges [a, b) of about shard_tokens tokens each (an example never splits).

    >>> plan_shards([3, 3, 3, 10, 1], 6)
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    ranges, start, acc = [], 0, 0
    for i, n in enumerate(lengths):
        if acc and acc + n > shard_tokens:
            ranges.append((start, i))
            start, acc = i, 0
        acc += n
    if start < len(lengths):
        ranges.append((start, len(lengths)))
    return ranges


# ---- writing ------------------------------------------------------------------------------------


def write_features(
    target,
    examples,
    layers: list[int],
    out: str | os.PathLike,
    *,
    shard_tokens: int = 65536,
    batch_tokens: int = 4096,
    dtype: torch.dtype = torch.bfloat16,
    meta: dict | None = None,
    progress: bool = True,
    free_bytes: int | None = None,
) -> dict:
    """Write (or complete) the feature store for `examples`; returns the index."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    out = Path(out)
    lengths = [len(ex.input_ids) for ex in examples]
    hidden = target.config.hidden_size
    per_token = bytes_per_token(len(layers), hidden, dtype)
    ranges = plan_shards(lengths, shard_tokens)
    header = {
        "format_version": FORMAT_VERSION,
        "target": target.name,
        "layers": list(layers),
        "hidden_size": hidden,
        "dtype": str(dtype).removeprefix("torch."),
        "examples_sha256": examples_digest(examples),
        "num_examples": len(examples),
        "num_tokens": sum(lengths),
        "shard_tokens": shard_tokens,
    } | (meta or {})
    _check_existing(out, header)
    done = {i for i, _ in enumerate(ranges) if (out / _shard_name(i)).exists()}
    todo_tokens = sum(sum(lengths[a:b]) for i, (a, b) in enumerate(ranges) if i not in done)
    need = todo_tokens * per_token
    free = shutil.disk_usage(_existing_parent(out)).free if free_bytes is None else free_bytes
    sys.stderr.write(
        f"features: {len(examples)} examples, {sum(lengths)} tokens, {len(layers)} layers + final hidden "
        f"-> {_gb(sum(lengths) * per_token)} in {len(ranges)} shards; {_gb(need)} still to write, "
        f"{_gb(free)} free\n"
    )
    if need * 1.05 > free:
        raise UserError(
            f"features need {_gb(need)} but only {_gb(free)} is free under {out}: free space, "
            f"choose another --out, or lower --max-len/--num"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write_index(out, header | {"shards": [], "complete": False})
    bar = tqdm(total=todo_tokens, unit="tok", disable=not progress, desc="features")
    for i, (a, b) in enumerate(ranges):
        if i in done:
            continue
        feats, finals = [], []
        for chunk in _chunks(list(range(a, b)), lengths, batch_tokens):
            f, h = target_features(target, [examples[j] for j in chunk], layers)
            feats += [x.to(dtype) for x in f]
            finals += [x.to(dtype) for x in h]
            bar.update(sum(lengths[j] for j in chunk))
        offsets = torch.tensor([0, *torch.tensor(lengths[a:b]).cumsum(0).tolist()], dtype=torch.long)
        tensors = {"features": torch.cat(feats), "hidden": torch.cat(finals), "offsets": offsets}
        path = out / _shard_name(i)
        tmp = path.with_name(f".{path.name}.tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"first": str(a)})
        os.replace(tmp, path)
    bar.close()
    index = header | {"shards": [[_shard_name(i), a, b] for i, (a, b) in enumerate(ranges)], "complete": True}
    _write_index(out, index)
    return index


@torch.inference_mode()
def target_features(target, examples, layers: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per example: features [n, K, H] and the final normed hidden state [n, H], on the CPU."""
    from draftsmith.train.data import pack
    from draftsmith.train.target_pass import can_pack, packed_forward

    max_len = max(len(ex.input_ids) for ex in examples)
    batch = pack(examples, max_len, packing=can_pack(target)).to(target.device)
    out = packed_forward(target, target.base, batch)
    feats = torch.stack([out.hidden_states[i + 1] for i in layers], dim=2)  # [b, T, K, H]
    final = out.last_hidden_state  # after the final norm, what the LM head reads
    per_f: list[torch.Tensor] = [torch.empty(0)] * len(examples)
    per_h: list[torch.Tensor] = [torch.empty(0)] * len(examples)
    for j in range(len(examples)):
        b, t = (batch.segments == j).nonzero(as_tuple=True)
        per_f[j] = feats[b, t].cpu()
        per_h[j] = final[b, t].cpu()
    return per_f, per_h


def _chunks(indices: list[int], lengths: list[int], batch_tokens: int) -> list[list[int]]:
    chunks, cur, acc = [], [], 0
    for i in indices:
        if cur and acc + lengths[i] > batch_tokens:
            chunks.append(cur)
            cur, acc = [], 0
        cur.append(i)
        acc += lengths[i]
    return chunks + ([cur] if cur else [])


def _check_existing(out: Path, header: dict) -> None:
    path = out / INDEX
    if not path.exists():
        if out.exists() and any(out.iterdir()):
            raise UserError(f"{out} exists and is not a feature store: choose an empty or new --out")
        return
    old = json.loads(path.read_text())
    diff = [k for k in header if old.get(k) != header[k]]
    if diff:
        raise UserError(
            f"{out} holds features made with other settings ({', '.join(diff)}): use a new --out or delete it"
        )


def _write_index(out: Path, index: dict) -> None:
    from draftsmith.fileio import atomic_write_json

    atomic_write_json(out / INDEX, index)


def _shard_name(i: int) -> str:
    return f"shard-{i:05d}.safetensors"


def _existing_parent(p: Path) -> Path:
    p = p.absolute()
    while not p.exists():
        p = p.parent
    return p


def _gb(n: float) -> str:
    if n >= 1e8:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


# ---- reading ------------------------------------------------------------------------------------


@dataclass
class FeatureStore:
    """Read side: features and final hidden states of example i, memory-mapped from the shards."""

    root: Path
    index: dict

    @classmethod
    def open(cls, root: str | os.PathLike, examples=None, layers: list[int] | None = None) -> FeatureStore:
        root = Path(root)
        path = root / INDEX
        if not path.exists():
            raise UserError(f"{root} is not a feature store (no {INDEX}): run `draftsmith data features`")
        index = json.loads(path.read_text())
        if not index.get("complete"):
            raise UserError(
                f"the feature store {root} is incomplete: rerun the same `draftsmith data features`"
            )
        if examples is not None and index["examples_sha256"] != examples_digest(examples):
            raise UserError(
                f"the features in {root} were made from other data or another --max-len: "
                f"rerun `draftsmith data features` on this data"
            )
        if layers is not None and not set(layers) <= set(index["layers"]):
            raise UserError(
                f"the features in {root} hold layers {index['layers']}, the drafter needs {layers}: "
                f"rerun `draftsmith data features --layers {','.join(map(str, layers))}`"
            )
        return cls(root, index)

    def __post_init__(self) -> None:
        from safetensors import safe_open

        self._shards = []
        self._starts = []
        for name, a, _b in self.index["shards"]:
            f = safe_open(str(self.root / name), framework="pt")
            self._shards.append((f, f.get_tensor("offsets")))
            self._starts.append(a)

    def get(self, i: int, layers: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [n, K', H] in the order of `layers`, final hidden [n, H]) of example i."""
        s = bisect.bisect_right(self._starts, i) - 1  # the shard whose first example is <= i
        f, offsets = self._shards[s]
        lo, hi = int(offsets[i - self._starts[s]]), int(offsets[i - self._starts[s] + 1])
        feats = f.get_slice("features")[lo:hi]
        if layers is not None:
            feats = feats[:, [self.index["layers"].index(x) for x in layers]]
        return feats, f.get_slice("hidden")[lo:hi]


# ---- command line -------------------------------------------------------------------------------


def add_features_parser(subparsers) -> argparse.ArgumentParser:
    """Add `features` to the subparsers of `draftsmith data`."""
    p = subparsers.add_parser("features", help="write the target's hidden states for training data to disk")
    p.add_argument("--target", default="smollm2-135m", help="smollm2-135m, HF folder, hub id or .gguf")
    add_dtype_device_args(p)
    p.add_argument("--data", required=True, help="conversations .jsonl (from `draftsmith data regenerate`)")
    p.add_argument("--max-len", type=int, default=2048, help="tokens per example, as in training")
    p.add_argument("--layers", default="eagle3", help="eagle3, or comma-separated target layer ids")
    p.add_argument("--shard-tokens", type=int, default=65536)
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per target forward")
    p.add_argument("--out", required=True)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_features)
    return p


def parse_layers(spec: str, num_layers: int) -> list[int]:
    from draftsmith.drafters.eagle3 import feature_layers

    if spec == "eagle3":
        return feature_layers(num_layers)
    try:
        layers = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"--layers '{spec}' must be 'eagle3' or comma-separated layer ids like 1,14,26"
        ) from None
    bad = [x for x in layers if not 0 <= x < num_layers]
    if not layers or bad:
        raise UserError(f"--layers '{spec}': ids must lie in 0..{num_layers - 1}")
    return layers


def cmd_features(args) -> int:
    from draftsmith.target.model import load_target
    from draftsmith.train.data import load_conversations, tokenize_dataset

    for flag, v in (("--max-len", args.max_len), ("--shard-tokens", args.shard_tokens),
                    ("--batch-tokens", args.batch_tokens)):  # fmt: skip
        if v <= 0:
            raise UserError(f"{flag} {v} must be positive")
    records = load_conversations(args.data)
    target = load_target(args.target, args.dtype, args.device)
    target.model.requires_grad_(False)
    layers = parse_layers(args.layers, target.num_layers)
    examples = tokenize_dataset(target.tokenizer, records, args.max_len, progress=not args.no_progress)
    index = write_features(
        target,
        examples,
        layers,
        args.out,
        shard_tokens=args.shard_tokens,
        batch_tokens=args.batch_tokens,
        dtype=target.dtype,  # what --dtype resolved to: a bf16 target's features are bf16 values
        meta={"data": os.path.basename(args.data), "max_len": args.max_len},
        progress=not args.no_progress,
    )
    print(json.dumps({"out": args.out, "examples": index["num_examples"], "tokens": index["num_tokens"]}))
    return 0

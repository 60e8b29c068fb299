"""Is a DFlash draft learning, or only predicting token frequencies? Two probes on the embedded target.

    # per-slot accuracy of a trained speculator on blocks of its data, with the target's features,
    # with zeroed features and with features shifted by 37 positions, against the most frequent label
    python benchmarks/dflash_probe.py check speculators/smollm2-135m-dflash --data data/smollm2-train.jsonl

    # a small fresh draft trained on consecutive batches, scored on a held-out batch every 25 steps;
    # --init target copies the target's layers after the first feature layer into the draft
    python benchmarks/dflash_probe.py learn --data data/smollm2-train.jsonl --layers 1 --block-size 4 \
        --steps 100 --init random

A draft that uses the anchor and the context scores higher at slot 1 than at the last slot, and
worse without the features. These are the numbers the README's DFlash section quotes. Float32 so
that two runs agree; the loss and batching are the trainer's own (`dflash_loss`, `pack`,
`sample_blocks`), only the loop is shorter.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftsmith.drafters import dflash
from draftsmith.target.model import Target, load_target
from draftsmith.train.data import Example, load_conversations, pack, tokenize_dataset
from draftsmith.train.dflash_objective import dflash_loss, sample_blocks
from draftsmith.train.methods.common import batch_features

GAMMA = 7.0
ROW_TOKENS = 4096  # packed row length of a probe batch


def _blocks(
    target: Target, examples: list[Example], layers: list[int], block_size: int, anchors: int, seed: int
):
    batch = pack(examples, ROW_TOKENS)
    seeds = {i: seed * 100 + i for i in range(len(examples))}
    blocks = sample_blocks(
        batch.input_ids,
        batch.loss_mask,
        batch.segments,
        block_size=block_size,
        n_anchors=anchors,
        seeds=seeds,
    )
    return batch, blocks, batch_features(target, batch, layers)


def _score(model: dflash.DFlashModel, batch, blocks, features: torch.Tensor) -> tuple[float, list[float]]:
    with torch.no_grad():
        res = dflash_loss(
            model, batch.input_ids, features, blocks,
            segments=batch.segments, positions=batch.positions, gamma=GAMMA,
        )  # fmt: skip
    return float(res.loss), (res.correct.float() / res.counts.clamp(min=1)).tolist()


def _fmt(acc: list[float]) -> str:
    return (
        f"slot 1 {acc[0]:.3f}, slot 2 {acc[1]:.3f}, last slot {acc[-1]:.3f}"
        if len(acc) > 1
        else f"{acc[0]:.3f}"
    )


def check(args: argparse.Namespace, target: Target, examples: list[Example]) -> None:
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    model = dflash.load_dflash(args.speculator, embed, head, torch.float32)
    picked = examples[: args.examples]
    batch, blocks, feats = _blocks(target, picked, model.target_layer_ids, model.block_size, args.anchors, 0)
    for name, f in (("features", feats), ("zeroed", torch.zeros_like(feats)), ("shifted", feats.roll(37, 1))):
        loss, acc = _score(model, batch, blocks, f)
        print(f"{name:>9}: loss {loss:.3f}  acc {_fmt(acc)}")
    labels = blocks.labels[blocks.counted]
    top = int(labels.bincount().argmax())
    share = float((labels == top).float().mean())
    print(f"most frequent label {target.tokenizer.decode([top])!r}: {share:.3f} of the counted slots")


def _copy_target_layers(model: dflash.DFlashModel, target: Target, examples: list[Example]) -> None:
    """Draft layer i <- target layer (first feature layer + 1 + i); fc passes that feature through.

    The draft has q/k RMSNorms the Llama target lacks: they are set to the target's mean q/k RMS per
    head, so attention scores keep their size."""
    layers = target.model.model.layers
    first = model.target_layer_ids[0]
    src = [layers[min(first + 1 + i, len(layers) - 1)] for i in range(len(model.layers))]
    head_dim = model.config.head_dim
    rms: dict[tuple[int, str], float] = {}

    def hook(key):
        def f(_mod, _inp, out):
            rms[key] = float(out.view(*out.shape[:-1], -1, head_dim).pow(2).mean(-1).sqrt().mean())

        return f

    hooks = [  # measured on the first examples of the file
        getattr(layer.self_attn, name).register_forward_hook(hook((i, name)))
        for i, layer in enumerate(src)
        for name in ("q_proj", "k_proj")
    ]
    with torch.no_grad():
        target.model(input_ids=pack(examples[:3], 1 << 16).input_ids)
    for h in hooks:
        h.remove()
    H = model.config.hidden_size
    k = model.target_layer_ids.index(first)
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.weight[:, k * H : (k + 1) * H].copy_(torch.eye(H))
        model.hidden_norm.weight.copy_(src[0].input_layernorm.weight)
        model.norm.weight.copy_(target.model.model.norm.weight)
        for i, (draft, layer) in enumerate(zip(model.layers, src, strict=True)):
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(draft.self_attn, name).weight.copy_(getattr(layer.self_attn, name).weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(draft.mlp, name).weight.copy_(getattr(layer.mlp, name).weight)
            draft.input_layernorm.weight.copy_(layer.input_layernorm.weight)
            draft.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
            draft.self_attn.q_norm.weight.fill_(rms[(i, "q_proj")])
            draft.self_attn.k_norm.weight.fill_(rms[(i, "k_proj")])


def learn(args: argparse.Namespace, target: Target, examples: list[Example]) -> None:
    layers = dflash.default_target_layer_ids(target.num_layers)
    mask = dflash.default_mask_token_id(target.tokenizer, target.vocab_size)
    config = dflash.make_config(
        target.config,
        layers=args.layers,
        block_size=args.block_size,
        mask_token_id=mask,
        target_layer_ids=layers,
    )
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    model = dflash.DFlashModel(config, embed, head).float()
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(1)).tolist()
    held, train = [examples[i] for i in order[:6]], [examples[i] for i in order[6:]]
    if args.init == "target":
        _copy_target_layers(model, target, examples)
    held_batch = _blocks(target, held, layers, args.block_size, args.anchors, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    tokens, began = 0, time.perf_counter()
    for step in range(args.steps + 1):
        if step % 25 == 0 or step == args.steps:
            loss, acc = _score(model, *held_batch)
            print(f"step {step:4d}  tokens {tokens:7d}  held-out loss {loss:.3f}  acc {_fmt(acc)}", end="")
            print(f"  ({time.perf_counter() - began:.0f} s)", flush=True)
        if step == args.steps:
            break
        at = (step * 3) % len(train)
        batch, blocks, feats = _blocks(
            target, train[at : at + 3], layers, args.block_size, args.anchors, step + 1
        )
        tokens += batch.num_tokens
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 10)
        res = dflash_loss(
            model, batch.input_ids, feats, blocks,
            segments=batch.segments, positions=batch.positions, gamma=GAMMA,
        )  # fmt: skip
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="probe", required=True)
    c = sub.add_parser("check", help="per-slot accuracy of a trained DFlash speculator")
    c.add_argument("speculator")
    c.add_argument("--examples", type=int, default=4, help="every 50th conversation of --data")
    c.add_argument("--anchors", type=int, default=64)
    ln = sub.add_parser("learn", help="train a small fresh draft and watch held-out slot accuracy")
    ln.add_argument("--layers", type=int, default=1)
    ln.add_argument("--block-size", type=int, default=4)
    ln.add_argument("--steps", type=int, default=100)
    ln.add_argument("--lr", type=float, default=1e-3)
    ln.add_argument("--anchors", type=int, default=64)
    ln.add_argument("--init", choices=("random", "target"), default="random")
    for q, max_len in ((c, 2048), (ln, 1024)):
        q.add_argument("--data", default="data/smollm2-train.jsonl")
        q.add_argument("--target", default="smollm2-135m")
        q.add_argument("--max-len", type=int, default=max_len)
    args = p.parse_args()
    torch.manual_seed(0)
    target = load_target(args.target, "float32")
    records = load_conversations(args.data)
    if args.probe == "check":  # every 50th conversation: spread over the file, not one topic
        records = records[: 50 * args.examples : 50]
    examples = tokenize_dataset(target.tokenizer, records, args.max_len)
    (check if args.probe == "check" else learn)(args, target, examples)


if __name__ == "__main__":
    main()

"""`draftsmith train eagle3|dflash|mtp|draft-lm`: one training loop, read top to bottom, for every drafter.

setup (data, target, draft model, optimizer, the plan of global batches) -> resume (weights,
optimizer, RNG, data position, metrics) -> per step: the frozen target's features on this rank's
shard, the drafter's loss (`eagle3_objective`: TTT; `dflash_objective`: packed anchor blocks;
`mtp_objective`: the MTP head unrolled on its own outputs; `draft_lm_objective`: a small LM
distilled on the target's distribution),
gradients summed over ranks, clipping, AdamW at the scheduled learning rate -> metrics line,
held-out tau every `eval_every` steps (the real engine), atomic checkpoint every `save_every` steps
and at the end.

What differs between drafters lives in one small class each (`_Eagle3`, `_DFlash`, `_MTP`,
`_DraftLM`): how the
model is built, one step's forward/backward, and how it is exported. All report S per-position
numbers (EAGLE-3 and MTP: the unrolled steps; DFlash: the B-1 block slots; a draft LM: one, its
teacher-forced next-token agreement) in the same metrics layout.

Choices worth knowing:
- The learning-rate schedule (linear warmup, cosine to 0) spans all `epochs`; `max_steps` only
  stops early, as an interruption would, so `--max-steps k` then `--resume` equals one run.
- `time_budget` (seconds of training wall time, evaluations and checkpoints included) is for a
  machine held for a fixed time, as a leased GPU is: the schedule's progress is then whichever is
  further along, steps over all planned steps or wall time over the budget, and the run ends when
  either reaches 1, with the learning rate annealed to 0 on time. The last step is chosen so that
  it, the final evaluation and the final save (timed as the previous ones took) end within the
  budget. The step count then depends on the machine's speed, so such a run is not step-for-step
  reproducible.
- Draft weights are fp32 master weights; with bfloat16 the step runs under CPU/CUDA autocast and
  the target runs in bf16. The target (and so the shared embedding) is frozen: it is not in the
  optimizer and runs in inference mode.
- Only rank 0 evaluates, writes metrics and checkpoints.

This module knows the order of things; the math is in the objectives, batching in `data`, the
state on disk in `checkpoint`, collectives in `distributed`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from draftsmith.drafters import dflash
from draftsmith.drafters.eagle3 import Eagle3Model, feature_layers, load_eagle3, make_config
from draftsmith.drafters.mtp import build_head, load_head, save_head
from draftsmith.errors import UserError
from draftsmith.fileio import save_checkpoint_dir
from draftsmith.formats import draft_lm_format
from draftsmith.machine import auto_dtype
from draftsmith.target.model import FINAL_HIDDEN, load_target, parse_device, parse_dtype
from draftsmith.train import checkpoint, distributed
from draftsmith.train.data import (
    draft_vocab,
    load_conversations,
    pack,
    plan_batches,
    shard,
    token_ranking,
    tokenize_dataset,
)
from draftsmith.train.dflash_objective import anchor_seed, dflash_loss, sample_blocks
from draftsmith.train.draft_lm_objective import counted as draft_lm_counted
from draftsmith.train.draft_lm_objective import draft_lm_loss
from draftsmith.train.eagle3_init import token_attention, typical_rms
from draftsmith.train.eagle3_objective import TargetSignal, count_positions, ttt_loss
from draftsmith.train.evaluate import eval_prompts, measure_tau
from draftsmith.train.heldout import heldout_batches, score
from draftsmith.train.mtp_objective import count_positions as mtp_count_positions
from draftsmith.train.mtp_objective import mtp_loss
from draftsmith.train.target_pass import can_pack, packed_forward, stored_pass, target_pass

# Settings that define a run: a checkpoint resumes only under the same ones.
FINGERPRINT = (
    "target", "epochs", "lr", "batch_tokens", "max_len", "ttt_steps",
    "draft_vocab", "warmup_ratio", "grad_clip", "seed", "head_init",
)  # fmt: skip
DFLASH_FINGERPRINT = (
    "method", "target", "epochs", "lr", "batch_tokens", "max_len", "block_size", "layers",
    "anchors", "gamma", "target_layers", "mask_token_id", "warmup_ratio", "grad_clip", "seed",
)  # fmt: skip
MTP_FINGERPRINT = (
    "method", "target", "epochs", "lr", "batch_tokens", "max_len", "ttt_steps", "init",
    "warmup_ratio", "grad_clip", "seed",
)  # fmt: skip
DRAFT_LM_FINGERPRINT = (
    "method", "target", "epochs", "lr", "batch_tokens", "max_len", "layers", "hidden", "init_layers",
    "warmup_ratio", "grad_clip", "seed",
)  # fmt: skip
MTP_INITS = ("random", "last_layer", "native")  # or a folder holding a head (`mtp.*` tensors)


@dataclass
class TrainConfig:
    target: str
    data: str
    out: str
    epochs: int = 1
    lr: float = 1e-4
    batch_tokens: int = 4096
    max_len: int = 2048
    ttt_steps: int = 7
    draft_vocab: int = 32000
    head_init: str = "random"  # EAGLE-3: "random" or "target" (the target's LM head rows)
    attn_init: str = "token"  # EAGLE-3: "token" (`eagle3_init.token_attention`) or "random"
    warmup_ratio: float = 0.04
    grad_clip: float = 0.5
    eval_every: int = 200  # 0: only at the end of a run
    eval_workload: str = "chat"
    eval_prompts: int = 8  # 0: no held-out tau
    eval_max_new_tokens: int = 64
    eval_k: int | None = None  # drafted tokens per step when measuring tau; None = ttt_steps
    eval_data: str | None = None  # held-out conversations: teacher-forced accuracy per position
    eval_every_minutes: float | None = None  # also evaluate each time training wall time passes a multiple
    eval_at_start: bool = False  # held-out tau of the starting weights too, before the first step
    save_every: int | None = None  # None = eval_every; 0: only at the end of a run
    resume: bool = False
    seed: int = 0
    dtype: str = "auto"  # resolved by `train` to what the device computes natively
    device: str = "cpu"
    max_steps: int | None = None
    time_budget: float | None = None  # seconds; None = the schedule is steps alone
    progress: bool = True
    command: str = ""
    extra: dict = field(default_factory=dict)  # anything else to record in draftsmith.json
    method: str = "eagle3"  # or "dflash", "mtp"
    features: str | None = None  # an offline feature store (`draftsmith data features`); None = online
    # DFlash only
    block_size: int = 16
    layers: int = 5
    anchors: int = 512
    gamma: float = 7.0
    target_layers: list[int] | None = None  # None: K=5 spread from 1 to L-3
    mask_token_id: int | None = None  # None: `dflash.default_mask_token_id`
    norm_init: str = "scaled"  # "scaled" (`dflash.scale_output_norm`) or "ones"
    # MTP only
    init: str = "random"  # random, last_layer, native (the target's own head) or a head's folder
    # draft LM only (`layers` above is its depth when `init_layers` is None)
    hidden: int | None = None  # None: the target's width, sharing its (frozen) embedding and head
    init_layers: list[int] | None = None  # copy these target layers (and the final norm) to start

    @property
    def positions(self) -> int:
        """Per-position metrics: unrolled steps (EAGLE-3, MTP), block slots B-1 (DFlash), 1 (draft LM)."""
        return {"dflash": self.block_size - 1, "draft-lm": 1}.get(self.method, self.ttt_steps)


def lr_at(step: int, total: int, warmup: int, base: float) -> float:
    """Linear warmup over `warmup` steps, then cosine from `base` to 0 at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def lr_at_progress(progress: float, warmup_ratio: float, base: float) -> float:
    """The same shape over a progress fraction: linear warmup to `base` over the first
    `warmup_ratio`, then cosine to 0 at progress 1 (a time-budgeted run's schedule).

    >>> [round(lr_at_progress(p, 0.1, 1.0), 3) for p in (0.05, 0.1, 0.55, 1.0)]
    [0.5, 1.0, 0.5, 0.0]
    """
    progress = min(max(progress, 0.0), 1.0)
    if progress < warmup_ratio:
        return base * progress / warmup_ratio
    rest = (progress - warmup_ratio) / max(1e-12, 1.0 - warmup_ratio)
    return base * 0.5 * (1.0 + math.cos(math.pi * rest))


def train_eagle3(cfg: TrainConfig) -> dict:
    """Train (or resume) an EAGLE-3 draft; returns a summary. User mistakes raise UserError."""
    cfg.method = "eagle3"
    return train(cfg)


def train_dflash(cfg: TrainConfig) -> dict:
    """Train (or resume) a DFlash draft; returns a summary. User mistakes raise UserError."""
    cfg.method = "dflash"
    return train(cfg)


def train_mtp(cfg: TrainConfig) -> dict:
    """Train, or fine-tune (`init` = a folder), an MTP head; returns a summary. User mistakes raise
    UserError."""
    cfg.method = "mtp"
    return train(cfg)


def train_draft_lm(cfg: TrainConfig) -> dict:
    """Distil a small causal LM from the target (`draft:PATH` drafts with it)."""
    cfg.method = "draft-lm"
    return train(cfg)


def train(cfg: TrainConfig) -> dict:
    _check_args(cfg)
    records = load_conversations(cfg.data)
    keys = {"dflash": DFLASH_FINGERPRINT, "mtp": MTP_FINGERPRINT, "draft-lm": DRAFT_LM_FINGERPRINT}.get(
        cfg.method, FINGERPRINT
    )
    fingerprint = {k: getattr(cfg, k) for k in keys} | {"data_sha256": _digest(cfg.data)}
    if cfg.method in ("eagle3", "dflash", "draft-lm") and cfg.init != "random":
        cfg.init = str(Path(cfg.init).resolve())
        # Only when set, so checkpoints written before `--init` existed still resume.
        fingerprint["init"] = cfg.init
    _check_out(cfg, fingerprint)
    device = parse_device(cfg.device)
    if cfg.dtype == "auto":
        cfg.dtype = auto_dtype(device)
    parse_dtype(cfg.dtype)
    world = distributed.init(device)
    try:
        return _train(cfg, records, fingerprint, world)
    finally:
        distributed.shutdown(world)


def _train(cfg: TrainConfig, records: list[dict], fingerprint: dict, world: distributed.World) -> dict:
    main = world.is_main
    out = Path(cfg.out)
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")  # rms_norm, autocast

    # ---- setup: target, examples, draft model, optimizer, batch plan ---------------------------
    target = load_target(cfg.target, cfg.dtype, str(world.device.type))
    target.model.requires_grad_(False)
    examples = tokenize_dataset(target.tokenizer, records, cfg.max_len, progress=main and cfg.progress)
    lengths = [len(ex.input_ids) for ex in examples]
    torch.manual_seed(cfg.seed)
    methods = {"eagle3": _Eagle3, "dflash": _DFlash, "mtp": _MTP, "draft-lm": _DraftLM}
    method = methods[cfg.method](cfg, target, examples, world)
    model = method.model
    # The target's embedding is not among them: it is frozen (a draft LM holds it, not training it).
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    plan = plan_batches(lengths, cfg.batch_tokens, cfg.epochs, cfg.seed)
    total = len(plan)
    warmup = max(1, math.ceil(cfg.warmup_ratio * total)) if cfg.warmup_ratio > 0 else 0
    stop = min(total, cfg.max_steps) if cfg.max_steps else total
    save_every = cfg.eval_every if cfg.save_every is None else cfg.save_every
    k_eval = cfg.eval_k or cfg.positions
    drafter = _DRAFTER.get(cfg.method, cfg.method)  # the registry name that loads the saved folder
    autocast = torch.autocast(world.device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16")

    # ---- resume: weights, optimizer, RNG, data position, metrics -------------------------------
    state = {"step": 0, "epoch": 0, "index": 0, "tokens_seen": 0, "wall_time_s": 0.0, "tau": None}
    state |= {"fingerprint": fingerprint, "commands": [], "total_steps": total, "warmup_steps": warmup}
    metrics: list[dict] = []
    if cfg.resume:
        ckpt = checkpoint.load(out, world.device)
        model.load_state_dict(ckpt.model)
        optimizer.load_state_dict(ckpt.optimizer)
        checkpoint.restore_rng(ckpt.rng)
        state |= {
            k: ckpt.state[k]
            for k in ("step", "epoch", "index", "tokens_seen", "wall_time_s", "tau", "commands")
        }
        state |= {k: ckpt.state[k] for k in ("heldout_start", "heldout", "tau_start") if k in ckpt.state}
        metrics = ckpt.metrics
        at = state["step"]
        if at < total and (plan[at].epoch, plan[at].index) != (state["epoch"], state["index"]):
            raise UserError(f"checkpoint in {out} stopped at a data position this data no longer has")
    state["commands"] = [*state["commands"], cfg.command]
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    prompts = []
    if main and cfg.eval_prompts > 0:
        prompts = eval_prompts(target, cfg.eval_workload, cfg.eval_prompts, cfg.eval_max_new_tokens, k_eval)
    heldout = None
    if main and cfg.eval_data:
        held = tokenize_dataset(
            target.tokenizer, load_conversations(cfg.eval_data), cfg.max_len, progress=False
        )
        held_batches = heldout_batches([len(ex.input_ids) for ex in held], cfg.batch_tokens)
        heldout = lambda: score(method, held, held_batches, cfg.positions, autocast)  # noqa: E731
    # Seconds the last evaluation and the last save took: a time-budgeted run keeps them in reserve,
    # so that its final evaluation and save end within the budget rather than after it.
    eval_s = save_s = 0.0
    t_eval = time.perf_counter()
    if heldout is not None and "heldout_start" not in state:
        state["heldout_start"] = heldout()  # where the draft stood before this run's first step
    if prompts and cfg.eval_at_start and "tau_start" not in state:
        state["tau_start"] = measure_tau(
            target,
            model,
            prompts,
            k_eval,
            cfg.eval_max_new_tokens,
            drafter=drafter,
        )
    eval_s = time.perf_counter() - t_eval
    period = 60.0 * cfg.eval_every_minutes if cfg.eval_every_minutes else None
    next_eval = (math.floor(state["wall_time_s"] / period) + 1) * period if period else math.inf

    # ---- training loop -------------------------------------------------------------------------
    step, began = state["step"], time.perf_counter()
    wall_before = state["wall_time_s"]
    bar = tqdm(
        total=stop, initial=step, unit="step", disable=not (main and cfg.progress), desc=f"train {cfg.method}"
    )
    last_dt = 0.0
    while step < stop:
        t0 = time.perf_counter()
        planned = plan[step]
        if cfg.time_budget:
            # Where the schedule will stand once this step, and then a final evaluation and save, are
            # done; ranks agree on their mean clock (only rank 0 evaluates and saves).
            now = wall_before + time.perf_counter() - began + last_dt
            clocks = distributed.all_sum(world, torch.tensor([now, eval_s + save_s], dtype=torch.float64))
            wall = float(clocks[0]) / world.size + float(clocks[1])
            at_end = max((step + 1) / total, wall / cfg.time_budget)
            lr = lr_at_progress(at_end, cfg.warmup_ratio, cfg.lr)
            if at_end >= 1.0:
                stop = step + 1  # the last step: evaluate and save after it
        else:
            lr = lr_at(step, total, warmup, cfg.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr

        ids = shard(planned.examples, lengths, world.rank, world.size)
        local = method.forward_backward([examples[i] for i in ids], ids, step, autocast)
        distributed.sum_gradients(world, params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        g = distributed.all_sum(world, local)  # [loss, step_loss x S, correct x S, counts x S, tokens]
        step += 1
        dt = last_dt = time.perf_counter() - t0

        # ---- metrics, held-out tau, checkpoint (rank 0) ----------------------------------------
        S = cfg.positions
        correct, counts, tokens = g[1 + S : 1 + 2 * S], g[1 + 2 * S : 1 + 3 * S], int(g[-1])
        state["tokens_seen"] += tokens
        state["wall_time_s"] = wall_before + time.perf_counter() - began
        # The data position is where the next batch starts: (epoch, index into its permutation).
        state |= {"step": step, "epoch": plan[step].epoch if step < total else cfg.epochs}
        state["index"] = plan[step].index if step < total else 0
        rec = {
            "step": step,
            "epoch": planned.epoch,
            "loss": float(g[0]),
            "step_loss": [round(float(x), 6) for x in g[1 : 1 + S]],
            "acc": [round(float(c / n), 6) if n > 0 else None for c, n in zip(correct, counts, strict=True)],
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": tokens,
            "tokens_per_s": tokens / dt,
            "wall_time_s": round(state["wall_time_s"], 3),
        }
        evaluate = step == stop or (cfg.eval_every and step % cfg.eval_every == 0)
        if state["wall_time_s"] >= next_eval:
            evaluate = True
            next_eval = (math.floor(state["wall_time_s"] / period) + 1) * period
        t_eval = time.perf_counter()
        if main and prompts and evaluate:
            state["tau"] = rec["tau"] = measure_tau(
                target,
                model,
                prompts,
                k_eval,
                cfg.eval_max_new_tokens,
                drafter=drafter,
            )
        if heldout is not None and evaluate:
            rec |= heldout()
            state["heldout"] = {k: rec[k] for k in ("heldout_loss", "heldout_acc")}
        if evaluate:
            eval_s = time.perf_counter() - t_eval
            state["wall_time_s"] = wall_before + time.perf_counter() - began
        metrics.append(rec)
        if main:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            bar.update(1)
            bar.set_postfix(
                loss=f"{rec['loss']:.3f}",
                acc=rec["acc"][0],
                tok_s=f"{rec['tokens_per_s']:.0f}",
                tau=state["tau"],
            )
        if main and (step == stop or (save_every and step % save_every == 0)):
            t_save = time.perf_counter()
            _save(out, method, optimizer, state, metrics, cfg, target.name)
            save_s = time.perf_counter() - t_save
    bar.close()
    return {k: state[k] for k in ("step", "tokens_seen", "wall_time_s", "tau")} | {
        "total_steps": total,
        "out": str(out),
    }


# ---------------------------------------------------------------- the drafters


def _parts(res, num_tokens: int) -> torch.Tensor:
    """[loss, step_loss x S, correct x S, counts x S, tokens]: what ranks all-reduce per step."""
    parts = [res.loss.detach().reshape(1), res.step_loss, res.correct, res.counts, torch.tensor([num_tokens])]
    return torch.cat([p.double().cpu() for p in parts])


def _idle(world, S: int) -> torch.Tensor:
    """A global batch smaller than the world: this rank only joins the collectives."""
    distributed.all_sum(world, torch.zeros(S, dtype=torch.long))
    return torch.zeros(2 + 3 * S, dtype=torch.float64)


class _Eagle3:
    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        self.layers = feature_layers(target.num_layers)
        config = make_config(target.model.config, cfg.draft_vocab, self.layers)
        if cfg.init != "random":
            self.model = _eagle3_init(cfg.init, config, target, examples).to(world.device, torch.float32)
        else:
            self.model = Eagle3Model(config, target.model.get_input_embeddings()).to(
                world.device, torch.float32
            )
            vocab = draft_vocab(examples, config.draft_vocab_size, target.vocab_size)
            self.model.set_vocab_map(vocab.to(world.device))
            if cfg.head_init == "target":
                self.model.init_head_from_target(target.head, getattr(target.base, "norm", None))
        self.store = _open_store(cfg, examples, self.layers)
        if cfg.init == "random" and cfg.attn_init == "token":
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
        """Loss and gradients on this rank's shard. Returns the all-reduced parts (`_parts`).
        `train=False` (held-out scoring, on one rank): online features, local counts, no backward."""
        cfg, model, S = self.cfg, self.model, self.cfg.ttt_steps
        if not examples:
            return _idle(self.world, S)
        batch = pack(examples, cfg.max_len, packing=can_pack(self.target)).to(self.world.device)
        if self.store is None or not train:
            features, logits = target_pass(self.target, batch, self.layers)
        else:
            features, logits = stored_pass(self.target, self.store, batch, ids, self.layers)
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
        return _parts(res, batch.num_tokens)

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
    _check_init_shape(path, have, want, "use a speculator made for this target")
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


def _check_init_shape(path: str, have: dict, want: dict, fix: str) -> None:
    """One line naming every way the `--init` speculator differs from what this run builds."""
    diff = [f"{k} {have[k]} (this run: {want[k]})" for k in want if have[k] != want[k]]
    if diff:
        raise UserError(
            f"--init {path}: the speculator there differs from this run: {'; '.join(diff)}; "
            f"{fix}, or use a speculator made for this target"
        )


class _DFlash:
    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        tc = target.config
        self.layers = list(cfg.target_layers or dflash.default_target_layer_ids(target.num_layers))
        if max(self.layers) >= target.num_layers or min(self.layers) < 0:
            raise UserError(
                f"--target-layers {self.layers}: the target has layers 0..{target.num_layers - 1}"
            )
        mask = cfg.mask_token_id
        if mask is None:
            mask = dflash.default_mask_token_id(target.tokenizer, target.vocab_size)
        if not 0 <= mask < target.vocab_size:
            raise UserError(
                f"--mask-token-id {mask} is outside the target's vocabulary of {target.vocab_size}"
            )
        config = dflash.make_config(
            tc, layers=cfg.layers, block_size=cfg.block_size, mask_token_id=mask, target_layer_ids=self.layers
        )
        embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
        if cfg.init != "random":
            self.model = _dflash_init(cfg.init, config, embed, head).to(world.device, torch.float32)
        else:
            self.model = dflash.DFlashModel(config, embed, head).to(world.device, torch.float32)
            if cfg.norm_init == "scaled":
                dflash.scale_output_norm(self.model)
        self.store = _open_store(cfg, examples, self.layers)

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        cfg, model, S = self.cfg, self.model, self.cfg.block_size - 1
        if not examples:
            return _idle(self.world, S)
        batch = pack(examples, cfg.max_len, packing=can_pack(self.target))
        # Anchors are drawn per example from (seed, step, example id): packing and ranks do not matter.
        seeds = {local: anchor_seed(cfg.seed, step, global_id) for local, global_id in enumerate(ids)}
        blocks = sample_blocks(
            batch.input_ids, batch.loss_mask, batch.segments,
            block_size=cfg.block_size, n_anchors=cfg.anchors, seeds=seeds,
        ).to(self.world.device)  # fmt: skip
        batch = batch.to(self.world.device)
        if self.store is None or not train:
            features = _features(self.target, batch, self.layers)
        else:
            features = stored_pass(self.target, self.store, batch, ids, self.layers, logits=False)[0]
        counts = distributed.all_sum(self.world, blocks.counts()) if train else blocks.counts()
        with autocast:
            res = dflash_loss(
                model, batch.input_ids, features, blocks,
                segments=batch.segments, positions=batch.positions, gamma=cfg.gamma, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return _parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> dflash.DFlashModel:
        m = self.model
        out = dflash.DFlashModel(m.config, m.embed_tokens, m.lm_head)
        out.load_state_dict(m.state_dict())
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

    _check_init_shape(path, shape(model.config), shape(config), "pass the flags it was trained with")
    return model.train()


class _MTP:
    """The head reads the target's final-normed hidden state and is scored against its logits; both
    come from one target pass (or the feature store's `hidden`, through the LM head)."""

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        self.layers = [FINAL_HIDDEN]
        if cfg.init in ("random", "last_layer"):
            head = build_head(target, init=cfg.init, seed=cfg.seed)
        else:  # fine-tuning: the target checkpoint's own head, another Qwen3.5 folder, a head saved here
            head = load_head(target, None if cfg.init == "native" else cfg.init)
        self.model = head.to(world.device, torch.float32).train()
        self.store = _open_store(cfg, examples, self.layers)

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        cfg, S = self.cfg, self.cfg.ttt_steps
        if not examples:
            return _idle(self.world, S)
        batch = pack(examples, cfg.max_len, packing=can_pack(self.target)).to(self.world.device)
        if self.store is None or not train:
            features, logits = target_pass(self.target, batch, self.layers)
        else:
            features, logits = stored_pass(self.target, self.store, batch, ids, self.layers)
        local = mtp_count_positions(batch.loss_mask, batch.segments, S)
        counts = distributed.all_sum(self.world, local) if train else local
        with autocast:
            res = mtp_loss(
                self.model, batch.input_ids, batch.loss_mask, features[:, :, 0], logits,
                steps=S, segments=batch.segments, positions=batch.positions, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return _parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> _SavedHead:
        return _SavedHead(self.model, self.target.config, dtype)

    def info(self) -> dict:
        return {"init": self.cfg.init, "ttt_steps": self.cfg.ttt_steps}


class _SavedHead:
    """An MTP head as `_save` writes it: `save(dir, extra)` puts its tensors in dtype, in Qwen's
    `mtp.*` layout, beside the target's config (`drafters.mtp.save_head`)."""

    def __init__(self, head, target_config, dtype: torch.dtype) -> None:
        self.head, self.target_config, self.dtype = head, target_config, dtype

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(self.dtype) for k, v in self.head.state_dict().items()}

    def save(self, path, extra: dict | None = None) -> None:
        save_head(self, path, self.target_config, extra)


class _DraftLM:
    """A small causal LM distilled from the target: fresh layers at the target's width, or copies of
    some of its layers (`init_layers`), on the target's own embedding and head, which stay frozen;
    at another width (`hidden`) it has its own embedding, tied to its head and trained."""

    def __init__(self, cfg: TrainConfig, target, examples, world) -> None:
        self.cfg, self.target, self.world = cfg, target, world
        self.layers = [FINAL_HIDDEN]  # what the store or the target pass yields: logits come from it
        self.model = DraftLMStudent(_draft_lm(cfg, target)).to(world.device, torch.float32).train()
        self.store = _open_store(cfg, examples, self.layers)
        # Saved with the draft, so `draft:PATH:vocab=N` can keep the head rows of the N most frequent.
        self.vocab_order = token_ranking(examples, target.vocab_size)

    def forward_backward(
        self, examples, ids: list[int], step: int, autocast, train: bool = True
    ) -> torch.Tensor:
        cfg = self.cfg
        if not examples:
            return _idle(self.world, 1)
        batch = pack(examples, cfg.max_len, packing=can_pack(self.target)).to(self.world.device)
        if self.store is None or not train:
            logits = target_pass(self.target, batch, self.layers)[1]
        else:
            logits = stored_pass(self.target, self.store, batch, ids, self.layers)[1]
        local = draft_lm_counted(batch.loss_mask, batch.segments).sum().reshape(1).long()
        counts = distributed.all_sum(self.world, local) if train else local
        with autocast:
            res = draft_lm_loss(
                self.model.lm, batch.input_ids, batch.loss_mask, logits,
                segments=batch.segments, positions=batch.positions, counts=counts,
            )  # fmt: skip
        if train:
            res.loss.backward()
        return _parts(res, batch.num_tokens)

    def export(self, dtype: torch.dtype) -> DraftLMStudent:
        return DraftLMStudent(self.model.lm, dtype, self.vocab_order)

    def info(self) -> dict:
        cfg = self.model.lm.config
        return {
            "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size,
            "init_layers": self.cfg.init_layers,
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
    config = copy.deepcopy(target.model.config)
    far = [i for i in cfg.init_layers or [] if i >= target.num_layers]
    if far:
        raise UserError(
            f"--init-from-target-layers: the target has layers 0-{target.num_layers - 1}, not {far}"
        )
    config.num_hidden_layers = len(cfg.init_layers) if cfg.init_layers else cfg.layers
    if getattr(config, "layer_types", None):
        kinds = config.layer_types
        config.layer_types = [kinds[i] for i in cfg.init_layers] if cfg.init_layers else kinds[: cfg.layers]
    shared = cfg.hidden is None or cfg.hidden == config.hidden_size
    if shared:
        lm = draft_lm_format.build_shared(config, target.model, torch.float32)
        lm.get_input_embeddings().weight.requires_grad_(False)
        lm.get_output_embeddings().weight.requires_grad_(False)
    else:
        head_dim = config.hidden_size // config.num_attention_heads
        ratio = config.intermediate_size / config.hidden_size
        config.hidden_size = cfg.hidden
        config.num_attention_heads = max(1, cfg.hidden // head_dim)
        config.num_key_value_heads = math.gcd(config.num_attention_heads, config.num_key_value_heads)
        config.head_dim = cfg.hidden // config.num_attention_heads
        config.intermediate_size = int(round(ratio * cfg.hidden / 64)) * 64
        config.tie_word_embeddings = True
        torch.manual_seed(cfg.seed)
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if cfg.init_layers:
        src = target.model.get_decoder()
        with torch.no_grad():
            for j, i in enumerate(cfg.init_layers):
                lm.model.layers[j].load_state_dict(src.layers[i].state_dict())
            lm.model.norm.load_state_dict(src.norm.state_dict())
    return lm


def _draft_lm_init(cfg: TrainConfig, target):
    """A trained draft LM to continue from (`--init FOLDER`): its architecture, its weights."""
    from transformers import AutoModelForCausalLM

    folder = Path(cfg.init)
    if not (folder / "config.json").is_file():
        raise UserError(f"--init {cfg.init}: no draft LM there (config.json missing); give a draft-lm folder")
    if cfg.init_layers:
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


def _open_store(cfg: TrainConfig, examples, layers: list[int]):
    """The offline feature store for these examples and layers, or None to compute them online."""
    if cfg.features is None:
        return None
    from draftsmith.data.features import FeatureStore

    # Every store holds the final hidden state; only real layer ids must be among its layers.
    return FeatureStore.open(cfg.features, examples, [i for i in layers if i != FINAL_HIDDEN])


def _features(target, batch, layers: list[int]) -> torch.Tensor:
    """[b, T, K, H] features of packed rows from the target's decoder alone (DFlash needs no target
    logits, so the LM head over the whole vocabulary is skipped)."""
    with torch.inference_mode():
        out = packed_forward(target, target.base, batch)
        feats = torch.stack(
            [out.last_hidden_state if i == FINAL_HIDDEN else out.hidden_states[i + 1] for i in layers], dim=2
        )
    return feats.clone()  # out of inference mode: `fc` saves its input for backward


def _save(out: Path, method, optimizer, state: dict, metrics: list[dict], cfg, target_name) -> None:
    model = method.model
    checkpoint.save(
        out,
        checkpoint.Checkpoint(
            model=model.state_dict(),
            optimizer=optimizer.state_dict(),
            rng=checkpoint.capture_rng(),
            state=state,
            metrics=metrics,
        ),
    )
    # The speculator itself, in the serving layout and the training dtype, next to the checkpoint.
    method.export(parse_dtype(cfg.dtype)).save(
        out,
        extra={
            "target": target_name,
            "target_spec": cfg.target,
            "data": str(Path(cfg.data).resolve()),
            "data_sha256": state["fingerprint"]["data_sha256"],
            "steps": state["step"],
            "total_steps": state["total_steps"],
            "tokens_seen": state["tokens_seen"],
            "wall_time_s": round(state["wall_time_s"], 1),
            "tau": state["tau"],
            "tau_workload": cfg.eval_workload,
            **{k: state[k] for k in ("heldout_start", "heldout", "tau_start") if k in state},
            "feature_layers": method.layers,
            **method.info(),
            "command": state["commands"][0],
            "commands": state["commands"],
            "train": {k: v for k, v in asdict(cfg).items() if k not in ("progress", "command", "extra")},
        }
        | cfg.extra,
    )


# ---------------------------------------------------------------- user errors, before any work


def _check_args(cfg: TrainConfig) -> None:
    positive = {"--epochs": cfg.epochs, "--lr": cfg.lr, "--batch-tokens": cfg.batch_tokens,
                "--max-len": cfg.max_len, "--ttt-steps": cfg.ttt_steps, "--draft-vocab": cfg.draft_vocab,
                "--grad-clip": cfg.grad_clip, "--eval-max-new-tokens": cfg.eval_max_new_tokens}  # fmt: skip
    for flag, v in positive.items():
        if not v > 0:
            raise UserError(f"{flag} {v} must be positive")
    for flag, v in {"--eval-every": cfg.eval_every, "--eval-prompts": cfg.eval_prompts,
                    "--save-every": cfg.save_every or 0}.items():  # fmt: skip
        if v < 0:
            raise UserError(f"{flag} {v} must be 0 or more")
    if not 0 <= cfg.warmup_ratio < 1:
        raise UserError(f"--warmup-ratio {cfg.warmup_ratio} must be in [0, 1)")
    if cfg.max_steps is not None and cfg.max_steps <= 0:
        raise UserError(f"--max-steps {cfg.max_steps} must be positive")
    if cfg.time_budget is not None and not cfg.time_budget > 0:
        raise UserError(f"--time-budget {cfg.time_budget} must be a positive number of seconds")
    if cfg.eval_data is not None and not Path(cfg.eval_data).is_file():
        raise UserError(
            f"--eval-data {cfg.eval_data} not found; pass a conversations JSONL held out from --data"
        )
    if cfg.eval_every_minutes is not None and not cfg.eval_every_minutes > 0:
        raise UserError(f"--eval-every-minutes {cfg.eval_every_minutes} must be positive")
    if cfg.eval_k is not None and cfg.eval_k <= 0:
        raise UserError(f"--eval-k {cfg.eval_k} must be positive")
    if cfg.method in ("eagle3", "dflash") and cfg.init != "random" and not Path(cfg.init).is_dir():
        kind = {"eagle3": "EAGLE-3", "dflash": "DFlash"}[cfg.method]
        raise UserError(f"--init {cfg.init}: give random or the folder of a trained {kind} speculator")
    if cfg.method == "mtp" and cfg.init not in MTP_INITS and not Path(cfg.init).is_dir():
        raise UserError(
            f"--init {cfg.init}: give random, last_layer, native, or a folder holding an MTP head "
            "(mtp.* tensors)"
        )
    if cfg.method == "draft-lm":
        if cfg.init_layers is not None:
            bad = [i for i in cfg.init_layers if i < 0]
            if not cfg.init_layers or bad:
                raise UserError(
                    f"--init-from-target-layers {cfg.init_layers}: give target layer ids 0, 1, ... "
                    "separated by commas"
                )
        elif cfg.layers <= 0:
            raise UserError(f"--layers {cfg.layers} must be positive")
        if cfg.hidden is not None and cfg.hidden <= 0:
            raise UserError(f"--hidden {cfg.hidden} must be positive")
        if cfg.hidden is not None and cfg.init_layers:
            raise UserError(
                "--hidden and --init-from-target-layers exclude each other: copied layers "
                "have the target's width"
            )
    if cfg.method == "dflash":
        if cfg.block_size < 2:
            raise UserError(f"--block-size {cfg.block_size} must be at least 2 (one token to draft)")
        for flag, v in {"--layers": cfg.layers, "--anchors": cfg.anchors, "--gamma": cfg.gamma}.items():
            if not v > 0:
                raise UserError(f"{flag} {v} must be positive")


def _check_out(cfg: TrainConfig, fingerprint: dict) -> None:
    saved = checkpoint.read_state(cfg.out)
    if saved is None:
        if cfg.resume:
            raise UserError(f"--resume but {cfg.out} holds no checkpoint; drop --resume to start a new run")
        return
    old = saved["fingerprint"]
    diff = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in fingerprint.items() if old.get(k) != v]
    if diff and cfg.resume:
        raise UserError(
            f"--resume: the checkpoint in {cfg.out} was made with other settings ({'; '.join(diff)}); "
            "pass the same settings or choose another --out"
        )
    if diff:
        raise UserError(
            f"{cfg.out} holds a checkpoint of another run ({'; '.join(diff)}); choose another --out"
        )
    if not cfg.resume:
        raise UserError(
            f"{cfg.out} already holds a checkpoint of this run at step {saved['step']}; "
            "pass --resume to continue it, or choose another --out"
        )


_DRAFTER = {"draft-lm": "draft"}  # method -> the registry name of the drafter that loads its folder


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

"""`draftsmith train eagle3|dflash|mtp|draft-lm`: one training loop, read top to bottom, for every drafter.

setup (data, target, draft model, optimizer, the plan of global batches) -> resume (weights,
optimizer, RNG, data position, metrics) -> per step: the frozen target's features on this rank's
shard, the drafter's loss (`eagle3_objective`: TTT; `dflash_objective`: packed anchor blocks;
`mtp_objective`: the MTP head unrolled on its own outputs; `draft_lm_objective`: a small LM
distilled on the target's distribution),
gradients summed over ranks, clipping, AdamW at the scheduled learning rate -> metrics line,
held-out tau every `eval_every` steps (the real engine), atomic checkpoint every `save_every` steps
and at the end.

What differs between drafters lives in one small class each, in `train/methods/` (`METHODS`,
the interface `methods.TrainingMethod`): its settings checks and `fingerprint` (the settings a
checkpoint resumes under), the `drafter` that loads its folder, how the `model` is built, one
step's `forward_backward`, and `export`/`info` for the saved folder.
All report S per-position numbers (EAGLE-3 and MTP: the unrolled steps; DFlash: the B-1 block slots; a draft LM: one, its
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

import hashlib
import json
import math
import time
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

from draftsmith.errors import UserError
from draftsmith.machine import auto_dtype
from draftsmith.target.model import load_target, parse_device, parse_dtype
from draftsmith.train import checkpoint, distributed
from draftsmith.train.config import TrainConfig
from draftsmith.train.data import (
    load_conversations,
    plan_batches,
    shard,
    tokenize_dataset,
)
from draftsmith.train.evaluate import eval_prompts, measure_tau
from draftsmith.train.heldout import heldout_batches, score
from draftsmith.train.methods import TrainingMethod
from draftsmith.train.methods.dflash import DFlashMethod
from draftsmith.train.methods.draft_lm import DraftLMMethod
from draftsmith.train.methods.eagle3 import Eagle3Method
from draftsmith.train.methods.mtp import MTPMethod

# --method -> how it builds, steps and saves its draft
METHODS: dict[str, type[TrainingMethod]] = {
    "eagle3": Eagle3Method,
    "dflash": DFlashMethod,
    "mtp": MTPMethod,
    "draft-lm": DraftLMMethod,
}


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


def train(cfg: TrainConfig) -> dict:
    """Train (or resume) the draft of `cfg.settings`' method; returns a summary. User mistakes raise
    UserError."""
    _check_args(cfg)
    records = load_conversations(cfg.data)
    kind = METHODS[cfg.method]
    settings = cfg.record()
    fingerprint = {k: settings[k] for k in kind.fingerprint} | {"data_sha256": _digest(cfg.data)}
    if kind.init_is_folder and cfg.init != "random":
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
    method = METHODS[cfg.method](cfg, target, examples, world)
    positions = method.positions(cfg)  # S per-position numbers in every metric
    model = method.model
    # The target's embedding is not among them: it is frozen (a draft LM holds it, not training it).
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    plan = plan_batches(lengths, cfg.batch_tokens, cfg.epochs, cfg.seed)
    total = len(plan)
    warmup = max(1, math.ceil(cfg.warmup_ratio * total)) if cfg.warmup_ratio > 0 else 0
    stop = min(total, cfg.max_steps) if cfg.max_steps else total
    save_every = cfg.eval_every if cfg.save_every is None else cfg.save_every
    k_eval = cfg.eval_k or positions
    # Engine tau of the draft as it stands, saved as the method saves a finished one (in the dtype
    # it trains in) and loaded back by its drafter's registry name.
    train_dtype = next(model.parameters()).dtype
    tau = lambda: measure_tau(  # noqa: E731
        target, method.export(train_dtype), prompts, k_eval, cfg.eval_max_new_tokens, method.drafter
    )
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
        heldout = lambda: score(method, held, held_batches, positions, autocast)  # noqa: E731
    # Seconds the last evaluation and the last save took: a time-budgeted run keeps them in reserve,
    # so that its final evaluation and save end within the budget rather than after it.
    eval_s = save_s = 0.0
    t_eval = time.perf_counter()
    if heldout is not None and "heldout_start" not in state:
        state["heldout_start"] = heldout()  # where the draft stood before this run's first step
    if prompts and cfg.eval_at_start and "tau_start" not in state:
        state["tau_start"] = tau()
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
        S = positions
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
            state["tau"] = rec["tau"] = tau()
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
            "train": {k: v for k, v in cfg.record().items() if k not in ("progress", "command", "extra")},
        }
        | cfg.extra,
    )


# ---------------------------------------------------------------- user errors, before any work


def _check_args(cfg: TrainConfig) -> None:
    positive = {"--epochs": cfg.epochs, "--lr": cfg.lr, "--batch-tokens": cfg.batch_tokens,
                "--max-len": cfg.max_len, "--grad-clip": cfg.grad_clip, "--eval-max-new-tokens": cfg.eval_max_new_tokens}  # fmt: skip
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
    METHODS[cfg.method].check(cfg)


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


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

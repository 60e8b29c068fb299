"""Peers: other engines timed on the same prompts, token budget and sampling settings as ours.

- `hf`: transformers `generate` on the target's own model (same weights, dtype and device as our
  engine, batch 1). Greedy output should equal our engine's token for token.
- `hf-assisted`: the same with transformers' assisted generation. When the bench runs a draft
  model (`draft:PATH`, the first such method), its `assistant_model` is that draft LM (the same
  transformers model our drafter runs, in the target's dtype) drafting a fixed k, the method's
  (`num_assistant_tokens=k`, schedule `constant`, confidence threshold 0, so it never stops a
  draft early or changes k); both engines then draft with the same model and differ only in how
  they run it. Otherwise it is prompt lookup (`prompt_lookup_num_tokens=10`). Prompt-lookup drafts
  carry no probabilities, so when sampling transformers samples a token from p at every drafted
  position and keeps drafts while they match; with a deterministic draft that is still exact, and
  a draft model's drafts are verified by speculative sampling, so every mode is lossless. The
  runner records which in the run (`"assistant": "draft:PATH"` or `"prompt_lookup"`).
- `llamacpp`: llama.cpp through `llama-cpp-python`, on the GGUF the target was converted from (for
  the embedded SmolLM2 a Q4_1 file, so its tokens differ from ours: different weights, not a bug).
- `llamacpp-lookup`: the same with llama-cpp-python's prompt-lookup drafter (10 tokens a draft).
- `vllm-plain`, `vllm-ngram`, `vllm-eagle3`, `vllm-dflash` (`vllm` means all four): vLLM's CPU build
  from its own venv in a subprocess, with the bench's EAGLE-3 / DFlash methods exported on the fly
  (`vllm_peer.py`). Their answers also carry verification steps and vLLM's acceptance counters.

Timing follows our engine: the first generated token belongs to prefill, so `prefill_s` is the
time to the first token and `decode_s` the time from the first token to the last; decode tok/s is
`decode_tokens / decode_s`, where `decode_tokens` counts the tokens that arrived after the first
token event (transformers' assisted generation fuses prefill with its first verification, so its
first event may bring several tokens). A `Peer` loads its engine once; `run` times one prompt.

Deliberately not here: choosing prompts, chat templates, repetitions, warm-up and reports (the
bench runner does those), and any check that a peer's output is lossless (the runner compares
token ids and reports the differences). Peers that cannot run on this machine or target are
reported by `peer_available` as a reason to skip, never as an error.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from draftsmith.decoding.sampling import SamplingParams
from draftsmith.errors import UserError
from draftsmith.target.model import Target
from draftsmith.target.packed import stock_linear

VLLM_PEERS = ("vllm-plain", "vllm-ngram", "vllm-eagle3", "vllm-dflash")  # run by vllm_peer.py
PEERS = ("hf", "hf-assisted", "llamacpp", "llamacpp-lookup", *VLLM_PEERS)
# A name on the command line that stands for several peers.
_GROUPS = {"llamacpp": ("llamacpp", "llamacpp-lookup"), "vllm": VLLM_PEERS, "all": PEERS}
LOOKUP_TOKENS = 10  # draft length of both prompt-lookup peers


def expand_peers(spec: str) -> list[str]:
    """Parse `--peers`: comma-separated names, in order, without repeats.

    >>> expand_peers("hf, llamacpp")
    ['hf', 'llamacpp', 'llamacpp-lookup']
    """
    names: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if part not in PEERS and part not in _GROUPS:
            raise UserError(
                f"unknown peer '{part}': use a comma-separated list of {', '.join(PEERS)} "
                "(llamacpp means both llama.cpp peers, vllm the four vLLM ones; all means every peer)"
            )
        for name in _GROUPS.get(part, (part,)):
            if name not in names:
                names.append(name)
    return names


@dataclass
class Assistant:
    """A draft model for `hf-assisted`: the bench method it comes from, the model and its k."""

    spec: str  # the method's drafter spec, `draft:PATH[:k=N]`
    model: torch.nn.Module  # a transformers causal LM with the target's tokenizer, dtype and device
    k: int


@dataclass
class PeerResult:
    token_ids: list[int]  # generated ids only
    prefill_s: float  # time to first token
    decode_s: float  # time from the first token to the last
    new_tokens: int
    decode_tokens: int  # tokens that arrived after the first token event
    steps: int | None = None  # verification steps, where the peer reports them (vLLM)
    spec: dict | None = None  # the peer's own acceptance counters over this prompt (vLLM)

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def peer_available(name: str, target: Target) -> str | None:
    """None if the peer can run on this target, else a short reason to report it as skipped."""
    if name not in PEERS:
        raise UserError(f"unknown peer '{name}': use one of {', '.join(PEERS)}")
    if name == "hf-assisted" and target.is_hybrid:
        # transformers refuses: it rolls back a rejected draft by cropping the cache, and recurrent
        # state cannot be cropped.
        return "transformers assisted generation does not support stateful (linear-attention) models"
    # The vLLM peers' own checks (their venv, the target's folder) are `vllm_peer.vllm_available`.
    if name.startswith("llamacpp"):
        if target.gguf_path is None:
            return "target has no GGUF file"
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            return "llama-cpp-python not installed"
        except Exception as e:  # a broken native build fails here, not with ImportError
            return f"llama-cpp-python does not load: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return None


def num_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Peer:
    """One peer engine, loaded once and reused for every prompt of a bench run."""

    def __init__(
        self, name: str, target: Target, max_context: int, assistant: Assistant | None = None
    ) -> None:
        reason = peer_available(name, target)
        if reason is not None:
            raise UserError(f"peer '{name}' cannot run: {reason}")
        self.name = name
        self.target = target
        self.max_context = max_context
        self.assistant = assistant if name == "hf-assisted" else None
        if self.assistant is not None:
            # transformers reads these from the assistant's own generation config: a fixed k, never
            # changed by its heuristic schedule nor cut by its confidence threshold.
            cfg = self.assistant.model.generation_config
            cfg.num_assistant_tokens = self.assistant.k
            cfg.num_assistant_tokens_schedule = "constant"
            cfg.assistant_confidence_threshold = 0.0
        self._llama = None
        if name.startswith("llamacpp"):
            self._llama = _load_llama(target.gguf_path, max_context, lookup=name == "llamacpp-lookup")

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> PeerResult:
        if not prompt_ids:
            raise UserError("empty prompt: give at least one token of input")
        if max_new_tokens <= 0:
            raise UserError(f"--max-new-tokens {max_new_tokens} must be positive")
        if len(prompt_ids) + max_new_tokens > self.max_context:
            raise UserError(
                f"prompt of {len(prompt_ids)} tokens plus {max_new_tokens} new tokens exceeds the peer's "
                f"context of {self.max_context}: shorten the prompt or lower --max-new-tokens"
            )
        if self._llama is not None:
            return self._run_llama(prompt_ids, max_new_tokens, sampling)
        return self._run_hf(prompt_ids, max_new_tokens, sampling)

    @property
    def assistant_name(self) -> str | None:
        """What `hf-assisted` drafts with, for the bench JSON; None for the other peers."""
        if self.name != "hf-assisted":
            return None
        return self.assistant.spec if self.assistant is not None else "prompt_lookup"

    @property
    def draft_k(self) -> int | None:
        """Tokens `hf-assisted` drafts a step; None for the other peers."""
        if self.name != "hf-assisted":
            return None
        return self.assistant.k if self.assistant is not None else LOOKUP_TOKENS

    # ---- transformers ---------------------------------------------------------------------------

    def _run_hf(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> PeerResult:
        t = self.target
        # The same stop set as our engine (generation config, model config and tokenizer EOS), so
        # greedy outputs are comparable token for token.
        eos = sorted(t.eos_ids)
        gen_config = getattr(t.model, "generation_config", None)
        pad = getattr(gen_config, "pad_token_id", None)
        kwargs: dict = dict(
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=not sampling.greedy,
            eos_token_id=eos or None,
            pad_token_id=pad if pad is not None else (eos[0] if eos else 0),
        )
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)  # transformers samples from the global generator
        models = [t.model]
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant.model
            models.append(self.assistant.model)
        elif self.name == "hf-assisted":
            kwargs["prompt_lookup_num_tokens"] = LOOKUP_TOKENS
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=t.device)
        clock = _FirstTokenClock()
        with torch.inference_mode(), ExitStack() as stack:
            for m in models:
                stack.enter_context(stock_linear(m))
            t0 = time.perf_counter()
            out = t.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock, **kwargs
            )
        ids = out[0, len(prompt_ids) :].tolist()
        if clock.first is None:  # nothing streamed after the prompt; cannot happen with budget >= 1
            raise RuntimeError(f"peer {self.name}: transformers generated no token")
        return PeerResult(
            token_ids=ids,
            prefill_s=clock.first - t0,
            decode_s=clock.last - clock.first,
            new_tokens=len(ids),
            decode_tokens=len(ids) - clock.first_count,
        )

    # ---- llama.cpp ------------------------------------------------------------------------------

    def _run_llama(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> PeerResult:
        import llama_cpp

        llm = self._llama
        # Our engine keeps no prefix cache between prompts; neither should the peer. With n_tokens
        # at 0, `generate` skips its prefix match and evaluates the whole prompt again.
        llm.reset()
        llm.set_seed(sampling.seed if sampling.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED)
        # llama.cpp's sampler: temp 0 is greedy; top_k 0 and top_p 1 are off, as in ours. Its other
        # filters (min_p, typical, repeat penalty) default to on-ish values, so turn them off.
        stop = set(self.target.eos_ids) | {llm.token_eos()}
        ids: list[int] = []
        first = last = 0.0
        t0 = time.perf_counter()
        gen = llm.generate(
            prompt_ids,
            temp=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            reset=True,
        )
        try:
            for tok in gen:
                last = time.perf_counter()
                if not ids:
                    first = last
                ids.append(int(tok))
                if tok in stop or len(ids) >= max_new_tokens:
                    break
        finally:
            gen.close()
        return PeerResult(
            token_ids=ids,
            prefill_s=first - t0,
            decode_s=last - first,
            new_tokens=len(ids),
            decode_tokens=len(ids) - 1,
        )


def _load_llama(gguf_path: str, n_ctx: int, lookup: bool):
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    cores = num_cores()
    return llama_cpp.Llama(
        model_path=gguf_path,
        n_ctx=n_ctx,
        n_threads=cores,
        n_threads_batch=cores,
        n_batch=512,
        n_gpu_layers=0,
        # With a draft model llama-cpp-python evaluates with all logits on but sizes its score
        # buffer from this flag (n_batch rows when False), which overflows once the context passes
        # 512 tokens; so ask for all logits explicitly when drafting.
        logits_all=lookup,
        verbose=False,
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS) if lookup else None,
    )


class _FirstTokenClock(BaseStreamer):
    """A transformers streamer that only keeps time: the first `put` is the prompt, the second brings
    the first generated token(s), the last brings the last ones."""

    def __init__(self) -> None:
        self.seen_prompt = False
        self.first: float | None = None
        self.first_count = 0
        self.last = 0.0

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        now = time.perf_counter()  # value is already on the CPU: transformers synchronised
        if self.first is None:
            self.first = now
            self.first_count = value.numel()  # batch 1: one row of tokens
        self.last = now

    def end(self) -> None:
        pass

"""`draft:PATH`: the classic draft model. A small causal LM that shares the target's tokenizer
drafts k tokens one at a time with its own KV cache; the target verifies them in one forward.

It needs nothing from the target but token ids (`needs_features = ()`), so any small model of the
same family works untrained (SmolLM2-135M drafting for SmolLM2-1.7B), and one distilled by
`draftsmith train draft-lm` loads the same way. PATH is a folder that shares the target's
embedding and LM head (`formats/draft_lm_format.py`), or anything `--target` accepts: an HF
causal-LM folder, a hub id, a `.gguf`, an embedded name. The draft runs in the target's dtype and on
its device, wrapped in `Target`, so it takes the same fast CPU forward (packed weights, the lean
decoder) and the same `RaggedCache`.

Cache and rollback, as for the target: one cache row per request, written at absolute positions.
The drafter keeps the ids whose keys/values stand in it (`cached`). `propose(k)` feeds the context
tokens not yet cached (at least the last committed one) in one forward, then each drafted token but
the last, one forward each. `commit` extends the context and cuts `cached` back to its longest
common prefix with the context by setting the cache length; rejected drafts are overwritten by the
next forward. A commit without a proposal (the other side of a hybrid drafted) only grows the
context, and the next proposal feeds all of it at once, so the draft stays in sync either way.

Greedy decoding drafts the argmax; at temperature T > 0 each token is drawn from q =
softmax(logits / T) and q returned, so verification's min(1, p/q) keeps the output exact. A head with
padding rows past the target's vocabulary is cut to it; a shorter one (same tokenizer) gets q = 0
on the missing rows. Drafting is per request, one-row forwards: a batch of B rows costs B draft
forwards per drafted position.

`draft:PATH:k=N` drafts at most N tokens even when the engine asks for more (in a hybrid, the other
side keeps the engine's k). Different tokenizers are refused: universal assisted decoding
(transformers' `assistant_tokenizer`) is not implemented.

Two options make a draft step cheaper, both exact:
- `vocab=N` keeps the N rows of the draft's LM head for the tokens most frequent in its training
  data (the ranking `draftsmith train draft-lm` saves, `vocab_order.safetensors`). On a small draft
  the head is most of what a step reads; drafts then come from those N tokens only, and q is zero
  elsewhere, which verification handles like any other q.
- `min_prob=P` ends the chain at the first position where the draft's top probability is below P,
  before drafting it: the cut looks at q alone, never at the sampled token, so each drafted token is
  still x ~ q.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.decoding.sampling import SamplingParams, draft_generator
from draftsmith.drafters.base import Draft, FactoryBase
from draftsmith.drafters.options import check_probability, split_path_options
from draftsmith.errors import UserError
from draftsmith.formats import vocab_order
from draftsmith.formats.draft_lm_format import load_shared, shares_target_embedding
from draftsmith.target.model import Target

SPARE = 256  # positions a request's cache holds beyond what it needs when (re)allocated
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class DraftLMDrafter:
    """One request's draft model state: its cache row and the ids standing in it."""

    needs_features: tuple[int, ...] = ()

    def __init__(self, factory: DraftLMFactory, sampling: SamplingParams, gen: torch.Generator) -> None:
        self.f = factory
        self.sampling = not sampling.greedy  # drafts x ~ q at the request's temperature, else argmax
        self.temperature = sampling.temperature or 1.0
        self.lm: Target = factory.lm
        self.gen = gen
        self.context: list[int] = []  # prompt and committed tokens
        self.cached: list[int] = []  # ids whose keys/values sit at positions 0..len-1 of the cache
        self.valid = 0  # cached[:valid] == context[:valid], known from earlier commits
        self.cache = self.lm.new_cache(1, 0)

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self.context = list(prompt_ids)
        self.cached, self.valid = [], 0
        self.cache = self.lm.new_cache(1, len(prompt_ids) + SPARE)

    @torch.inference_mode()
    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        self.context.extend(accepted_ids)
        # Roll back to the longest common prefix, keeping at least the last context token unfed so
        # that the next proposal has a position to read logits from.
        limit = min(len(self.cached), len(self.context) - 1)
        n = min(self.valid, limit)
        while n < limit and self.cached[n] == self.context[n]:
            n += 1
        del self.cached[n:]
        self.valid = n
        self.cache.lengths[0] = n

    @torch.inference_mode()
    def propose(self, k: int) -> Draft:
        if self.f.max_k:
            k = min(k, self.f.max_k)
        if k <= 0:
            return Draft(tokens=[])
        need = len(self.context) + k  # the last drafted token is never fed
        if need > self.cache.capacity:
            self.cache.grow(0, max(need + SPARE, 2 * self.cache.capacity))
        logits = self._feed(self.context[len(self.cached) :])
        self.valid = len(self.context)  # the whole context is cached now; drafts follow it
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if (
                self.f.min_prob
                and float(torch.softmax(logits.float() / self.temperature, -1).max()) < self.f.min_prob
            ):
                break
            token, q = self._pick(logits)
            tokens.append(token)
            if q is not None:
                qs.append(q)
            if i < k - 1:
                logits = self._feed([token])
        return Draft(tokens=tokens, probs=torch.stack(qs) if qs else None)

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Run `ids` into the cache after the cached ones; the draft's logits [Vd] after the last."""
        x = torch.tensor([ids], dtype=torch.long)
        if self.f.embed_rows < self.f.vocab_size:
            # A target token past a shorter draft vocabulary (a padding row): any id keeps the
            # output exact, only that draft is likely wrong.
            x.clamp_(max=self.f.embed_rows - 1)
        out = self.lm.forward(self.cache, x, logit_index=torch.tensor([len(ids) - 1]))
        self.cache.advance(0, len(ids))
        self.cached.extend(ids)
        return out.logits[0, 0]

    def _pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """The drafted token and, when sampling, q [target vocab] it was drawn from."""
        v, rows = self.f.vocab_size, self.f.head_rows
        if rows is None:
            logits = logits[:v]  # padding rows of a larger head are not tokens of the target
        if not self.sampling:
            j = int(logits.argmax())
            return (j if rows is None else int(rows[j])), None
        q = torch.softmax(logits.float().cpu() / self.temperature, -1)
        # Exact speculative sampling needs x ~ q, so sample rather than take the argmax.
        j = int(torch.multinomial(q, 1, generator=self.gen))
        if rows is None:
            return j, F.pad(q, (0, v - q.shape[0]))
        full = torch.zeros(v)
        full[rows] = q
        return int(rows[j]), full


class DraftLMFactory(FactoryBase):
    """Loads the draft model once (at `bind`, in the target's dtype and device); one drafter per request."""

    name = "draft"
    needs_features: tuple[int, ...] = ()

    def __init__(self, path: str, max_k: int = 0, vocab: int = 0, min_prob: float = 0.0) -> None:
        self.path = path
        self.max_k = max_k  # 0: draft as many tokens as the engine asks for
        self.vocab = vocab  # 0: the whole head; else its rows for the `vocab` most frequent tokens
        self.min_prob = min_prob  # chains end where the draft's top probability falls below it
        self.head_rows: torch.Tensor | None = None  # target ids of the kept head rows (vocab > 0)
        self.lm: Target | None = None
        self.vocab_size = 0  # the target's (head rows), the width of q
        self.embed_rows = 0  # the draft's input embedding rows
        self.sampling = SamplingParams()  # for drafters made without settings of their own
        self._requests = itertools.count()

    @property
    def model(self):
        """The draft as a transformers causal LM (what `bench --peers hf-assisted` hands transformers)."""
        if self.lm is None:
            raise RuntimeError("DraftLMFactory.bind(target, sampling) must run before the model is read")
        return self.lm.model

    def bind(self, target: Target, sampling) -> None:
        if self.lm is None:
            lm = load_draft_lm(self.path, target)
            check_vocabulary(lm, target, self.path)
            if lm.is_hybrid:
                raise UserError(
                    f"draft model {self.path} has linear-attention layers, whose state a rejected draft "
                    "cannot roll back: use a draft model with attention layers only"
                )
            if self.vocab:
                # Ids the target has and the draft's head has a row for.
                self.head_rows = vocab_order.head_rows(
                    "draft", self.path, self.vocab, min(target.vocab_size, lm.vocab_size)
                )
                lm.restrict_head(self.head_rows)
            self.lm = lm
            self.vocab_size = target.vocab_size
            self.embed_rows = lm.model.get_input_embeddings().weight.shape[0]
        self.sampling = sampling

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> DraftLMDrafter:
        if self.lm is None:
            raise RuntimeError("DraftLMFactory.bind(target, sampling) must run before drafting")
        s = sampling or self.sampling
        return DraftLMDrafter(self, s, generator or draft_generator(s.seed, next(self._requests)))


def load_draft_lm(path: str, target: Target) -> Target:
    """The draft model at `path` as a `Target` in the target's dtype, on its device."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from draftsmith.target.resolve import resolve_target

    hf_logging.disable_progress_bar()  # as for the target: a load takes a second, no bars
    if shares_target_embedding(path):
        folder = Path(path).expanduser()
        model = load_shared(folder, target.model, target.dtype)
        return Target(model, _tokenizer(str(folder), local=True), name=path)
    try:
        resolved = resolve_target(path)
    except UserError as e:
        raise UserError(f"draft model: {e}") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.model_path, dtype=target.dtype)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load draft model '{path}': {str(e).splitlines()[0]}") from None
    tokenizer = _tokenizer(resolved.model_path, local=resolved.is_local)
    return Target(model.to(target.device), tokenizer, name=resolved.name)


def _tokenizer(model_path: str, local: bool):
    """The folder's tokenizer, or None where it has none (a draftsmith-trained folder, a bare model)."""
    from transformers import AutoTokenizer

    if local and not any((Path(model_path) / n).is_file() for n in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError):
        return None


def check_vocabulary(draft: Target, target: Target, spec: str) -> None:
    """Refuse a draft whose tokens are not the target's: a different vocabulary, or too few rows."""
    fix = (
        "use a draft model with the target's tokenizer (universal assisted decoding across tokenizers "
        "is not implemented)"
    )
    both = draft.tokenizer is not None and target.tokenizer is not None
    if both and draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise UserError(
            f"draft model {spec} has another tokenizer ({len(draft.tokenizer)} tokens) than target "
            f"{target.name} ({len(target.tokenizer)} tokens): {fix}"
        )
    need = len(target.tokenizer) if target.tokenizer is not None else target.vocab_size
    rows = min(draft.vocab_size, draft.model.get_input_embeddings().weight.shape[0])
    if rows < need:
        raise UserError(
            f"draft model {spec} has {rows} token rows but target {target.name} has {need} tokens: {fix}"
        )


def build(arg: str | None) -> DraftLMFactory:
    """`draft:PATH[:k=N][:vocab=V][:min_prob=P]`: a draft model at PATH drafting at most N tokens a
    step (0: the engine's k), over its V most frequent tokens (0: all), cut below probability P."""
    if not arg:
        raise UserError(
            "draft needs a model: use draft:PATH[:k=N][:vocab=V][:min_prob=P] with PATH a draft-LM "
            "folder or a target spec"
        )
    path, o = split_path_options(arg, {"k": 0, "vocab": 0, "min_prob": 0.0})
    if o["k"] < 0:
        raise UserError(f"draft option k={o['k']} must be a positive draft length (or 0 for the engine's k)")
    if o["vocab"] < 0:
        raise UserError(f"draft option vocab={o['vocab']} must be a positive token count (or 0 for all)")
    return DraftLMFactory(
        path,
        max_k=int(o["k"]),
        vocab=int(o["vocab"]),
        min_prob=check_probability("min_prob", o["min_prob"]),
    )

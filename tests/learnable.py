"""A tiny target whose continuation is learnable but cannot be looked up: the learnability fixture.

The target is built by hand from the tiny character-level Llama of `conftest.make_tiny_checkpoint`:
attention and MLP outputs are zeroed, so every hidden state is its token's embedding, and the LM
head scores token c by the embedding of perm^-1(c). Its greedy continuation of any text is therefore
the walk x, perm(x), perm(perm(x)), ... along one cycle through all 62 letters and digits, starting
from the prompt's last character. The chat template is bare (messages concatenated), so every prompt
starts its own walk.

Why it suits the check. A drafter that learns perm drafts whole blocks; prompt lookup finds nothing
to copy, because a prompt of random characters rarely holds the pair (x, perm(x)) and an answer
shorter than the cycle never repeats itself. So a learned speculator's tau must end well above
prompt lookup's, and a recipe that cannot learn a 62-entry table in a minute fails.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import torch
from conftest import make_tiny_checkpoint
from tokenizers import decoders
from transformers import AutoTokenizer, LlamaForCausalLM

ALPHABET = string.ascii_letters + string.digits
BARE_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def make_cycle_target(path: Path, seed: int = 0) -> tuple[str, dict[str, str]]:
    """Write the target to `path`; returns (path, perm as a character map)."""
    make_tiny_checkpoint(path, max_positions=256, seed=seed)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = BARE_TEMPLATE
    tok.backend_tokenizer.decoder = decoders.Fuse()
    tok.save_pretrained(path)
    rng = random.Random(seed)
    order = list(ALPHABET)
    rng.shuffle(order)
    perm = {a: b for a, b in zip(order, order[1:] + order[:1], strict=True)}  # one cycle through all
    model = LlamaForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        head = torch.zeros_like(emb)
        ids = {c: tok.convert_tokens_to_ids(c) for c in ALPHABET}
        for a, b in perm.items():
            head[ids[b]] = 30 * emb[ids[a]] / emb[ids[a]].norm()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(path)
    return str(path), perm


def write_prompts(path: Path, n: int, seed: int, lo: int = 6, hi: int = 20) -> str:
    """n prompts of random letters and digits, one `{"prompt": ...}` per line."""
    rng = random.Random(seed)
    lines = [
        json.dumps(
            {
                "id": f"p{seed}-{i}",
                "prompt": "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, hi))),
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)

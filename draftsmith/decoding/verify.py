"""Verification: which drafted tokens the target accepts, and which token it adds. Pure functions.

For one row with k drafted tokens x_1..x_k, the target forward yields k+1 distributions p_1..p_{k+1}
(p_i predicts the token at draft position i; p_{k+1} follows the whole draft).

- accepted: x_i is kept if x_1..x_{i-1} were kept and the test below passes.
- recovered: at the first rejection i, the target's own token replaces x_i.
- bonus: if all k are accepted, the target adds a token from p_{k+1}.

Either way one target token is committed after the n accepted ones, so a step commits n + 1 tokens.

Greedy (temperature 0): x_i is accepted iff it equals argmax p_i; the added token is argmax p_{n+1}.
Sampling (Leviathan et al. / Chen et al.): accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
on rejection sample from norm(max(0, p_i - q_i)); the bonus token is sampled from p_{k+1}. With a
deterministic draft (q one-hot at x_i) this reduces to accepting with probability p_i(x_i) and
resampling from p_i with x_i removed. The committed tokens are then distributed exactly as plain
sampling from p would give.
"""

from __future__ import annotations

import torch


def verify_greedy(draft: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """Return (n accepted, the target's next token).

    >>> verify_greedy([5, 6, 7], [5, 6, 9, 4])
    (2, 9)
    >>> verify_greedy([5, 6], [5, 6, 8])
    (2, 8)
    """
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, target_argmax[n]


def verify_sampling(
    draft: list[int],
    draft_probs: torch.Tensor | None,  # [k, V] q, or None for a deterministic (one-hot) draft
    target_p: torch.Tensor,  # [k+1, V] processed target distributions p
    generator: torch.Generator,
) -> tuple[int, int]:
    """Exact speculative sampling. Return (n accepted, the recovered or bonus token)."""
    k = len(draft)
    if k:
        idx = torch.tensor(draft)
        p_x = target_p[torch.arange(k), idx]
        q_x = torch.ones(k) if draft_probs is None else draft_probs[torch.arange(k), idx].float()
        u = torch.rand(k, generator=generator)
        # u < p/q  <=>  u * q < p, which also handles q == 0 without dividing.
        ok = (u * q_x < p_x).tolist()
        for i in range(k):
            if not ok[i]:
                if draft_probs is None:
                    residual = target_p[i].clone()
                    residual[draft[i]] = 0.0
                else:
                    residual = (target_p[i] - draft_probs[i].float()).clamp_min(0.0)
                return i, _sample(residual, generator)
    return k, _sample(target_p[k], generator)


def _sample(weights: torch.Tensor, generator: torch.Generator) -> int:
    total = weights.sum()
    if not total > 0:  # p == q exactly: rejection had probability 0, any choice is measure-zero
        return int(weights.argmax())
    return int(torch.multinomial(weights / total, 1, generator=generator))


def verify_tree(
    tokens: list[int],
    parents: list[int],
    target: torch.Tensor,  # [n+1, V]: row 0 follows the committed token, row 1+i follows node i
    generator: torch.Generator | None,  # None = greedy (argmax); else sample from the rows of p
) -> tuple[list[int], int]:
    """Walk a deterministic draft tree. Return (accepted node indices root-first, next token).

    At each node take the target's own choice y (argmax, or a sample from p at temperature > 0);
    if a child carries y, descend to it, else y is the next token. The committed tokens are
    therefore exactly what plain decoding would produce (greedy) or sample (sampling): the tree
    only decides how many of them one forward yields.

    >>> verify_tree([5, 6, 7], [-1, -1, 0], torch.eye(9)[[6, 7, 8, 8]], None)
    ([1], 8)
    """
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tokens, parents, strict=True)):
        children.setdefault(par, {}).setdefault(tok, i)
    path: list[int] = []
    node = -1
    while True:
        row = target[node + 1]
        y = int(row.argmax()) if generator is None else _sample(row, generator)
        nxt = children.get(node, {}).get(y)
        if nxt is None:
            return path, y
        path.append(nxt)
        node = nxt

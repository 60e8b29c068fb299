"""Helpers for tests/ecosystem: the library venvs under .peers/, the programs run inside them, our own
engine's answer on the same prompts, and the table of results `scripts/check_exports.sh` commits.

The library venvs hold no draftsmith: a program in programs/ is started there by path, reads its job
from a JSON file or argv, and writes JSON and safetensors files that the test (in the project venv)
compares with what draftsmith computes. A test whose venv is absent is skipped with the command that
creates it.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PEERS = REPO / ".peers"
PROGRAMS = Path(__file__).resolve().parent / "programs"
SHIPPED = REPO / "speculators"
# Offline: the library must read the folders we give it, never a hub copy of the same model.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
RESULTS_ENV = "DRAFTSMITH_ECOSYSTEM_RESULTS"  # a JSON file the table rows are appended to


def venv_python(name: str) -> Path:
    """The python of .peers/NAME; skips the calling test when that venv is absent."""
    python = PEERS / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no .peers/{name} venv: bash scripts/peer_venv.sh {name} creates it")
    return python


def run_program(venv: str, program: str, *args: str, timeout: float = 900) -> None:
    """Run programs/PROGRAM with .peers/VENV's python; its stderr tail becomes the failure message."""
    python = venv_python(venv)
    proc = subprocess.run(
        [str(python), str(PROGRAMS / program), *map(str, args)],
        env={**os.environ, **OFFLINE},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        pytest.fail(f"{program} in .peers/{venv} exited {proc.returncode}:\n{tail}")


@dataclass
class Ours:
    """Our engine's answers on a list of prompts: plain greedy and with the speculator."""

    plain: list[list[int]]
    spec: list[list[int]]
    tau: float
    accept_per_pos: list[float]
    steps: int


def our_decoding(target, spec: str | None, prompts: list[list[int]], k: int, max_new_tokens: int) -> Ours:
    """Plain and speculative greedy decoding with draftsmith's engine (`target` a loaded Target);
    `spec` None: plain only (the speculative fields then repeat it)."""
    from draftsmith.decoding.engine import DecodeStats, generate
    from draftsmith.drafters import registry

    factory = registry.build(spec) if spec else None
    plain, out = [], []
    for ids in prompts:  # one at a time, as the libraries run them
        plain.append(generate(target, None, [ids], max_new_tokens=max_new_tokens)[0])
        out.append(
            generate(target, factory, [ids], k=k, max_new_tokens=max_new_tokens)[0] if spec else plain[-1]
        )
    plain = [r.token_ids for r in plain]
    stats = DecodeStats.combined(r.stats for r in out)
    return Ours(
        plain=plain,
        spec=[r.token_ids for r in out],
        tau=stats.tau,
        accept_per_pos=[round(a, 4) for a in stats.accept_per_pos],
        steps=stats.steps,
    )


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first n prompts of the bench's chat workload, chat-formatted for `tokenizer`."""
    from draftsmith.data.workloads import load_workload
    from draftsmith.target.chat import encode_messages

    return [encode_messages(tokenizer, p.messages) for p in load_workload("chat", n)]


def record(row: dict) -> None:
    """Add one row (library, speculator, config_ok, weights_equal, output_equal, tau_library,
    tau_ours, ...) to the results file named by $DRAFTSMITH_ECOSYSTEM_RESULTS, if set."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    p = Path(path)
    rows = json.loads(p.read_text())["rows"] if p.exists() else []
    rows = [r for r in rows if (r["library"], r["speculator"]) != (row["library"], row["speculator"])]
    p.write_text(json.dumps({"rows": [*rows, row]}, indent=1) + "\n")


def deeper_checkpoint(src: str, dst: Path, layers: int, seed: int = 0) -> str:
    """A copy of the HF folder `src` (config and tokenizer) with `layers` random decoder layers:
    speculators wants three distinct EAGLE-3 feature layers, more than a two-layer model has."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(src)
    config.num_hidden_layers = layers
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return str(dst)


def close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))

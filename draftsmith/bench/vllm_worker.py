"""Runs inside vLLM's own venv (`.peers/vllm`, `scripts/setup.sh --vllm`), never imported by draftsmith:
one vLLM engine with one speculative config, serving timed requests over stdin/stdout.

    python vllm_worker.py ENGINE.json

ENGINE (written by `draftsmith.bench.vllm_peer`): {"model": DIR, "dtype": "float32" | "bfloat16",
"max_model_len": N, "speculative_config": null | {...}, "seed": S}.

Protocol, one JSON object a line: the worker answers `READY {"vllm": version, "load_s": s}` once
the engine is up, then reads requests {"prompt_ids", "max_new_tokens", "stop", "temperature",
"top_p", "top_k", "seed"} from stdin and answers each with `RESULT {"token_ids", "prefill_s",
"decode_s", "decode_tokens", "steps", "spec"}` (or `ERROR "message"`); end of input stops it.
Answers carry a prefix because vLLM also logs to stdout.

Timing follows draftsmith's peers: a request goes through `LLMEngine.add_request` / `step` with
DELTA outputs, so each step that returns tokens is one target forward. `prefill_s` is add_request to
the first token, `decode_s` the first token to the last, `decode_tokens` the tokens after the first
event and `steps` the events after the first (verification steps). `spec` is the change in vLLM's own
spec-decode counters over the request: {"drafts", "draft_tokens", "accepted", "accepted_per_pos"}
(null without a speculative config).

Kept standalone (stdlib and vllm only) so that the library's pins never meet ours.
"""

import json
import sys
import time
from pathlib import Path


def _spec_counters(llm) -> dict:
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for m in llm.get_metrics():
        name = m.name.removesuffix("_total")
        if name in names:
            out[names[name]] += int(m.value)
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = [int(v) for v in m.values]
            acc = out["accepted_per_pos"] + [0] * max(0, len(vals) - len(out["accepted_per_pos"]))
            out["accepted_per_pos"] = [a + (vals[i] if i < len(vals) else 0) for i, a in enumerate(acc)]
    return out


def _diff(after: dict, before: dict) -> dict:
    d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    pb = before["accepted_per_pos"]
    d["accepted_per_pos"] = [
        a - (pb[i] if i < len(pb) else 0) for i, a in enumerate(after["accepted_per_pos"])
    ]
    return d


def _run_one(llm, request_id: str, req: dict, spec: bool) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=req["max_new_tokens"],
        temperature=req["temperature"],
        top_p=req["top_p"],
        top_k=max(req["top_k"], 0),  # 0 keeps every token, as in ours
        seed=req["seed"],
        stop_token_ids=req["stop"],
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    engine = llm.llm_engine
    before = _spec_counters(llm) if spec else None
    tokens: list[int] = []
    first = last = 0.0
    first_count = events = 0
    t0 = time.perf_counter()
    engine.add_request(request_id, {"prompt_token_ids": req["prompt_ids"]}, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            new = list(out.outputs[0].token_ids) if out.outputs else []
            if not new:
                continue
            last = time.perf_counter()
            if not tokens:
                first, first_count = last, len(new)
            events += 1
            tokens.extend(new)
    return {
        "token_ids": tokens,
        "prefill_s": first - t0,
        "decode_s": last - first,
        "decode_tokens": len(tokens) - first_count,
        "steps": max(events - 1, 0),
        "spec": _diff(_spec_counters(llm), before) if spec else None,
    }


def _say(kind: str, obj) -> None:
    sys.stdout.write(f"{kind} {json.dumps(obj)}\n")
    sys.stdout.flush()


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    import vllm
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(
        model=cfg["model"],
        dtype=cfg["dtype"],
        max_model_len=cfg["max_model_len"],
        enforce_eager=True,
        speculative_config=cfg["speculative_config"],
        disable_log_stats=False,  # the spec-decode counters live in the stats
        enable_prefix_caching=False,  # our engine keeps no prefix cache between prompts
        seed=cfg["seed"],
    )
    _say("READY", {"vllm": vllm.__version__, "load_s": round(time.perf_counter() - t0, 2)})
    spec = bool(cfg["speculative_config"])
    for n, line in enumerate(sys.stdin):
        if not line.strip():
            continue
        try:
            _say("RESULT", _run_one(llm, f"r{n}", json.loads(line), spec))
        except Exception as e:  # report and keep serving; the caller decides
            _say("ERROR", f"{type(e).__name__}: {e}")


if __name__ == "__main__":  # vLLM starts worker processes that re-import the main module
    main()

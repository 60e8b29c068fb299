"""Run inside .peers/dflash (z-lab's `dflash` 0.1.0, no draftsmith): load a target and a DFlash
drafter with the library's own loader and decode with its `dflash_generate`.

    python dflash_check.py JOB.json OUT_DIR

JOB: {"target": DIR, "draft": DIR, "prompts": [[ids]], "max_new_tokens": N, "stop": [ids]}.
Writes OUT_DIR/result.json ({"config": what the library read, "plain": [[ids]], "spec": [[ids]],
"acceptance_lengths": [[n per step]]}) and OUT_DIR/draft.safetensors (the drafter's tensors as the
library loaded them). Float32 throughout: the loader gives bf16 models, which are cast up so the
comparison with plain decoding is not at the mercy of bf16 ties.
"""

import json
import sys
import time
from pathlib import Path

import torch
from dflash import benchmark
from dflash import model as dflash_model
from safetensors.torch import save_file


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    # dflash_generate times itself with torch.cuda.synchronize(), which a CPU build of torch refuses.
    dflash_model._cuda_time = time.perf_counter
    target, draft, _ = benchmark.load_transformers_models(job["target"], job["draft"], torch.device("cpu"))
    target, draft = target.float(), draft.float()
    plain, spec, accept = [], [], []
    for ids in job["prompts"]:
        x = torch.tensor([ids], dtype=torch.long)
        n = len(ids)
        for block, dest in ((1, plain), (None, spec)):
            r = dflash_model.dflash_generate(
                draft,
                target=target,
                input_ids=x,
                max_new_tokens=job["max_new_tokens"],
                stop_token_ids=job["stop"] or None,
                block_size=block,
                return_stats=True,
            )
            dest.append(r.output_ids[0, n:].tolist())
            if block is None:
                accept.append([int(a) for a in r.acceptance_lengths])
    save_file({k: v.contiguous() for k, v in draft.state_dict().items()}, str(out / "draft.safetensors"))
    config = {
        "class": type(draft).__name__,
        "block_size": int(draft.block_size),
        "mask_token_id": int(draft.mask_token_id),
        "target_layer_ids": [int(i) for i in draft.target_layer_ids],
        "num_hidden_layers": int(draft.config.num_hidden_layers),
    }
    result = {"config": config, "plain": plain, "spec": spec, "acceptance_lengths": accept}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

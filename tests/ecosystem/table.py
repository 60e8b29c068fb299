"""Print the ecosystem results (rows written by tests/ecosystem with $DRAFTSMITH_ECOSYSTEM_RESULTS) as
a table: library x speculator x (config ok, weights equal, output equal, tau library vs ours).

    python tests/ecosystem/table.py benchmarks/results/ecosystem.json
"""

import json
import sys
from pathlib import Path


def _yn(x) -> str:
    return "-" if x is None else ("yes" if x else "NO")


def _num(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text())
    head = ("library", "speculator", "config ok", "weights equal", "output equal", "tau library", "tau ours")
    rows = [
        (
            r["library"],
            r["speculator"],
            _yn(r["config_ok"]),
            _yn(r["weights_equal"]) + (f" ({r['tensors']})" if r.get("tensors") else ""),
            _yn(r["output_equal"]),
            _num(r["tau_library"]),
            _num(r["tau_ours"]),
        )
        for r in data["rows"]
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=False)]
    for line in (head, tuple("-" * w for w in widths), *rows):
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
    print()
    print("tau: committed tokens per verification step (the bonus token included), greedy, float32;")
    print("weights equal (n): n tensors compared bit for bit; '-': not checked (see tests/ecosystem).")


if __name__ == "__main__":
    main()

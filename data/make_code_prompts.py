"""HumanEval-style code prompts from the Python standard library, for regenerating code training data.

The `code` benchmark asks the target to complete a function from its signature and docstring
(HumanEval, through `CODE_REQUEST`), and the only code prompts held out from it are HumanEval's 124
other problems. This writes many more of the same shape: every top-level function and public method of the
standard library with a docstring of at least `--min-doc` characters and a body of at least three
statements becomes `def name(args):` plus its docstring, in the benchmark's own request text. The
answers are the target's, written by `draftsmith data regenerate`; the library's own bodies are
never shown. Files the `long` benchmark can send (its first `--skip-long` prompts at seed 0) are
left out, so no benchmark prompt shares a file with these.

    .venv/bin/python data/make_code_prompts.py --num 3000 --out .gpu/prompts-stdlib-code.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
from pathlib import Path

from draftsmith.data.workloads import CODE_REQUEST, load_workload
from draftsmith.fileio import atomic_write_text

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "idlelib"}


def function_prompts(path: Path, module: str, min_doc: int) -> list[tuple[str, str]]:
    """(id, HumanEval-style prompt) for each qualifying top-level function of one file."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out = []
    # Top-level functions and the methods of top-level classes (as `Class.method`).
    nodes = [(n, n.name) for n in tree.body if isinstance(n, ast.FunctionDef)]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
        nodes += [(n, f"{cls.name}.{n.name}") for n in cls.body if isinstance(n, ast.FunctionDef)]
    for node, name in nodes:
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node, clean=True)
        if not doc or len(doc) < min_doc or len(node.body) < 4:  # docstring + 3 statements
            continue
        args = ast.unparse(node.args)
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        body = "\n".join(("    " + line).rstrip() for line in doc.splitlines())
        prompt = f'def {node.name}({args}){returns}:\n    """\n{body}\n    """\n'
        out.append((f"stdlib/{module}/{name}", prompt))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, default=3000)
    p.add_argument("--min-doc", type=int, default=40, help="shortest docstring kept, in characters")
    p.add_argument("--skip-long", type=int, default=40, help="leave out the files of this many long prompts")
    p.add_argument("--seed", type=int, default=0, help="order of the prompts")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    long_files = (
        {x.id.removeprefix("stdlib/") for x in load_workload("long", args.skip_long)}
        if args.skip_long
        else set()
    )
    found: dict[str, str] = {}
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if SKIP_DIRS & set(rel.parts) or rel.as_posix() in long_files:
            continue
        for pid, prompt in function_prompts(path, rel.with_suffix("").as_posix(), args.min_doc):
            found.setdefault(pid, prompt)
    ids = sorted(found)
    random.Random(args.seed).shuffle(ids)
    lines = [
        json.dumps({"id": i, "messages": [{"role": "user", "content": CODE_REQUEST.format(prompt=found[i])}]})
        + "\n"
        for i in ids[: args.num]
    ]
    atomic_write_text(args.out, "".join(lines))
    print(f"{len(lines)} of {len(found)} functions -> {args.out}")


if __name__ == "__main__":
    main()

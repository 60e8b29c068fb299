"""Benchmark workloads: the prompts a benchmark run decodes, as OpenAI-style chat messages.

`load_workload(name_or_path, num_prompts, seed)` returns up to `num_prompts` prompts, always the
same ones for the same arguments on the same machine:

- `chat`: held-out ShareGPT conversations (see `draftsmith.data.sources`), in file order; each
  prompt is the conversation's first user message alone (system banners dropped); user texts
  over `CHAT_MAX_CHARS` are skipped. 276 are available; asking for N reads the ShareGPT file only
  as far as the N-th one (held-out records are spread through it: N = 50 takes about 0.1 s, all
  of them about 0.4 s here).
- `code`: the first N HumanEval problems, each a user turn asking to complete the function.
- `long`: SWE-like requests about one Python standard library file of `LONG_MIN_CHARS` to
  `LONG_MAX_CHARS` characters and at least `LONG_MIN_WORDS` words (2,600-6,800 SmolLM2 tokens a
  prompt): the file in a code block plus a request about one of its real top-level functions or
  classes ("add type hints to X", "explain class Y", "rename X to Z", "write a docstring for X",
  "find a bug in X"). `seed` picks the files and names. Test suites, third-party packages and
  mostly-data files (codec tables) are left out; the set depends on the installed Python (122
  files on CPython 3.11.7).
- a path to a JSONL file: one JSON object per line with `messages` (a list of
  `{"role": "system"|"user"|"assistant", "content": str}`) or `prompt` (a string, taken as one
  user message), and an optional `id` (default `line-N`); blank lines are skipped. Every line is
  checked, and the first bad one raises `UserError` naming the file and line.

If fewer prompts exist than asked, the shorter list is returned; the caller reports it.
Deliberately not here: chat templates and tokenization (the runner applies the target's template),
max new tokens, sampling settings and timing.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import sysconfig
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.data.sources import iter_humaneval, iter_sharegpt
from draftsmith.errors import UserError

BUILTIN = ("chat", "code", "long")
ROLES = ("system", "user", "assistant")

CHAT_MAX_CHARS = 6_000
# Long prompts should be at least ~2,500 tokens, so that prefill and attention over the context
# show. Characters alone are a poor proxy (stdlib files run 3.1-4.9 characters per SmolLM2 token,
# indentation-heavy ones the most), so a file must also hold LONG_MIN_WORDS words and punctuation
# marks: a BPE rarely merges across those, so the count undercounts tokens (by 1-35% on these files)
# and 2,200 of them gave at least 2,600 SmolLM2 tokens per prompt.
LONG_MIN_CHARS = 9_000
LONG_MAX_CHARS = 24_000
LONG_MIN_WORDS = 2_200
_WORD = re.compile(r"\w+|[^\w\s]")
CODE_REQUEST = (
    "Complete the following Python function. Reply with the full function in one code block."
    "\n\n```python\n{prompt}```"
)


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. `messages` is OpenAI chat format: [{"role": ..., "content": ...}]."""

    id: str
    messages: list[dict]


def load_workload(name_or_path: str, num_prompts: int, seed: int = 0) -> list[Prompt]:
    """Up to `num_prompts` prompts of a built-in workload (chat, code, long) or a JSONL file.

    `seed` only affects `long`; the others take the first prompts in their source's order.
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts <= 0:
        raise UserError(f"number of prompts must be a positive integer, got {num_prompts!r}; pass 1 or more")
    if name_or_path == "chat":
        return _chat(num_prompts)
    if name_or_path == "code":
        return _code(num_prompts)
    if name_or_path == "long":
        return _long(num_prompts, seed)
    path = Path(name_or_path).expanduser()
    if path.exists() or path.suffix == ".jsonl":
        return _jsonl(name_or_path, path)[:num_prompts]
    raise UserError(
        f"unknown workload {name_or_path!r}; choose chat, code, long, or the path of a .jsonl file"
    )


# ---------------------------------------------------------------- chat (held-out ShareGPT)


def _chat(n: int) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for record in iter_sharegpt(split="heldout"):
        # A repeated id would make two report rows indistinguishable; keep the first.
        if record["id"] in seen:
            continue
        # iter_sharegpt guarantees the first non-system message is a user turn.
        user = next(m for m in record["messages"] if m["role"] == "user")
        if len(user["content"]) > CHAT_MAX_CHARS:
            continue
        seen.add(record["id"])
        prompts.append(Prompt(id=f"sharegpt/{record['id']}", messages=[dict(user)]))
        if len(prompts) == n:
            break
    return prompts


# ---------------------------------------------------------------- code (HumanEval)


def _code(n: int) -> list[Prompt]:
    prompts = []
    for problem in iter_humaneval():
        code = problem["prompt"] if problem["prompt"].endswith("\n") else problem["prompt"] + "\n"
        content = CODE_REQUEST.format(prompt=code)
        prompts.append(Prompt(id=problem["id"], messages=[{"role": "user", "content": content}]))
        if len(prompts) == n:
            break
    return prompts


# ---------------------------------------------------------------- long (standard library files)

# Directories whose files are not the standard library proper (third-party packages, test suites).
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_MIN_CODE_FRACTION = 1 / 3


@dataclass
class _Module:
    """What the request templates need to know about one parsed file."""

    functions: list[str]  # top-level functions (the substantial ones, see _substantial)
    classes: list[str]
    called: list[str]  # top-level functions this file also calls or references
    undocumented: list[str]  # top-level functions and classes without a docstring
    class_names: set[str]  # all top-level classes
    names: set[str]  # every identifier in the file, to avoid renaming onto an existing one


def _long(n: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    files = _stdlib_candidates()
    rng.shuffle(files)
    prompts: list[Prompt] = []
    for rel, path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not LONG_MIN_CHARS <= len(source) <= LONG_MAX_CHARS or len(_WORD.findall(source)) < LONG_MIN_WORDS:
            continue
        module = _parse(source)
        if module is None:
            continue
        # Rotate through the templates; a file lacking what one needs (no class, say) takes the next.
        for i in range(len(_TEMPLATES)):
            request = _TEMPLATES[(len(prompts) + i) % len(_TEMPLATES)](module, rng)
            if request is not None:
                break
        else:
            continue
        body = source if source.endswith("\n") else source + "\n"
        content = f"Here is the file `{rel}`:\n\n```python\n{body}```\n\n{request}"
        prompts.append(Prompt(id=f"stdlib/{rel}", messages=[{"role": "user", "content": content}]))
        if len(prompts) == n:
            break
    return prompts


def _stdlib_candidates() -> list[tuple[str, Path]]:
    """(relative posix path, path) of stdlib .py files that may be in the size range, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath, filename)
            # A cheap filter on bytes; the exact character count is checked after reading.
            # UTF-8 takes 1-4 bytes a character, hence the wider upper bound.
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if LONG_MIN_CHARS <= size <= 4 * LONG_MAX_CHARS:
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def _parse(source: str) -> _Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old files are not our concern
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    defs = [
        node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    # Mostly-data files (codec tables like encodings/cp1252.py, opcode lists) are not code one asks
    # to change; require functions and classes to span at least a third of the lines.
    if sum(d.end_lineno - d.lineno + 1 for d in defs) < len(source.splitlines()) * _MIN_CODE_FRACTION:
        return None
    referenced = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names = set(referenced)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    functions = [d for d in defs if not isinstance(d, ast.ClassDef)]
    classes = [d for d in defs if isinstance(d, ast.ClassDef)]
    return _Module(
        functions=_substantial(functions),
        classes=_substantial(classes),
        called=_substantial([d for d in functions if d.name in referenced]),
        undocumented=_substantial([d for d in defs if ast.get_docstring(d) is None]),
        class_names={d.name for d in classes},
        names=names,
    )


def _substantial(defs: list[ast.stmt]) -> list[str]:
    """Names of defs spanning at least 5 lines, or of all of them if none does.

    A request about a two-line helper ("find a bug in X") would not be a realistic task.
    """
    big = [d for d in defs if (d.end_lineno or d.lineno) - d.lineno >= 4]
    return [d.name for d in big or defs]


def _type_hints(m: _Module, rng: random.Random) -> str | None:
    if not m.functions:
        return None
    name = rng.choice(m.functions)
    return (
        f"Add type hints to the function `{name}`: every parameter and the return value. "
        "Keep its behaviour unchanged and show the whole updated function."
    )


def _explain_class(m: _Module, rng: random.Random) -> str | None:
    if not m.classes:
        return None
    name = rng.choice(m.classes)
    return (
        f"Explain what the class `{name}` does: its purpose, its main methods, "
        "and how the rest of this file uses it."
    )


def _rename(m: _Module, rng: random.Random) -> str | None:
    if not (m.called or m.functions):
        return None
    old = rng.choice(m.called or m.functions)
    # Make a private function public or the reverse, the usual reason for such a rename.
    options = [old[1:] if old.startswith("_") else "_" + old, old + "_impl", old + "_v2"]
    new = next((name for name in options if name.isidentifier() and name not in m.names), None)
    if new is None:
        return None
    return (
        f"Rename the function `{old}` to `{new}` and update every caller in this file. "
        "Show each changed line with its line context."
    )


def _docstring(m: _Module, rng: random.Random) -> str | None:
    name = rng.choice(m.undocumented or m.functions or m.classes)
    if name in m.class_names:
        return (
            f"Write a docstring for the class `{name}` in the style of the rest of this file: "
            "what it represents, how to construct it and its main methods."
        )
    return (
        f"Write a docstring for the function `{name}` in the style of the rest of this file: "
        "what it does, its arguments, what it returns and what it raises."
    )


def _find_bug(m: _Module, rng: random.Random) -> str | None:
    if not m.functions:
        return None
    name = rng.choice(m.functions)
    return (
        f"A colleague says `{name}` misbehaves on some inputs. Find a bug or an unhandled edge "
        f"case in `{name}`, explain it, and show a fixed version of the function."
    )


_TEMPLATES: list[Callable[[_Module, random.Random], str | None]] = [
    _type_hints,
    _explain_class,
    _rename,
    _docstring,
    _find_bug,
]


# ---------------------------------------------------------------- JSONL files


def load_jsonl_prompts(path: str) -> list[Prompt]:
    """Every prompt of a JSONL file in the format above, each line checked (UserError on the first
    bad one). Unlike `load_workload`, never takes the name for a built-in workload."""
    return _jsonl(path, Path(path).expanduser())


def _jsonl(shown: str, path: Path) -> list[Prompt]:
    if not path.exists():
        raise UserError(f"workload file {shown} not found; check the path")
    if not path.is_file():
        raise UserError(f"workload file {shown} is not a file; pass a .jsonl file")
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:
        # Read bytes and decode per line, so a bad encoding is reported with its line number.
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(_bad_line(shown, lineno, "not valid UTF-8")) from None
            if not line.strip():
                continue
            prompt = _parse_line(line, lineno, shown)
            if prompt.id in first_line:
                problem = f"id {prompt.id!r} already used on line {first_line[prompt.id]}"
                raise UserError(_bad_line(shown, lineno, problem))
            first_line[prompt.id] = lineno
            prompts.append(prompt)
    if not prompts:
        raise UserError(
            f'workload file {shown} has no prompts; add one JSON object per line with "messages" or "prompt"'
        )
    return prompts


def _bad_line(shown: str, lineno: int, problem: str) -> str:
    return f"workload file {shown} line {lineno}: {problem}; fix or remove that line"


def _parse_line(line: str, lineno: int, shown: str) -> Prompt:
    def bad(problem: str) -> UserError:
        return UserError(_bad_line(shown, lineno, problem))

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise bad(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise bad("expected a JSON object")
    if ("messages" in obj) == ("prompt" in obj):
        raise bad(
            'expected "messages" or "prompt"' if "prompt" not in obj else 'has both "messages" and "prompt"'
        )

    prompt_id = obj.get("id", f"line-{lineno}")
    if isinstance(prompt_id, int) and not isinstance(prompt_id, bool):
        prompt_id = str(prompt_id)
    if not isinstance(prompt_id, str) or not prompt_id.strip():
        raise bad('"id" must be a non-empty string or an integer')

    if "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise bad('"prompt" must be a non-empty string')
        return Prompt(id=prompt_id, messages=[{"role": "user", "content": text}])

    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise bad('"messages" must be a non-empty list of {"role", "content"} objects')
    clean = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f'messages[{i}] must be an object with "role" and "content"')
        role, content = message.get("role"), message.get("content")
        if "role" not in message:
            raise bad(f'messages[{i}] has no "role"; use system, user or assistant')
        if role not in ROLES:
            raise bad(f"messages[{i}] has role {role!r}; use system, user or assistant")
        if not isinstance(content, str):
            raise bad(f'messages[{i}] "content" must be a string')
        if not content.strip():
            raise bad(f"messages[{i}] has empty content")
        # Extra keys (OpenAI's "name", ...) are dropped: the chat template only takes these two.
        clean.append({"role": role, "content": content})
    return Prompt(id=prompt_id, messages=clean)

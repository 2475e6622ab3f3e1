"""Task prompt sets built from text on every machine, chosen reproducibly by seed.

- translate: an English gettext message -> German (the catalog's human translation is the reference);
- summarise: the start of a man page;
- code: a Python standard-library function to rewrite with type hints;
- chat: open questions from a fixed list (nothing to quote: the hard case for prompt lookup);
- code-edit: a standard-library function with one local name to rename, returned whole (a small
  change to a longer text, as in editing a file);
- multi-turn: a chat question, the target's own answer to it, then a second turn that asks for the
  answer again with an edit (the runner makes the first answer: `follow_up` holds the second turn).

A user's own prompts come from a JSONL file, one {"task": ..., "prompt": ...} object per line.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecdecError
from . import corpus

TASKS = ("translate", "summarise", "code", "chat", "code-edit", "multi-turn")

FOLLOW_UPS = [
    "Repeat your answer word for word, but as a numbered list.",
    "Repeat your answer exactly, and add one more sentence at the end.",
    "Write your answer again, word for word, with a short title above it.",
]

CHAT_QUESTIONS = [
    "What are three good habits for writing maintainable software?",
    "Explain why the sky looks blue during the day and red at sunset.",
    "Give me a simple recipe for a vegetable soup.",
    "What is the difference between a process and a thread?",
    "Suggest a short plan for learning to play the guitar as an adult.",
    "Why do we have seasons on Earth?",
    "Write a short poem about the sea in autumn.",
    "What should I consider when choosing a laptop for programming?",
    "How does a refrigerator keep food cold?",
    "Explain what a hash table is to a beginner.",
    "What are the benefits of regular exercise for mental health?",
    "Describe how a bill becomes a law in a parliamentary democracy.",
    "What is photosynthesis and why does it matter?",
    "Give some tips for writing a clear email to a colleague.",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Explain recursion with a simple example.",
    "What are some ways to reduce food waste at home?",
    "Why is sleep important for learning?",
    "How does compound interest work?",
    "Tell me a short story about a robot who learns to paint.",
    "What makes a good team leader?",
    "Explain the difference between TCP and UDP.",
    "What are black holes and how do they form?",
    "How can I make my small garden more friendly to bees?",
    "What are the main causes of inflation?",
    "Describe the water cycle in a few sentences.",
    "What is a good way to prepare for a job interview?",
    "Explain what an API is using an everyday analogy.",
    "Why do cats purr?",
    "How do noise-cancelling headphones work?",
    "What is the difference between a virus and a bacterium?",
]


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str
    reference: str | None = None
    source: str = ""
    follow_up: str | None = None
    """A second user turn, asked after the target's own answer to `text` (multi-turn chat)."""

    def messages(self, first_answer: str) -> list[dict]:
        """The conversation of a multi-turn prompt, given the target's first answer."""
        return [{"role": "user", "content": self.text}, {"role": "assistant", "content": first_answer},
                {"role": "user", "content": self.follow_up}]


def _renamable(source: str) -> str | None:
    """A local variable (assigned in the function, not a parameter) to rename, if there is one."""
    import ast

    function = ast.parse(source).body[0]
    params = {a.arg for a in function.args.args + function.args.kwonlyargs}
    names = [n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    names = [n for n in names if n not in params and len(n) > 1]
    return max(sorted(set(names)), key=names.count) if names else None


def task_prompts(task: str, count: int, seed: int = 0) -> list[Prompt]:
    """`count` prompts of one task, chosen by a seeded shuffle of the sorted source list."""
    rng = random.Random(f"{task}:{seed}")
    if task == "translate":
        messages = [m for m in corpus.gettext_messages(min_chars=60, max_chars=300)]
        picked = rng.sample(messages, min(count, len(messages)))
        return [Prompt(task, f"Translate this message from English to German:\n\n{m.english}", m.german, m.domain)
                for m in picked]
    if task == "summarise":
        pages = corpus.man_pages(count, seed=rng.randrange(2**31))
        return [Prompt(task, f"Summarise this man page in a few sentences:\n\n{text[:1500]}", None, name)
                for name, text in pages]
    if task == "code":
        functions = corpus.stdlib_functions(min_lines=6, max_lines=25)
        picked = rng.sample(functions, min(count, len(functions)))
        return [Prompt(task, "Rewrite this Python function with type hints, keeping its behaviour the same:\n\n"
                       f"```python\n{source}\n```", None, name) for name, source in picked]
    if task == "chat":
        picked = rng.sample(CHAT_QUESTIONS, min(count, len(CHAT_QUESTIONS)))
        return [Prompt(task, q, None, "chat") for q in picked]
    if task == "code-edit":
        functions = [(name, source, _renamable(source)) for name, source in corpus.stdlib_functions(12, 40)]
        functions = [f for f in functions if f[2]]
        picked = rng.sample(functions, min(count, len(functions)))
        return [Prompt(task, f"Rename the variable `{var}` to `{var}_new` in this Python function and return the "
                       f"whole function, otherwise unchanged:\n\n```python\n{source}\n```", None, name)
                for name, source, var in picked]
    if task == "multi-turn":
        picked = rng.sample(CHAT_QUESTIONS, min(count, len(CHAT_QUESTIONS)))
        return [Prompt(task, q, None, "chat", follow_up=rng.choice(FOLLOW_UPS)) for q in picked]
    raise SpecdecError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")


def load_prompts_file(path: str | Path) -> list[Prompt]:
    """A JSONL file of {"prompt": "...", "task": "..."} objects (task optional: "custom")."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SpecdecError(f"cannot read prompts file {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SpecdecError(f"{path}:{number}: each line must be a JSON object with a \"prompt\" string") from None
        if not isinstance(text, str) or not text.strip():
            raise SpecdecError(f"{path}:{number}: \"prompt\" must be a non-empty string")
        prompts.append(Prompt(str(obj.get("task", "custom")), text, obj.get("reference"), f"{path}:{number}"))
    if not prompts:
        raise SpecdecError(f"prompts file {path} holds no prompts")
    return prompts

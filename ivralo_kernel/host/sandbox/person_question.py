"""[host] The egress question as the person reads it at the cell's input prompt, and the answer
taken from what they type. The host asks it itself, through its channel relay (``ChannelRelay.ask``):
the answer never passes through the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Typed text -> the person's answer; None: nobody can answer (or nobody did in time).
TypedAnswer = Callable[[str], str | None]
PROMPT_ATTEMPTS = 3  # an answer that is none of the choices is asked again, this many times in all


def prompt_text(question: str, choices: Sequence[str]) -> str:
    """What the person reads at the cell's input prompt (the README's screenshot shows it; the
    gateway client recognizes it by its ``. Allow? [...] `` end)."""
    return f"{question}. Allow? [{'/'.join(choices)}] "


def split_prompt(prompt: str) -> tuple[str, tuple[str, ...]] | None:
    """``prompt_text``'s question and choices, from its text (a dialog offers them as buttons);
    None for any other text."""
    question, sep, tail = prompt.rpartition(". Allow? [")
    if not sep or not tail.endswith("] "):
        return None
    return question, tuple(tail[:-2].split("/"))


def ask_until_chosen(ask: TypedAnswer, question: str, choices: Sequence[str]) -> str | None:
    """Ask until the answer is one of the choices or a prefix of one ("no" after the last
    attempt); None if nobody can answer."""
    prompt = prompt_text(question, choices)
    for _ in range(PROMPT_ATTEMPTS):
        typed = ask(prompt)
        if typed is None:
            return None
        typed = typed.strip().lower()
        for choice in choices:
            if typed and choice.startswith(typed):
                return choice
        prompt = f"Please answer {', '.join(choices[:-1])} or {choices[-1]}. {question}. Allow? "
    return "no"

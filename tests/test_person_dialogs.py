"""The host's egress question as the page's dialog (host/jupyter/person_dialogs.py): only a
registered connection is asked by dialog; only an offered choice answers; a question whose
execution ended is nobody's; and the prompt's text splits back into its question and choices."""

from __future__ import annotations

import threading
import time

import pytest

from ivralo_kernel.host.jupyter.person_dialogs import PersonDialogs
from ivralo_kernel.host.sandbox.person_question import prompt_text, split_prompt

pytestmark = pytest.mark.fast


def open_question(dialogs: PersonDialogs, kernel: str) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while not dialogs.open_questions(kernel):
        assert time.monotonic() < deadline, "the question never opened"
        time.sleep(0.01)
    (question,) = dialogs.open_questions(kernel)
    return question


def test_only_a_registered_connection_is_asked_by_dialog() -> None:
    dialogs = PersonDialogs()
    dialogs.register("k1", "page-a")
    assert dialogs.by_dialog("k1", "page-a")
    assert not dialogs.by_dialog("k1", "console")
    assert not dialogs.by_dialog("k2", "page-a")
    assert not dialogs.by_dialog(None, "page-a")


def test_an_offered_choice_answers_and_nothing_else_does() -> None:
    dialogs = PersonDialogs()
    got: list[str | None] = []
    asking = threading.Thread(
        target=lambda: got.append(dialogs.ask("k1", "exec-1", "Code wants", ("yes", "no"), 30, lambda: False))
    )
    asking.start()
    question = open_question(dialogs, "k1")
    assert question["question"] == "Code wants" and question["choices"] == ["yes", "no"]
    assert not dialogs.answer("k1", str(question["id"]), "always")  # not offered (an untrusted folder)
    assert not dialogs.answer("k2", str(question["id"]), "yes")  # another kernel's page
    assert dialogs.answer("k1", str(question["id"]), "yes")
    asking.join(timeout=10)
    assert got == ["yes"]
    assert dialogs.open_questions("k1") == []
    assert not dialogs.answer("k1", str(question["id"]), "no")  # answered once


def test_a_question_whose_execution_ended_is_nobodys() -> None:
    dialogs = PersonDialogs()
    ended = threading.Event()
    got: list[str | None] = []
    asking = threading.Thread(
        target=lambda: got.append(dialogs.ask("k1", "exec-1", "Code wants", ("yes", "no"), 30, ended.is_set))
    )
    asking.start()
    open_question(dialogs, "k1")
    ended.set()
    asking.join(timeout=10)
    assert got == [None]
    assert dialogs.open_questions("k1") == []


def test_the_prompt_splits_into_its_question_and_choices() -> None:
    question = "Code in this cell wants to reach localhost, this machine, port 8000"
    assert split_prompt(prompt_text(question, ("yes", "always", "no"))) == (question, ("yes", "always", "no"))
    assert split_prompt("Please answer yes or no. Code wants. Allow? ") is None

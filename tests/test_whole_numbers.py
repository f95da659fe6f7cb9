"""The one whole-number check, and the sentences of the places that ask it."""

import ast
import os

import pytest

import loops
from conftest import ROOT
from loops.core import schedules, target_networks
from loops.input.random_access import SeekableBatches
from loops.vocabulary import settings
from loops.vocabulary.whole_numbers import check_whole, is_whole

HELPER = os.path.join(ROOT, "loops", "vocabulary", "whole_numbers.py")


@pytest.mark.parametrize(
    "value, least, expected",
    [
        (3, None, True),
        (0, None, True),
        (-2, None, True),
        (True, None, False),  # Python's 1, never a count
        (False, 0, False),
        (2.0, None, False),
        ("3", None, False),
        (None, None, False),
        (3, 3, True),
        (2, 3, False),
        (0, 0, True),
    ],
)
def test_is_whole_takes_ints_that_are_not_bools_at_least_the_bound(value, least, expected):
    assert is_whole(value, least) is expected


@pytest.mark.parametrize(
    "arguments, sentence",
    [
        (("num_envs", 0), "num_envs must be a whole number >= 1, got 0."),
        (("num_envs", True), "num_envs must be a whole number >= 1, got True."),
        (("steps", 2.0, 2), "steps must be a whole number >= 2, got 2.0."),
        (
            ("eval_episodes", -1, 0, " (0: no evaluation)"),
            "eval_episodes must be a whole number >= 0 (0: no evaluation), got -1.",
        ),
    ],
)
def test_check_whole_names_the_setting_the_bound_its_note_and_the_value(arguments, sentence):
    with pytest.raises(ValueError) as caught:
        check_whole(*arguments)
    assert str(caught.value) == sentence
    assert check_whole("num_envs", 1) is None


def isinstance_int_calls(path):
    """Lines of `path` that call isinstance(x, int): a whole-number check written by hand."""
    tree = ast.parse(open(path).read(), filename=path)
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and len(node.args) == 2
        and getattr(node.args[1], "id", None) == "int"
    ]


def test_no_module_of_the_framework_writes_the_check_by_hand(tmp_path):
    found = {}
    for directory, _, names in os.walk(os.path.join(ROOT, "loops")):
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".py") and path != HELPER and isinstance_int_calls(path):
                found[os.path.relpath(path, ROOT)] = isinstance_int_calls(path)
    assert found == {}
    # The scan sees a hand copy where there is one: the helper's own, and a scratch module's.
    assert isinstance_int_calls(HELPER) == [15]
    scratch = tmp_path / "scratch.py"
    scratch.write_text("def f(n):\n    return isinstance(n, bool) or not isinstance(n, int)\n")
    assert isinstance_int_calls(scratch) == [2]


@pytest.mark.parametrize(
    "call, sentence",
    [
        # Each place keeps its own sentence; a bool, which the hand copies of some let
        # through as 1, is now refused by all.
        (
            lambda: SeekableBatches(lambda position: None).batches_from(True),
            "A stream position is a whole number >= 0, got True.",
        ),
        (
            lambda: schedules.PerEpoch(lambda epoch: epoch, True),
            "steps_per_epoch must be a whole number >= 1, got True.",
        ),
        (
            lambda: loops.make_strategy("default", True),
            "num_replicas must be a whole number >= 1, got True.",
        ),
        (
            lambda: target_networks.copy_every([], [], step=1, every=False),
            "every must be a whole number >= 1, got False.",
        ),
        (
            lambda: settings.whole_number(1, " (or None to turn it off)", optional=True)(
                "eval_every", 0
            ),
            "eval_every must be a whole number >= 1 (or None to turn it off), got 0.",
        ),
        (
            lambda: loops.ClassifierLoop(
                model_fn=lambda: None, optimizer_fn=lambda: None, worst_images=-1
            ),
            "worst_images must be a whole number >= 0, got -1.",
        ),
    ],
)
def test_each_place_keeps_its_sentence_and_refuses_a_bool(call, sentence):
    with pytest.raises(ValueError) as caught:
        call()
    assert str(caught.value) == sentence

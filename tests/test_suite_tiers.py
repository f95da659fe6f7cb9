"""The fast tier: the `slow` marker is registered and conftest.py's list names real tests.

`pytest -m "not slow"` leaves out what tests/conftest.py's SLOW_TESTS names; an entry whose
file or test was renamed would silently move that test into the fast tier, so each must
name a file and, after `::`, at least one test function in it.
"""

import ast
import fnmatch
import os
import pathlib
from types import SimpleNamespace

import pytest

from conftest import ROOT, SLOW_TESTS, is_slow, pytest_collection_modifyitems

TESTS = os.path.join(ROOT, "tests")


def defined_tests(file):
    """The names of the test functions (methods included) that `file` defines."""
    with open(os.path.join(TESTS, file), encoding="utf-8") as source:
        tree = ast.parse(source.read())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


@pytest.mark.parametrize("entry", SLOW_TESTS)
def test_every_slow_entry_names_an_existing_file_and_test(entry):
    file, _, pattern = entry.partition("::")
    assert os.path.isfile(os.path.join(TESTS, file)), (
        f"SLOW_TESTS in tests/conftest.py names {file!r}, which is not a file in tests/: "
        "give its new name or remove the entry"
    )
    if pattern:
        assert fnmatch.filter(sorted(defined_tests(file)), pattern), (
            f"SLOW_TESTS in tests/conftest.py names {entry!r}, but no test function in "
            f"{file} matches {pattern!r}: give its new name or remove the entry"
        )


def test_no_slow_entry_repeats_or_is_covered_by_its_whole_file():
    files = {entry for entry in SLOW_TESTS if "::" not in entry}
    covered = [entry for entry in SLOW_TESTS if entry.partition("::")[0] in files - {entry}]
    assert covered == []
    assert len(set(SLOW_TESTS)) == len(SLOW_TESTS)


def test_the_slow_marker_is_registered(pytestconfig):
    registered = [line.split(":")[0].strip() for line in pytestconfig.getini("markers")]
    assert "slow" in registered


@pytest.mark.parametrize(
    "path, name, slow",
    [
        ("tests/test_launch.py", "test_the_launcher_starts_without_importing_tensorflow", True),
        ("tests/test_fault_tolerance.py", "any_test_in_a_slow_file", True),
        ("tests/test_update.py", "test_anything", False),
        (
            "/elsewhere/test_launch.py",
            "test_the_launcher_starts_without_importing_tensorflow",
            True,
        ),
    ],
)
def test_a_test_is_slow_by_its_file_or_its_name(path, name, slow):
    assert is_slow(path, name) is slow


def test_the_collection_hook_marks_the_slow_tests_and_only_them():
    def item(path, name):
        markers = []
        return SimpleNamespace(
            path=pathlib.Path(TESTS, path),
            originalname=name,
            add_marker=markers.append,
            markers=markers,
        )

    items = [item("test_hosts_apart.py", "test_x"), item("test_update.py", "test_y")]
    pytest_collection_modifyitems(config=None, items=items)
    assert [found.markers for found in items] == [[pytest.mark.slow], []]


def test_the_files_with_slow_tests_come_first_each_kept_together_and_in_order():
    def item(path, name):
        return SimpleNamespace(
            path=pathlib.Path(TESTS, path), originalname=name, add_marker=lambda marker: None
        )

    names = [
        ("test_actions.py", "test_fast_one"),
        ("test_actions.py", "test_resume_keeps_the_best_value"),
        ("test_data.py", "test_a"),
        ("test_data.py", "test_b"),
        ("test_launch.py", "test_fast_in_a_slow_file"),
        ("test_launch.py", "test_a_module_runs_with_this_python_and_a_program_as_given"),
        ("test_update.py", "test_c"),
    ]
    items = [item(*name) for name in names]
    pytest_collection_modifyitems(config=None, items=items)
    order = [(found.path.name, found.originalname) for found in items]
    assert order == [names[0], names[1], names[4], names[5], names[2], names[3], names[6]]

"""The checks .ci/run adds to ruff and mypy: the size limits and the import contracts.

No TensorFlow: each test runs a check in a subprocess on a scratch tree, in well
under a second. They need none of conftest.py's fixtures (`pytest --noconftest`
runs them without importing TensorFlow at all).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK_SIZES = os.path.join(ROOT, ".ci", "check_sizes.py")


def check_sizes(root, *args):
    return subprocess.run(
        [sys.executable, CHECK_SIZES, "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(root, path, source):
    path = root / path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def function(lines, name="f", indent="", docstring_lines=1):
    """A `def` of exactly `lines` code lines, after them a docstring of `docstring_lines`
    lines, a comment and a blank line, which do not count."""
    docstring = ['    """A docstring.'] + ["    More of it."] * (docstring_lines - 1)
    docstring[-1] += '"""'
    body = [*docstring, "    # a comment", ""] + ["    x = 1"] * (lines - 1)
    return "".join(f"{indent}{line}\n" if line else "\n" for line in [f"def {name}():", *body])


def klass(lines, name="C"):
    """A `class` of exactly `lines` lines, all of them code."""
    return f"class {name}:\n" + "    x = 1\n" * (lines - 1)


def test_a_function_over_60_lines_fails_with_its_place_its_size_and_the_limit(tmp_path):
    write(tmp_path, "loops/module.py", '"""A module."""\n\n' + function(61))
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["loops/module.py:3: f is 61 code lines (limit 60)"]


def test_a_function_of_55_lines_passes_and_decorators_do_not_count(tmp_path):
    write(tmp_path, "loops/module.py", "@first\n@second\n" + function(55))
    done = check_sizes(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "1 functions and 0 classes" in done.stdout


def test_methods_nested_functions_and_subpackages_are_checked_by_qualified_name(tmp_path):
    method = function(61, name="method", indent="    ")
    write(tmp_path, "loops/bin/module.py", "class C:\n" + method)
    write(tmp_path, "loops/other.py", "def outer():\n" + function(61, name="inner", indent="    "))
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "loops/other.py:1: outer is 62 code lines (limit 60)",
        "loops/other.py:2: outer.inner is 61 code lines (limit 60)",
        "loops/bin/module.py:2: C.method is 61 code lines (limit 60)",
    ]


def test_a_class_over_300_lines_fails_and_one_of_300_with_a_reason_passes(tmp_path):
    write(tmp_path, ".ci/size_baseline.txt", "loops/module.py:Fits 300 one table\n")
    write(tmp_path, "loops/module.py", klass(300, "Fits") + klass(301, "TooLong"))
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["loops/module.py:301: TooLong is 301 lines (limit 300)"]


def test_a_class_counts_all_its_lines_its_docstrings_comments_and_blank_lines_included(tmp_path):
    # 147 code lines, and 154 lines of docstrings, comments and blanks: 301 lines.
    docstring = '    """A class.\n' + "    More of it.\n" * 98 + '    """\n'
    method = function(49, name="method", indent="    ", docstring_lines=50)  # 101 lines
    source = "class C:\n" + docstring + method + "    # a comment\n\n" + "    x = 1\n" * 97
    write(tmp_path, "loops/module.py", source)
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["loops/module.py:1: C is 301 lines (limit 300)"]
    # One line less is within the margin: the message counts the class in lines, not code.
    write(tmp_path, "loops/module.py", source[: -len("    x = 1\n")])
    assert check_sizes(tmp_path).stdout.splitlines() == [
        "loops/module.py:1: C is 300 lines, within 5 of its limit 300: split it, or give the "
        "reason it stays whole in .ci/size_baseline.txt as `loops/module.py:C 300 <reason>`"
    ]


def test_docstrings_comments_and_blank_lines_do_not_count_however_they_are_wrapped(tmp_path):
    # 56 code lines: one over the margin, so the check prints the size it measured.
    for docstring_lines in (1, 12):
        module = '"""A module\n' + "docstring line\n" * docstring_lines + '"""\n'
        write(tmp_path, "loops/module.py", module + function(56, docstring_lines=docstring_lines))
        done = check_sizes(tmp_path)
        assert done.returncode == 1
        assert done.stdout.splitlines() == [
            f"loops/module.py:{docstring_lines + 3}: f is 56 code lines, within 5 of its limit "
            "60: split it, or give the reason it stays whole in .ci/size_baseline.txt as "
            "`loops/module.py:f 56 <reason>`"
        ]
    # Nor does a method's docstring count for the method: one of 55 code lines passes.
    method = function(55, name="method", indent="    ", docstring_lines=30)
    klass_with_docstring = 'class C:\n    """A class.\n\n    More."""\n\n    y = 2\n'
    write(tmp_path, "loops/module.py", klass_with_docstring + method)
    done = check_sizes(tmp_path)
    assert done.returncode == 0, done.stdout


def test_strings_that_are_not_docstrings_count_every_line(tmp_path):
    # The first statement's string is the docstring; a later string, or one in an
    # expression, is code with each of its lines: 1 (def) + 3 + 3 + 49 = 56 code lines.
    text = '    """Docstring."""\n    """Second string:\n    code.\n    """\n'
    text += '    message = (\n        "a"\n    )\n'
    source = "def f():\n" + text + "    x = 1\n" * 49
    write(tmp_path, "loops/module.py", source)
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith("loops/module.py:1: f is 56 code lines, within 5")


@pytest.mark.parametrize(
    "source, name, size, unit, limit",
    [(function(56), "f", 56, "code lines", 60), (klass(296), "C", 296, "lines", 300)],
)
def test_an_item_within_5_lines_of_its_limit_without_a_reason_fails(
    tmp_path, source, name, size, unit, limit
):
    write(tmp_path, "loops/module.py", source)
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"loops/module.py:1: {name} is {size} {unit}, within 5 of its limit {limit}: "
        "split it, or give the reason it stays whole in .ci/size_baseline.txt as "
        f"`loops/module.py:{name} {size} <reason>`"
    ]


def test_an_item_within_5_lines_of_its_limit_with_a_reason_in_the_baseline_passes(tmp_path):
    write(
        tmp_path,
        ".ci/size_baseline.txt",
        "loops/module.py:f 56 one table of the settings, read top to bottom\n"
        "loops/module.py:C 296 the state machine's transitions in one place\n",
    )
    write(tmp_path, "loops/module.py", function(56) + klass(296))
    done = check_sizes(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "(2 listed in .ci/size_baseline.txt)" in done.stdout


def test_the_baseline_lets_a_listed_item_keep_or_lower_its_size_but_not_grow(tmp_path):
    write(tmp_path, ".ci/size_baseline.txt", "# comment\nloops/module.py:f 70 a reason\n")
    for lines in (70, 65):
        write(tmp_path, "loops/module.py", function(lines))
        assert check_sizes(tmp_path).returncode == 0
    write(tmp_path, "loops/module.py", function(71))
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "loops/module.py:1: f is 71 code lines (limit 60); "
        ".ci/size_baseline.txt lets it be 70, it may not grow"
    ]


def test_the_baseline_fails_on_an_entry_no_longer_near_the_limit_or_gone(tmp_path):
    baseline = (
        "loops/module.py:f 70 a reason\nloops/module.py:K 299 a reason\n"
        "loops/module.py:C.g 80 a reason\n"
    )
    write(tmp_path, ".ci/size_baseline.txt", baseline)
    write(tmp_path, "loops/module.py", function(55) + klass(295, "K"))
    done = check_sizes(tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        ".ci/size_baseline.txt: loops/module.py:f is 55 code lines, not within 5 of its "
        "limit 60: remove it from the baseline",
        ".ci/size_baseline.txt: loops/module.py:K is 295 lines, not within 5 of its "
        "limit 300: remove it from the baseline",
        ".ci/size_baseline.txt: loops/module.py:C.g no longer exists: remove it from the baseline",
    ]


@pytest.mark.parametrize("line", ["loops/module.py f", "loops/module.py:f 56"])
def test_a_malformed_baseline_line_or_one_without_a_reason_is_an_error_showing_the_format(
    tmp_path, line
):
    write(tmp_path, "loops/module.py", function(10))
    write(tmp_path, ".ci/size_baseline.txt", line + "\n")
    done = check_sizes(tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(
        f".ci/size_baseline.txt:1: {line!r} is not `path:qualname N reason`, e.g."
    ), done.stderr


def test_the_framework_is_within_its_limits_and_its_baseline():
    done = check_sizes(ROOT)
    assert done.returncode == 0, done.stdout


def lint_imports(tree, *contracts):
    """`lint-imports` with this repository's setup.cfg, importing the packages from `tree`."""
    import importlinter  # noqa: F401  (the test extras install it; missing, the test fails)

    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    options = [option for contract in contracts for option in ("--contract", contract)]
    return subprocess.run(
        [sys.executable, "-c", code, "--config", os.path.join(ROOT, "setup.cfg"), "--no-cache"]
        + ["--no-logo", *options],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tree,
        # COLUMNS: lines as wide as they are, not wrapped at 80.
        env=dict(os.environ, PYTHONPATH=str(tree), COLUMNS="200"),
    )


@pytest.fixture
def tree(tmp_path):
    """A copy of the framework and the examples, under the names they install as."""
    ignore = shutil.ignore_patterns("__pycache__")
    for folder, package in [("loops", "loops"), ("data", "loops_data"), ("models", "loops_models")]:
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / package, ignore=ignore)
    return tmp_path


LAYER_CONTRACTS = [
    "examples",
    "kinds",
    "kinds-stand-on-the-definition",
    "layers",
    "cluster-wing",
    "cluster-on-the-ground-floor",
    "keras-private",
    "rl-layers",
]


def test_the_layer_contracts_hold_on_a_copy_of_the_tree(tree):
    done = lint_imports(tree, *LAYER_CONTRACTS)
    assert done.returncode == 0, done.stdout
    assert "8 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "contract, module, imported",
    [
        ("examples", "core.reduction", "loops_models"),  # the core imports an example
        ("kinds", "kinds.gan", "loops.kinds.rl"),
        ("kinds", "kinds.library.ranking_metrics", "loops.kinds.retrieval"),  # library under kinds
        ("kinds-stand-on-the-definition", "kinds.lm", "loops.model_dir.checkpoints"),
        ("kinds-stand-on-the-definition", "kinds.gan", "loops.run.controller"),
        ("layers", "core.update", "loops.run.controller"),  # the core imports the run
        ("layers", "input.distributed_input", "loops.core.update"),  # input under the core
        # The cluster wing sits beside the model_dir; its own contract keeps it off the
        # core and the input.
        ("cluster-on-the-ground-floor", "cluster.strategies", "loops.input.random_access"),
        ("layers", "vocabulary.settings", "loops.cluster.strategies"),
        ("layers", "model_dir.checkpoints", "loops.definition.loop"),
        # The ground floor: the core and the input stand apart, on topology, under the
        # cluster wing, which stands beside the model_dir.
        ("layers", "core.update", "loops.input.distributed_input"),
        ("layers", "input.distributed_input", "loops.cluster.strategies"),
        ("layers", "model_dir.checkpoints", "loops.cluster.strategies"),
        ("layers", "topology", "loops.input.random_access"),
        ("layers", "topology", "loops.cluster.strategies"),
        # The private-name adapters lie at the bottom, apart: they import no layer.
        ("layers", "tf_private", "loops.topology"),
        ("layers", "keras_private", "loops.vocabulary.errors"),
        ("keras-private", "input.random_access", "loops.keras_private"),
        ("keras-private", "cluster.strategies", "loops.keras_private"),
        ("cluster-wing", "run.controller", "loops.cluster.strategies"),
        ("cluster-wing", "kinds.gan", "loops.cluster.cluster_config"),
        ("cluster-on-the-ground-floor", "cluster.launch", "loops.core.reduction"),
        # Modules of the run that the hand lists these contracts had did not name.
        ("kinds-stand-on-the-definition", "kinds.lm", "loops.run.lr_finder"),
        ("kinds-stand-on-the-definition", "kinds.classifier", "loops.run.faults.loss_spikes"),
        # The definition sits under the run: it names none of the run that trains it.
        ("layers", "definition.loop", "loops.run.faults.failed_frames"),
        ("layers", "definition.run_context", "loops.run.trainer"),
        # The tables wing sits under the core whose Update applies it, and under the input.
        ("layers", "tables.embedding_tables", "loops.core.update"),
        ("layers", "tables.table_ids", "loops.input.feature_tables"),
        # The package loops.kinds.rl is one kind: each of its modules is held to the kinds' rules.
        ("kinds", "kinds.rl.dqn", "loops.kinds.gan"),
        ("kinds-stand-on-the-definition", "kinds.rl.actor_critic", "loops.model_dir.checkpoints"),
        ("layers", "kinds.rl.noise", "loops.bin"),
        # Inside it, the algorithms stand apart and the environment loop names neither.
        ("rl-layers", "kinds.rl.dqn", "loops.kinds.rl.actor_critic"),
        ("rl-layers", "kinds.rl.environment_loop", "loops.kinds.rl.dqn"),
    ],
)
def test_an_import_against_a_contract_fails_lint_imports(tree, contract, module, imported):
    with open(tree / "loops" / (module.replace(".", "/") + ".py"), "a") as source:
        source.write(f"\nimport {imported}\n")
    done = lint_imports(tree, contract)
    assert done.returncode == 1
    # The report names the import and its line.
    assert f"loops.{module} -> {imported} (l." in done.stdout, done.stdout


@pytest.mark.parametrize(
    "contract, new_module, importer",
    [
        ("kinds-stand-on-the-definition", "run.scratch_part", "kinds.gan"),
        ("kinds-stand-on-the-definition", "model_dir.scratch_part", "kinds.rl.dqn"),
        ("layers", "run.scratch_part", "definition.loop"),
        ("cluster-wing", "cluster.scratch_part", "run.inner_loops"),
    ],
)
def test_a_new_module_is_covered_without_editing_a_contract(tree, contract, new_module, importer):
    # Forbidden by package, allowed by exception: no list in setup.cfg names the new module.
    (tree / "loops" / (new_module.replace(".", "/") + ".py")).write_text('"""New."""\n')
    with open(tree / "loops" / (importer.replace(".", "/") + ".py"), "a") as source:
        source.write(f"\nimport loops.{new_module}\n")
    assert new_module.split(".")[-1] not in open(os.path.join(ROOT, "setup.cfg")).read()
    done = lint_imports(tree, contract)
    assert done.returncode == 1
    assert f"loops.{importer} -> loops.{new_module} (l." in done.stdout, done.stdout


def test_a_module_outside_every_layer_fails_lint_imports(tree):
    (tree / "loops" / "new_module.py").write_text('"""A module nobody placed in a layer."""\n')
    done = lint_imports(tree, "layers")
    assert done.returncode == 1
    assert "- loops.new_module" in done.stdout, done.stdout


@pytest.mark.parametrize("type_checking_import", [False, True])
@pytest.mark.parametrize("package", ["loops", "loops/run"])  # between layers, inside one
def test_an_import_cycle_fails_even_through_type_checking(tmp_path, type_checking_import, package):
    for name in ("loops", "loops_data", "loops_models", package):
        write(tmp_path, f"{name}/__init__.py", "")
    dotted = package.replace("/", ".")
    write(tmp_path, f"{package}/first.py", f"from {dotted} import second\n")
    back = f"from {dotted} import first" if type_checking_import else "x = 1"
    second = f"""
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            {back}
    """
    write(tmp_path, f"{package}/second.py", textwrap.dedent(second))
    done = lint_imports(tmp_path, "acyclic")
    assert done.returncode == int(type_checking_import), done.stdout
    assert ("No cycles are allowed in" in done.stdout) == type_checking_import

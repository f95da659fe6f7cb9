"""The README's Python examples run as written."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SUBPROCESS_ENV, run_python
from loops.bin import flag_reference
from loops.core.text_generation import decode, encode, generate
from loops.model_dir.lm_export import export_text_generator
from loops_models.lm import transformer_lm


def readme_python_blocks():
    readme = open(os.path.join(ROOT, "README.md")).read()
    return re.findall(r"```python\n(.*?)```", readme, flags=re.S)


def readme_block_containing(text):
    blocks = [block for block in readme_python_blocks() if text in block]
    assert len(blocks) == 1, f"expected one README python block containing {text!r}"
    return blocks[0]


def test_every_readme_python_block_is_run_by_a_test():
    blocks = readme_python_blocks()
    assert len(blocks) == 5
    assert len({readme_block_containing(text) for text in RUN_BLOCKS}) == 5


# What tells each README python block apart: each is run by the test named beside it.
RUN_BLOCKS = (
    "class ",  # test_readme_subclass_example_trains
    "MODEL_DIR/export",  # test_readme_export_example_serves_the_greedy_continuation
    "loops.UpdateContext(",  # test_readme_update_without_a_definition_trains
    # tests/test_recommender.py: the README example beats popularity
    "loops.RetrievalLoop(",
    "loops.CTRLoop(",  # tests/test_ctr.py: the README example nears the planted truth's AUC
)


def test_readme_update_without_a_definition_trains():
    done = run_python(readme_block_containing("loops.UpdateContext("))
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-4


def test_readme_subclass_example_trains():
    done = run_python(readme_block_containing("class "))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 200/200" in done.stdout
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-6


def test_readme_export_example_serves_the_greedy_continuation(tmp_path):
    sequence_length = 8
    model = transformer_lm(
        sequence_length=sequence_length, width=32, num_layers=1, num_heads=2, seed=3
    )
    export_text_generator(model, str(tmp_path / "MODEL_DIR" / "export"), sequence_length=8)
    # -I: isolated mode, so neither loops nor the checkout is importable.
    done = subprocess.run(
        [sys.executable, "-I", "-c", readme_block_containing("MODEL_DIR/export")],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = generate(model, encode("def ")[None], 60, sequence_length=sequence_length)
    # An untrained model emits bytes that are not UTF-8: the example must still print them.
    assert "\ufffd" in decode(expected[0])
    assert done.stdout == decode(expected[0]) + "\n"


def test_the_flag_reference_is_what_the_declarations_generate():
    flags = open(os.path.join(ROOT, "docs", "flags.md")).read()
    begin, end = flags.index(flag_reference.BEGIN), flags.index(flag_reference.END)
    section = flags[begin + len(flag_reference.BEGIN) : end]
    assert section == "\n" + flag_reference.reference() + "\n", (
        f"docs/flags.md differs from the declarations; run: {flag_reference.COMMAND}"
    )
    assert flag_reference.COMMAND == "python -m loops.bin.flag_reference --write docs/flags.md"
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert flag_reference.BEGIN not in readme and "[docs/flags.md](docs/flags.md)" in readme


def test_the_flag_reference_is_written_into_docs_flags_md_alone(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- flags:begin -->\nold\n<!-- flags:end -->\n")
    assert flag_reference.main(["--write", str(readme)]) == 1
    assert readme.read_text() == "a\n<!-- flags:begin -->\nold\n<!-- flags:end -->\n"
    assert capsys.readouterr().err == (
        f"error: --write {readme}: the flag reference lives in docs/flags.md alone (README.md "
        "links to it and holds no copy); run, from the repository's root: "
        "python -m loops.bin.flag_reference --write docs/flags.md\n"
    )
    flags = tmp_path / "docs" / "flags.md"
    flags.parent.mkdir()
    flags.write_text("# Flag reference\n<!-- flags:begin -->\nold\n<!-- flags:end -->\n")
    assert flag_reference.main(["--write", str(flags)]) == 0
    assert flags.read_text() == (
        f"# Flag reference\n<!-- flags:begin -->\n{flag_reference.reference()}\n"
        "<!-- flags:end -->\n"
    )


def test_readme_gives_a_fresh_machine_two_commands_and_no_other():
    readme = open(os.path.join(ROOT, "README.md")).read()
    fresh = readme[readme.index("## On a fresh machine") :]
    fresh = fresh[: fresh.index("\n## ")]
    assert re.findall(r"```\n(.*?)\n```", fresh, flags=re.S) == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install . && loops-classifier",
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' "
        "&& pytest -n 2 tests",
    ]


def test_the_flag_reference_lists_each_binary_and_its_own_defaults():
    reference = flag_reference.reference()
    headings = [line for line in reference.splitlines() if line.startswith("### ")]
    assert headings == [
        "### Flags of every binary",
        "### loops-classifier",
        "### loops-gan",
        "### loops-lm",
        "### loops-rl",
        "### loops-recommender",
        "### loops-ctr",
    ]
    # A shared flag is listed once, with its declared default; a binary's own default beside it.
    assert reference.count("| `--train_steps` |") == 1
    assert reference.count("| `--export_dir` |") == 5
    assert "Its defaults of shared flags: `--train_steps=600`, `--global_batch_size=64`, " in (
        reference
    )
    assert "| `--async_checkpoints` | bool | `false` |" in reference


def test_the_flag_reference_refuses_a_readme_without_its_markers():
    with pytest.raises(ValueError) as raised:
        flag_reference.replaced("# a README\n", "table")
    assert str(raised.value) == (
        "docs/flags.md has no <!-- flags:begin --> ... <!-- flags:end --> pair (in that order); "
        "put both lines under its heading 'Flag reference' and run this again."
    )
    assert flag_reference.replaced("a\n<!-- flags:begin -->\nold\n<!-- flags:end -->\n", "new") == (
        "a\n<!-- flags:begin -->\nnew\n<!-- flags:end -->\n"
    )

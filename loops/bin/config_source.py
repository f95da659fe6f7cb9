"""loops.RunConfig's source, generated from the declarations: `python -m loops.bin.config_source`.

One frozen dataclass per section of `loops.vocabulary.settings.SECTIONS`, one typed
field per shared setting (its default, its help as the field's docstring), and
`RunConfig` holding the sections. `--write` puts it into
loops/vocabulary/run_config_tree.py; tests/test_config.py fails when that file differs
from what this generates, so a new setting is its declaration plus this command.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Iterable

from loops.vocabulary import settings

COMMAND = "python -m loops.bin.config_source --write"
TARGET = os.path.join(os.path.dirname(settings.__file__), "run_config_tree.py")
_WIDTH = 96  # where the generated docstrings wrap
_LINE = 100  # the longest line ruff allows (.ci/ruff.toml)


def section_class(section: str) -> str:
    """The class name of a section: "update" -> "UpdateSettings"."""
    return section.capitalize() + "Settings"


def _docstring(text: str, indent: str) -> list[str]:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if len(indent) + len(text) + 6 <= _LINE:
        return [f'{indent}"""{text}"""']
    lines = textwrap.wrap(text, _WIDTH - len(indent) - 3, break_on_hyphens=False)
    return [f'{indent}"""{lines[0]}', *(f"{indent}{line}" for line in lines[1:]), f'{indent}"""']


def _literal(value: object) -> str:
    """`value` as ruff formats it (strings in double quotes)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _section(name: str, declarations: Iterable[settings.Setting]) -> list[str]:
    lines = ["", "", "@dataclasses.dataclass(frozen=True)"]
    lines += [f"class {section_class(name)}(ConfigSection):"]
    lines += _docstring(f"{name}: {settings.SECTIONS[name]}", "    ")
    for setting in declarations:
        lines += ["", f"    {setting.name}: {setting.annotation} = {_literal(setting.default)}"]
        lines += _docstring(setting.help, "    ")
    return lines


def source() -> str:
    """The text of loops/vocabulary/run_config_tree.py for the declarations as they are now."""
    unknown = {setting.section for setting in settings.SETTINGS} - set(settings.SECTIONS)
    if unknown:
        raise ValueError(
            f"Settings declare the sections {sorted(unknown)}, which settings.SECTIONS does "
            "not describe; add each there (its place in the tree and what it holds)."
        )
    lines = [
        '"""The typed tree of a run\'s settings, generated from loops/vocabulary/settings.py',
        f"by `{COMMAND}`: edit the declarations there, not this file.",
        "",
        "`RunConfig` holds a section per `settings.SECTIONS`, each field a setting with its",
        "declared default and type, checked by its declaration when made (`ConfigSection`).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "",
        "from loops.vocabulary.config_tree import ConfigSection, ConfigTree",
    ]
    for name in settings.SECTIONS:
        under = [setting for setting in settings.SETTINGS if setting.section == name]
        lines += _section(name, under)
    lines += ["", "", "@dataclasses.dataclass(frozen=True)", "class RunConfig(ConfigTree):"]
    lines += [
        '    """A run\'s settings, section by section.',
        "",
        "    Made by `RunConfig.from_flat({...})`, `RunConfig().replace(steps_per_loop=10)` or",
        "    `RunConfig.from_json(MODEL_DIR/config.json)`; `loops.Trainer(definition, config)`",
        '    reads the sections it runs by."""',
    ]
    for name in settings.SECTIONS:
        cls = section_class(name)
        lines += ["", f"    {name}: {cls} = dataclasses.field(default_factory={cls})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Prints the source, or writes it into loops/vocabulary/run_config_tree.py with --write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write it into {TARGET}")
    arguments = parser.parse_args(argv)
    text = source()
    if not arguments.write:
        print(text, end="")
        return 0
    with open(TARGET, "w", encoding="utf-8") as file:
        file.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

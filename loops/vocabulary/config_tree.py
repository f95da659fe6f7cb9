"""What the generated `loops.RunConfig` does (`ConfigTree`) and what each of its sections does
(`ConfigSection`): check every value by its declaration, and go to and from flat mappings
and a run's config.json.

The classes themselves, one field per declared setting, are generated from
loops/vocabulary/settings.py into loops/vocabulary/run_config_tree.py. Nothing here
imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from loops.vocabulary import settings
from loops.vocabulary.recorded_settings import RecordedSettingsError, read_recorded_settings

Tree = TypeVar("Tree", bound="ConfigTree")


def unknown_setting(name: str, known: Iterable[str], what: str) -> str:
    """The sentence for a setting `name` that is not one of `known`: the closest, and the fix."""
    closest = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean {closest[0]!r}? " if closest else ""
    return (
        f"{what} has no setting {name!r}; {hint}Every setting is declared in "
        "loops/vocabulary/settings.py (python -m loops.bin.config_source lists them)."
    )


@dataclasses.dataclass(frozen=True)
class ConfigSection:
    """A section of `loops.RunConfig`: each field checked by its declaration when made.

    A part's options are its section (`loops.run.controller_options.ControllerOptions` is a
    `ControllerSettings`): what they add beside the settings (no declaration) is theirs."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            declared = settings.BY_NAME.get(field.name)
            if declared is not None:
                value = declared.checked(getattr(self, field.name))
                object.__setattr__(self, field.name, value)  # frozen: the checked form

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        """The declared settings among the fields, in order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name in settings.BY_NAME)

    def values(self) -> dict[str, Any]:
        """Setting name -> value, of this section's declared settings alone."""
        return {name: getattr(self, name) for name in self.setting_names()}


@dataclasses.dataclass(frozen=True)
class ConfigTree:
    """The sections of a run's settings; each field a `ConfigSection` made by its default."""

    @classmethod
    def sections(cls) -> dict[str, type[ConfigSection]]:
        """Section name -> its class, in the tree's order."""
        return {
            field.name: field.default_factory  # type: ignore[misc]
            for field in dataclasses.fields(cls)
        }

    @classmethod
    def names(cls) -> list[str]:
        """Every setting of the tree, section by section."""
        return [
            field.name
            for section in cls.sections().values()
            for field in dataclasses.fields(section)
        ]

    @classmethod
    def from_flat(cls: type[Tree], values: Mapping[str, Any]) -> Tree:
        """The tree of `values` (setting name -> value), the declared default for each left out.

        Raises:
            ValueError: a name that is not a setting (naming the closest), or a bad value
                (its declaration's sentence).
        """
        names = set(cls.names())
        for name in values:
            if name not in names:
                raise ValueError(unknown_setting(name, names, f"loops.{cls.__name__}"))
        made = {}
        for section_name, section in cls.sections().items():
            fields = (field.name for field in dataclasses.fields(section))
            made[section_name] = section(
                **{name: values[name] for name in fields if name in values}
            )
        return cls(**made)

    def flat(self) -> dict[str, Any]:
        """Setting name -> value, section by section (what `from_flat` takes back)."""
        return {
            field.name: getattr(section, field.name)
            for section in (getattr(self, name) for name in self.sections())
            for field in dataclasses.fields(section)
        }

    def replace(self: Tree, **overrides: Any) -> Tree:
        """This tree with `overrides` (setting name -> value), checked as `from_flat` checks."""
        return self.from_flat({**self.flat(), **overrides})

    def for_trainer(self: Tree) -> Tree:
        """This tree with every setting a `loops.Trainer` does not read (one declared with
        `elsewhere`: the mode, the strategy's, ...) at its default: what a binary, which acts
        on those itself, gives its Trainer."""
        return self.replace(
            **{
                name: settings.BY_NAME[name].default
                for name in self.names()
                if settings.BY_NAME[name].elsewhere
            }
        )

    @classmethod
    def from_json(cls: type[Tree], path: str) -> Tree:
        """The tree of the settings a run recorded in `path` (its MODEL_DIR/config.json).

        A binary's flag values are taken as its flags mean them (0 for "off" is None,
        --profile_steps's START,END a pair); the keys that are not settings of the
        tree (a binary's own data and model flags, the checkpoint's items) are left out.

        Raises:
            ValueError: `path` does not read as a JSON object, or holds a bad value.
        """
        try:
            recorded = read_recorded_settings(path)
        except RecordedSettingsError as error:
            if error.cause is None:
                raise ValueError(
                    f"{path} holds no JSON object of settings; pass a run's config.json."
                ) from None
            raise ValueError(
                f"Cannot read the run's settings from {path} ({error.cause}); pass the "
                "config.json a run wrote into its model_dir."
            ) from error.cause
        names = set(cls.names())
        return cls.from_flat(
            {
                name: settings.BY_NAME[name].value_of_flag(value)
                for name, value in recorded.items()
                if name in names
            }
        )

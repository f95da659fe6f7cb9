"""What a setting's declaration is (`Setting`), and the one check its Python value and its
flag's value both go through.

A declaration gives one default, one check (its kind, choices and bounds, or its own
`check`), the section of `loops.RunConfig` it belongs to and whether a resumed run may
change it. Nothing here imports TensorFlow: a binary checks its flags before its import.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from loops.vocabulary.whole_numbers import check_whole, is_whole

# A check: (the name to say, "--name" for a flag, the value) -> the value; ValueError
# with a sentence naming the value and the fix.
Check = Callable[[str, Any], Any]
# The Python type of a value of each kind (`loops.RunConfig`'s field annotations).
KIND_TYPES = {
    "integer": "int",
    "float": "float",
    "bool": "bool",
    "string": "str",
    "enum": "str",
    "list": "tuple[str, ...]",
}


def is_flag(name: str) -> bool:
    """Whether a check was given a flag's name ("--name") rather than a keyword's."""
    return name.startswith("--")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_number(least: int, note: str = "", *, optional: bool = False) -> Check:
    """A check: a whole number >= least, or None where `optional` (`note` says what None does)."""

    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        check_whole(name, value, least, note)
        return value

    return check


def positive_number(note: str) -> Check:
    """A check: a finite number > 0, or None."""

    def check(name: str, value: Any) -> Any:
        if value is None:
            return None
        if not _is_number(value) or not math.isfinite(value) or not value > 0:
            raise ValueError(f"{name} must be > 0{note}, got {value!r}.")
        return value

    return check


def number_above(least: float, example: str) -> Check:
    """A check: a finite number > least (`example` shows a good value)."""

    def check(name: str, value: Any) -> Any:
        if not _is_number(value) or not math.isfinite(value) or not value > least:
            raise ValueError(
                f"{name} must be a finite number > {least:g}, got {value!r}; {example}."
            )
        return value

    return check


def one_of(choices: tuple[str, ...], advice: str = "") -> Check:
    """A check: one of `choices`."""

    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}{advice}.")
        return value

    return check


def satisfies(rule: Callable[[Any], bool], sentence: str) -> Check:
    """A check: None (unset), or a number `rule` holds for; else `sentence`, its {name}
    filled in ("--name" for a flag)."""

    def check(name: str, value: Any) -> Any:
        if value is None:
            return None
        if not _is_number(value) or not math.isfinite(value) or not rule(value):
            raise ValueError(sentence.format(name=name))
        return value

    return check


def check_ema_decay(name: str, value: Any) -> Any:
    """None, or a decay in (0, 1) (a flag's 0 is None: no average)."""
    if value is not None and (not _is_number(value) or not 0 < value < 1):
        if is_flag(name):
            raise ValueError(f"{name} must be in [0, 1), e.g. 0.999 (0: no average).")
        raise ValueError(
            f"{name} must be in (0, 1), e.g. 0.999, or None for no average; got {value!r}."
        )
    return value


def check_profile_steps(name: str, value: Any) -> tuple[int, int] | None:
    """None, or (start, end), whole numbers with 1 <= start <= end."""
    if value is None:
        return None
    try:
        start, end = value
    except (TypeError, ValueError):
        start = end = None
    if not (is_whole(start) and is_whole(end)):
        raise ValueError(
            f"{name} must be (start, end), two whole numbers, got {value!r}; "
            "e.g. (10, 20) (--profile_steps=10,20) traces steps 10 to 20."
        )
    if not 1 <= start <= end:
        raise ValueError(
            f"{name} must have 1 <= start <= end, got {value!r}; e.g. (10, 20) "
            "traces steps 10 to 20 (counted from 1)."
        )
    return start, end


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """ "START,END" as (START, END) when 1 <= START <= END; None when unset or malformed."""
    parts = (text or "").split(",")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        return None
    start, end = (int(part) for part in parts)
    return (start, end) if 1 <= start <= end else None


def profile_steps_of_flag(value: Any) -> Any:
    """--profile_steps's START,END as (START, END); a recorded (start, end) as it is.

    Raises:
        ValueError: text that is not START,END with 1 <= START <= END.
    """
    if not isinstance(value, str):
        return value
    steps = parse_profile_steps(value)
    if steps is None:
        raise ValueError(
            "--profile_steps must be START,END with 1 <= START <= END, e.g. --profile_steps=10,20."
        )
    return steps


def _as_given(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: a flag of the binaries that declare it, a field of `loops.RunConfig`
    (the shared ones), and where `loop` is set a `loops.Trainer` keyword.

    Attributes:
        name: the flag's name, the field's and the keyword's.
        heading: the --help heading it is listed under.
        help: what it does, as --help says it (and the field's comment).
        kind: "integer", "float", "bool", "string", "enum" or "list" (comma-separated
            strings): the flag's type and the value's.
        default: the one default, the flag's and Python's; None: unset. Where it is None
            and `off` is given, the flag shows `off` (which means the same).
        section: the section of `loops.RunConfig` it is a field of (default: its heading).
        resumable: whether a resumed run may change it without a warning (how long it
            trains, how often it reports, where its outputs go); the rest are warned about.
        loop: whether `loops.Trainer` takes it as a keyword argument (and reads it).
        elsewhere: for a setting `loops.Trainer` does not read (not `loop`): who reads it
            instead and what a Trainer takes in its place, the end of the sentence with which
            a Trainer refuses it at another value than its default (`loops.run.trainer_arguments`).
        check: (name, value) -> the value; ValueError with a sentence. Without one, the
            check is the kind's, the choices' and the bounds' (`checked`).
        off: the flag's value that means None (e.g. 0: no average).
        from_flag: the flag's value (after `off`) -> the Python value (a parser).
        choices: the values an "enum" takes.
        lower_bound, upper_bound: the bounds of a number without its own `check`.
        annotation: the Python type where the kind's is not it (a parsed flag's).
        path: a file or folder path ("string"): its flag expands a leading ~ to the home
            folder, which a shell leaves as it is in --name=~/...
        reaction: a built-in bad-step rule's reaction (what its bad step leads to): the rule
            class of the run that names it as its `setting` reads it
            (`loops.run.faults.builtin_rules`), and a run that trains nothing (the
            evaluator, the range test) sets it back to its default.
    """

    name: str
    heading: str
    help: str
    kind: str
    default: Any = None
    section: str = ""
    resumable: bool = False
    loop: bool = False
    elsewhere: str = ""
    check: Check | None = None
    off: Any = None
    from_flag: Callable[[Any], Any] = _as_given
    choices: tuple[str, ...] = ()
    lower_bound: float | None = None
    upper_bound: float | None = None
    annotation: str = ""
    path: bool = False
    reaction: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KIND_TYPES:
            raise ValueError(f"Setting {self.name}: kind must be one of {', '.join(KIND_TYPES)}.")
        if self.path and self.kind != "string":
            raise ValueError(f"Setting {self.name}: a path is of kind string.")
        if not self.section:
            object.__setattr__(self, "section", self.heading)
        if not self.annotation:
            optional = " | None" if self.default is None else ""
            object.__setattr__(self, "annotation", KIND_TYPES[self.kind] + optional)

    @property
    def flag_default(self) -> Any:
        """The flag's default: `default`, or `off` where that is None (derived, not a second)."""
        return self.off if self.default is None and self.off is not None else self.default

    def value_of_flag(self, value: Any) -> Any:
        """The Python value of the flag's `value`: None for `off`, else through `from_flag`."""
        if self.off is not None and value == self.off:
            return None
        return self.from_flag(value)

    def checked(self, value: Any, *, flag: bool = False) -> Any:
        """`value`, checked: ValueError naming it (as "--name" where `flag`) and the fix."""
        name = f"--{self.name}" if flag else self.name
        if self.check is not None:
            return self.check(name, value)
        if value is None and self.default is None:
            return None  # unset
        return _checked_by_kind(self, name, value)


def _checked_by_kind(setting: Setting, name: str, value: Any) -> Any:
    """`value` checked against the kind, choices and bounds `setting` declares."""
    kind, lower, upper = setting.kind, setting.lower_bound, setting.upper_bound
    if kind == "bool" and not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    if kind == "enum":
        return one_of(setting.choices)(name, value)
    if kind == "string" and not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}.")
    if kind == "list":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{name} must be a list of strings, got {value!r}.")
        return tuple(value)
    if kind == "integer" and lower is None and not is_whole(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}.")
    if kind == "integer" and lower is not None:
        check_whole(name, value, int(lower))
    if kind == "float" and (not _is_number(value) or not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    if kind == "float" and lower is not None and value < lower:
        raise ValueError(f"{name} must be >= {lower:g}, got {value!r}.")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be <= {upper:g}, got {value!r}.")
    return value

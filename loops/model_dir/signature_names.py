"""The names a click-through export's signatures give their inputs, derived from the spec's
column names so that a client can compute them, and a spec whose columns would share one
refused (nothing here imports TensorFlow: the binary checks a spec before it starts)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loops.input.feature_tables import FeatureSpec

_NOT_KEPT = re.compile(r"[^A-Za-z0-9_]")
RULE = (
    "a signature input's name is its column's with each character other than an ASCII "
    "letter, digit or _ made _, and arg_ in front unless it then starts with an ASCII letter"
)


def served_name(column: str) -> str:
    """The name `column` is served under: native-country -> native_country, 1st -> arg_1st.

    TensorFlow gives a loaded signature's inputs its own keyword names (every character but a
    letter or digit made _, arg_ before one that does not start with a letter) and refuses a
    SavedModel whose inputs are named outside ASCII; the export names each input so, itself,
    so the name a client sends is the one TensorFlow serves, with no warning.
    """
    name = _NOT_KEPT.sub("_", column)
    return name if re.match(r"[A-Za-z]", name) else f"arg_{name}"


def served_names(columns: Iterable[str], signature: str) -> dict[str, str]:
    """column -> its served name, for the inputs of `signature`.

    Raises:
        ValueError: two columns served under one name, naming both and the fix.
    """
    names: dict[str, str] = {}
    taken: dict[str, str] = {}
    for column in columns:
        name = served_name(column)
        if name in taken:
            raise ValueError(
                f"Columns {taken[name]!r} and {column!r} would both be served as {name!r} by "
                f"the export's {signature} signature ({RULE}); rename one of them in the spec."
            )
        names[column], taken[name] = name, column
    return names


def raw_columns(spec: FeatureSpec) -> list[str]:
    """The columns a raw request holds: the spec's but the crossed ones, then each column a
    cross reads that the spec does not list."""
    columns = [column.name for column in spec.columns if not column.crosses()]
    for column in spec.columns:
        for source in column.crosses():
            if source not in columns:
                columns.append(source)
    return columns


def check_spec(spec: FeatureSpec) -> None:
    """Refuses a spec two of whose columns an export would serve under one name (raw
    `serving_default` or `serve_prepared`), before anything is trained.

    Raises:
        ValueError: as `served_names`.
    """
    served_names(raw_columns(spec), "serving_default")
    served_names([column.name for column in spec.columns], "serve_prepared")

"""How a click model's feature statistics carry over to a run on new rows: a continued run's
vocabularies grow by the new rows' values behind the old ones (each old value keeps its row)
while its scales and bucket boundaries stay as they were, and each column table's rows are
named by value so that a warm start remaps them through two runs' vocabularies.

The rule, and why: the continued weights were trained on rows indexed by the old vocabulary
and on numbers scaled by the old center and scale, so both stay; refitting a scale would move
every numeric input under weights trained on the old one, and resorting a vocabulary by the
new day's counts would hand an id another id's row. New values are those the new rows admit
(`min_count` on their own counts, most frequent first), appended until the vocabulary holds
`max_vocabulary` values; a column that must keep admitting ids past that is a dynamic one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from loops.input import feature_tables

# The rule in words, for results.json's "data": "features".
RULE = (
    "vocabularies: the run's, then the new rows' values it lacks (most frequent first, up to "
    "max_vocabulary); scales and bucket boundaries: the run's, kept"
)

# A table's row 0 is every value out of its vocabulary: its id in `row_ids`, which no
# value's id (VALUE_MARK + the value) can equal.
OUT_OF_VOCABULARY = "out-of-vocabulary"
VALUE_MARK = "="


def _spec_json(spec: feature_tables.FeatureSpec) -> dict[str, Any]:
    return json.loads(feature_tables.FittedFeatures(spec, {}, {}).to_json())["spec"]


def check_same_spec(
    previous: feature_tables.FittedFeatures, spec: feature_tables.FeatureSpec, source: str
) -> None:
    """Refuses a continuation whose spec is not the one the run it continues read: its
    checkpoint holds a table per column of that spec, and this run's model one per its own.

    Raises:
        ValueError: naming the first column that differs, `source` and the fix.
    """
    was, now = _spec_json(previous.spec), _spec_json(spec)
    if was == now:
        return
    columns = {c["name"]: c for c in was["columns"]}, {c["name"]: c for c in now["columns"]}
    differs = sorted(
        name
        for name in set(columns[0]) | set(columns[1])
        if columns[0].get(name) != columns[1].get(name)
    )
    what = f"column {differs[0]!r}" if differs else "its label"
    raise ValueError(
        f"The spec differs from the one the run {source} read in {what} (there: "
        f"{columns[0].get(differs[0]) if differs else was['label']}; here: "
        f"{columns[1].get(differs[0]) if differs else now['label']}): a continuation goes "
        "on with the spec its checkpoint was trained on; pass that spec, or start a new run "
        "with --warm_start_from to take the shared columns' tables."
    )


def grown(
    previous: feature_tables.FittedFeatures, fitted: feature_tables.FittedFeatures
) -> feature_tables.FittedFeatures:
    """The statistics of a run that goes on from `previous` on rows that fitted `fitted`
    (the same spec): each vocabulary `previous`'s, then `fitted`'s values it lacks in
    `fitted`'s order, up to the column's `max_vocabulary`; the scales and bucket boundaries
    `previous`'s (the module docstring says why)."""
    vocabularies = {}
    for name, old in previous.vocabularies.items():
        known = set(old)
        added = [value for value in fitted.vocabularies.get(name, []) if value not in known]
        most = next(c for c in fitted.spec.columns if c.name == name).option("max_vocabulary")
        if most is not None:
            added = added[: max(most - len(old), 0)]
        vocabularies[name] = [*old, *added]
    return feature_tables.FittedFeatures(
        fitted.spec, vocabularies, dict(previous.scales), dict(previous.boundaries)
    )


def growth(
    previous: feature_tables.FittedFeatures, fitted: feature_tables.FittedFeatures
) -> dict[str, dict[str, int]]:
    """Each vocabulary's rows before and after, and the values added: {column: {"was",
    "now", "added"}} (a run's report of what its statistics grew by)."""
    return {
        name: {
            "was": len(previous.vocabularies.get(name, [])),
            "now": len(values),
            "added": len(values) - len(previous.vocabularies.get(name, [])),
        }
        for name, values in fitted.vocabularies.items()
    }


def row_values(vocabulary: list[str]) -> list[str]:
    """The id of each row of a vocabulary column's table: row 0's `OUT_OF_VOCABULARY`, then
    each value marked (`VALUE_MARK`), distinct from it whatever the value."""
    return [OUT_OF_VOCABULARY, *(VALUE_MARK + value for value in vocabulary)]


def table_row_ids(
    previous: feature_tables.FittedFeatures,
    fitted: feature_tables.FittedFeatures,
    layers: Mapping[str, list[str]],
) -> dict[str, tuple[list[str], list[str]]]:
    """`loops.WarmStart`'s row_ids of the tables of each column with a vocabulary in both
    statistics: `layers[column]` names its tables (a wide & deep model has two), each
    remapped from `previous`'s rows to `fitted`'s. A hashed, bucketized or dynamic column's
    rows mean the same in both runs, and are taken whole."""
    row_ids = {}
    for column, names in layers.items():
        if column in previous.vocabularies and column in fitted.vocabularies:
            pair = (
                row_values(previous.vocabularies[column]),
                row_values(fitted.vocabularies[column]),
            )
            row_ids.update({name: pair for name in names})
    return row_ids

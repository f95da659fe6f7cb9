"""Where a `loops-ctr` run starts when it does not start from the initial values: the feature
statistics of the run it continues or warm-starts from (its MODEL_DIR/features.json), and the
`loops.WarmStart` that takes that run's checkpoint, each vocabulary column's tables remapped
by value (`loops.input.feature_growth`).

Nothing here imports TensorFlow when loaded: a continuation's statistics are read and checked
before TensorFlow starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from loops.input import feature_growth, feature_tables

# In a click model's MODEL_DIR: the statistics its checkpoints were trained on (written as
# training starts), which a run that continues or warm-starts from it reads.
FEATURES_FILE = "features.json"


def source_of(values: Mapping[str, Any]) -> tuple[str, str] | None:
    """(the flag, the model_dir) a run starts from: --continue_from or --warm_start_from;
    None for the initial values."""
    for flag in ("continue_from", "warm_start_from"):
        if values.get(flag):
            return flag, values[flag]
    return None


def source_features(source: str, flag: str) -> feature_tables.FittedFeatures | None:
    """The statistics the run in `source` was trained on: its `FEATURES_FILE`, else (a run of
    an earlier version) the features.json of its export; None for a run of the generated log,
    which has none (its config.json names no --data).

    Raises:
        ValueError: a run of a feature table or log whose statistics are nowhere, or do not
            read, naming --`flag`, the files and the fix.
    """
    from loops.model_dir import run_config

    config = run_config.read_if_intact(source) or {}
    export = config.get("export_dir") or os.path.join(source, "export")
    places = [os.path.join(source, FEATURES_FILE), os.path.join(export, "features.json")]
    for path in places:
        if os.path.isfile(path):
            try:
                with open(path) as stream:
                    return feature_tables.FittedFeatures.from_json(stream.read())
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise ValueError(
                    f"--{flag}={source!r}: {path} does not read as a click model's feature "
                    f"statistics ({error}); pass the model_dir of an intact loops-ctr run."
                ) from None
    if config and config.get("data") is None and "generated_rows" in config:
        return None
    raise ValueError(
        f"--{flag}={source!r} holds no feature statistics ({' or '.join(places)}): it is not "
        "the model_dir of a loops-ctr run, whose vocabularies it needs to give each value its "
        "row; pass such a model_dir."
    )


def continued_features(
    values: Mapping[str, Any], trains_on_table: bool
) -> feature_tables.FittedFeatures | None:
    """With --continue_from, the statistics this run's grow from (`source_features`); None
    without it, or from a run of the generated log onto the generated log.

    Raises:
        ValueError: as `source_features`, or a run of the generated log continued on a table
            (or the other way round), naming both and the fix.
    """
    if not values.get("continue_from"):
        return None
    source = values["continue_from"]
    features = source_features(source, "continue_from")
    if (features is not None) != trains_on_table:
        was, now = ("a feature table", "the generated log")
        if features is None:
            was, now = now, was
        raise ValueError(
            f"--continue_from={source!r} was trained on {was} and this run reads {now}: a "
            "continuation goes on with the same kind of data; pass --data and --spec as that "
            "run did, or start a new run with --warm_start_from."
        )
    return features


def warm_start(
    values: Mapping[str, Any],
    fitted: feature_tables.FittedFeatures | None,
    table_layers: Mapping[str, list[str]],
) -> Any:
    """The `loops.WarmStart` of --continue_from (the run's newest checkpoint whole:
    `loops.WarmStart.continuation`) or --warm_start_from (--warm_start_variables' variables),
    each vocabulary column's tables (`table_layers`: their layer names by column) remapped
    from that run's statistics to `fitted`, this run's, by value; None without either.

    Raises:
        ValueError: as `source_features`.
    """
    import loops

    start = source_of(values)
    if start is None:
        return None
    flag, source = start
    previous = source_features(source, flag)
    row_ids: dict[str, Any] = {}
    if previous is not None and fitted is not None:
        row_ids = feature_growth.table_row_ids(previous, fitted, table_layers)
    if flag == "continue_from":
        return loops.WarmStart.continuation(source, row_ids=row_ids)
    return loops.WarmStart(source, variables=values["warm_start_variables"], row_ids=row_ids)

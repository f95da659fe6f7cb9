"""A CSV or Parquet table read by a feature spec into a click-through model's arrays."""

import json

import numpy as np
import pyarrow
import pyarrow.parquet
import pytest
import tensorflow as tf

from loops.input import feature_tables
from loops.input.feature_tables import FeatureSpec, FittedFeatures
from loops_models import ctr

SPEC = {
    "label": "income",
    "positive": ">50K",
    "columns": [
        {"name": "age", "kind": "numeric"},
        {"name": "hours", "kind": "numeric", "normalize": "log", "fill": 0},
        {"name": "occupation", "kind": "categorical", "min_count": 2},
        {"name": "zip", "kind": "categorical", "hash_buckets": 50},
        {"name": "genres", "kind": "multi_hot", "pooling": "sum"},
    ],
}
# income, age, hours ("" is filled), occupation ("pilot" seen once), zip, genres.
TRAIN = [
    (">50K", 39, "40", "clerk", "02139", "drama|comedy"),
    ("<=50K", 50, "", "clerk", "94110", ""),
    ("<=50K", 38, "20", "cook", "02139", "drama"),
    (">50K", 53, "60", "cook", "10001", "comedy|drama|war"),
    ("<=50K", 28, "40", "cook", "60601", "war"),
    ("<=50K", 37, "35", "pilot", "94110", "drama"),
]
# A value training never saw (occupation "judge", genre "noir") and an empty bag.
TEST = [
    (">50K", 61, "45", "judge", "73301", "noir|drama"),
    ("<=50K", 22, "10", "clerk", "02139", ""),
]
HEADER = ("income", "age", "hours", "occupation", "zip", "genres")


def write_csv(path, rows, header=HEADER):
    lines = [",".join(header)] + [",".join(str(field) for field in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_parquet(path, rows):
    """The same rows as Parquet holds them: numbers as numbers, an empty number as null,
    the bags as lists."""
    columns = dict(zip(HEADER, zip(*rows)))
    table = pyarrow.table(
        {
            "income": list(columns["income"]),
            "age": pyarrow.array(columns["age"], pyarrow.int64()),
            "hours": [float(value) if value else None for value in columns["hours"]],
            "occupation": list(columns["occupation"]),
            "zip": list(columns["zip"]),
            "genres": [value.split("|") if value else [] for value in columns["genres"]],
        }
    )
    pyarrow.parquet.write_table(table, str(path))
    return str(path)


def test_csv_and_parquet_of_the_same_rows_give_the_same_arrays_fitted_on_the_training_rows(
    tmp_path,
):
    spec = FeatureSpec.from_json(json.dumps(SPEC))
    train_csv = feature_tables.read_table(write_csv(tmp_path / "train.csv", TRAIN))
    fitted = feature_tables.fit(spec, train_csv)
    # Most frequent first, ties by name; "pilot" (once) is below min_count 2.
    assert fitted.vocabularies == {
        "occupation": ["cook", "clerk"],
        "genres": ["drama", "comedy", "war"],
    }
    assert fitted.cardinalities() == {"occupation": 3, "zip": 50, "genres": 4}
    ages = np.array([39, 50, 38, 53, 28, 37], np.float64)
    assert fitted.scales["age"] == (ages.mean(), ages.std())
    assert fitted.scales["hours"] == (0.0, 1.0)

    for name, table in {
        "csv": feature_tables.read_table(write_csv(tmp_path / "test.csv", TEST)),
        "parquet": feature_tables.read_table(write_parquet(tmp_path / "test.data", TEST)),
    }.items():
        columns, labels = fitted.arrays(table)
        np.testing.assert_array_equal(labels, [1.0, 0.0], err_msg=name)
        np.testing.assert_allclose(
            columns["age"], (np.array([61, 22]) - ages.mean()) / ages.std(), rtol=1e-6
        )
        np.testing.assert_allclose(columns["hours"], np.log1p([45.0, 10.0]), rtol=1e-6)
        assert columns["age"].dtype == columns["hours"].dtype == np.float32
        # "judge" was never seen: the out-of-vocabulary row 0.
        np.testing.assert_array_equal(columns["occupation"], [0, 2], err_msg=name)
        expected_zip = tf.strings.to_hash_bucket_fast(["73301", "02139"], 50).numpy()
        np.testing.assert_array_equal(columns["zip"], expected_zip, err_msg=name)
        # "noir" to row 0, "drama" to row 1; the empty bag all padding.
        np.testing.assert_array_equal(columns["genres"], [[0, 1], [-1, -1]], err_msg=name)

    # The training rows: the empty hours field takes its fill; a bag of 3 sets the width and
    # keeps its order.
    columns, labels = fitted.arrays(train_csv)
    np.testing.assert_allclose(columns["hours"][1], 0.0)
    np.testing.assert_array_equal(columns["genres"][3], [2, 1, 3])  # comedy, drama, war
    np.testing.assert_array_equal(columns["genres"][1], [-1, -1, -1])
    np.testing.assert_array_equal(labels, [1, 0, 0, 1, 0, 0])

    # What a checkpoint or an export carries gives the same arrays.
    again = FittedFeatures.from_json(fitted.to_json())
    assert again == fitted
    for name, array in again.arrays(train_csv)[0].items():
        np.testing.assert_array_equal(array, columns[name], err_msg=name)


def test_the_arrays_feed_a_wide_and_deep_model_of_the_fitted_cardinalities(tmp_path):
    spec = FeatureSpec.from_json(SPEC)
    fitted = feature_tables.fit(
        spec, feature_tables.read_table(write_csv(tmp_path / "train.csv", TRAIN))
    )
    cardinalities = fitted.cardinalities()
    features = ctr.CTRFeatures(
        numeric=("age", "hours"),
        categorical={name: cardinalities[name] for name in ("occupation", "zip")},
        multi_hot={"genres": (cardinalities["genres"], "sum")},
    )
    model = ctr.wide_and_deep(features, embedding_dim=4, hidden_units=(8,), seed=1)
    columns, _ = fitted.arrays(feature_tables.read_table(write_csv(tmp_path / "t.csv", TEST)))
    logits = model({name: tf.constant(array) for name, array in columns.items()})
    assert logits.shape[0] == 2 and np.all(np.isfinite(logits.numpy()))


SPEC_REFUSALS = {
    "not JSON": ("{label: x}", "The feature spec is not JSON"),
    "no columns": ({"label": "y", "columns": []}, "The feature spec has no columns"),
    "an unknown key": (
        {"label": "y", "colums": [], "columns": [{"name": "a", "kind": "numeric"}]},
        "A feature spec takes a label (a column name), columns and optionally positive",
    ),
    "an unknown kind": (
        {"label": "y", "columns": [{"name": "a", "kind": "float"}]},
        "Column 'a' has kind 'float'; use one of numeric, categorical, multi_hot.",
    ),
    "an option of another kind": (
        {"label": "y", "columns": [{"name": "a", "kind": "numeric", "hash_bucket": 9}]},
        "Column 'a' (numeric) has no option 'hash_bucket'; its options are normalize, fill.",
    ),
    "a misspelt option": (
        {"label": "y", "columns": [{"name": "a", "kind": "categorical", "hash_bucket": 9}]},
        "has no option 'hash_bucket' (did you mean 'hash_buckets'?)",
    ),
    "zero buckets": (
        {"label": "y", "columns": [{"name": "a", "kind": "categorical", "hash_buckets": 0}]},
        "Column 'a' has hash_buckets=0; give a whole number >= 1.",
    ),
    "a pooling": (
        {"label": "y", "columns": [{"name": "a", "kind": "multi_hot", "pooling": "max"}]},
        "Column 'a' has pooling='max'; use one of mean, sum.",
    ),
    "a fill that is not finite": (
        {"label": "y", "columns": [{"name": "a", "kind": "numeric", "fill": float("nan")}]},
        "Column 'a' has fill=nan; give a finite number or null.",
    ),
    "a column twice": (
        {"label": "y", "columns": [{"name": "a", "kind": "numeric"}] * 2},
        "The feature spec names a twice",
    ),
    "the label as a feature": (
        {"label": "a", "columns": [{"name": "a", "kind": "numeric"}]},
        "'a' is the label and a feature column",
    ),
}


@pytest.mark.parametrize("case", sorted(SPEC_REFUSALS))
def test_a_bad_spec_is_refused_naming_the_entry_and_the_fix(case):
    spec, sentence = SPEC_REFUSALS[case]
    with pytest.raises(ValueError) as refused:
        FeatureSpec.from_json(spec)
    assert sentence in str(refused.value)


TABLE_REFUSALS = {
    "a column the file lacks": (
        {"columns": [{"name": "ages", "kind": "numeric"}]},
        "a,ages_x,clicked\n1,2,0\n",
        "The feature spec names column 'ages', which {path} does not have (its columns: a, "
        "ages_x, clicked); did you mean 'ages_x'?",
    ),
    "text in a numeric column": (
        {"columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\n1,0\nten,1\n",
        "{path} line 3: numeric column 'a' holds 'ten', not a number",
    ),
    "an empty number without a fill": (
        {"columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\n,0\n",
        "{path} line 2: numeric column 'a' is empty; give the column a \"fill\" value",
    ),
    "infinity": (
        {"columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\ninf,0\n",
        "{path} line 2: numeric column 'a' holds 'inf'; it must be finite.",
    ),
    "a negative number under log": (
        {"columns": [{"name": "a", "kind": "numeric", "normalize": "log"}]},
        "a,clicked\n-3,0\n",
        "it must be a non-negative number (normalize=log).",
    ),
    "a label that is no click": (
        {"columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\n1,yes\n",
        "{path} line 2: label column 'clicked' holds 'yes', not 0 or 1",
    ),
    "a positive among three values": (
        {"positive": "yes", "columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\n1,yes\n2,no\n3,maybe\n",
        "Label column 'clicked' of {path} holds 'maybe', 'no', 'yes': with positive='yes' it "
        "must hold that value and one other",
    ),
    "a short row": (
        {"columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\n1\n",
        "{path} line 2 has 1 fields and the header 2",
    ),
    "no rows": (
        {"columns": [{"name": "a", "kind": "numeric"}]},
        "a,clicked\n",
        "{path} has a header and no rows",
    ),
}


@pytest.mark.parametrize("case", sorted(TABLE_REFUSALS))
def test_a_table_that_does_not_fit_its_spec_is_refused_naming_the_column_row_and_value(
    case, tmp_path
):
    entries, text, sentence = TABLE_REFUSALS[case]
    path = tmp_path / "table.csv"
    path.write_text(text)
    spec = FeatureSpec.from_json({"label": "clicked", **entries})
    with pytest.raises(ValueError) as refused:
        feature_tables.fit(spec, feature_tables.read_table(str(path)))
    assert sentence.format(path=path) in str(refused.value)


def test_a_list_in_a_categorical_column_is_refused_naming_the_parquet_row(tmp_path):
    path = tmp_path / "rows.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"tags": [["a"], ["b", "c"]], "y": [0, 1]}), path)
    spec = FeatureSpec.from_json(
        {"label": "y", "columns": [{"name": "tags", "kind": "categorical"}]}
    )
    with pytest.raises(ValueError, match=r"rows.parquet row 0: categorical column 'tags' holds a"):
        feature_tables.fit(spec, feature_tables.read_table(str(path)))

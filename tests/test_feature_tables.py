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
        "Column 'a' (numeric) has no option 'hash_bucket' (did you mean 'buckets'?); its "
        "options are normalize, fill, buckets.",
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
    "a cross on a numeric column": (
        {"label": "y", "columns": [{"name": "c", "kind": "numeric", "cross": ["a", "b"]}]},
        "Column 'c' (numeric) has cross; only a categorical column crosses columns: give it "
        '"kind": "categorical".',
    ),
    "a cross of one column": (
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "cross": ["a"]}]},
        "Column 'c' has cross=['a']; list 2 or more distinct columns of the table, like "
        '"cross": ["education", "occupation"].',
    ),
    "a cross of one column twice": (
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "cross": ["a", "a"]}]},
        "Column 'c' has cross=['a', 'a']; list 2 or more distinct columns",
    ),
    "a cross that is no list": (
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "cross": "a,b"}]},
        "Column 'c' has cross='a,b'; list 2 or more distinct columns",
    ),
    "a separator without a cross": (
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "separator": "#"}]},
        "Column 'c' has a separator and no cross; a categorical column's separator joins the "
        'values it crosses: add "cross", or make it a multi_hot column.',
    ),
    "an empty separator of a cross": (
        {
            "label": "y",
            "columns": [{"name": "c", "kind": "categorical", "cross": ["a", "b"], "separator": ""}],
        },
        "Column 'c' has separator=''; give a character.",
    ),
    "a cross of the label": (
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "cross": ["a", "y"]}]},
        "Column 'c' crosses the label 'y'; a model must not read its label: cross feature columns.",
    ),
    "a cross of itself": (
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "cross": ["a", "c"]}]},
        "Column 'c' crosses itself; list the table's columns whose values it joins.",
    ),
    "a cross of a cross": (
        {
            "label": "y",
            "columns": [
                {"name": "ab", "kind": "categorical", "cross": ["a", "b"]},
                {"name": "c", "kind": "categorical", "cross": ["ab", "d"]},
            ],
        },
        "Column 'c' crosses 'ab', itself a crossed column; cross the columns it joins instead: "
        '"cross": ["a", "b", "d"].',
    ),
    "a cross of a numeric column": (
        {
            "label": "y",
            "columns": [
                {"name": "a", "kind": "numeric"},
                {"name": "c", "kind": "categorical", "cross": ["a", "b"]},
            ],
        },
        "Column 'c' crosses 'a', a numeric column; cross categorical columns, or columns of "
        "the table the spec does not list (read as text).",
    ),
    "a cross of a multi-hot column": (
        {
            "label": "y",
            "columns": [
                {"name": "c", "kind": "categorical", "cross": ["b", "tags"]},
                {"name": "tags", "kind": "multi_hot"},
            ],
        },
        "Column 'c' crosses 'tags', a multi_hot column; cross categorical columns",
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
    "a crossed column the file lacks": (
        {"columns": [{"name": "c", "kind": "categorical", "cross": ["city", "zips"]}]},
        "city,zip,clicked\nOslo,0150,1\n",
        "Column 'c' crosses 'zips', which {path} does not have (its columns: city, zip, "
        "clicked); did you mean 'zip'?",
    ),
    "a crossed column named as a column of the file": (
        {"columns": [{"name": "zip", "kind": "categorical", "cross": ["city", "code"]}]},
        "city,code,zip,clicked\nOslo,47,0150,1\n",
        "Column 'zip' crosses city, code and {path} has a column 'zip' too; give the crossed "
        "column a name of its own (e.g. 'zip_cross'), or drop its cross to read the table's.",
    ),
    "a crossed value holding the separator": (
        {"columns": [{"name": "c", "kind": "categorical", "cross": ["city", "zip"]}]},
        "city,zip,clicked\nOslo,0150,1\nSan|Jose,95110,0\n",
        "{path} line 3: column 'city', crossed by 'c', holds 'San|Jose', which has the cross's "
        "separator '|'; give 'c' a \"separator\" that no crossed value holds.",
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


def test_a_list_in_a_crossed_column_is_refused_naming_the_parquet_row(tmp_path):
    path = tmp_path / "rows.parquet"
    pyarrow.parquet.write_table(
        pyarrow.table({"city": ["Oslo", "Rome"], "tags": [["a"], ["b", "c"]], "y": [0, 1]}), path
    )
    spec = FeatureSpec.from_json(
        {"label": "y", "columns": [{"name": "c", "kind": "categorical", "cross": ["city", "tags"]}]}
    )
    with pytest.raises(ValueError) as refused:
        feature_tables.fit(spec, feature_tables.read_table(str(path)))
    assert str(refused.value) == (
        f"{path} row 0: column 'tags', crossed by 'c', holds a list (['a']); cross single values."
    )


CROSS_SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "city", "kind": "categorical"},
        # city by day (a column the spec does not list), each pair seen twice or more.
        {"name": "city_x_day", "kind": "categorical", "cross": ["city", "day"], "min_count": 2},
        # day by hour (a number read as its text), hashed, joined by "#".
        {
            "name": "day_x_hour",
            "kind": "categorical",
            "cross": ["day", "hour"],
            "hash_buckets": 11,
            "separator": "#",
        },
    ],
}
CROSS_HEADER = ("city", "day", "hour", "clicked")
CROSS_TRAIN = [
    ("Oslo", "Mon", 9, 1),
    ("Oslo", "Mon", 9, 0),
    ("Rome", "Tue", 9, 0),
    ("Oslo", "Tue", 17, 1),
    ("Rome", "Tue", 17, 1),
    ("Rome", "Mon", 17, 0),
    ("Oslo", "Mon", 8, 0),
]
# Rome|Mon seen once in training (under min_count 2), Oslo|Mon 3 times, Lima never.
CROSS_TEST = [("Rome", "Mon", 9, 1), ("Oslo", "Mon", 17, 0), ("Lima", "Tue", 9, 0)]


def expected_cross_ids(train, rows):
    """The crossed columns' ids computed here from the rows themselves: the pair texts, the
    vocabulary of the training pairs seen twice (most frequent first, then by text) and
    TensorFlow's FarmHash of the day#hour texts."""
    pairs = np.array([f"{city}|{day}" for city, day, _, _ in train])
    kept, counts = np.unique(pairs, return_counts=True)
    order = sorted(zip(-counts, kept))
    vocabulary = [str(pair) for count, pair in order if -count >= 2]
    rows_of = {pair: row for row, pair in enumerate(vocabulary, 1)}
    city_x_day = [rows_of.get(f"{city}|{day}", 0) for city, day, _, _ in rows]
    day_x_hour = tf.strings.to_hash_bucket_fast([f"{d}#{h}" for _, d, h, _ in rows], 11)
    return vocabulary, city_x_day, day_x_hour.numpy().tolist()


def test_a_crossed_column_reads_the_joined_values_of_its_columns_in_csv_and_parquet(tmp_path):
    spec = FeatureSpec.from_json(CROSS_SPEC)
    train = feature_tables.read_table(write_csv(tmp_path / "train.csv", CROSS_TRAIN, CROSS_HEADER))
    fitted = feature_tables.fit(spec, train)
    vocabulary, _, _ = expected_cross_ids(CROSS_TRAIN, CROSS_TRAIN)
    # Oslo|Mon 3 times, Rome|Tue twice; the other pairs once.
    assert vocabulary == ["Oslo|Mon", "Rome|Tue"]
    assert fitted.vocabularies == {"city": ["Oslo", "Rome"], "city_x_day": vocabulary}
    assert fitted.cardinalities() == {"city": 3, "city_x_day": 3, "day_x_hour": 11}
    # The hour as Parquet holds it, a float: 9.0 reads as "9", as the CSV's text.
    parquet = tmp_path / "test.parquet"
    columns = dict(zip(CROSS_HEADER, map(list, zip(*CROSS_TEST))))
    columns["hour"] = [float(hour) for hour in columns["hour"]]
    pyarrow.parquet.write_table(pyarrow.table(columns), parquet)
    for rows, path in (
        (CROSS_TRAIN, tmp_path / "train.csv"),
        (CROSS_TEST, write_csv(tmp_path / "test.csv", CROSS_TEST, CROSS_HEADER)),
        (CROSS_TEST, parquet),
    ):
        arrays, _ = fitted.arrays(feature_tables.read_table(str(path)))
        _, city_x_day, day_x_hour = expected_cross_ids(CROSS_TRAIN, rows)
        assert arrays["city_x_day"].tolist() == city_x_day, path
        assert arrays["day_x_hour"].tolist() == day_x_hour, path
        assert arrays["city_x_day"].dtype == arrays["day_x_hour"].dtype == np.int64
    # Rome|Mon (once in training), Oslo|Mon, Lima|Tue (never).
    assert arrays["city_x_day"].tolist() == [0, 1, 0]
    assert fitted.arrays(train)[0]["city_x_day"].tolist() == [1, 1, 2, 0, 2, 0, 1]


def test_a_fitted_spec_with_crosses_read_back_from_features_json_gives_the_same_arrays(
    tmp_path,
):
    train = feature_tables.read_table(write_csv(tmp_path / "train.csv", CROSS_TRAIN, CROSS_HEADER))
    fitted = feature_tables.fit(FeatureSpec.from_json(json.dumps(CROSS_SPEC)), train)
    (tmp_path / "features.json").write_text(fitted.to_json())
    again = FittedFeatures.from_json((tmp_path / "features.json").read_text())
    assert again == fitted
    assert again.spec.columns[1].crosses() == ("city", "day")
    assert again.spec.columns[2].option("separator") == "#"
    test = feature_tables.read_table(write_csv(tmp_path / "test.csv", CROSS_TEST, CROSS_HEADER))
    columns, labels = fitted.arrays(test)
    columns_again, labels_again = again.arrays(test)
    assert sorted(columns_again) == ["city", "city_x_day", "day_x_hour"]
    for name, array in columns.items():
        np.testing.assert_array_equal(columns_again[name], array, err_msg=name)
    np.testing.assert_array_equal(labels_again, labels)
    assert columns_again["city_x_day"].tolist() == [0, 1, 0]

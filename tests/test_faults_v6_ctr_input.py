"""Faults of the click-through table reader (issue 64): a huge number's scale, a header that
names a column twice, Parquet bytes and float labels, a spec that is not UTF-8, a CSV file
named as Parquet, the reader's words for a table row, and labels of one value; each held
with the numbers or the exact sentence."""

import gzip
import json

import numpy as np
import pyarrow
import pyarrow.parquet
import pytest

from loops.input import feature_tables, log_text
from loops.input.feature_tables import FeatureSpec, FittedFeatures
from loops_data import ctr_tables

AGE_SPEC = {"label": "y", "columns": [{"name": "age", "kind": "numeric"}]}


def write(path, text):
    path.write_text(text)
    return str(path)


def refusal(call, *args):
    with pytest.raises(ValueError) as refused:
        call(*args)
    return str(refused.value)


def fitted_of(spec, path):
    return feature_tables.fit(FeatureSpec.from_json(spec), feature_tables.read_table(path))


@pytest.mark.parametrize("big", [1e200, 1e308])
def test_a_huge_number_standardizes_to_finite_scales_and_strict_json(tmp_path, big):
    ages = [big if row % 3 == 0 else 20.0 + row for row in range(9)]
    path = write(
        tmp_path / "t.csv",
        "age,y\n" + "".join(f"{age!r},{row % 2}\n" for row, age in enumerate(ages)),
    )
    fitted = fitted_of(AGE_SPEC, path)
    center, scale = fitted.scales["age"]
    # The ordinary ages are below the big values' precision: the mean is big / 3 and the
    # deviation big * sqrt(2) / 3, both finite (before: an infinite scale, or NaN).
    np.testing.assert_allclose([center, scale], [big / 3, big * np.sqrt(2) / 3], rtol=1e-12)
    columns, _ = fitted.arrays(feature_tables.read_table(path))
    expected = np.where(np.arange(9) % 3 == 0, np.sqrt(2), -1 / np.sqrt(2)).astype(np.float32)
    np.testing.assert_allclose(columns["age"], expected, rtol=1e-6)

    def no_constant(name):
        raise AssertionError(f"features.json holds {name}")

    saved = json.loads(fitted.to_json(), parse_constant=no_constant)
    assert saved["scales"]["age"] == [center, scale]
    again = FittedFeatures.from_json(fitted.to_json())
    np.testing.assert_array_equal(
        again.arrays(feature_tables.read_table(path))[0]["age"], columns["age"]
    )


def test_a_value_past_float32_after_normalizing_is_refused_naming_the_row(tmp_path):
    huge = write(tmp_path / "huge.csv", "age,y\n1e200,1\n30,0\n")
    unscaled = {"label": "y", "columns": [{"name": "age", "kind": "numeric", "normalize": "none"}]}
    assert refusal(fitted_of, unscaled, huge) == (
        f"{huge} line 2: numeric column 'age' holds 1e+200, which normalized is 1e+200, past "
        'the range of the float32 the model reads (3.4e+38); give the column "normalize": '
        '"standard" or "log", or rescale its values.'
    )
    # A later row far beyond the training rows' deviation (1) is refused too.
    fitted = fitted_of(AGE_SPEC, write(tmp_path / "train.csv", "age,y\n30,1\n32,0\n"))
    later = write(tmp_path / "later.csv", "age,y\n31,1\n1e50,0\n")
    assert refusal(fitted.arrays, feature_tables.read_table(later)) == (
        f"{later} line 3: numeric column 'age' holds 1e+50, which normalized, less the "
        "training rows' mean 31 over their deviation 1, is 1e+50, past the range of the "
        'float32 the model reads (3.4e+38); give the column "normalize": "log", or rescale '
        "its values."
    )


def test_a_header_that_names_a_column_twice_is_refused_naming_both_columns(tmp_path):
    csv_path = write(tmp_path / "t.csv", "age,city,age,y\n31,Oslo,40,1\n")
    assert refusal(feature_tables.read_table, csv_path) == (
        f"{csv_path}'s header names column 'age' twice (columns 1 and 3); give each column "
        "its own name."
    )
    parquet_path = tmp_path / "t.parquet"
    arrays = [pyarrow.array([1]), pyarrow.array([2]), pyarrow.array([3]), pyarrow.array([1])]
    table = pyarrow.Table.from_arrays(arrays, names=["y", "age", "age", "city"])
    pyarrow.parquet.write_table(table, str(parquet_path))
    assert refusal(feature_tables.read_table, str(parquet_path)) == (
        f"{parquet_path}'s header names column 'age' twice (columns 2 and 3); give each column "
        "its own name."
    )


BYTES_SPEC = {
    "label": "y",
    "columns": [
        {"name": "job", "kind": "categorical"},
        {"name": "tags", "kind": "multi_hot"},
    ],
}


def test_parquet_bytes_read_as_the_csv_files_text(tmp_path):
    parquet_path = tmp_path / "t.parquet"
    columns = {
        "job": pyarrow.array([b"Tech", b"Caf\xc3\xa9", b"Tech"], pyarrow.binary()),
        "tags": pyarrow.array([[b"a", b"b"], [], [b"b"]], pyarrow.list_(pyarrow.large_binary())),
        # Bytes that are not UTF-8 in a column the spec does not read stay unread.
        "photo": pyarrow.array([b"\xff\xd8", b"\xff", b""], pyarrow.binary()),
        "y": [1, 0, 1],
    }
    pyarrow.parquet.write_table(pyarrow.table(columns), str(parquet_path))
    csv_path = write(tmp_path / "t.csv", "job,tags,y\nTech,a|b,1\nCafé,,0\nTech,b,1\n")
    from_parquet = fitted_of(BYTES_SPEC, str(parquet_path))
    assert from_parquet.vocabularies == {"job": ["Tech", "Café"], "tags": ["b", "a"]}
    assert from_parquet == fitted_of(BYTES_SPEC, csv_path)
    serving = write(tmp_path / "serving.csv", "job,tags,y\nTech,a,1\n")
    np.testing.assert_array_equal(
        from_parquet.arrays(feature_tables.read_table(serving))[0]["job"], [1]
    )
    spec = {"label": "y", "columns": [{"name": "photo", "kind": "categorical"}]}
    assert refusal(fitted_of, spec, str(parquet_path)) == (
        f"{parquet_path} row 0: column 'photo' (binary) holds b'\\xff\\xd8', which is not "
        "UTF-8 text; write the column as UTF-8 strings (or numbers), or leave it out of the "
        "spec."
    )


def test_a_label_reads_as_a_number_alike_in_csv_and_parquet(tmp_path):
    csv_path = write(tmp_path / "t.csv", "age,y\n30,1.0\n40,0.0\n50, 1\n")
    parquet_path = tmp_path / "t.parquet"
    table = pyarrow.table({"age": [30, 40, 50], "y": [1.0, 0.0, 1.0]})
    pyarrow.parquet.write_table(table, str(parquet_path))
    for path in (csv_path, str(parquet_path)):
        _, labels = fitted_of(AGE_SPEC, path).arrays(feature_tables.read_table(path))
        np.testing.assert_array_equal(labels, [1, 0, 1], err_msg=path)
    for text, shown in (("2.0", "'2.0'"), ("True", "'True'")):
        path = write(tmp_path / "bad.csv", f"age,y\n30,1\n40,{text}\n")
        assert refusal(fitted_of, AGE_SPEC, path) == (
            f"{path} line 3: label column 'y' holds {shown}, not 0 or 1; name the value of a "
            'click in the spec (e.g. "positive": ">50K").'
        )
    pyarrow.parquet.write_table(pyarrow.table({"age": [1, 2], "y": [1.0, 2.0]}), parquet_path)
    assert refusal(fitted_of, AGE_SPEC, str(parquet_path)) == (
        f"{parquet_path} row 1: label column 'y' holds 2.0, not 0 or 1; name the value of a "
        'click in the spec (e.g. "positive": ">50K").'
    )


def test_a_spec_file_that_is_not_utf8_is_refused_in_a_sentence(tmp_path):
    path = tmp_path / "spec.json"
    path.write_bytes(
        '{"label": "y",\n "columns": [{"name": "âge", "kind": "numeric"}]}'.encode("latin1")
    )
    assert refusal(FeatureSpec.read, str(path)) == (
        f"{path} is not UTF-8 text (byte 0xe2 at line 2, column 24 does not decode); a "
        "feature spec is UTF-8 JSON: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE)."
    )


def test_a_file_named_as_parquet_that_is_not_one_is_refused_naming_the_suffix(tmp_path):
    named = write(tmp_path / "clicks.Parquet", "age,y\n30,1\n")
    assert refusal(feature_tables.read_table, named) == (
        f"{named} is named .Parquet, which reads it as Parquet, and it is not a Parquet file "
        "(it does not start with Parquet's bytes PAR1); if it is CSV text, name it .csv, else "
        "write it again as Parquet."
    )
    whole = tmp_path / "whole.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"age": [30], "y": [1]}), str(whole))
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[:-12])
    assert refusal(feature_tables.read_table, str(cut)).startswith(
        f"{cut} does not read as Parquet ("
    )
    assert refusal(feature_tables.read_table, str(cut)).endswith(
        "); check that the file is whole (a copy cut short loses the footer Parquet reads "
        "first), or write it again."
    )


def test_the_csv_reader_speaks_of_a_table_row_not_an_interaction(tmp_path, monkeypatch):
    long_line = write(tmp_path / "long.csv", "age,y\n" + "7" * 70_000 + ",1\n")
    nul = write(tmp_path / "nul.csv", "age,y\n3\x000,1\n")
    packed = tmp_path / "packed.csv"
    packed.write_bytes(gzip.compress(b"age,y\n30,1\n"))
    open_quote = write(tmp_path / "quote.csv", 'age,y\n30,1\n"31,0\n' + "32,1\n" * 30_000)
    for path, sentence in (
        (
            long_line,
            "{path} line 2 is over 65,536 bytes, more than a row of a feature table may hold; "
            "check that the file is the CSV table, one row a line (a file with no line ends is "
            "one long line).",
        ),
        (
            nul,
            "{path} line 2 holds a NUL byte (column 2), which no CSV table holds; remove it, or "
            "check that the file is the CSV table and not binary data.",
        ),
        (
            str(packed),
            "{path} is a gzip file (it starts with gzip's bytes 1f 8b), not a CSV table; "
            "decompress it first (e.g. gunzip) and pass the text file.",
        ),
        (
            open_quote,
            "{path} line 3 does not read as CSV (field larger than field limit (131072)); "
            'write one row a line and close each field quoted with " (one left open runs on '
            "over the lines below).",
        ),
    ):
        assert refusal(feature_tables.read_table, path) == sentence.format(path=path)
    small = write(tmp_path / "small.csv", "age,y\n" + "30,1\n" * 199)  # 1,001 bytes
    monkeypatch.setattr(log_text, "memory_bytes", lambda: 4_000)
    assert refusal(feature_tables.read_table, small) == (
        f"{small} is 1,001 bytes, more than this machine can read: its fields as strings need "
        "at least 4 bytes a byte of file (4,004 bytes), and it has 4,000 bytes of memory; pass "
        "a table of at most 1,000 bytes (a sample of the rows, or only the columns the spec "
        "reads)."
    )


@pytest.mark.parametrize(
    "labels, entries, said",
    [
        ("0,0,0", {}, "is 0"),
        ("1,1,1", {}, "is 1"),
        ("yes,yes,yes", {"positive": "yes"}, "holds 'yes' (positive)"),
    ],
)
def test_labels_of_one_value_are_refused_before_training(tmp_path, labels, entries, said):
    both = {"is 0": "0 and 1", "is 1": "0 and 1"}.get(said, "'yes' and another")
    path = write(
        tmp_path / "t.csv",
        "age,y\n" + "".join(f"{30 + i},{y}\n" for i, y in enumerate(labels.split(","))),
    )
    spec = write(tmp_path / "spec.json", json.dumps({**AGE_SPEC, **entries}))
    assert refusal(ctr_tables.checked_table, path, spec) == (
        f"Label column 'y' of {path} {said} on all 3 rows: with one label there is nothing to "
        f"learn (nor an AUC to measure); give rows of both labels, {both}. (--spec={spec})"
    )

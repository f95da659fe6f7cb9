"""Faults of the exports (issue 64): a click-through row the model cannot score (a number
training refuses, an id outside its table) is flagged with NaN on keras and placed tables
alike; a column's signature name is derivable from the spec, and names that would collide are
refused; a log id with spaces, commas or brackets is read, and a recommender request of the
log's own bytes (decomposed accents, blanks around it) finds its id."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.input import feature_tables, interaction_logs
from loops.model_dir import canonical_text, id_vocabulary, signature_names
from loops.model_dir.ctr_export import export_ctr
from loops.model_dir.recommender_export import export_recommender
from loops_data import ctr_tables
from loops_models import ctr

TABLE = (
    "age,income,native-country,tags,clicked\n31,1200,Oslo,a|b,1\n45,80,Rome,,0\n"
    "28,3400,Oslo,b,0\n52,0,Lima,c|a,1\n39,560,Rome,a,0\n33,90,Oslo,a,1\n"
)
SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "age", "kind": "numeric"},
        {"name": "income", "kind": "numeric", "normalize": "log"},
        {"name": "native-country", "kind": "categorical"},
        {"name": "tags", "kind": "multi_hot"},
    ],
}


@pytest.fixture(scope="module", params=["keras", "placed"])
def exported(request, tmp_path_factory):
    """(the live model, its fitted features, the loaded export) of a table with a log column
    and a hyphenated one, its tables keras Embeddings or placed `loops.EmbeddingTable`s."""
    directory = tmp_path_factory.mktemp(request.param)
    (directory / "train.csv").write_text(TABLE)
    split = ctr_tables.from_table(
        feature_tables.FeatureSpec.from_json(SPEC),
        feature_tables.read_table(str(directory / "train.csv")),
        seed=0,
        test_fraction=0.2,
        validation_fraction=0,
    )
    tables = (lambda: loops.RowwiseAdagrad(0.1)) if request.param == "placed" else None
    features = ctr.CTRFeatures(**split.features)
    model = ctr.build_model("dcn_v2", features, seed=0, table_optimizer_fn=tables)
    export_ctr(model, str(directory / "export"), fitted=split.fitted)
    return model, split.fitted, tf.saved_model.load(str(directory / "export"))


def live_probabilities(model, columns):
    prepared = {name: np.asarray(a, np.int32 if a.dtype.kind == "i" else a.dtype)
                for name, a in columns.items()}  # fmt: skip
    return tf.sigmoid(tf.reshape(model(prepared), [-1])).numpy()


def test_a_raw_number_training_refuses_gives_a_flagged_nan_row_on_either_table_kind(exported):
    model, fitted, loaded = exported
    incomes = [np.nan, np.inf, -0.5, -1.0, 100.0, 1e308, 2500.0]
    ages = [33.0, 40.0, 50.0, 20.0, 1e308, 30.0, 47.0]
    served = loaded.signatures["serving_default"](
        age=tf.constant(ages, tf.float64),
        income=tf.constant(incomes, tf.float64),
        native_country=tf.constant(["Oslo", "Rome", "Oslo", "Lima", "Oslo", "Oslo", "Rome"]),
        tags=tf.constant(["a"] * 6 + ["b|z"]),
    )
    # NaN, inf, -0.5 and -1 in the log column, 1e308 in the standard one (past float32 once
    # scaled): no row the model can score (before: 0.5, 0.5, a plausible number, 0.5, 0).
    # 1e308 in the log column is log1p'd to 709.2, a value training takes too.
    assert served["valid_row"].numpy().tolist() == [False] * 5 + [True] * 2
    assert np.isnan(served["probabilities"].numpy()[:5]).all()
    assert np.isnan(served["logits"].numpy()[:5]).all()
    good = "age,income,native-country,tags,clicked\n30,1e308,Oslo,a,0\n47,2500,Rome,b|z,1\n"
    columns, _ = fitted.arrays(feature_tables.Table("t", _columns(good), "line", 2))
    np.testing.assert_allclose(
        served["probabilities"].numpy()[5:], live_probabilities(model, columns), atol=1e-6
    )


def _columns(text):
    header, *rows = [line.split(",") for line in text.strip().split("\n")]
    return {name: [row[i] for row in rows] for i, name in enumerate(header)}


def test_a_prepared_id_outside_its_table_is_flagged_alike_on_keras_and_placed_tables(exported):
    model, fitted, loaded = exported
    rows = fitted.cardinalities()
    country, tags = rows["native-country"], rows["tags"]
    served = loaded.signatures["serve_prepared"](
        age=tf.constant([0.5, 0.1, 0.2, 0.3, np.nan, -0.4]),
        income=tf.constant([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        native_country=tf.constant([-1, country, 1, 2, 1, country - 1]),
        tags=tf.constant([[1, -1], [1, 2], [-2, 1], [tags, -1], [1, -1], [2, 1]]),
    )
    # A categorical -1 (before: a zero row on keras tables, refused on placed ones) and row
    # `rows`, a bag's -2 and `rows`, a NaN number: flagged, NaN; the padding -1 is no fault.
    assert served["valid_row"].numpy().tolist() == [False] * 5 + [True]
    assert np.isnan(served["probabilities"].numpy()[:5]).all()
    live = live_probabilities(
        model,
        {
            "age": np.float32([-0.4]),
            "income": np.float32([6.0]),
            "native-country": np.int64([country - 1]),
            "tags": np.int64([[2, 1]]),
        },
    )
    np.testing.assert_allclose(served["probabilities"].numpy()[5:], live, atol=1e-6)


def test_each_signature_names_its_inputs_as_the_spec_derives_them(exported):
    _, _, loaded = exported
    for name in ("serving_default", "serve_prepared"):
        signature = loaded.signatures[name]
        # The SavedModel's own input names, which a serving client sends (before:
        # native-country there, native_country as a loaded signature's keyword).
        inputs = sorted(spec.name for spec in signature.structured_input_signature[1].values())
        assert inputs == ["age", "income", "native_country", "tags"]
        assert sorted(signature.structured_input_signature[1]) == inputs
    assert [signature_names.served_name(n) for n in ["native-country", "1st", "café", "a b"]] == [
        "native_country",
        "arg_1st",
        "caf_",
        "a_b",
    ]


def test_columns_served_under_one_name_are_refused_before_any_export(tmp_path):
    spec = feature_tables.FeatureSpec.from_json(
        {
            "label": "y",
            "columns": [
                {"name": "a-b", "kind": "numeric"},
                {"name": "a_b", "kind": "categorical"},
            ],
        }
    )
    sentence = (
        "Columns 'a-b' and 'a_b' would both be served as 'a_b' by the export's "
        "serving_default signature (a signature input's name is its column's with each "
        "character other than an ASCII letter, digit or _ made _, and arg_ in front unless it "
        "then starts with an ASCII letter); rename one of them in the spec."
    )
    with pytest.raises(ValueError) as refused:
        signature_names.check_spec(spec)
    assert str(refused.value) == sentence
    fitted = feature_tables.FittedFeatures(spec, {"a_b": ["x"]}, {"a-b": (0.0, 1.0)})
    model = ctr.build_model(
        "wide_and_deep", ctr.CTRFeatures(numeric=["a-b"], categorical={"a_b": 2}), seed=0
    )
    with pytest.raises(ValueError) as refused:
        export_ctr(model, str(tmp_path / "export"), fitted=fitted)
    assert "would both be served as 'a_b' by the export's serve_prepared" in str(refused.value)
    assert not list(tmp_path.iterdir())


def test_the_binary_refuses_columns_served_under_one_name_before_training(tmp_path):
    import json

    from conftest import run_module

    table, spec = tmp_path / "t.csv", tmp_path / "spec.json"
    table.write_text("a-b,a_b,y\n1,x,1\n2,z,0\n3,x,1\n4,z,0\n")
    columns = [{"name": "a-b", "kind": "numeric"}, {"name": "a_b", "kind": "categorical"}]
    spec.write_text(json.dumps({"label": "y", "columns": columns}))
    model_dir = tmp_path / "run"
    done = run_module(
        "loops.bin.ctr", f"--data={table}", f"--spec={spec}", f"--model_dir={model_dir}"
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Columns 'a-b' and 'a_b' would both be served as 'a_b'" in done.stderr
    assert f"rename one of them in the spec. (--spec={spec})" in done.stderr
    assert not model_dir.exists()


def test_a_prepared_export_without_the_tables_rows_is_refused_and_with_them_flags(tmp_path):
    model = ctr.build_model(
        "wide_and_deep", ctr.CTRFeatures(numeric=["x"], categorical={"c": 3}), seed=0
    )
    with pytest.raises(ValueError) as refused:
        export_ctr(model, str(tmp_path / "export"))
    assert str(refused.value) == (
        "export_ctr needs the rows of each id column's table to flag an id outside it, and 'c' "
        "has none; pass fitted= (the table's FittedFeatures) or cardinalities={name: rows} "
        "(CTRFeatures' cardinalities)."
    )
    export_ctr(model, str(tmp_path / "export"), cardinalities={"c": 3})
    served = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"](
        x=tf.constant([0.0, 0.0, 1.0]), c=tf.constant([3, -1, 2])
    )
    assert served["valid_row"].numpy().tolist() == [False, False, True]
    live = live_probabilities(model, {"x": np.float32([1.0]), "c": np.int64([2])})
    np.testing.assert_allclose(served["probabilities"].numpy()[2:], live, atol=1e-6)


# A log whose ids hold spaces, commas and brackets (quoted), and one decomposed name.
LOG = (
    'user,item,rating\n"Smith, John",cafe\u0301 (2),4\nAnn Lee,"x:y@z.w",3\n'
    '"Smith, John",x:y@z.w,5\nAnn Lee,café (2),2\n'
)


def test_a_log_id_with_spaces_commas_and_brackets_is_read_and_control_characters_refused(
    tmp_path,
):
    path = tmp_path / "log.csv"
    path.write_text(LOG)
    log = interaction_logs.read_interactions(path)
    # Before: "'Smith, John' is not an id (a whole number or a name of letters, digits and _)".
    assert log.user_ids.tolist() == ["Ann Lee", "Smith, John"]
    assert log.item_ids.tolist() == ["café (2)", "x:y@z.w"]  # the decomposed one merged
    assert log.items.tolist() == [0, 1, 1, 0]
    path.write_text('user,item\n"a\tb",1\n c ,\n')
    with pytest.raises(ValueError) as refused:
        interaction_logs.read_interactions(path)
    # No hint of a column order: the header names the columns.
    assert str(refused.value) == (
        f"{path} line 2: the user id 'a\\tb' holds the control character '\\t' (an id is any "
        "text but an empty one or one holding a control character, the blanks around it not "
        "part of it); remove it."
    )


def test_a_recommender_request_of_the_logs_own_bytes_finds_its_id(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text(LOG)
    log = interaction_logs.read_interactions(path)
    users = keras.layers.Embedding(2, 2, embeddings_initializer=keras.initializers.Constant(
        [[1.0, 0.0], [0.0, 1.0]]))  # fmt: skip
    items = keras.layers.Embedding(2, 2, embeddings_initializer=keras.initializers.Constant(
        [[3.0, 5.0], [7.0, 11.0]]))  # fmt: skip
    user, item = keras.Input((), dtype="int32"), keras.Input((), dtype="int32")
    model = keras.Model([user, item], keras.ops.sum(users(user) * items(item), axis=-1))
    export = export_recommender(
        model,
        str(tmp_path / "export"),
        score_all_items=lambda rows: tf.matmul(users(rows), items.embeddings, transpose_b=True),
        score_pairs=lambda u, i: model([u, i]),
        top_k=1,
        user_ids=log.user_ids,
        item_ids=log.item_ids,
        item_counts=log.item_counts(),
    )
    pairs = tf.saved_model.load(export).signatures["score_pairs"]
    # The log's own bytes (decomposed, blanks around them), NFC, and ids it does not hold.
    served = pairs(
        users=tf.constant(["Smith, John", " Ann Lee\u00a0", "Smith, John", "Smith", "Ann Lee"]),
        items=tf.constant(["cafe\u0301 (2)", "café (2)", "x:y@z.w", "x:y@z.w", "cafe (2)"]),
    )
    # Before: the decomposed item and the spaced user were unknown, their scores NaN.
    assert served["known_user"].numpy().tolist() == [True, True, True, False, True]
    assert served["known_item"].numpy().tolist() == [True, True, True, True, False]
    np.testing.assert_array_equal(served["scores"].numpy()[:3], [5.0, 3.0, 11.0])
    assert np.isnan(served["scores"].numpy()[3:]).all()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \u3000",
        "a\u0301\u0323b",  # marks out of canonical order
        "\u1e0b\u0323",  # a precomposed letter, then a mark of lower class
        "\ud55c\uad6d\uc5b4",  # Hangul syllables, with and without a trailing jamo
        "\u212b\u2126",  # singletons: the angstrom and ohm signs
        "\u0f73\u0344\U0001d15e",  # multi-part and astral decompositions
        "\u00a0 e\u0301\u0301\t",
    ],
)
def test_the_graphs_canonical_form_is_pythons(text):
    served = canonical_text.canonical(tf.constant([text, "x"])).numpy().tolist()
    assert served == [canonical_text.canonical_key(text).encode(), b"x"]


def test_bytes_that_are_not_utf8_become_nul_and_ids_a_request_cannot_tell_apart_are_refused():
    assert canonical_text.canonical(tf.constant([b"a\xff", b"\xc3"])).numpy().tolist() == [
        b"a\x00",
        b"\x00",
    ]
    with pytest.raises(ValueError) as refused:
        id_vocabulary.checked_ids("item_ids", np.array(["café", "cafe\u0301", "tea"]))
    assert str(refused.value) == (
        "item_ids holds the ids 'caf\\xe9' and 'cafe\\u0301', which a served request cannot tell "
        "apart "
        "(ids are compared without the blanks around them, in Unicode's canonical form, as "
        "the log reader merges them); give the two one row (one raw id, one index)."
    )

"""Reading interaction logs of each format into dense indices, their refusals, and the splits."""

import gzip
import tracemalloc

import numpy as np
import pytest

from loops.input import interaction_logs, log_text
from loops.input.interaction_logs import Interactions, read_interactions, split, split_validation


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_movielens_u_data_file_gives_dense_indices_in_id_order(tmp_path):
    path = write(
        tmp_path,
        "u.data",
        "196\t242\t3\t881250949\n186\t302\t3\t891717742\n"
        "22\t377\t1\t878887116\n196\t51\t2\t880606923\n",
    )
    log = read_interactions(path)
    # Users 22 < 186 < 196 numerically (not as text), items 51 < 242 < 302 < 377.
    np.testing.assert_array_equal(log.user_ids, [22, 186, 196])
    np.testing.assert_array_equal(log.item_ids, [51, 242, 302, 377])
    np.testing.assert_array_equal(log.users, [2, 1, 0, 2])
    np.testing.assert_array_equal(log.items, [1, 2, 3, 0])
    np.testing.assert_array_equal(log.ratings, [3, 3, 1, 2])
    np.testing.assert_array_equal(log.timestamps, [881250949, 891717742, 878887116, 880606923])
    assert (log.users.dtype, log.items.dtype, log.ratings.dtype, log.timestamps.dtype) == (
        np.int32,
        np.int32,
        np.float32,
        np.int64,
    )
    assert (log.num_users, log.num_items, len(log)) == (3, 4, 4)
    assert log.describe() == {
        "source": str(path),
        "interactions": 4,
        "users": 3,
        "items": 4,
        "ratings": "explicit",
        "features": [],
        "split": "none",
    }


def test_a_recbole_inter_file_reads_its_typed_header(tmp_path):
    path = write(
        tmp_path,
        "ml.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        "u7\tm2\t4.5\t100.0\nu3\tm2\t1\t99.5\n",
    )
    log = read_interactions(path)
    np.testing.assert_array_equal(log.user_ids, ["u3", "u7"])
    np.testing.assert_array_equal(log.users, [1, 0])
    np.testing.assert_array_equal(log.items, [0, 0])
    np.testing.assert_array_equal(log.ratings, [4.5, 1.0])
    np.testing.assert_array_equal(log.timestamps, [100, 99])  # rounded down


def test_a_csv_with_a_label_and_features_and_no_timestamp(tmp_path):
    path = write(
        tmp_path,
        "clicks.csv",
        "userId,movieId,label,device,price\n5,a,1,phone,2.5\n5,b,0,web,1\n9,a,1,web,3\n",
    )
    log = read_interactions(path)
    np.testing.assert_array_equal(log.users, [0, 0, 1])
    np.testing.assert_array_equal(log.items, [0, 1, 0])
    np.testing.assert_array_equal(log.ratings, [1, 0, 1])
    np.testing.assert_array_equal(log.timestamps, [0, 1, 2])  # the row order is the time
    assert log.features["price"].dtype == np.float32
    np.testing.assert_array_equal(log.features["price"], [2.5, 1, 3])
    np.testing.assert_array_equal(log.features["device"], ["phone", "web", "web"])


def test_an_implicit_csv_rates_every_row_one(tmp_path):
    log = read_interactions(write(tmp_path, "views.csv", "user,item\n1,10\n2,10\n"))
    np.testing.assert_array_equal(log.ratings, [1.0, 1.0])
    assert log.implicit and log.describe()["ratings"] == "implicit (1.0)"
    np.testing.assert_array_equal(log.item_counts(), [2])


@pytest.mark.parametrize(
    "name, text, format, expected",
    [
        (
            "u.data",
            "",
            "auto",
            "{path} holds no interactions (it is empty); pass a log with one interaction a line.",
        ),
        (
            "log.csv",
            "user,rating\n1,3\n",
            "auto",
            "{path}'s header names no item column (it names user, rating); name the columns "
            "user,item[,rating|label][,timestamp] in the first line (item may also be called "
            "item_id or itemid or movie_id or movieid).",
        ),
        (
            "u.data",
            "1\t2\t3\t4\n1\t \t3\t5\n",
            "auto",
            "{path} line 2: the item id is empty (an id is any text but an empty one or one "
            "holding a control character, the blanks around it not part of it); give every "
            "interaction its item's id.",
        ),
        (
            "u.data",
            "1\t2\tgood\t4\n",
            "auto",
            "{path} line 1: the rating 'good' is not a number; write each rating as a finite "
            "number (e.g. 4 or 3.5), 1 or 0 for a label.",
        ),
        (
            "a.inter",
            "user_id:token\titem_id:token\ttimestamp:float\nu\ti\tnan\n",
            "auto",
            "{path} line 2: the timestamp 'nan' is not a number; write each timestamp as a "
            "finite number (e.g. 4 or 3.5).",
        ),
        (
            "u.data",
            "1\t2\t3\n",
            "auto",
            "{path} line 1 has 3 fields and the log 4 (user\titem\trating\ttimestamp); give "
            "every line one field a column, separated by tabs.",
        ),
        (
            "log.txt",
            "1\t2\t3\t4\n",
            "auto",
            "format='auto' cannot tell the format of {path} from its name (known: .data, .inter, "
            ".csv); pass format='movielens' (u.data: user item rating timestamp, tab-separated), "
            "'recbole' (.inter, a typed header) or 'csv' (a header naming user,item,...).",
        ),
        (
            "log.csv",
            "user,item,rating,label\n1,2,3,1\n",
            "auto",
            "{path}'s header names two rating columns (rating and label); keep one, or rename "
            "the other to a feature name.",
        ),
        (
            "log.inter",
            "user_id:token\titem_id:token\n",
            "auto",
            "{path} holds a header and no interactions; pass a log with one interaction a line "
            "below its header.",
        ),
        (
            "log.txt",
            "1\t2\t3\t4\n",
            "parquet",
            "format='parquet' is not a log format loops reads; pass one of auto, movielens, "
            "recbole, csv.",
        ),
    ],
)
def test_a_bad_log_is_refused_with_the_value_and_the_fix(tmp_path, name, text, format, expected):
    path = write(tmp_path, name, text)
    with pytest.raises(ValueError) as refused:
        read_interactions(path, format=format)
    assert str(refused.value) == expected.replace("{path}", str(path))


def test_a_log_given_in_another_format_reads_as_that_format(tmp_path):
    log = read_interactions(write(tmp_path, "log.txt", "1\t2\t5\t9\n"), format="movielens")
    np.testing.assert_array_equal(log.ratings, [5.0])


def small_log(rows=1000, users=50, items=30, seed=3):
    rng = np.random.default_rng(seed)
    return Interactions(
        users=rng.integers(0, users, rows).astype(np.int32),
        items=rng.integers(0, items, rows).astype(np.int32),
        ratings=rng.integers(1, 6, rows).astype(np.float32),
        timestamps=rng.integers(0, 50, rows).astype(np.int64),  # many equal times
        num_users=users,
        num_items=items,
        user_ids=np.arange(users, dtype=np.int64),
        item_ids=np.arange(items, dtype=np.int64),
        features={"row": np.arange(rows, dtype=np.float32)},
    )


def test_a_random_split_takes_the_fraction_and_repeats_for_its_seed():
    log = small_log()
    train, test = split(log, how="random", test_fraction=0.2, seed=4)
    assert (len(train), len(test)) == (800, 200)
    assert train.split == test.split == "random 80/20, seed 4"
    rows = np.concatenate([train.features["row"], test.features["row"]])
    np.testing.assert_array_equal(np.sort(rows), np.arange(1000))  # every row once
    again = split(log, how="random", test_fraction=0.2, seed=4)[1]
    np.testing.assert_array_equal(again.features["row"], test.features["row"])
    other = split(log, how="random", test_fraction=0.2, seed=5)[1]
    assert not np.array_equal(other.features["row"], test.features["row"])
    assert (train.num_users, train.num_items) == (50, 30)


def test_a_time_split_sends_each_users_last_rows_to_test():
    log = small_log()
    train, test = split(log, how="time", test_fraction=0.25)
    assert test.split == "time: each user's last 25% by timestamp (rounded down) to test"
    for user in range(log.num_users):
        mine = log.users == user
        order = np.lexsort((np.arange(1000)[mine], log.timestamps[mine]))
        rows = np.arange(1000)[mine][order]
        cut = len(rows) - int(np.floor(len(rows) * 0.25))
        np.testing.assert_array_equal(
            np.sort(train.features["row"][train.users == user]), np.sort(rows[:cut])
        )
        np.testing.assert_array_equal(
            np.sort(test.features["row"][test.users == user]), np.sort(rows[cut:])
        )


def test_the_validation_rows_are_disjoint_from_train_and_test_and_repeat_for_the_seed():
    log = small_log()
    for how in ("random", "time"):
        train, test = split(log, how=how, test_fraction=0.2, seed=4)
        left, validation = split_validation(train, how=how, validation_fraction=0.1, seed=4)
        parts = [part.features["row"] for part in (left, validation, test)]
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
        again = split_validation(train, how=how, validation_fraction=0.1, seed=4)[1]
        np.testing.assert_array_equal(again.features["row"], validation.features["row"])
        if how == "random":
            assert (len(left), len(validation)) == (720, 80)
            assert validation.split == (
                "random 80/20, seed 4; validation: a random 10% of the training rows"
            )
            other = split_validation(train, how=how, validation_fraction=0.1, seed=5)[1]
            assert not np.array_equal(other.features["row"], validation.features["row"])
            continue
        # A time split: each user's validation rows are their latest training rows.
        for user in range(log.num_users):
            kept, held = (part.timestamps[part.users == user] for part in (left, validation))
            counts = np.sum(train.users == user)
            assert len(held) == int(np.floor(counts * 0.1))
            if len(held):
                assert kept.max(initial=-1) <= held.min()
    with pytest.raises(ValueError) as refused:
        split_validation(small_log(rows=8, users=4), how="time", validation_fraction=0.1, seed=0)
    assert str(refused.value) == (
        "the log: --validation_fraction=0.1 holds none of the 8 training interactions for "
        "validation; pass a larger --validation_fraction or --split=random (a time split "
        "rounds each user's share down), or --validation_fraction=0 to evaluate on the test "
        "rows."
    )
    with pytest.raises(ValueError, match=r"^validation_fraction must lie in \(0, 1\), got 1"):
        split_validation(small_log(), how="random", validation_fraction=1, seed=0)


def test_bad_split_arguments_are_refused():
    with pytest.raises(ValueError, match=r"^how='last' is not a split; pass one of random, time"):
        split(small_log(), how="last")
    with pytest.raises(ValueError, match=r"^test_fraction must lie in \(0, 1\), got 1.5; e.g."):
        split(small_log(), test_fraction=1.5)


def test_arrays_of_the_wrong_type_or_range_are_refused():
    log = small_log()
    import dataclasses

    with pytest.raises(ValueError, match="Interactions.users must be a 1-D numpy array of int32"):
        dataclasses.replace(log, users=log.users.astype(np.int64))
    with pytest.raises(ValueError, match=r"holds indices in \[0, 49\], outside \[0, 40\)"):
        dataclasses.replace(log, num_users=40, user_ids=np.arange(40))
    assert interaction_logs.describe_split("random", 0.1, 2) == "random 90/10, seed 2"


# ---- Values and text that passed the reader and poisoned the run (issue 51, items 6 and 7). ----

LATIN1_E = "é".encode("latin-1")  # one byte, 0xe9, that starts no UTF-8 character


@pytest.mark.parametrize(
    "name, data, expected",
    [
        (
            "u.data",
            b"1\t2\t3\t4\n1\t3\t1e39\t5\n",
            "{path} line 2: the rating '1e39' is beyond float32 (|rating| <= 3.403e+38), the "
            "numbers ratings train in; write each rating on its scale (e.g. 1 to 5 stars, or 1 "
            "or 0 for a label).",
        ),
        *[
            (
                "u.data",
                b"1\t2\t3\t4\n\n\n1\t3\t4\t" + stamp + b"\n",  # line 4: blank lines counted
                "{path} line 4: the timestamp '"
                + stamp.decode()
                + "' is beyond int64 (|timestamp| < 2^63, about 9.2e18), the numbers "
                "timestamps are kept in; write each timestamp in seconds (e.g. 881250949), or "
                "check the column order.",
            )
            for stamp in (b"1e19", b"1e300", b"9223372036854775808")
        ],
        (
            "log.csv",
            b"user,item\n5,1\n99999999999999999999,2\n",
            "{path} line 3: the user id '99999999999999999999' is a whole number beyond 64 "
            "bits (|id| < 2^63); number the users within 64 bits, or give every user id a "
            "letter first (e.g. u99999999999999999999).",
        ),
        (
            "log.csv",
            b"user,item\ncaf" + LATIN1_E + b",1\n",
            "{path} line 2 is not UTF-8 text (byte 0xe9 at column 4 does not decode); save it "
            "as UTF-8 text (e.g. iconv -f latin1 -t utf-8 FILE).",
        ),
        (
            "log.csv",
            gzip.compress(b"user,item\n1,2\n", mtime=0),
            "{path} is a gzip file (it starts with gzip's bytes 1f 8b), not a text log; "
            "decompress it first (e.g. gunzip) and pass the text file.",
        ),
        (
            "log.csv",
            "user,item\n1,2\n".encode("utf-16"),
            "{path} is UTF-16 text (it starts with a UTF-16 mark); save it as UTF-8 text (e.g. "
            "iconv -f utf-16 -t utf-8 FILE).",
        ),
        (
            "log.csv",
            b"user,item\nu1\x00,2\n",
            "{path} line 2 holds a NUL byte (column 3), which no text log holds; remove it, or "
            "check that the file is the text log and not binary data.",
        ),
        (
            "log.csv",
            b'user,item\n1,2\n3,"4\n' + b"5,6\n" * 40_000,
            "{path} line 3 does not read as CSV (field larger than field limit (131072)); "
            "write one interaction a line, with no carriage return inside it, and close each "
            'field quoted with " on its line (one left open runs on over the lines below).',
        ),
        (
            "u.data",
            b"1\t2\t3\t4\n1\t" + b"7" * 70_000 + b"\t3\t4\n",
            "{path} line 2 is over 65,536 bytes, longer than any interaction (a few ids and "
            "numbers); check that the file is the text log, one interaction a line (a file "
            "with no line ends is one long line).",
        ),
    ],
)
def test_a_value_or_text_beyond_what_trains_is_refused_by_line(tmp_path, name, data, expected):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as refused:
        read_interactions(path)
    assert str(refused.value) == expected.replace("{path}", str(path))


def test_marks_scripts_and_exact_times_read_as_written(tmp_path):
    path = tmp_path / "log.csv"
    # A UTF-8 byte-order mark before the header; a name starting with é as with c; café in
    # its decomposed form (e and a combining accent) is café.
    text = "\ufeffuser,item,ts\nété_1,1,9223372036854775807\ncafé_1,1,1.5\ncafe\u0301_1,2,-3\n"
    path.write_bytes(text.encode())
    log = read_interactions(path)
    np.testing.assert_array_equal(log.user_ids, ["café_1", "été_1"])
    np.testing.assert_array_equal(log.users, [1, 0, 0])
    # Whole numbers exactly (2^63 - 1 is not 2^63 as a float), a fraction rounded down.
    np.testing.assert_array_equal(log.timestamps, [2**63 - 1, 1, -3])
    assert log.has_timestamps


def test_a_sparse_two_gigabyte_file_is_refused_after_one_line_bound(tmp_path):
    path = tmp_path / "sparse.csv"
    with open(path, "wb") as handle:
        handle.truncate(2 << 30)  # 2 GiB of NULs, no disk blocks, no line end
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as refused:
            read_interactions(path, memory=2**40)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value).startswith(f"{path} line 1 is over 65,536 bytes, longer than")
    assert peak < 4 << 20  # one bounded line read, not gigabytes


def test_a_log_larger_than_memory_can_hold_is_refused_unread(tmp_path):
    path = write(tmp_path, "u.data", "1\t2\t3\t4\n" * 125)  # 1,000 bytes
    assert len(read_interactions(path, memory=4_000)) == 125
    with pytest.raises(ValueError) as refused:
        read_interactions(path, memory=3_999)
    assert str(refused.value) == (
        f"{path} is 1,000 bytes, more than this machine can read: its fields as strings need "
        "at least 4 bytes a byte of file (4,000 bytes), and it has 3,999 bytes of memory; pass "
        "a log of at most 999 bytes (a sample of the users, or the columns user, item, rating "
        "and timestamp alone)."
    )
    gib = 2**30
    with pytest.raises(ValueError, match=r"is 2\.0 GiB, .* \(8\.0 GiB\), and it has 7\.5 GiB "):
        log_text.check_fits_memory("big.data", 2 * gib, memory=7 * gib + gib // 2)
    log_text.check_fits_memory("big.data", 2 * gib, memory=0)  # no figure: nothing to check


def test_splits_that_leave_a_part_empty_or_have_no_time_are_refused(tmp_path):
    untimed = read_interactions(write(tmp_path, "views.csv", "user,item\n1,10\n2,10\n1,11\n"))
    assert not untimed.has_timestamps
    with pytest.raises(ValueError) as refused:
        split(untimed, how="time")
    assert str(refused.value) == (
        f"{tmp_path / 'views.csv'} has no timestamp column, so a time split has no time to "
        "split by; pass how='random' (--split=random), or add a timestamp column (timestamp, "
        "time or ts) to the log."
    )
    with pytest.raises(ValueError) as refused:
        split(untimed, how="random", test_fraction=0.1)  # 0.3 of a row rounds to none
    assert str(refused.value) == (
        f"{tmp_path / 'views.csv'}: the split (random 90/10, seed 0) holds out none of its 3 "
        "interactions, leaving nothing to evaluate on; pass a larger test_fraction "
        "(--test_fraction), or a log with more interactions."
    )
    with pytest.raises(ValueError) as refused:
        split(untimed.take(np.array([0])), how="random", test_fraction=0.9)
    assert "holds out all of its 1 interactions, leaving nothing to train on; pass a " in str(
        refused.value
    )
    # Every user with fewer than 1 / 0.2 rows: a time split rounds each share down to none.
    timed = small_log(rows=8, users=4)
    with pytest.raises(ValueError) as refused:
        split(timed, how="time", test_fraction=0.2)
    assert str(refused.value) == (
        "the log: the split (time: each user's last 20% by timestamp (rounded down) to test) "
        "holds out none of its 8 interactions, leaving nothing to evaluate on; pass a larger "
        "test_fraction (--test_fraction) or how='random' (--split=random): a time split "
        "rounds each user's share down, or a log with more interactions."
    )


def test_a_grown_log_numbers_the_old_ids_first_and_its_new_ones_after(tmp_path):
    path = tmp_path / "day2.csv"
    path.write_text("user,item\n9,x\n3,y\n40,x\n3,z\n")
    day2 = read_interactions(str(path))
    grown = interaction_logs.grown(day2, np.array([40, 7, 3], np.int64), np.array(["z", "w"]))
    assert grown.user_ids.tolist() == [40, 7, 3, 9] and grown.num_users == 4
    assert grown.item_ids.tolist() == ["z", "w", "x", "y"] and grown.num_items == 4
    # Each row names the same raw ids as before.
    assert grown.user_ids[grown.users].tolist() == [9, 3, 40, 3]
    assert grown.item_ids[grown.items].tolist() == ["x", "y", "x", "z"]
    # Whole numbers join a vocabulary of text as their decimal text; text cannot join numbers.
    as_text = interaction_logs.grown(day2, np.array(["3", "u1"]), np.array(["x"]))
    assert as_text.user_ids.tolist() == ["3", "u1", "9", "40"]
    with pytest.raises(ValueError, match=r"names items by text \(e\.g\. 'x'\).*e\.g\. 5"):
        interaction_logs.grown(day2, np.array([1], np.int64), np.array([5], np.int64))

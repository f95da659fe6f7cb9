"""Delta exports (`loops.model_dir.export_deltas`): export 0 patched by the deltas 1..n has
export n's fingerprint and answers 10^4 requests bit for bit as export n does, in a process
that imports only TensorFlow; rows that changed are all a delta holds of a table, a table
that grows sends its new rows; a gap, another model's delta and a damaged one are refused
naming both fingerprints; a delta killed while written leaves the chain before it valid."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from loops.model_dir import export_deltas

ROWS, DIM = 200, 8


class Scorer(tf.Module):
    """A table of rows by id and a dense layer: score(ids) = rows[ids] . kernel + bias, and a
    string vocabulary looked up by the graph (a file that changes when the ids grow)."""

    def __init__(self, table, kernel, bias):
        super().__init__()
        self.table = tf.Variable(table)
        self.kernel = tf.Variable(kernel)
        self.bias = tf.Variable(bias)
        self.name_of = tf.Variable(np.array([f"id{i}".encode() for i in range(len(table))]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def score(self, ids):
        ids = tf.minimum(ids, tf.shape(self.table, out_type=tf.int64)[0] - 1)
        rows = tf.gather(self.table, ids)
        return {
            "scores": tf.linalg.matvec(rows, self.kernel) + self.bias,
            "names": tf.gather(self.name_of, ids),
        }


def exported(path, table, kernel, bias):
    module = Scorer(table, kernel, bias)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.score})
    return str(path)


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Three exports of one model: day 1 changes 7 rows and the dense weights; day 2 grows
    the table by 20 rows and changes 3 old ones."""
    root = tmp_path_factory.mktemp("exports")
    rng = np.random.default_rng(0)
    table = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    kernel, bias = rng.normal(size=DIM).astype(np.float32), np.float32(0.5)
    paths = [exported(root / "day0", table, kernel, bias)]
    table = table.copy()
    table[[3, 50, 51, 99, 120, 121, 199]] += 1.0
    paths.append(exported(root / "day1", table, kernel * 2, bias + 1))
    table = np.concatenate([table, rng.normal(size=(20, DIM)).astype(np.float32)])
    table[[0, 3, 7]] -= 0.25
    paths.append(exported(root / "day2", table, kernel * 2, bias + 1))
    deltas = str(root / "deltas")
    for before, after in zip(paths, paths[1:]):
        export_deltas.write_delta(before, after, deltas)
    return root, paths, deltas


def test_a_delta_holds_the_changed_rows_and_the_dense_weights(days):
    _, paths, deltas = days
    first, second = (
        export_deltas.read_delta(os.path.join(deltas, n)) for n in ("000001", "000002")
    )
    assert first["follows"] == export_deltas.fingerprint(paths[0])
    assert first["gives"] == export_deltas.fingerprint(paths[1]) == second["follows"]
    (table,) = [e for e in first["variables"].values() if e["shape"] == [ROWS, DIM]]
    assert table["rows"] == 7 and first["touched_rows"] == 7
    (grown,) = [e for e in second["variables"].values() if e["shape"] == [ROWS + 20, DIM]]
    assert grown["rows"] == 23  # 3 changed, 20 added
    # A day whose names did not change sends none of them.
    assert not any(e["shape"] == [ROWS] for e in first["variables"].values())
    row_bytes = DIM * 4
    assert first["bytes"]["rows"] == 7 * row_bytes
    assert first["bytes"]["whole"] == (DIM + 1) * 4  # the kernel and the bias
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(os.path.join(deltas, "000001"))
        for name in names
        if not root.endswith("files") and name != export_deltas.DELTA_FILE
    )
    # The tensors' bundle: the rows, their indices and the dense weights, and its index.
    assert size <= 1.1 * (7 * row_bytes) + (DIM + 1) * 4 + 7 * 8 + 1024
    # The graph goes compressed (each export's differs, if only in its functions' names).
    assert "saved_model.pb" in first["files"]
    sent = os.path.getsize(os.path.join(deltas, "000001", "files", "saved_model.pb"))
    assert sent * 3 < os.path.getsize(os.path.join(paths[1], "saved_model.pb"))
    assert first["bytes"]["files"] == sum(
        os.path.getsize(os.path.join(deltas, "000001", "files", name)) for name in first["files"]
    )


def test_a_delta_of_the_first_format_with_its_files_as_they_are_still_applies(days, tmp_path):
    import shutil
    import zlib

    _, paths, deltas = days
    old = str(tmp_path / "000001")
    shutil.copytree(os.path.join(deltas, "000001"), old)
    manifest = export_deltas.read_delta(old)
    for name in manifest["files"]:
        path = os.path.join(old, "files", name)
        with open(path, "rb") as stream:
            packed = stream.read()
        with open(path, "wb") as stream:
            stream.write(zlib.decompress(packed))
    with open(os.path.join(old, export_deltas.DELTA_FILE), "w") as stream:
        json.dump({**manifest, "format": 1}, stream)
    done = export_deltas.apply_deltas(paths[0], [old], str(tmp_path / "patched"))
    assert done["fingerprint"] == export_deltas.fingerprint(paths[1])


def test_export_0_patched_by_its_deltas_answers_as_export_n_bit_for_bit(days, tmp_path):
    _, paths, deltas = days
    patched = str(tmp_path / "patched")
    # Given in any order, or as the deltas/ folder: the chain orders them by fingerprint.
    done = export_deltas.apply_deltas(
        paths[0], [os.path.join(deltas, "000002"), os.path.join(deltas, "000001")], patched
    )
    assert done["fingerprint"] == export_deltas.fingerprint(paths[2])
    assert [os.path.basename(p) for p in done["applied"]] == ["000001", "000002"]
    code = (
        "import sys, numpy as np, tensorflow as tf\n"
        "ids = np.random.default_rng(1).integers(0, 260, 10_000)\n"
        "a, b = (tf.saved_model.load(p).signatures['serving_default'](tf.constant(ids))"
        " for p in sys.argv[1:])\n"
        "assert a['scores'].numpy().tobytes() == b['scores'].numpy().tobytes()\n"
        "assert (a['names'].numpy() == b['names'].numpy()).all()\n"
        "print('modules', sorted(m for m in sys.modules if m.startswith('loops')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, patched, paths[2]], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "modules []" in run.stdout


def test_a_gap_another_models_delta_and_a_damaged_one_are_refused(days, tmp_path):
    root, paths, deltas = days
    with pytest.raises(ValueError, match=r"000002 follows the export of fingerprint .*a gap"):
        export_deltas.apply_deltas(paths[0], [os.path.join(deltas, "000002")], str(tmp_path / "a"))
    other = exported(
        tmp_path / "other",
        np.zeros((ROWS, DIM), np.float32),
        np.ones(DIM, np.float32),
        np.float32(0),
    )
    with pytest.raises(
        ValueError, match=r"000001 follows .*" + export_deltas.fingerprint(other)[:16]
    ):
        export_deltas.apply_deltas(other, [deltas], str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    damaged = tmp_path / "damaged"
    import shutil

    shutil.copytree(os.path.join(deltas, "000001"), damaged)
    manifest = json.loads((damaged / export_deltas.DELTA_FILE).read_text())
    manifest["gives"] = "0" * 64
    (damaged / export_deltas.DELTA_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="a delta's files were changed"):
        export_deltas.apply_deltas(paths[0], [str(damaged)], str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


def test_a_delta_killed_while_written_leaves_the_chain_before_it_valid(days, tmp_path, monkeypatch):
    root, paths, deltas = days
    import shutil

    chain = str(tmp_path / "deltas")
    shutil.copytree(os.path.join(deltas, "000001"), os.path.join(chain, "000001"))
    # What a writer killed midway leaves: its staging folder, half written (pid 2**22 + 1 is
    # no process), and one that fails as it writes.
    os.makedirs(os.path.join(chain, ".delta-4194305-abcdefgh", "files"))

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_deltas.checkpoints, "write_tensors", failing)
    with pytest.raises(OSError, match="No space left"):
        export_deltas.write_delta(paths[1], paths[2], chain)
    monkeypatch.undo()
    assert sorted(os.listdir(chain)) == ["000001"]  # the abandoned staging removed as well
    done = export_deltas.apply_deltas(paths[0], [chain], str(tmp_path / "patched"))
    assert done["fingerprint"] == export_deltas.fingerprint(paths[1])

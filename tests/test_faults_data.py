"""Fault trials of an --image_dir and --data_dir: each damage named with its fix, before any work.

The damaged folders are checked in-process (`image_streams.from_image_folder`,
what the binary calls), and once through the binary itself, which must exit 1
with the sentences, no traceback, and the model_dir as it was. An unreadable
class folder is made with a patched os.listdir that raises PermissionError:
the tests run as root here, whom chmod 000 does not stop.
"""

import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, SUBPROCESS_ENV, read_results
from loops_data import image_check, image_folders, image_streams

SECRET = "the-private-contents-of-another-file"
TRUNCATED = "does not decode completely (truncated or corrupt)"
NOT_AN_IMAGE = "is not a PNG or JPEG image (it does not start like one)"


def write_folder(root, per_class=4):
    """ROOT/{train,test}/{red,blue}/NNN.{png,jpg}: 16x16 images, even ones PNG, odd ones JPEG."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("test", per_class // 2)):
        for channel, name in enumerate(("red", "blue")):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for index in range(count):
                pixels = rng.integers(0, 60, size=(16, 16, 3))
                pixels[..., 2 * channel] += 160
                image = tf.constant(pixels, tf.uint8)
                encode, suffix = (
                    (tf.io.encode_png, "png") if index % 2 == 0 else (tf.io.encode_jpeg, "jpg")
                )
                with open(os.path.join(folder, f"{index:03d}.{suffix}"), "wb") as handle:
                    handle.write(encode(image).numpy())
    return str(root)


def truncate(path):
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def corrupt_inside(path):
    """Overwrites bytes 20 to 60 (a JPEG's tables): the start is intact, the decode fails."""
    with open(path, "r+b") as handle:
        handle.seek(20)
        handle.write(bytes(40))


def link_to_secret(path):
    secret = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(path))), "..", "s.txt")
    with open(secret, "w") as handle:
        handle.write(SECRET + "\n")
    os.remove(path)
    os.symlink(os.path.abspath(secret), path)


# (case, the file it damages, how, the clause that follows the file's path)
DAMAGED_FILES = [
    ("truncated JPEG", "train/red/001.jpg", truncate, TRUNCATED),
    ("truncated PNG", "train/blue/002.png", truncate, TRUNCATED),
    ("corrupt JPEG inside", "test/blue/001.jpg", corrupt_inside, TRUNCATED),
    ("symlink x.png to a text file", "train/red/000.png", link_to_secret, NOT_AN_IMAGE),
]


def empty(path):
    open(path, "wb").close()


def break_link(path):
    os.remove(path)
    os.symlink(path + ".gone", path)


# Damage the header check before this one also found: still named, the same way.
MORE_DAMAGED_FILES = [
    ("zero-byte PNG", "train/blue/000.png", empty, NOT_AN_IMAGE),
    (
        "broken symlink",
        "test/red/001.jpg",
        break_link,
        "cannot be read (a broken symbolic link, or removed since it was listed)",
    ),
]


NOT_A_FILE = "is not a regular file (a directory, device or pipe, or a link to one)"


def link_to_dev_zero(path):
    os.remove(path)
    os.symlink("/dev/zero", path)


def make_fifo(path):
    os.remove(path)
    os.mkfifo(path)


def make_directory(path):
    os.remove(path)
    os.mkdir(path)


# Not a regular file: refused before a byte is read (a FIFO's open never waits).
NOT_FILES = [
    ("PNG link to /dev/zero", "train/red/000.png", link_to_dev_zero, NOT_A_FILE),
    ("FIFO named .png", "train/blue/002.png", make_fifo, NOT_A_FILE),
    ("directory named .jpg", "test/red/001.jpg", make_directory, NOT_A_FILE),
]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test's check results in its own cache directory (in-process and in subprocesses)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def folder_streams(root, **options):
    return image_streams.from_image_folder(
        str(root), train_split="train", eval_split="test", global_batch_size=4, seed=0, **options
    )


@pytest.mark.parametrize(
    "case, relative, damage, why", DAMAGED_FILES + MORE_DAMAGED_FILES + NOT_FILES
)
def test_each_damaged_file_is_named_with_the_fix(tmp_path, case, relative, damage, why):
    root = write_folder(tmp_path / "images")
    path = os.path.join(root, relative)
    damage(path)
    with pytest.raises(image_folders.BadImageFolderError) as raised:
        folder_streams(root)
    message = str(raised.value)
    assert message.startswith(f"{path} {why}. Replace it with a valid image or remove it"), case
    assert "--skip_bad_images" in message
    assert SECRET not in message


def test_an_unreadable_class_folder_is_named_with_the_fix(tmp_path, monkeypatch):
    root = write_folder(tmp_path / "images")
    locked = os.path.join(root, "train", "blue")
    listdir = os.listdir

    def refusing_listdir(folder="."):
        if os.fspath(folder) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return listdir(folder)

    monkeypatch.setattr(os, "listdir", refusing_listdir)
    with pytest.raises(image_folders.BadImageFolderError) as raised:
        folder_streams(root)
    assert str(raised.value) == (
        f"Cannot read the class folder {locked!r} (Permission denied). Give the user running "
        f"training read and search rights on it (e.g. chmod a+rx {locked!r}) or remove it."
    )


def test_many_bad_files_are_counted_after_the_first_ten(tmp_path):
    root = write_folder(tmp_path / "images", per_class=12)
    bad = [
        os.path.join(root, "train", name, f"{i:03d}.png")
        for name in ("red", "blue")
        for i in range(0, 12, 2)
    ]
    for path in bad:
        truncate(path)
    with pytest.raises(image_folders.BadImageFolderError) as raised:
        folder_streams(root)
    message = str(raised.value)
    assert message.startswith("12 image files are not usable: ")
    assert "; and 2 more. Replace them with valid images or remove them" in message
    assert sum(path in message for path in bad) == 10


def test_skip_bad_images_leaves_them_out_and_lists_them(tmp_path):
    root = write_folder(tmp_path / "images")
    for _, relative, damage, _ in DAMAGED_FILES:
        damage(os.path.join(root, relative))
    streams = folder_streams(root, skip_bad_images=True)
    left_out = dict(streams.spec.left_out)
    assert left_out == {os.path.join(root, relative): why for _, relative, _, why in DAMAGED_FILES}
    assert streams.spec.split_sizes == {"train": 8 - 3, "test": 4 - 1}


def test_the_check_decodes_each_file_once_while_it_does_not_change(tmp_path, own_cache):
    root = write_folder(tmp_path / "images")
    folder = os.path.join(root, "train")
    paths = [
        os.path.join(folder, name, file)
        for name in ("red", "blue")
        for file in sorted(os.listdir(os.path.join(folder, name)))
    ]
    lines = []
    first = image_check.check_images(paths, folder=folder, say=lines.append)
    assert (first.decoded, first.bad) == (8, {})
    assert lines == [
        f"checked the 8 images of {folder}: 8 decoded now, 0 known from an earlier check, "
        "0 not usable"
    ]
    assert os.path.dirname(image_check.cache_path(folder)) == str(
        own_cache / "loops" / "image_checks"
    )
    again = image_check.check_images(paths, folder=folder)
    assert again.decoded == 0 and again.sizes == first.sizes

    truncate(paths[3])  # a changed size: decoded again, and found
    changed = image_check.check_images(paths, folder=folder)
    assert changed.decoded == 1 and changed.bad == {paths[3]: TRUNCATED}

    with open(image_check.cache_path(folder), "wb") as handle:
        handle.write(b"\x80 not json")  # a damaged cache is only a slower check
    assert image_check.check_images(paths, folder=folder).decoded == 8


def test_a_file_damaged_with_its_size_and_mtime_kept_is_decoded_again_and_named(tmp_path):
    root = write_folder(tmp_path / "images")
    folder_streams(root)  # checked once: the cache vouches for every file
    path = os.path.join(root, "test", "blue", "001.jpg")
    before = os.stat(path)
    corrupt_inside(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (
        before.st_size,
        before.st_mtime_ns,
    )
    assert image_folders.changed_files(root, ("train", "test")) == {path: TRUNCATED}
    # What a run stopped by it in training ends with (and a rerun's check refuses it too).
    trainer = types.SimpleNamespace(
        definition=types.SimpleNamespace(data_notes={}), checkpointer=None
    )
    assert image_folders.explain_changed_images(root, ("train", "test"), trainer) == (
        "training stopped: an image changed after the check before training and no longer "
        f"decodes: {path} {TRUNCATED}. Replace or remove it, then run the same command "
        "again (no checkpoint was saved yet: it starts over)."
    )
    with pytest.raises(image_folders.BadImageFolderError) as raised:
        folder_streams(root)
    assert str(raised.value).startswith(f"{path} {TRUNCATED}. Replace it with a valid image")


def test_the_check_says_how_far_it_is_and_runs_without_a_cache(tmp_path, monkeypatch):
    root = write_folder(tmp_path / "images")
    folder = os.path.join(root, "train")
    paths = [os.path.join(folder, "red", file) for file in sorted(os.listdir(f"{folder}/red"))]
    monkeypatch.setattr(image_check, "PROGRESS_SECONDS", 0.0)  # a line after every file
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # no cache can be written under it
    for _ in range(2):
        lines = []
        checked = image_check.check_images(paths, folder=folder, say=lines.append)
        assert checked.decoded == 4 and not checked.bad
        assert lines == [
            *(f"checking the images of {folder}: {done}/4 decoded" for done in range(1, 5)),
            f"checked the 4 images of {folder}: 4 decoded now, 0 known from an earlier check, "
            "0 not usable",
        ]


# Code for `run_classifier`: counts the train iterators still alive when the interpreter exits.
COUNT_LIVE_ITERATORS = """
import atexit, sys, weakref
from loops.run.train_input import TrainInput
made = []
at_step = TrainInput.at_step
def recording_at_step(self, step):
    iterator = at_step(self, step)
    if iterator is not None and not any(ref() is iterator for ref in made):
        made.append(weakref.ref(iterator))
    return iterator
TrainInput.at_step = recording_at_step
atexit.register(lambda: print(
    f"train iterators alive at exit: {sum(ref() is not None for ref in made)} of {len(made)}",
    file=sys.stderr,
))
"""


def run_classifier(model_dir, image_dir, *extra, code=None):
    """loops-classifier on a tiny folder; `code` runs first in the process (a fault to inject)."""
    argv = [
        f"--model_dir={model_dir}",
        f"--image_dir={image_dir}",
        "--global_batch_size=4",
        "--train_steps=8",
        "--steps_per_loop=2",
        "--checkpoint_every=2",
        "--num_replicas=1",
        "--export_dir=",
        *extra,
    ]
    runner = textwrap.dedent(code or "") + (
        "\nimport runpy, sys\nsys.argv[0] = 'loops-classifier'\n"
        "runpy.run_module('loops.bin.classifier', run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", runner, *argv],
        capture_output=True,
        text=True,
        env=dict(SUBPROCESS_ENV, XDG_CACHE_HOME=os.environ["XDG_CACHE_HOME"]),
        timeout=600,
        cwd=ROOT,
    )


def model_dir_state(model_dir):
    return {name: (model_dir / name).read_bytes() for name in sorted(os.listdir(model_dir))}


def test_the_binary_refuses_a_damaged_folder_then_trains_past_it_with_skip_bad_images(tmp_path):
    root = write_folder(tmp_path / "images")
    for _, relative, damage, _ in DAMAGED_FILES:
        damage(os.path.join(root, relative))
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "notes.txt").write_text("kept")
    before = model_dir_state(model_dir)

    refused = run_classifier(model_dir, root)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "4 image files are not usable: " in refused.stderr
    for _, relative, _, why in DAMAGED_FILES:
        assert f"{os.path.join(root, relative)} {why}" in refused.stderr
    assert "Traceback" not in refused.stderr and SECRET not in refused.stderr + refused.stdout
    assert model_dir_state(model_dir) == before

    trained = run_classifier(model_dir, root, "--skip_bad_images")
    assert trained.returncode == 0, trained.stderr[-3000:]
    # The good files of the refused run's check are not decoded again; the bad ones are.
    train_folder = os.path.join(root, "train")
    assert (
        f"checked the 8 images of {train_folder}: 3 decoded now, 5 known from an earlier "
        "check, 3 not usable" in trained.stdout
    )
    results = read_results(model_dir)
    assert results["global_step"] == 8
    assert results["data"]["left_out_images"] == 4
    assert {(entry["path"], entry["why"]) for entry in results["data"]["left_out"]} == {
        (os.path.join(root, relative), why) for _, relative, _, why in DAMAGED_FILES
    }
    assert (model_dir / "notes.txt").read_text() == "kept"


def test_a_file_damaged_during_training_is_named_after_the_last_checkpoint(tmp_path):
    root = write_folder(tmp_path / "images")
    damaged = os.path.join(root, "train", "red", "001.jpg")
    model_dir = tmp_path / "run"
    # Right after the checkpoint at step 4 the file is cut short: a later step reads it.
    code = f"""
        import os
        from loops.run.controller import Controller
        save = Controller.save_checkpoint
        def save_then_damage(self):
            path = save(self)
            if self.state.step == 4:
                with open({damaged!r}, "r+b") as handle:
                    handle.truncate(os.path.getsize({damaged!r}) // 2)
            return path
        Controller.save_checkpoint = save_then_damage
    """
    # The batches read ahead before the damage may cover some steps: train well past them.
    done = run_classifier(
        model_dir, root, "--train_steps=40", code=textwrap.dedent(code) + COUNT_LIVE_ITERATORS
    )
    assert done.returncode == 1, done.stderr[-3000:]
    # The stopped run's reader (Python, on tf.data's threads) went before the exit, where it
    # can hang the interpreter; the error's traceback would have kept it.
    assert "train iterators alive at exit: 0 of 1" in done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.rsplit("(it goes on from ", 1)[-1].split(").")[0]
    assert (
        "error: training stopped: an image changed after the check before training and no "
        f"longer decodes: {damaged} {TRUNCATED}. Replace or remove it, then run the same "
        f"command again (it goes on from {last})." in done.stderr
    )
    assert last.startswith(str(model_dir / "checkpoints" / "ckpt-"))
    assert int(last.rsplit("-", 1)[1]) >= 4 and os.path.exists(last + ".index")


def run_module(module, *argv):
    """`python -m module argv...`, for a refusal that comes before any work."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize("module", ["loops.bin.classifier", "loops.bin.gan"])
def test_a_data_dir_that_is_a_file_is_refused_before_work(tmp_path, module):
    a_file = tmp_path / "passwd"
    a_file.write_text(SECRET)
    model_dir = tmp_path / "run"
    done = run_module(module, f"--data_dir={a_file}", f"--model_dir={model_dir}")
    assert done.returncode == 1
    assert (
        "--data_dir names a file, not a folder; point it at the TFDS data directory or at "
        "one prepared dataset's folder (DATA_DIR/NAME/VERSION), or leave it unset."
    ) in done.stderr
    assert f"--data_dir={a_file}" in done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stderr
    assert not model_dir.exists()


def test_skip_bad_images_without_an_image_dir_is_refused(tmp_path):
    model_dir = tmp_path / "run"
    done = run_module("loops.bin.classifier", "--skip_bad_images", f"--model_dir={model_dir}")
    assert done.returncode == 1
    assert "--skip_bad_images leaves files out of an --image_dir; pass --image_dir" in done.stderr
    assert "Traceback" not in done.stderr
    assert not model_dir.exists()

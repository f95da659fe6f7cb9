"""Issue 45's "write only what the run made": a link planted at a name a run writes is refused
by name and what it points to stays as it was; the default model_dir's parent is private;
--mode=find_lr on a new run, and its output directory checked before the range test.

Every case calls the writer a run calls, in-process; each asserts the sentence and that
the link's target kept its bytes and modification time.
"""

import os
import stat
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver

from conftest import ROOT, SUBPROCESS_ENV
from loops.bin import classifier  # noqa: F401 (defines the binaries' flags)
from loops.cli import flags as loop_flags
from loops.core import own_files, reporting
from loops.kinds import gan
from loops.model_dir import checkpoints, model_dir_lock
from loops.run import lr_finder

NOBODY = 65534
# A refusal before TensorFlow loads takes about a second; far below this on a loaded machine.
REFUSAL_SECONDS = 60


def victim(tmp_path):
    """A file a planted link points to, with an old modification time: (path, bytes, mtime)."""
    path = tmp_path / "victim.txt"
    path.write_bytes(b"not the run's to change\n")
    os.utime(path, ns=(10**18, 10**18))
    return str(path), path.read_bytes(), os.stat(path).st_mtime_ns


def plant(link, target):
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(target, link)
    return str(link)


def refusal(path, target):
    return (
        f"{path} is a symbolic link (to {target}) that this program did not make, where it "
        "writes a file of its own; it writes nothing through a link, and nothing the link "
        "points to was read or changed. Remove the link (or use another directory) and run "
        "the same command again."
    )


def assert_untouched(target, content, mtime):
    assert open(target, "rb").read() == content
    assert os.stat(target).st_mtime_ns == mtime


def write_state_file(directory):
    checkpoints._write_state_file(str(directory), str(directory / "ckpt-2"), [])


def write_gan_samples(directory):
    run = types.SimpleNamespace(
        model_dir=str(directory),
        is_chief=True,
        step=4,
        summaries=types.SimpleNamespace(images=lambda *arguments: None),
        progress=types.SimpleNamespace(line=print),
    )
    picture = np.zeros((4, 4, 3), np.uint8)
    gan._write_picture(types.SimpleNamespace(sample_files=[]), run, picture, "")


# (the file, relative to the model_dir or output directory; how the run writes it)
WRITERS = [
    ("results.json", lambda d: reporting.write_json_atomic(str(d / "results.json"), {})),
    ("config.json", lambda d: reporting.write_json_atomic(str(d / "config.json"), {})),
    ("best.json", lambda d: reporting.write_json_atomic(str(d / "best.json"), {})),
    ("checkpoints/checkpoint", lambda d: write_state_file(d / "checkpoints")),
    ("samples-000004.png", write_gan_samples),
    ("lr_find.png", lambda d: own_files.write_atomic(str(d / "lr_find.png"), b"png")),
]


@pytest.mark.parametrize("name, write", WRITERS, ids=[name for name, _ in WRITERS])
def test_a_link_planted_where_a_run_writes_is_refused_by_name(tmp_path, name, write):
    target, content, mtime = victim(tmp_path)
    link = plant(tmp_path / "run" / name, target)
    with pytest.raises(own_files.PlantedLinkError) as raised:
        write(tmp_path / "run")
    assert str(raised.value) == refusal(link, target)
    assert_untouched(target, content, mtime)
    assert os.readlink(link) == target
    assert sorted(os.listdir(os.path.dirname(link))) == [os.path.basename(link)]


def test_a_json_file_is_written_whole_with_the_users_mode(tmp_path):
    path = tmp_path / "results.json"
    reporting.write_json_atomic(str(path), {"step": 2})
    assert path.read_text() == '{\n  "step": 2\n}\n'
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~own_files.current_umask()


def test_a_link_at_the_lock_file_is_refused_and_its_target_kept(tmp_path):
    target, content, mtime = victim(tmp_path)
    model_dir = tmp_path / "run"
    link = plant(model_dir / ".lock", target)
    with pytest.raises(ValueError) as raised:
        model_dir_lock.acquire(str(model_dir))
    assert str(raised.value) == refusal(link, target)
    assert_untouched(target, content, mtime)
    assert os.readlink(link) == target


def test_a_hard_link_at_the_lock_file_is_refused_and_its_target_kept(tmp_path):
    target, content, mtime = victim(tmp_path)
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    os.link(target, model_dir / ".lock")
    with pytest.raises(ValueError) as raised:
        model_dir_lock.acquire(str(model_dir))
    assert str(raised.value) == (
        f"{model_dir / '.lock'} is not a plain file of its own (a file with 2 hard links), "
        "where this program keeps a file it writes; nothing was written to it. Remove it "
        "(or use another directory) and run the same command again."
    )
    assert_untouched(target, content, mtime)


def test_a_lock_taken_and_given_back_leaves_no_file(tmp_path):
    model_dir = str(tmp_path / "run")
    path = model_dir_lock.acquire(model_dir)
    assert open(path).read() == f"pid {os.getpid()} on {os.uname().nodename}\n"
    model_dir_lock.release(path)
    assert os.listdir(model_dir) == []


def test_a_link_at_the_next_checkpoints_index_is_refused_before_tensorflow_writes_through_it(
    tmp_path,
):
    target, content, mtime = victim(tmp_path)
    directory = tmp_path / "checkpoints"
    link = plant(directory / "ckpt-3.index", target)
    step = tf.Variable(3, dtype=tf.int64)
    checkpointer = checkpoints.Checkpointer(
        strategy=tf.distribute.get_strategy(),
        directory=str(directory),
        items={"step": step},
        step_counter=step,
        max_to_keep=2,
    )
    with pytest.raises(own_files.PlantedLinkError) as raised:
        checkpointer.save()
    assert str(raised.value) == refusal(link, target)
    assert_untouched(target, content, mtime)
    assert os.listdir(directory) == ["ckpt-3.index"]


# ---- The default model_dir's parent, TEMP/loops. ----


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The temp dir the default model_dir goes under: tmp_path/tmp."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(loop_flags.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    return tmp_path / "tmp"


def test_the_default_model_dirs_parent_is_made_private(temp_dir):
    path = loop_flags.default_output_dir("classifier")
    assert os.path.dirname(path) == str(temp_dir / "loops")
    assert os.path.basename(path).startswith("classifier-")
    assert stat.S_IMODE(os.stat(temp_dir / "loops").st_mode) == 0o700
    assert not os.path.exists(path)  # the run makes it


def test_a_default_parent_another_user_owns_is_refused(temp_dir):
    parent = temp_dir / "loops"
    parent.mkdir()
    os.chown(parent, NOBODY, NOBODY)
    with pytest.raises(ValueError) as raised:
        loop_flags.default_output_dir("classifier")
    assert str(raised.value) == (
        f"{parent} belongs to user nobody (uid {NOBODY}), not to this user (user root "
        "(uid 0)), who could replace what a run writes there. Pass --model_dir (and "
        f"--find_lr_dir) in a directory of your own, or remove {parent}."
    )
    assert os.listdir(parent) == []


def test_a_default_parent_that_is_a_link_is_refused(tmp_path, temp_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, temp_dir / "loops")
    with pytest.raises(ValueError) as raised:
        loop_flags.default_output_dir("lr_find")
    assert str(raised.value) == (
        f"{temp_dir / 'loops'} is a symbolic link (to {elsewhere}), not a directory this "
        "user made. Pass --model_dir (and --find_lr_dir) in a directory of your own, or "
        f"remove {temp_dir / 'loops'}."
    )
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("owner, warned", [(NOBODY, True), (0, False)])
def test_a_model_dir_in_another_users_directory_gets_a_warning(tmp_path, capsys, owner, warned):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, owner, owner)
    model_dir = str(shared / "run")
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["loops-classifier", f"--model_dir={model_dir}"])
        assert loop_flags.resolve_model_dir("classifier") == model_dir
    warning = (
        f"warning: --model_dir={model_dir} lies where {shared} belongs to user nobody "
        f"(uid {NOBODY}), who can replace or link the files the run writes there; pass a "
        "--model_dir in a directory of your own.\n"
    )
    assert capsys.readouterr().err == (warning if warned else "")


# ---- The learning-rate finder's output directory. ----


def test_find_lr_on_a_model_dir_not_made_yet_accepts_the_default_output_dir(tmp_path, temp_dir):
    new_run = str(temp_dir / "newrun")
    lr_finder.check_outside_run(loop_flags.default_output_dir("lr_find"), new_run)
    lr_finder.check_outside_run(str(temp_dir / "lr_find"), new_run)  # a sibling
    assert sorted(os.listdir(temp_dir)) == ["loops"]  # nothing made for the new run


def test_an_output_dir_through_a_link_into_the_run_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    link = plant(tmp_path / "outside", run / "checkpoints")
    with pytest.raises(ValueError) as raised:
        lr_finder.check_outside_run(link, str(run))
    assert str(raised.value) == (
        f"output_dir={link!r} lies in {run}, the run's directory, which the range test "
        "leaves untouched; pass an output_dir outside it (--find_lr_dir)."
    )


def test_an_output_dir_that_is_a_file_is_refused_before_the_range_test(tmp_path):
    output_dir = tmp_path / "lr_find"
    output_dir.write_text("a file")
    with pytest.raises(ValueError) as raised:
        lr_finder.check_output_dir(str(output_dir))
    assert str(raised.value) == (
        f"output_dir={str(output_dir)!r} is a file (File exists); the range test writes "
        "lr_find.json and lr_find.png there: pass a writable directory (--find_lr_dir)."
    )


def test_an_output_dir_on_a_read_only_file_system_is_refused_before_the_range_test(tmp_path):
    mount_point = tmp_path / "read_only"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", mount_point], check=True)
    try:
        with pytest.raises(ValueError) as raised:
            lr_finder.check_output_dir(str(mount_point))
    finally:
        subprocess.run(["umount", mount_point], check=True)
    assert str(raised.value) == (
        f"output_dir={str(mount_point)!r} cannot be made or written (Read-only file "
        "system); the range test writes lr_find.json and lr_find.png there: pass a "
        "writable directory (--find_lr_dir)."
    )


def test_a_link_at_the_finders_picture_is_refused_before_the_range_test(tmp_path):
    target, content, mtime = victim(tmp_path)
    link = plant(tmp_path / "lr_find" / lr_finder.PNG_FILE, target)
    with pytest.raises(ValueError) as raised:
        lr_finder.check_output_dir(str(tmp_path / "lr_find"))
    assert str(raised.value) == refusal(link, target)
    assert_untouched(target, content, mtime)


def test_the_binary_refuses_another_users_default_parent_before_tensorflow_loads(tmp_path):
    parent = tmp_path / "loops"
    parent.mkdir()
    os.chown(parent, NOBODY, NOBODY)
    new_run = tmp_path / "newrun"
    done = subprocess.run(
        [sys.executable, "-m", "loops.bin.classifier", "--mode=find_lr", f"--model_dir={new_run}"],
        capture_output=True,
        text=True,
        env={**SUBPROCESS_ENV, "TMPDIR": str(tmp_path)},
        cwd=ROOT,
        timeout=REFUSAL_SECONDS,
    )
    assert done.returncode == 1
    assert f"{parent} belongs to user nobody (uid {NOBODY}), not to this user" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["loops"] and os.listdir(parent) == []

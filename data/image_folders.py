"""A user's folder of images as a classification dataset (TFDS ImageFolder layout), checked.

Layout: ROOT/SPLIT/CLASS/IMAGE, e.g. photos/train/cat/001.jpg and
photos/test/dog/7.png. Classes are the sorted names of the class folders of
the train split; labels are their positions. Every image is decoded in full
before training starts (`loops_data.image_check`: in parallel, and only once
per file while it does not change), so a folder with no classes, a folder
that cannot be read, a file that is no PNG or JPEG or does not decode
completely, or images of different sizes without a resize fail at once with
a sentence naming them and the fix. With `skip_bad_images` the files that
do not decode are left out instead, and listed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import tensorflow as tf

from loops_data import image_check

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# A refusal names this many bad files, then counts the rest.
NAMED_BAD_FILES = 10


class BadImageFolderError(ValueError):
    """The folder cannot be read as an image classification dataset; the message says why."""


@dataclasses.dataclass(frozen=True)
class ImageFolderSplit:
    """One split of an image folder: its files, their labels and the class names."""

    root: str
    split: str
    files: tuple[str, ...]
    labels: tuple[int, ...]
    class_names: tuple[str, ...]
    # Each (height, width) found, with the first file of that size.
    sizes: tuple[tuple[tuple[int, int], str], ...]
    # (path, why) of each file left out (skip_bad_images).
    left_out: tuple[tuple[str, str], ...] = ()

    @property
    def num_examples(self) -> int:
        return len(self.files)

    def read(self, indices: tf.Tensor):
        """(file bytes, label) of the examples at `indices`, in graph mode."""
        files = tf.gather(tf.constant(self.files), indices)
        labels = tf.gather(tf.constant(self.labels, tf.int64), indices)
        contents = tf.map_fn(tf.io.read_file, files, fn_output_signature=tf.string)
        return contents, labels


def read_splits(
    root: str,
    splits: tuple[str, ...],
    *,
    skip_bad_images: bool = False,
    say: Callable[[str], None] | None = None,
) -> list[ImageFolderSplit]:
    """Scans ROOT/SPLIT of each split, then decodes every image (`image_check.check_images`).

    The class folders of the first split are the classes; every other
    split's must be among them. All splits are checked before any bad file is
    refused, so one refusal names the bad files of every split.

    Args:
        root: the folder holding one folder per split.
        splits: e.g. ('train', 'test'), the train split first.
        skip_bad_images: leave out the files that are no PNG or JPEG or do
            not decode (listed in each split's `left_out`) instead of refusing them.
        say: prints the check's progress and outcome; None: silent.

    Raises:
        BadImageFolderError: a missing or unreadable folder, no classes, a
            class with no (usable) images, a class unknown to the first
            split, or (without skip_bad_images) a file that is no PNG or JPEG
            or does not decode completely.
    """
    scanned: list[tuple[str, dict[str, list[str]]]] = []
    class_names: tuple[str, ...] | None = None
    for split in splits:
        images = _scan_split(root, split, class_names)
        class_names = class_names or tuple(images)
        scanned.append((split, images))
    checks = [
        image_check.check_images(
            [path for paths in images.values() for path in paths],
            folder=os.path.join(root, split),
            say=say,
        )
        for split, images in scanned
    ]
    bad = {path: why for checked in checks for path, why in checked.bad.items()}
    if bad and not skip_bad_images:
        raise BadImageFolderError(bad_files_sentence(bad))
    assert class_names is not None
    return [
        _usable_split(root, split, images, checked, class_names)
        for (split, images), checked in zip(scanned, checks)
    ]


def _scan_split(root: str, split: str, class_names: tuple[str, ...] | None) -> dict[str, list[str]]:
    """Class name -> its image files, of ROOT/SPLIT; `class_names`: the classes it may have."""
    folder = _split_folder(root, split)
    found = sorted(
        name
        for name in _listed(folder, "split folder")
        if os.path.isdir(os.path.join(folder, name)) and not name.startswith(".")
    )
    if not found:
        raise BadImageFolderError(
            f"{folder!r} holds no class folders. Put each class's images in a folder "
            f"named after the class: {os.path.join(folder, 'CLASS', 'IMAGE.png')!r}."
        )
    unknown = [name for name in found if class_names is not None and name not in class_names]
    if unknown:
        raise BadImageFolderError(
            f"{folder!r} has class folders the train split does not have: {unknown}. "
            f"The train split's classes are {list(class_names or ())}; rename or remove "
            "the others."
        )
    return {name: _class_images(os.path.join(folder, name)) for name in found}


def _usable_split(
    root: str,
    split: str,
    images: dict[str, list[str]],
    checked: image_check.ImageCheck,
    class_names: tuple[str, ...],
) -> ImageFolderSplit:
    """The split of the `images` that decode (`checked`); the others are its `left_out`."""
    files, labels, sizes = _usable_files(images, checked, class_names)
    return ImageFolderSplit(
        root=root,
        split=split,
        files=tuple(files),
        labels=tuple(labels),
        class_names=class_names,
        sizes=tuple(sizes.items()),
        left_out=tuple(checked.bad.items()),
    )


def _usable_files(
    images: dict[str, list[str]], checked: image_check.ImageCheck, class_names: tuple[str, ...]
) -> tuple[list[str], list[int], dict[tuple[int, int], str]]:
    """(files, labels, each size with its first file) of the images that decode, by class."""
    files: list[str] = []
    labels: list[int] = []
    sizes: dict[tuple[int, int], str] = {}
    for name, paths in images.items():
        usable = [path for path in paths if path not in checked.bad]
        if not usable:
            raise BadImageFolderError(
                f"Class folder {os.path.dirname(paths[0])!r} holds no image that decodes "
                f"(--skip_bad_images left out all {len(paths)}). Add valid images to it or "
                "remove the folder."
            )
        for path in usable:
            sizes.setdefault(checked.sizes[path], path)
        files.extend(usable)
        labels.extend([class_names.index(name)] * len(usable))
    return files, labels, sizes


def bad_files_sentence(bad: dict[str, str]) -> str:
    """The refusal of the files in `bad` (path -> why): the first few named, the rest counted."""
    named = "; ".join(f"{path} {why}" for path, why in list(bad.items())[:NAMED_BAD_FILES])
    more = len(bad) - NAMED_BAD_FILES
    if len(bad) == 1:
        return (
            f"{named}. Replace it with a valid image or remove it, or pass "
            "--skip_bad_images to train without it (results.json lists it)."
        )
    return (
        f"{len(bad)} image files are not usable: {named}"
        + (f"; and {more} more" if more > 0 else "")
        + ". Replace them with valid images or remove them, or pass --skip_bad_images "
        "to train without them (results.json lists them)."
    )


def _split_folder(root: str, split: str) -> str:
    """ROOT/SPLIT, checked to be a folder."""
    if not os.path.isdir(root):
        raise BadImageFolderError(
            f"--image_dir={root!r} is not a folder. Point it at a folder laid out as "
            "ROOT/train/CLASS/IMAGE.png (and ROOT/test/CLASS/IMAGE.png)."
        )
    folder = os.path.join(root, split)
    if not os.path.isdir(folder):
        present = sorted(
            name
            for name in _listed(root, "--image_dir folder")
            if os.path.isdir(os.path.join(root, name))
        )
        raise BadImageFolderError(
            f"{root!r} has no {split!r} folder (it has {present or 'no folders'}). Put the "
            f"{split} images in {os.path.join(root, split, 'CLASS', 'IMAGE.png')!r}, one "
            "folder per class, or pick a split that exists (--train_split / --eval_split)."
        )
    return folder


def _class_images(class_folder: str) -> list[str]:
    """The paths of the image files in a class folder, sorted; refuses a class with none."""
    images = sorted(
        entry
        for entry in _listed(class_folder, "class folder")
        if entry.lower().endswith(IMAGE_SUFFIXES) and not entry.startswith(".")
    )
    if not images:
        raise BadImageFolderError(
            f"Class folder {class_folder!r} holds no images ({', '.join(IMAGE_SUFFIXES)}). "
            "Add images to it or remove the folder."
        )
    return [os.path.join(class_folder, image) for image in images]


def _listed(folder: str, what: str) -> list[str]:
    """os.listdir(folder); a folder that cannot be read is named with the fix."""
    try:
        return os.listdir(folder)
    except OSError as error:
        raise BadImageFolderError(
            f"Cannot read the {what} {folder!r} ({error.strerror}). Give the user running "
            f"training read and search rights on it (e.g. chmod a+rx {folder!r}) or remove it."
        ) from error


def check_one_size(splits: list[ImageFolderSplit]) -> tuple[int, int]:
    """The (height, width) all splits share.

    Raises:
        BadImageFolderError: two images differ in size; names both and the
            flag that resizes them.
    """
    seen: dict[tuple[int, int], str] = {}
    for split in splits:
        for size, path in split.sizes:
            seen.setdefault(size, path)
    if len(seen) > 1:
        (first_size, first), (other_size, other) = list(seen.items())[:2]
        raise BadImageFolderError(
            f"{other} is {other_size[0]}x{other_size[1]} (height x width) but {first} "
            f"is {first_size[0]}x{first_size[1]}: a batch needs one image size. Pass "
            f"--image_size=HEIGHT,WIDTH (e.g. --image_size={first_size[0]},"
            f"{first_size[1]}) to resize every image to it."
        )
    return next(iter(seen))


def changed_files(
    root: str, splits: tuple[str, ...], *, trained_without: frozenset[str] = frozenset()
) -> dict[str, str]:
    """path -> why, of the files of `splits` that are not usable now (e.g. changed after the check).

    Decodes again only the files changed since the check (`image_check`'s
    cache); `trained_without` (files left out at the start) are not named.
    """
    try:
        now = read_splits(root, splits, skip_bad_images=True)
    except BadImageFolderError:
        return {}  # the folder changed as a whole: nothing to name file by file
    return {
        path: why for split in now for path, why in split.left_out if path not in trained_without
    }


# results.json names this many of the files --skip_bad_images left out, and counts all.
NAMED_LEFT_OUT = 100


def left_out_notes(left_out: tuple[tuple[str, str], ...]) -> dict:
    """results.json's "data" entry for the files left out; {} when none were."""
    if not left_out:
        return {}
    return {
        "left_out_images": len(left_out),
        "left_out": [{"path": path, "why": why} for path, why in left_out[:NAMED_LEFT_OUT]],
    }


def explain_changed_images(root: str | None, splits: tuple[str, ...], trainer) -> str | None:
    """The sentence a run stopped by an image of `root` that no longer decodes ends with;
    None when `root` is None or no file changed (the error is something else).

    The check before training decoded every file, so a failure now is a file
    changed since: the check, run again, decodes the changed files and names them.
    `trainer`: the Trainer of the ClassifierLoop that stopped (its data notes, checkpoints).
    """
    if root is None:
        return None
    left_out = trainer.definition.data_notes.get("left_out", ())
    left_out = frozenset(entry["path"] for entry in left_out)
    changed = changed_files(root, splits, trained_without=left_out)
    if not changed:
        return None
    files = "; ".join(f"{path} {why}" for path, why in changed.items())
    checkpointer = trainer.run_context.checkpointer
    newest = checkpointer.latest if checkpointer is not None else None
    resume = (
        f"it goes on from {newest}" if newest else "no checkpoint was saved yet: it starts over"
    )
    return (
        "training stopped: an image changed after the check before training and no longer "
        f"decodes: {files}. Replace or remove it, then run the same command again ({resume})."
    )

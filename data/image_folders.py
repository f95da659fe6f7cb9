"""A user's folder of images as a classification dataset (TFDS ImageFolder layout), checked.

Layout: ROOT/SPLIT/CLASS/IMAGE, e.g. photos/train/cat/001.jpg and
photos/test/dog/7.png. Classes are the sorted names of the class folders of
the train split; labels are their positions. Every image file's header is read
before training starts (not its pixels), so a folder with no classes, a file
that is no PNG or JPEG, or images of different sizes without a resize fail at
once with a sentence naming the file and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import struct

import tensorflow as tf

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (they carry the size); C4, C8 and CC are other segments.
_JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


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

    @property
    def num_examples(self) -> int:
        return len(self.files)

    def read(self, indices: tf.Tensor):
        """(file bytes, label) of the examples at `indices`, in graph mode."""
        files = tf.gather(tf.constant(self.files), indices)
        labels = tf.gather(tf.constant(self.labels, tf.int64), indices)
        contents = tf.map_fn(tf.io.read_file, files, fn_output_signature=tf.string)
        return contents, labels


def read_split(
    root: str, split: str, *, class_names: tuple[str, ...] | None = None
) -> ImageFolderSplit:
    """Scans ROOT/SPLIT and checks every image's header.

    Args:
        root: the folder holding one folder per split.
        split: 'train', 'test', ...
        class_names: the train split's classes, when reading another split:
            its class folders must be among them.

    Raises:
        BadImageFolderError: a missing folder, no classes, a class with no
            images, a class unknown to the train split, or a file that is no
            readable PNG or JPEG.
    """
    if not os.path.isdir(root):
        raise BadImageFolderError(
            f"--image_dir={root!r} is not a folder. Point it at a folder laid out as "
            "ROOT/train/CLASS/IMAGE.png (and ROOT/test/CLASS/IMAGE.png)."
        )
    folder = os.path.join(root, split)
    if not os.path.isdir(folder):
        present = sorted(
            name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name))
        )
        raise BadImageFolderError(
            f"{root!r} has no {split!r} folder (it has {present or 'no folders'}). Put the "
            f"{split} images in {os.path.join(root, split, 'CLASS', 'IMAGE.png')!r}, one "
            "folder per class, or pick a split that exists (--train_split / --eval_split)."
        )
    found = sorted(
        name
        for name in os.listdir(folder)
        if os.path.isdir(os.path.join(folder, name)) and not name.startswith(".")
    )
    if not found:
        raise BadImageFolderError(
            f"{folder!r} holds no class folders. Put each class's images in a folder "
            f"named after the class: {os.path.join(folder, 'CLASS', 'IMAGE.png')!r}."
        )
    if class_names is None:
        class_names = tuple(found)
    unknown = [name for name in found if name not in class_names]
    if unknown:
        raise BadImageFolderError(
            f"{folder!r} has class folders the train split does not have: {unknown}. "
            f"The train split's classes are {list(class_names)}; rename or remove the others."
        )
    files: list[str] = []
    labels: list[int] = []
    sizes: dict[tuple[int, int], str] = {}
    for name in found:
        class_folder = os.path.join(folder, name)
        images = sorted(
            entry
            for entry in os.listdir(class_folder)
            if entry.lower().endswith(IMAGE_SUFFIXES) and not entry.startswith(".")
        )
        if not images:
            raise BadImageFolderError(
                f"Class folder {class_folder!r} holds no images ({', '.join(IMAGE_SUFFIXES)}). "
                "Add images to it or remove the folder."
            )
        for image in images:
            path = os.path.join(class_folder, image)
            sizes.setdefault(image_size(path), path)
            files.append(path)
            labels.append(class_names.index(name))
    return ImageFolderSplit(
        root=root,
        split=split,
        files=tuple(files),
        labels=tuple(labels),
        class_names=tuple(class_names),
        sizes=tuple(sizes.items()),
    )


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


def image_size(path: str) -> tuple[int, int]:
    """(height, width) of a PNG or JPEG file, from its header alone.

    Raises:
        BadImageFolderError: the file cannot be read or is no PNG or JPEG.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
    except OSError as error:
        raise BadImageFolderError(
            f"Cannot read {path}: {error.strerror}. Fix its permissions or remove it."
        ) from error
    size = _png_size(head) or _jpeg_size(head)
    if size is None:
        raise BadImageFolderError(
            f"{path} is not a readable PNG or JPEG image (its first bytes are {head[:8]!r}). "
            "Replace it with a valid image or remove it."
        )
    return size


def _png_size(head: bytes) -> tuple[int, int] | None:
    if not head.startswith(_PNG_SIGNATURE) or head[12:16] != b"IHDR" or len(head) < 24:
        return None
    width, height = struct.unpack(">II", head[16:24])
    return (height, width) if width and height else None


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    if not head.startswith(b"\xff\xd8"):
        return None
    position = 2
    while position + 9 <= len(head):
        if head[position] != 0xFF:
            return None
        marker = head[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        (length,) = struct.unpack(">H", head[position + 2 : position + 4])
        if marker in _JPEG_FRAME_MARKERS:
            height, width = struct.unpack(">HH", head[position + 5 : position + 9])
            return (height, width) if width and height else None
        position += 2 + length
    return None

"""Runs a module (a loops binary) with every streamed batch's position and hash logged.

Usage: `python stream_run.py LOG_FILE MODULE FLAGS...`. Each batch a
`SeekableBatches` stream builds appends "pid position sha256" to LOG_FILE when
the pipeline makes it (prefetching makes some that are never trained on).
"""

import hashlib
import os
import runpy
import sys


def log_batches(log_file: str) -> None:
    import numpy as np
    import tensorflow as tf

    from loops.input import random_access

    batches_from = random_access.SeekableBatches.batches_from

    def write(position, *parts):
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(p).tobytes() for p in parts))
        with open(log_file, "a") as log:
            log.write(f"{os.getpid()} {int(position)} {digest.hexdigest()}\n")
        return position

    def logged(self, position):
        def log(index, batch):
            parts = tf.nest.flatten(batch)
            done = tf.numpy_function(write, [index, *parts], tf.int64, stateful=True)
            with tf.control_dependencies([done]):
                return tf.nest.map_structure(tf.identity, batch)

        return batches_from(self, position).enumerate(start=position).map(log)

    random_access.SeekableBatches.batches_from = logged


if __name__ == "__main__":
    log_file, module, *flags = sys.argv[1:]
    log_batches(log_file)
    sys.argv = [module, *flags]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

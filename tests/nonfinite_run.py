"""Runs a loop binary as if some global batches of its train stream made the loss infinite.

Usage: `python nonfinite_run.py BATCHES MODULE FLAGS...`, e.g.
`python nonfinite_run.py 5,9 loops.bin.classifier --on_nonfinite=recover`.

BATCHES are positions in the train stream (the first batch is 1; without
recoveries, step k reads batches (k - 1) * batches_per_step + 1 to
k * batches_per_step). A step that reads one of them has the loss of its last
replica multiplied by inf in every `loops.Update`, so its gradients are not
finite, whatever the binary trains on (the classifier's uint8 images cannot
hold an inf). The position follows the stream past a recovery's skipped
batches, as a bad batch in the data would.
"""

import runpy
import sys


def arm(bad_batches: list[int]) -> None:
    import tensorflow as tf

    from loops.core import update
    from loops.run import train_input

    # Batches the run's recoveries moved the stream past, set on the host whenever
    # the Controller positions the train stream (made then: no op may run before
    # the binary splits the CPU into replicas).
    skipped: list[tf.Variable] = []
    # The definition's batches_per_step (an Update does not see it), set there too.
    run: list = []
    at_step = train_input.TrainInput.at_step

    def positioned_at_step(self, step):
        if not skipped:
            skipped.append(tf.Variable(0, dtype=tf.int64, trainable=False))
            run.append(self._batches_per_step)
        skipped[0].assign(self._recoveries.skipped_batches)
        return at_step(self, step)

    train_input.TrainInput.at_step = positioned_at_step
    original_call = update.Update.__call__

    def poisoned_call(self, replica_loss, args=()):
        def poisoned(*replica_args):
            loss, logs = replica_loss(*replica_args)
            context = tf.distribute.get_replica_context()
            last_replica = context.replica_id_in_sync_group == context.num_replicas_in_sync - 1
            # The global step holds the index of the step being run.
            per_step, global_step = run[0], self.context.global_step
            first = tf.cast(global_step, tf.int64) * per_step + skipped[0] + 1
            reads = first + tf.range(per_step, dtype=tf.int64)
            bad = tf.reduce_any(tf.equal(reads[:, None], tf.constant(bad_batches, tf.int64)))
            factor = tf.where(tf.logical_and(last_replica, bad), float("inf"), 1.0)
            return loss * tf.cast(factor, loss.dtype), logs

        return original_call(self, poisoned, args)

    update.Update.__call__ = poisoned_call


if __name__ == "__main__":
    batches, module, *flags = sys.argv[1:]
    sys.argv = [module, *flags]
    arm([int(batch) for batch in batches.split(",")])
    runpy.run_module(module, run_name="__main__", alter_sys=True)

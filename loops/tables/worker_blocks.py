"""A table's blocks of rows split over several synchronous workers: each process makes and holds
only its own replicas' blocks, and a checkpoint saves them as the one (rows, width) tensor
gathered from every worker, which restores into any other split.

Under MultiWorkerMirroredStrategy each worker is its own process: it cannot make
a variable on another worker's device, so a table split over all N replicas
(`loops.placement.Placement.table_row_blocks`) is held as this worker's L
blocks, beside the global bounds of all N. A save (which every worker of such a
strategy runs, at the same step) all-gathers the blocks in replica order, so
the chief writes the whole table under the key a variable or a ShardedVariable
saves it under; a restore hands every worker the whole tensor, and each keeps
its own blocks' rows. The gather runs only as a checkpoint saves (or as
`whole()` is called, by every worker alike), never while training.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from loops import tf_private


class WorkerBlocks(tf_private.SavedAsOneValue):
    """This worker's blocks of a table (or slot) whose blocks are held by every worker's replicas.

    Args:
        name: the table's (or slot's) name, as a variable's.
        parts: this worker's blocks, in row order, each on its replica's device.
        bounds: (first, one-past-last) row of every block of every worker.
        first_block: the index in `bounds` of `parts[0]`.
        strategy: the MultiWorkerMirroredStrategy whose replicas hold the blocks.
    """

    def __init__(
        self,
        name: str,
        parts: Sequence[tf.Variable],
        bounds: Sequence[tuple[int, int]],
        first_block: int,
        strategy: tf.distribute.Strategy,
    ):
        super().__init__()
        self.checkpoint_name = name
        self.variables = list(parts)
        self.bounds = tuple(bounds)
        self.first_block = first_block
        self.dtype = self.variables[0].dtype
        self.device = self.variables[0].device
        self.shape = tf.TensorShape([bounds[-1][1], self.variables[0].shape[1]])
        self._strategy = strategy

    @property
    def own_bounds(self) -> tuple[tuple[int, int], ...]:
        """(first, one-past-last) row of each of this worker's blocks."""
        return self.bounds[self.first_block : self.first_block + len(self.variables)]

    def whole(self) -> tf.Tensor:
        """Every worker's blocks joined in row order: a collective every worker must call."""
        strategy = self._strategy

        def own_block(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
            return tf.identity(self.variables[context.replica_id_in_sync_group - self.first_block])

        blocks = strategy.experimental_distribute_values_from_function(own_block)
        return strategy.gather(blocks, axis=0)

    def whole_value(self) -> tf.Tensor:
        return self.whole()

    def restore_whole(self, value: tf.Tensor) -> tf.Operation:
        value = tf.convert_to_tensor(value)
        if value.shape != self.shape:
            raise ValueError(
                f"{self.checkpoint_name}: the checkpoint holds a table of shape {value.shape}, "
                f"and this one is {self.shape}; restore it into a table of the same rows and "
                "width."
            )
        return tf.group(
            [
                part.assign(value[first:last])
                for part, (first, last) in zip(self.variables, self.own_bounds, strict=True)
            ]
        )

"""A table of many numeric columns: the traced eval pass and train step grow by one slice op a
column a replica, with no cond over the columns, so the first evaluation of 400 columns on 2
replicas no longer spends minutes in Grappler (issue 64, item 8)."""

import collections

import keras
import numpy as np
import tensorflow as tf

import loops
from loops.input import distributed_input
from loops_data.in_memory import batches_in_memory, endless_batches_in_memory
from loops_models import ctr

ROWS, BATCH, REPLICAS = 19, 8, 2  # the last eval batch holds 3 rows: 2 and 1 a replica


def numeric_trainer(columns: int) -> loops.Trainer:
    """A CTRLoop of wide & deep over `columns` numeric columns on 2 replicas."""
    rng = np.random.default_rng(columns)
    table = {f"x{i}": rng.normal(size=ROWS).astype(np.float32) for i in range(columns)}
    labels = (np.arange(ROWS) % 3 == 0).astype(np.float32)
    features = ctr.CTRFeatures(numeric=list(table))
    return loops.Trainer(
        loops.CTRLoop(
            model_fn=lambda: ctr.wide_and_deep(features, embedding_dim=2, hidden_units=(4,)),
            optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        ),
        strategy=loops.testing.replica_strategy(REPLICAS),
        train_data=lambda: endless_batches_in_memory((table, labels), BATCH, 0),
        eval_data=lambda: batches_in_memory((table, labels), BATCH),
        steps_per_loop=1,
        progress=loops.testing.quiet_progress(),
    )


def op_counts(graph: tf.Graph) -> collections.Counter:
    """The ops of a traced graph and of every function it calls (cond branches, loop bodies)."""
    graph_def = graph.as_graph_def()
    counts = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        counts.update(node.op for node in function.node_def)
    return counts


def traced_graphs(columns: int) -> dict[str, tf.Graph]:
    """The eval pass and the train inner loop of `numeric_trainer(columns)`, as run."""
    trainer = numeric_trainer(columns)
    iterators = []
    evaluate = trainer.executor.evaluate
    trainer.executor.evaluate = lambda iterator: iterators.append(iterator) or evaluate(iterator)
    evaluation = trainer.evaluate()
    assert evaluation["examples"] == ROWS
    trainer.train(num_steps=1)
    return {
        "eval": trainer.executor.eval_function.get_concrete_function(iterators[0]).graph,
        "train": trainer.executor._train_call.graph,
    }


def op_counts_of(columns: int) -> dict[str, collections.Counter]:
    return {name: op_counts(graph) for name, graph in traced_graphs(columns).items()}


def test_each_numeric_column_adds_one_slice_a_replica_to_the_eval_pass_and_the_train_step():
    few, many = op_counts_of(20), op_counts_of(40)
    for name in ("eval", "train"):
        added = many[name].copy()
        added.subtract(few[name])
        grown = {op: count for op, count in added.items() if count}
        # 20 columns more: one StridedSlice each on each of the 2 replicas, nothing else.
        assert grown == {"StridedSlice": 20 * REPLICAS}, name
    # No cond passes the columns: the distributed iterator's (one a replica, every column
    # through it) is what Grappler's dependency optimizer took minutes over at 400 columns.
    conds = {"If", "StatelessIf"}
    assert not conds & set(many["eval"]), many["eval"]


def test_a_replica_slice_of_many_parts_is_one_op_a_part():
    batch = {f"x{i}": tf.TensorSpec([None], tf.float32) for i in range(50)}

    def sliced(batch):
        return distributed_input.replica_slice(batch, 1, 2)

    counts = op_counts(tf.function(sliced).get_concrete_function(batch).graph)
    assert counts["StridedSlice"] == 50 + 1  # each part's, and the batch's row count
    assert counts["Pack"] == 2  # its bounds (begin, end), shared by every part

"""Where a compiled inner loop's time goes: the loop's own traced step inside variants of the loop.

    python -m benchmarks.inner_loop                       # mlp, 1 replica, default threads
    python -m benchmarks.inner_loop --threads=1 --rounds=9  # CPU time: one TensorFlow thread
    python -m benchmarks.inner_loop --replicas=2

Every variant calls the same traced train step of one `ClassifierLoop` on the
digits stream, in one process, rounds interleaved, medians in us a step and as
a ratio of the compute bound:

- compute_bound: the step repeated on one fixed batch (`throughput.repeated_step`).
- read: the step fed from the train iterator, its outputs summed; nothing else.
- executor: the Loop's executor as it is (`Executor.run`): the read, the
  global step, one float64 TensorArray row of logs and the stop condition.
- dequeue_ahead: the executor's loop as it was before 2026-11-25: step i + 1's
  batches dequeued in step i's round and carried as a loop variable.
- per_dtype_arrays: the executor's loop with one TensorArray per log dtype.
- chunked_at_source: the same loop fed chunks that the in-memory stream draws
  whole (one batch of `--chunk` x 64 rows, reshaped), not batched from batches.
- fixed_carried: the executor's loop on one batch read before it and carried
  through it as a loop variable: everything but the read.
- rolled_carried: the same, the batch's rows rolled by one each step: a new
  tensor every step (one copy), still no input pipeline.
- chunked: the executor's loop nested: one iterator read of `--chunk` steps'
  batches (the stream batched by `--chunk`), then that many steps each taking
  its batch from the chunk by index (amortized input reads, issue 30).
- chunked_sliced: the same, each step slicing its batch out of the chunk
  tensor (`chunk[j]`, a copy of one batch) instead of a TensorArray's element.
- chunked_unrolled: chunked_sliced with the inner loop unrolled (a chunk's
  steps written out in the graph; a call runs whole chunks).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks import report

MODES = (
    "compute_bound",
    "read",
    "executor",
    "dequeue_ahead",
    "per_dtype_arrays",
    "chunked",
    "chunked_at_source",
    "fixed_carried",
    "rolled_carried",
    "chunked_sliced",
    "chunked_unrolled",
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3000, help="steps per call and round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median taken)")
    parser.add_argument("--chunk", type=int, default=50, help="steps per read in mode chunked")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow's intra- and inter-op threads (0: its default); 1: CPU time = wall time",
    )
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "inner_loop.json")
    )
    args = parser.parse_args(argv)
    if min(args.replicas, args.steps, args.rounds, args.chunk) < 1 or args.threads < 0:
        parser.error("--replicas, --steps, --rounds and --chunk must be >= 1, --threads >= 0")
    if args.steps % args.chunk:
        parser.error(f"--steps={args.steps} must be a multiple of --chunk={args.chunk}")
    return args


def build_modes(args) -> dict:
    """name -> runner (steps -> None), each traced and warmed up."""
    import keras
    import tensorflow as tf

    import loops
    import loops_data as data
    import loops_models as models
    from benchmarks import throughput
    from loops.core import outputs
    from loops.input import distributed_input

    strategy = loops.testing.replica_strategy(args.replicas)

    def data_fn():
        return data.global_batches(
            "digits", "train", global_batch_size=64, shuffle_seed=0, repeat=True
        )

    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.build_classifier(
                args.model, input_shape=(8, 8, 1), num_classes=10, seed=0
            ),
            optimizer_fn=lambda: keras.optimizers.Adam(1e-3),
        ),
        strategy=strategy,
        train_data=data_fn,
        progress=loops.testing.quiet_progress(),
    )
    executor = loop.executor
    batch_spec = tf.nest.map_structure(
        tf.type_spec_from_value,
        distributed_input.next_batch(distributed_input.train_iterator(strategy, data_fn), strategy),
    )
    step = tf.function(executor.flat_train_step).get_concrete_function(batch_spec)
    names = list(step.structured_outputs)

    def inner_loop(*, ahead=False, count=True, packed=True, fixed=False, rolled=False):
        """A traced inner loop of `steps` steps around `step`, as the executor's variants."""
        dtypes = {name: step.structured_outputs[name].dtype for name in names}
        groups = {"all": names} if packed else {}
        if not packed:
            for name in names:
                groups.setdefault(dtypes[name].name, []).append(name)

        def row(names_in_group, logs):
            if packed:
                return tf.stack([tf.cast(logs[name], tf.float64) for name in names_in_group])
            return tf.stack([logs[name] for name in names_in_group])

        def run(iterator, steps):
            def read():
                return distributed_input.next_batch(iterator, strategy)

            arrays = (
                {
                    key: tf.TensorArray(
                        tf.float64 if packed else dtypes[group[0]],
                        size=steps,
                        element_shape=[len(group)],
                    )
                    for key, group in groups.items()
                }
                if count
                else {}
            )
            total = tf.constant(0.0)

            def body(i, batch, arrays, stopped, total):
                if rolled:  # a new tensor each step, made without the input pipeline
                    following = strategy.run(
                        lambda rows: tf.nest.map_structure(lambda part: tf.roll(part, 1, 0), rows),
                        (batch,),
                    )
                else:
                    following = batch if fixed else read() if ahead else batch
                logs = step(batch if ahead else read())
                if count:
                    loop.global_step.assign_add(1)
                    arrays = {
                        key: arrays[key].write(i, row(group, logs)) for key, group in groups.items()
                    }
                    stopped = logs[outputs.NONFINITE] > 0
                else:
                    total += tf.add_n([tf.cast(logs[name], tf.float32) for name in names])
                return i + 1, following, arrays, stopped, total

            first = read() if ahead else tf.zeros([])
            _, _, arrays, _, total = tf.while_loop(
                lambda i, batch, arrays, stopped, total: tf.logical_and(
                    i < steps, tf.logical_not(stopped)
                ),
                body,
                (tf.constant(0), first, arrays, tf.constant(False), total),
            )
            for array in arrays.values():
                total += tf.reduce_sum(tf.cast(array.stack(), tf.float32))
            return total

        traced = tf.function(run)
        iterator = distributed_input.train_iterator(strategy, data_fn)
        return lambda steps: traced(iterator, tf.constant(steps)).numpy()

    executor_iterator = distributed_input.train_iterator(strategy, data_fn)

    def batched_chunks(**variant):
        """The executor's loop on the stream batched by `--chunk` (`chunked_loop`'s variant)."""
        return chunked_loop(
            loop,
            strategy,
            lambda: data_fn().batch(args.chunk, drop_remainder=True),
            step,
            names,
            args.chunk,
            **variant,
        )

    runners = {
        "chunked": batched_chunks(),
        # The source draws a chunk's rows as one batch and cuts it into the steps' batches
        # with one reshape: the stream's per-batch work is done once a chunk.
        "chunked_at_source": chunked_loop(
            loop,
            strategy,
            lambda: data.global_batches(
                "digits", "train", global_batch_size=64 * args.chunk, shuffle_seed=0, repeat=True
            ).map(
                lambda *parts: tuple(
                    tf.reshape(part, [args.chunk, 64, *part.shape[1:]]) for part in parts
                )
            ),
            step,
            names,
            args.chunk,
        ),
        "chunked_sliced": batched_chunks(split=False),
        "chunked_unrolled": batched_chunks(split=False, unrolled=True),
        "compute_bound": throughput.repeated_step(loop, strategy, data_fn),
        "read": inner_loop(count=False),
        "executor": lambda steps: executor.run(executor_iterator, steps),
        "dequeue_ahead": inner_loop(ahead=True),
        "per_dtype_arrays": inner_loop(packed=False),
        "fixed_carried": inner_loop(ahead=True, fixed=True),
        "rolled_carried": inner_loop(ahead=True, rolled=True),
    }
    for runner in runners.values():
        runner(10)  # trace and warm up
    return runners


def chunked_loop(
    loop, strategy, chunks, step, names, chunk: int, split: bool = True, unrolled: bool = False
):
    """The executor's loop reading `chunk` steps' batches at a time from the dataset `chunks`
    makes: an outer loop over chunks, an inner one over the steps of each (each step's
    batch a TensorArray's element with `split`, else a slice of the chunk; `unrolled`: the
    inner loop written out, whole chunks only)."""
    import tensorflow as tf

    from loops.core import outputs
    from loops.input import distributed_input

    num_replicas = strategy.num_replicas_in_sync

    def step_batch(chunk_batches, index):
        batch = tf.nest.map_structure(
            lambda part: part.read(index) if split else part[index], chunk_batches
        )
        if num_replicas == 1:
            return batch
        return strategy.experimental_distribute_values_from_function(
            lambda context: distributed_input.replica_slice(
                batch, context.replica_id_in_sync_group, num_replicas
            )
        )

    def run(iterator, steps):
        size = (steps + chunk - 1) // chunk * chunk if unrolled else steps
        array = tf.TensorArray(tf.float64, size=size, element_shape=[len(names)])

        def outer(i, array, stopped):
            # Split once into a TensorArray: each step reads its batch without a slice's copy.
            chunk_batches = tf.nest.map_structure(
                lambda part: (
                    tf.TensorArray(part.dtype, size=chunk).unstack(part) if split else part
                ),
                next(iterator),  # one read a chunk: its kernel's cost does not matter
            )
            limit = tf.minimum(chunk, steps - i)  # a short call drops the chunk's rest

            def inner(j, array, stopped):
                logs = step(step_batch(chunk_batches, j))
                loop.global_step.assign_add(1)
                row = tf.stack([tf.cast(logs[name], tf.float64) for name in names])
                return j + 1, array.write(i + j, row), logs[outputs.NONFINITE] > 0

            if unrolled:
                j = tf.constant(0)
                for _ in range(chunk):
                    j, array, stopped = inner(j, array, stopped)
                return i + j, array, stopped
            j, array, stopped = tf.while_loop(
                lambda j, array, stopped: tf.logical_and(j < limit, tf.logical_not(stopped)),
                inner,
                (tf.constant(0), array, stopped),
            )
            return i + j, array, stopped

        _, array, _ = tf.while_loop(
            lambda i, array, stopped: tf.logical_and(i < steps, tf.logical_not(stopped)),
            outer,
            (tf.constant(0), array, tf.constant(False)),
        )
        return tf.reduce_sum(tf.cast(array.stack(), tf.float32))

    traced = tf.function(run)
    with tf.device("/cpu:0"):
        iterator = iter(chunks())
    return lambda steps: traced(iterator, tf.constant(steps)).numpy()


def measure(args) -> dict[str, list[float]]:
    """Mode -> us a step in each round."""
    runners = build_modes(args)
    samples: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(args.rounds):
        for name in MODES:
            started = time.perf_counter()
            runners[name](args.steps)
            samples[name].append((time.perf_counter() - started) / args.steps * 1e6)
    return samples


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import loops
    from loops import topology

    if args.threads:  # before anything starts TensorFlow's runtime
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    loops.configure_logical_cpus(args.replicas)
    samples = measure(args)
    bound = statistics.median(samples["compute_bound"])
    rows = []
    print(f"{'mode':18} {'us/step':>8} {'x bound':>8}  rounds")
    for name in MODES:
        median = statistics.median(samples[name])
        rows.append(
            {
                "mode": name,
                "us_per_step": median,
                "ratio_to_bound": bound / median,
                "samples": samples[name],
            }
        )
        rounds = ", ".join(f"{value:.0f}" for value in samples[name])
        print(f"{name:18} {median:8.1f} {bound / median:8.3f}  [{rounds}]")
    onednn = topology.onednn_enabled()
    print(
        f"{args.model}, {args.replicas} replica(s), threads: {args.threads or 'default'}, "
        f"oneDNN kernels: {'on' if onednn else 'off'}"
    )
    report.write(args, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

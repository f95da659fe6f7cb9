"""Runs loops-classifier with a fault at one named moment.

Usage: `python fault_run.py MOMENT SIGNAL FLAGS...`.

The async_write moments fire in the thread that writes a checkpoint's files in
the background: _first at a save before the last, _final at the last.

SIGNAL is TERM (a preemption: the run notes it and saves) or KILL (kill -9:
nothing runs after it). The moments are places in the run's own code, not
times, so a trial hits the same moment on any machine.
"""

import os
import signal
import sys
import threading


def arm(moment: str, signum: int) -> None:
    import tensorflow as tf
    from tensorflow.python.checkpoint import checkpoint_management

    from loops.core import reporting
    from loops.definition import executors, loop
    from loops.model_dir import checkpoints

    calls = {"inner": 0, "eval": 0}
    train_steps = int(next(a for a in sys.argv if a.startswith("--train_steps=")).split("=")[1])

    def fire():
        os.kill(os.getpid(), signum)

    def wrap(owner, name, before=None, after=None):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            if before and before(*args):
                fire()
            result = original(*args, **kwargs)
            if after and after(*args):
                fire()
            return result

        setattr(owner, name, wrapped)

    def nth_inner_loop(n):
        def check(*_):
            calls["inner"] += 1
            return calls["inner"] == n

        return check

    def eval_at_step(final):
        def check(self, *_):
            return (self.step == train_steps) == final

        return check

    if moment == "first_trace":
        wrap(executors.Executor, "_make_train_function", before=lambda *_: True)
    elif moment == "inner_loop":
        wrap(executors.Executor, "run", before=nth_inner_loop(2))
    elif moment in ("evaluation", "final_evaluation"):
        wrap(loop.Loop, "run_evaluation", before=eval_at_step(moment == "final_evaluation"))
    elif moment == "final_save":
        wrap(
            checkpoints.Checkpointer,
            "save",
            before=lambda self: int(self._step_counter.numpy()) == train_steps,
        )
    elif moment == "state_file":  # a save's files are written, its state-file entry is not
        wrap(
            checkpoint_management, "update_checkpoint_state_internal", before=lambda *_: True
        )  # the run saves once, at its end
    elif moment == "results":  # while results.json is half-written
        writing = []
        wrap(
            reporting,
            "write_json_atomic",
            before=lambda path, *_: bool(writing.append(path.endswith("results.json"))),
        )
        wrap(reporting.os, "fsync", before=lambda *_: writing[-1])
    elif moment.startswith("async_write"):  # in the thread writing a checkpoint's files
        final = moment == "async_write_final"

        def in_writer_thread(self, prefix, *_):
            background = threading.current_thread() is not threading.main_thread()
            return background and str(prefix).endswith(f"ckpt-{train_steps}") == final

        wrap(tf.train.Checkpoint, "_write", before=in_writer_thread)
    elif moment == "export":
        wrap(tf.saved_model, "save", after=lambda *_: True)
    elif moment == "outputs":  # train has returned: the binary says where the outputs went
        from loops.cli import application

        wrap(application, "report_outputs", before=lambda *_: True)
    else:
        raise SystemExit(f"unknown moment {moment!r}")


if __name__ == "__main__":
    moment, name, *flags = sys.argv[1:]
    sys.argv = [sys.argv[0], *flags]
    arm(moment, {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}[name])
    from loops.bin import classifier

    classifier.run()

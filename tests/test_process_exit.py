"""A binary that finished well ends at once, yet as an ordinary exit would: its threads
finished, its exit handlers run, its last words flushed; a failing one exits as before."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, pathlib, sys, threading, time
    from absl import app
    from loops.cli import application

    out = pathlib.Path(sys.argv[1])
    atexit.register(lambda: (out / "handler").write_text("ran"))

    def late_writer():
        time.sleep(0.3)
        (out / "thread").write_text("done")

    def main(argv):
        threading.Thread(target=late_writer).start()
        sys.stdout.write("last words, unflushed")
        if "--fail" in sys.argv:
            raise app.UsageError("a bad flag")

    sys.argv = sys.argv[:1] + [a for a in sys.argv[2:] if a != "--fail"] + (
        ["--undefined_flag_fails"] if "--fail" in sys.argv[2:] else []
    )
    application.run(main, description="a probe")
    """
)


def run_probe(tmp_path, *extra):
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_finished_binary_waits_for_its_threads_runs_its_handlers_and_flushes(tmp_path):
    done = run_probe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("last words, unflushed")
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "handler").read_text() == "ran"


def test_a_failing_binary_exits_the_ordinary_way_with_its_status(tmp_path):
    done = run_probe(tmp_path, "--fail")
    assert done.returncode == 1
    assert "undefined_flag_fails" in done.stderr
    assert (tmp_path / "handler").read_text() == "ran"

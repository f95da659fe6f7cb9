"""The templates loops-launch prints are safe to generate from any value: what a user gives
reaches the tasks' command line exactly, runs nothing else, or is refused with a sentence."""

import json
import os
import subprocess
import sys

import pytest

from loops.cluster import launch, templates

# Flag values a user could pass on, each trying to run `touch` in the script's shell.
HOSTILE_WORDS = [
    "--note=run\ntouch PWNED_newline",
    "--note=$(touch PWNED_dollar)",
    "--note=`touch PWNED_backtick`",
    "--note=a; touch PWNED_semicolon",
    "--note=it's \"quoted\" ' && touch PWNED_quote '",
    "--note=two  words | touch PWNED_pipe",
    "--note=${IFS}touch${IFS}PWNED_ifs",
    "--note=\\'; touch PWNED_backslash #",
    "--model_dir=/shared/a run/with spaces",
]

# Records its arguments, as JSON, in $SRUN_LOG.
STAND_IN_SRUN = """#!{python}
import json, os, sys
with open(os.environ["SRUN_LOG"], "w") as log:
    json.dump(sys.argv[1:], log)
"""


def printed(capsys, *argv):
    assert launch.main(list(argv)) == 0
    return capsys.readouterr().out


def test_the_sbatch_script_hands_hostile_values_to_srun_exactly_and_runs_nothing_else(
    capsys, tmp_path
):
    script = printed(
        capsys, "--print=slurm", "--num_workers=2", "--", "loops.bin.classifier", *HOSTILE_WORDS
    )
    bin_dir, work_dir = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work_dir.mkdir()
    (bin_dir / "srun").write_text(STAND_IN_SRUN.format(python=sys.executable))
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)
    log = tmp_path / "srun.json"
    environment = dict(
        os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SRUN_LOG=str(log)
    )
    finished = subprocess.run(
        ["bash", str(tmp_path / "job.sbatch")],
        cwd=work_dir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout == finished.stderr == ""
    assert json.loads(log.read_text()) == [
        "--label",
        "--distribution=block",
        "python3",
        "-m",
        "loops.bin.classifier",
        *HOSTILE_WORDS,
    ]
    # Nothing else ran: no file anywhere but the script, the log and the stand-in.
    assert sorted(os.listdir(work_dir)) == []
    assert sorted(os.listdir(tmp_path)) == ["bin", "job.sbatch", "srun.json", "work"]
    assert os.listdir(bin_dir) == ["srun"]


def test_the_srun_line_labels_each_tasks_output_and_quotes_every_word():
    line = templates.srun_line(["python3", "-m", "loops.bin.classifier", "--note=a b"], num_ps=1)
    assert line == (
        "srun --label --distribution=block python3 -m loops.bin.classifier '--note=a b' "
        "--cluster_num_ps=1"
    )


def test_the_manifest_carries_hostile_command_words_as_json_strings(capsys):
    manifest = printed(
        capsys,
        "--print=kubernetes",
        "--num_workers=2",
        "--image=registry.example.com:5000/team/loops:1@sha256:0a1b",
        "--",
        "loops.bin.classifier",
        *HOSTILE_WORDS,
    )
    # The value's newline is an escape in a JSON string, not a line break of the text.
    assert "\ntouch PWNED_newline" not in manifest
    assert '"--note=run\\ntouch PWNED_newline"' in manifest
    (container,) = json.loads(manifest)["items"][1]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python3", "-m", "loops.bin.classifier", *HOSTILE_WORDS]
    assert container["image"] == "registry.example.com:5000/team/loops:1@sha256:0a1b"


SLURM_RULE = (
    "use letters, digits, '.', '_', '+' and '-', starting with a letter or digit, at most "
    "128 characters, e.g. --job_name=digits."
)
KUBERNETES_RULE = (
    "use lowercase letters, digits and '-', starting with a letter and ending with a letter "
    "or digit, at most 52 characters, e.g. --job_name=digits."
)
IMAGE_RULE = (
    "a reference such as registry.example.com/loops:1 holds letters, digits, '.', '_', '/', "
    "':', '@' and '-'."
)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--print=slurm", "--job_name=run\ntouch /tmp/PWNED"],
            "--job_name='run\\ntouch /tmp/PWNED' cannot name a SLURM job (it holds '\\n'): "
            + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name=run\x1b[2J"],
            "--job_name='run\\x1b[2J' cannot name a SLURM job (it holds '\\x1b'): " + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name=my run"],
            "--job_name='my run' cannot name a SLURM job (it holds ' '): " + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name=run-%j"],
            "--job_name='run-%j' cannot name a SLURM job (it holds '%'): " + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name=../run"],
            "--job_name='../run' cannot name a SLURM job (it holds '/'): " + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name=-run"],
            "--job_name='-run' cannot name a SLURM job (it starts with '-'): " + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name="],
            "--job_name='' cannot name a SLURM job (it is empty): " + SLURM_RULE,
        ),
        (
            ["--print=slurm", "--job_name=" + "r" * 129],
            f"--job_name='{'r' * 129}' cannot name a SLURM job (it is 129 characters long): "
            + SLURM_RULE,
        ),
        (
            ["--print=kubernetes", "--image=x", "--job_name=run.1"],
            "--job_name='run.1' cannot name a Kubernetes Job and Service (it holds '.'): "
            + KUBERNETES_RULE,
        ),
        (
            ["--print=kubernetes", "--image=x", "--job_name=run-"],
            "--job_name='run-' cannot name a Kubernetes Job and Service (it ends with '-'): "
            + KUBERNETES_RULE,
        ),
        (
            ["--print=kubernetes", "--image=x", "--job_name=1run"],
            "--job_name='1run' cannot name a Kubernetes Job and Service (it starts with '1'): "
            + KUBERNETES_RULE,
        ),
        (
            ["--print=kubernetes", "--image=x", "--job_name=" + "r" * 53],
            f"--job_name='{'r' * 53}' cannot name a Kubernetes Job and Service (it is 53 "
            "characters long): " + KUBERNETES_RULE,
        ),
        (
            ["--print=kubernetes", "--image=loops:1\nkind: Pod"],
            "--image='loops:1\\nkind: Pod' cannot be a container image (it holds '\\n'): "
            + IMAGE_RULE,
        ),
        (
            ["--print=kubernetes", "--image=loops 1"],
            "--image='loops 1' cannot be a container image (it holds ' '): " + IMAGE_RULE,
        ),
        (
            ["--print=kubernetes", "--image=x", "--port=0"],
            "--port=0 is outside 1..65535; pick a port in range.",
        ),
    ],
)
def test_a_value_no_template_can_carry_is_refused_with_a_sentence_naming_it(capsys, flags, message):
    with pytest.raises(SystemExit) as exited:
        launch.main([*flags, "--num_workers=2", "--", "loops.bin.classifier"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith(f"loops-launch: error: {message}\n")

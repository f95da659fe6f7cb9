"""The README's research example runs as written."""

import os
import re
import subprocess
import sys

from conftest import ROOT, SUBPROCESS_ENV


def test_readme_subclass_example_trains():
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 1
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 200/200" in done.stdout
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-6

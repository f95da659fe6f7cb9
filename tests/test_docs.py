"""The documents say what the code is: BUILD.md names every module of loops/, README states the
package's version, and no document names a path of one machine instead of the repository's."""

import configparser
import json
import os
import pathlib
import re

from conftest import ROOT

REPOSITORY = pathlib.Path(ROOT)
DOCUMENTS = [
    "README.md",
    "BUILD.md",
    "benchmarks/RESULTS.md",
    *sorted(str(path.relative_to(REPOSITORY)) for path in (REPOSITORY / "docs").glob("*.md")),
]


def read(name: str) -> str:
    return (REPOSITORY / name).read_text(encoding="utf-8")


def test_build_md_names_every_module_of_loops_by_its_path_or_dotted_name():
    build = read("BUILD.md")
    unnamed = []
    for path in sorted((REPOSITORY / "loops").rglob("*.py")):
        relative = path.relative_to(REPOSITORY)
        if path.name == "__init__.py":  # a package: `loops/core/`
            names = [f"{relative.parent}/", str(relative.parent).replace(os.sep, ".")]
        else:
            names = [str(relative), str(relative.with_suffix("")).replace(os.sep, ".")]
        if not any(
            re.search(rf"(?<![\w./]){re.escape(name)}(?![\w/]|\.\w)", build) for name in names
        ):
            unnamed.append(str(relative))
    assert unnamed == []


def test_readme_states_the_version_setup_cfg_installs():
    config = configparser.ConfigParser()
    config.read(REPOSITORY / "setup.cfg")
    version = config["metadata"]["version"]
    stated = re.findall(r"This is version (\S+?);", read("README.md"))
    assert stated == [version], f"README's 'This is version ...;' line must say {version}"
    assert re.findall(r"`version` in setup.cfg \((\S+?)\)", read("BUILD.md")) == [version]


def test_no_document_names_a_path_of_one_machine():
    # Paths relative to the repository; a scratch directory is named as one ($TMPDIR).
    machine = re.compile(r"/work/|/home/|/Users/|(?:cd|git clone \S+) /tmp\b")
    found = {
        name: sorted({match.group(0) for match in machine.finditer(read(name))})
        for name in DOCUMENTS
    }
    assert {name: paths for name, paths in found.items() if paths} == {}
    assert "docs/flags.md" in DOCUMENTS


def test_every_relative_link_of_readme_and_docs_leads_to_a_file():
    missing = []
    for name in ["README.md", *[d for d in DOCUMENTS if d.startswith("docs/")]]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", read(name)):
            if not (REPOSITORY / name).parent.joinpath(target).exists():
                missing.append(f"{name}: {target}")
    assert missing == []


def test_the_adult_spec_docs_ctr_md_shows_is_the_benchmarks_file():
    page = (REPOSITORY / "docs" / "ctr.md").read_text()
    start = page.index("```json\n", page.index("benchmarks/adult_spec.json")) + len("```json\n")
    shown = json.loads(page[start : page.index("```", start)])
    assert shown == json.loads((REPOSITORY / "benchmarks" / "adult_spec.json").read_text())
    assert any(column.get("buckets") for column in shown["columns"])

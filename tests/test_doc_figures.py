"""The numbers the documents quote are the numbers their sources hold.

- The version: setup.cfg's `version` is CHANGELOG.md's newest release, and every version of
  loops a document states (README's "This is version X;", BUILD.md's "`version` in setup.cfg
  (X)", any "version X.Y.Z" or "loops X.Y.Z") is that one.
- Measured figures. The convention: a decimal number in the prose of README.md or docs/*.md
  (outside code, which holds settings' values: `0.1`) is a measured figure, and its paragraph
  cites the section of benchmarks/RESULTS.md it comes from, as (benchmarks/RESULTS.md,
  "Section"); the figure is written there as in that section (0.9016, not 0.902). So a
  MovieLens, Adult or default-run figure that a new measurement changes fails here until the
  document quotes the new one. docs/flags.md is generated from the declarations (its check is
  tests/test_readme.py) and is left out.
- Every section of RESULTS.md that a document or a source file names exists.
- The test count: no document quotes one but README's sentence "N tests", which is what pytest
  collects (`pytest --collect-only -q tests`, about 16 s on 2 cores: benchmarks/RESULTS.md,
  "The suite's time").
"""

import configparser
import pathlib
import re
import subprocess
import sys

from conftest import ROOT, SUBPROCESS_ENV

REPOSITORY = pathlib.Path(ROOT)
RESULTS = "benchmarks/RESULTS.md"
# The prose documents whose figures are checked (docs/flags.md is generated).
PROSE = [
    "README.md",
    *sorted(
        str(path.relative_to(REPOSITORY))
        for path in (REPOSITORY / "docs").glob("*.md")
        if path.name != "flags.md"
    ),
]
# Every document a test count could drift in.
DOCUMENTS = [*PROSE, "docs/flags.md", "BUILD.md", RESULTS, "CHANGELOG.md"]

# A cited section: `RESULTS.md, "Classifier throughput"` (the comma optional; the file's
# name may be a link: `[benchmarks/RESULTS.md](../benchmarks/RESULTS.md), "Embedding tables"`).
CITATION = re.compile(r'RESULTS\.md(?:\]\([^)]*\))?,? "([^"]+)"')
# A decimal figure: 0.9016, 46.9 (in 46.9x), 0.29 (in 0.29-0.51); not a part of 3.11.7.
FIGURE = re.compile(r"(?<![\w.])\d+\.\d+(?!\.?\d)(?![a-wyzA-Z_])")
# Versions of other software written in prose are no figures: "TensorFlow 2.21".
PRODUCT_VERSION = re.compile(r"\b(?:TensorFlow|Keras|Python) \d+\.\d+(?:\.\d+)?")
HEADING = re.compile(r"^(#{2,6}) (.+?)\s*$", re.M)
TEST_COUNT = re.compile(r"\b(\d[\d,]*) (?:tests|passed|failed)\b")
# A version of loops stated in prose: "version 6.0.0", "loops 6.0.0".
STATED_VERSION = re.compile(r"\b(?:version|loops) (\d+\.\d+\.\d+)\b")


def read(name: str) -> str:
    return (REPOSITORY / name).read_text(encoding="utf-8")


def prose(text: str) -> str:
    """Text without fenced blocks, code spans, HTML comments and link targets."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`(?:[^`\n]|\n(?!\s*\n))*`", "", text)  # a code span may wrap, not a paragraph
    return re.sub(r"\]\([^)]*\)", "]", text)


def paragraphs(text: str) -> list[str]:
    """Blocks of text between blank lines, fenced blocks left out whole."""
    text = re.sub(r"^```.*?^```", "\n", text, flags=re.S | re.M)
    return [block for block in re.split(r"\n\s*\n", text) if block.strip()]


def figures(text: str) -> list[str]:
    return FIGURE.findall(PRODUCT_VERSION.sub("", prose(text)))


def results_sections() -> dict[str, str]:
    """RESULTS.md's sections by heading, each with its subsections' text."""
    text = read(RESULTS)
    headings = list(HEADING.finditer(text))
    sections = {}
    for index, heading in enumerate(headings):
        level = len(heading.group(1))
        end = len(text)
        for later in headings[index + 1 :]:
            if len(later.group(1)) <= level:
                end = later.start()
                break
        sections[heading.group(2)] = text[heading.end() : end]
    return sections


def section_named(name: str, sections: dict[str, str]) -> str | None:
    """The heading a citation names: the heading itself, or the one heading it begins."""
    if name in sections:
        return name
    begun = [heading for heading in sections if heading.startswith(name)]
    return begun[0] if len(begun) == 1 else None


def one_line(text: str) -> str:
    """Citations broken over comment lines read as one line."""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*#+\s*", " ", text))


def cited_from() -> set[pathlib.Path]:
    """The documents and the source files that may name a section of RESULTS.md."""
    files = {REPOSITORY / name for name in ["README.md", "BUILD.md", "CHANGELOG.md", "setup.cfg"]}
    for folder in ["docs", "loops", "tests", "benchmarks", "data", "models"]:
        for pattern in ("*.md", "*.py", "*.flags"):
            files.update((REPOSITORY / folder).rglob(pattern))
    # This file's own examples of the form are no citations.
    return files - {pathlib.Path(__file__).resolve()}


def setup_cfg_version() -> str:
    config = configparser.ConfigParser()
    config.read(REPOSITORY / "setup.cfg")
    return config["metadata"]["version"]


def test_setup_cfg_changelog_and_every_document_state_one_version():
    version = setup_cfg_version()
    changelog = read("CHANGELOG.md")
    headings = re.findall(r"^## (.+)$", changelog, flags=re.M)
    releases = [heading for heading in headings if re.match(r"\d+\.\d+\.\d+ \(", heading)]
    assert releases[0].startswith(f"{version} ("), (
        f"setup.cfg says {version}; CHANGELOG.md's newest release is {releases[0]}"
    )
    # Unreleased changes, if any, sit above the newest release.
    assert headings.index(releases[0]) <= 1 and headings[:1] in (["Unreleased"], [releases[0]])
    stated = {}
    for name in ["README.md", "BUILD.md", *PROSE[1:]]:
        text = read(name)
        found = re.findall(r"This is version (\S+?);", text)
        found += re.findall(r"`version` in setup\.cfg \((\S+?)\)", text)
        found += STATED_VERSION.findall(prose(text))
        stated[name] = sorted(set(found))
    assert stated["README.md"] == [version] and stated["BUILD.md"] == [version]
    assert {name: found for name, found in stated.items() if found not in ([], [version])} == {}


def test_the_version_test_reads_what_the_documents_write():
    assert STATED_VERSION.findall(prose("loops 1.2.3 and `loops 9.9.9`, Keras 3.15.1")) == ["1.2.3"]


def test_every_results_section_a_document_or_a_source_file_names_exists():
    sections = results_sections()
    cited = []
    for path in sorted(cited_from()):
        for name in CITATION.findall(one_line(path.read_text(encoding="utf-8"))):
            cited.append((str(path.relative_to(REPOSITORY)), name))
    assert cited, "no citation found: the pattern no longer reads them"
    missing = [(where, name) for where, name in cited if section_named(name, sections) is None]
    assert missing == [], (
        "each names a section of benchmarks/RESULTS.md by its heading (or the one heading it "
        "begins); rename the citation or the heading"
    )


def test_every_figure_readme_and_docs_quote_is_the_cited_sections_figure():
    sections = results_sections()
    uncited, unmatched = [], []
    for name in PROSE:
        for paragraph in paragraphs(read(name)):
            quoted = figures(paragraph)
            if not quoted:
                continue
            names = CITATION.findall(one_line(paragraph))
            cited = [section_named(section, sections) for section in names]
            if not cited:
                uncited.append(f"{name}: {quoted} in {one_line(paragraph)[:100]!r}")
                continue
            held = {figure for section in cited if section for figure in figures(sections[section])}
            for figure in quoted:
                if figure not in held:
                    unmatched.append(f"{name}: {figure} not in {cited}")
    assert uncited == [], (
        "a paragraph quoting a measured figure cites its section: "
        '(benchmarks/RESULTS.md, "Section"); a setting\'s value goes in code (`0.1`)'
    )
    assert unmatched == [], "a figure is written as the cited section of RESULTS.md has it"


def test_the_figure_check_reads_figures_as_the_convention_says():
    quoted = "RMSE 0.9016 (`--l2=0.1`), 46.9x, 0.29-0.51x, Python 3.11.7, TensorFlow 2.21"
    assert figures(quoted) == ["0.9016", "46.9", "0.29", "0.51"]
    sections = {"Recommenders (`x`)": "", "Click-through rate": "", "Click-through speed": ""}
    assert section_named("Recommenders", sections) == "Recommenders (`x`)"
    assert section_named("Click-through", sections) is None  # two headings begin with it
    assert CITATION.findall(one_line('(benchmarks/RESULTS.md,\n    # "Binary\n    # start")')) == [
        "Binary start"
    ]


def test_readme_alone_quotes_a_test_count_and_it_is_what_pytest_collects():
    counts = {
        name: TEST_COUNT.findall(PRODUCT_VERSION.sub("", prose(read(name)))) for name in DOCUMENTS
    }
    assert {name: found for name, found in counts.items() if found and name != "README.md"} == {}, (
        "the test count lives in README's one sentence alone"
    )
    assert len(counts["README.md"]) == 1, counts["README.md"]
    stated = int(counts["README.md"][0].replace(",", ""))
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "tests"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    # "1781 tests collected in 5.1s" (or "N/M tests collected" where some are deselected: N run).
    found = re.findall(r"^(\d+)(?:/\d+)? tests? collected", collected.stdout, flags=re.M)
    assert len(found) == 1, collected.stdout[-2000:]
    assert stated == int(found[0]), (
        f"README says {stated} tests; pytest collects {found[0]}: write {found[0]} in README"
    )

"""The framework stands on its own: no imports of the examples, and its public names."""

import ast
import os

import loops
from conftest import ROOT, run_python

EXAMPLE_PACKAGES = {"loops_data", "loops_models"}  # the folders data/ and models/
FRAMEWORK = os.path.join(ROOT, "loops")
# The binaries wire the examples into the framework; only they may import them.
BINARIES = os.path.join(FRAMEWORK, "bin")


def framework_modules():
    """Paths of every module under loops/ but loops/bin/."""
    for directory, _, names in os.walk(FRAMEWORK):
        if os.path.commonpath([directory, BINARIES]) == BINARIES:
            continue
        yield from (os.path.join(directory, name) for name in sorted(names) if name.endswith(".py"))


def imported_packages(path):
    """The top-level packages a module imports, by `import`, `from` or importlib.import_module."""
    tree = ast.parse(open(path).read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return {name.split(".")[0] for name in names}


def test_no_framework_module_imports_the_example_packages():
    paths = list(framework_modules())
    assert os.path.join(FRAMEWORK, "kinds", "rl", "environment_loop.py") in paths
    assert len(paths) > 20
    offenders = {
        os.path.relpath(path, ROOT): sorted(imported_packages(path) & EXAMPLE_PACKAGES)
        for path in paths
    }
    assert {path: found for path, found in offenders.items() if found} == {}
    # The scan does see such imports where they belong: the RL binary wires CartPole in.
    assert imported_packages(os.path.join(BINARIES, "rl.py")) >= EXAMPLE_PACKAGES


def test_importing_every_framework_module_loads_no_example_package():
    modules = sorted(
        "loops." + os.path.relpath(path, FRAMEWORK)[:-3].replace(os.sep, ".")
        for path in framework_modules()
    )
    modules = [name.removesuffix(".__init__") for name in modules]
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(EXAMPLE_PACKAGES)!r})))"  # noqa: E501
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_loops_and_the_environment_interface_are_public_names():
    from loops.input import environments
    from loops.kinds import gan, rl

    assert loops.GANLoop is gan.GANLoop
    assert loops.EnvironmentLoop is rl.EnvironmentLoop
    assert loops.ActorCriticLoop is rl.ActorCriticLoop
    assert loops.DQNLoop is rl.DQNLoop
    assert loops.Environment is environments.Environment
    assert loops.environments is environments
    names = {
        "GANLoop",
        "EnvironmentLoop",
        "ActorCriticLoop",
        "DQNLoop",
        "Environment",
        "environments",
    }
    assert names <= set(loops.__all__) and names <= set(dir(loops))


def test_the_controller_and_the_actions_do_not_import_the_loop_module():
    # The Loop imports both; either importing loops.definition.loop back would be a cycle.
    code = (
        "import sys\nimport loops.run.actions, loops.run.controller\n"
        "print('loops.definition.loop' in sys.modules)\n"
        "import loops.kinds.classifier\nprint('loops.definition.loop' in sys.modules)"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    # The second line shows the check sees the module once something does import it.
    assert done.stdout.split() == ["False", "True"]


def imported_framework_modules(path, modules):
    """The framework modules a module imports, TYPE_CHECKING imports included."""
    tree = ast.parse(open(path).read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name in modules and name != "loops"}


def test_no_framework_modules_import_each_other_in_a_circle():
    paths = {
        "loops." + os.path.relpath(path, FRAMEWORK)[:-3].replace(os.sep, "."): path
        for path in framework_modules()
    }
    modules = {name.removesuffix(".__init__"): path for name, path in paths.items()}
    imports = {name: imported_framework_modules(path, modules) for name, path in modules.items()}
    assert (
        "loops.definition.run_context" in imports["loops.run.actions"]
    )  # the scan sees `from x import y`

    def reaches(start, target, seen):
        for name in imports[start] - seen:
            seen.add(name)
            if name == target or reaches(name, target, seen):
                return True
        return False

    circles = sorted(name for name in imports if reaches(name, name, set()))
    assert circles == []


def test_setup_cfg_installs_every_package_of_the_framework():
    # `pip install .` (the README's main command) installs only the packages setup.cfg
    # lists; an editable install finds the rest, so only this test sees one missing.
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    listed = set(config["options"]["packages"].split())
    on_disk = {
        "loops." + os.path.relpath(directory, FRAMEWORK).replace(os.sep, ".")
        for directory, _, names in os.walk(FRAMEWORK)
        if "__init__.py" in names and directory != FRAMEWORK
    }
    assert len(on_disk) >= 10 and "loops.kinds.rl" in on_disk
    assert on_disk - listed == set(), "list these under [options] packages in setup.cfg"


def test_the_cluster_wing_is_imported_only_where_a_cluster_is_started_or_its_loss_worded():
    # Read from the source (TYPE_CHECKING imports included), as lint-imports' contracts
    # `layers`, `cluster-wing` and `cluster-on-the-ground-floor` hold them.
    paths = {
        "loops." + os.path.relpath(path, FRAMEWORK)[:-3].replace(os.sep, "."): path
        for path in framework_modules()
    }
    modules = {name.removesuffix(".__init__"): path for name, path in paths.items()}
    imports = {name: imported_framework_modules(path, modules) for name, path in modules.items()}

    def importers(package, among=""):
        return sorted(
            name
            for name, imported in imports.items()
            if name.startswith(among) and any(i.startswith(package) for i in imported)
        )

    # The floor of strategy facts stands only on the TensorFlow adapter under it; the two
    # private-name adapters import nothing of the framework; the core no longer stands on the input.
    assert imports["loops.topology"] == {"loops.tf_private"}
    assert imports["loops.tf_private"] == imports["loops.keras_private"] == set()
    assert importers("loops.input", among="loops.core") == []
    assert "loops.core.replica_random" in importers("loops.topology")  # the scan sees it
    outside_the_wing = [
        name
        for name in importers("loops.cluster")
        if not name.startswith(("loops.cluster", "loops.cli", "loops.testing"))
    ]
    # The Trainer words a lost task's error (a parameter-server task serves in the wing).
    assert outside_the_wing == ["loops.run.trainer"]

"""A user of the removed v2 API (a Loop that took the run's settings and ran itself) is told
what replaced it."""

import inspect

import pytest

import loops
from loops.definition import removed_api
from loops.run import trainer_arguments


class MyLoop(loops.Loop):
    pass


class Seeded(loops.Loop):
    def __init__(self, seed):  # a definition's own argument that shares a setting's name
        self.seed = seed


def test_a_definition_given_the_run_settings_names_the_trainer():
    with pytest.raises(TypeError) as raised:
        MyLoop(strategy=None, train_data=None)
    assert str(raised.value) == (
        "MyLoop takes no run settings (got strategy, train_data): a definition says what a "
        "step does, and a loops.Trainer runs it with the run's settings; write "
        "loops.Trainer(MyLoop(), strategy=..., train_data=...) (CHANGELOG.md, 3.0.0)."
    )


def test_a_kind_with_arguments_of_its_own_is_shown_with_them():
    with pytest.raises(TypeError) as raised:
        loops.ClassifierLoop(model_fn=None, optimizer_fn=None, steps_per_loop=10, clip_norm=1.0)
    assert str(raised.value) == (
        "ClassifierLoop takes no run settings (got steps_per_loop): a definition says what a "
        "step does, and a loops.Trainer runs it with the run's settings; write "
        "loops.Trainer(ClassifierLoop(...), steps_per_loop=...) (CHANGELOG.md, 3.0.0)."
    )


def test_a_definition_keeps_its_own_argument_of_a_settings_name():
    assert Seeded(seed=3).seed == 3
    assert Seeded(4).seed == 4
    with pytest.raises(TypeError, match=r"^Seeded takes no run settings \(got model_dir\)"):
        Seeded(seed=3, model_dir="/tmp/run")


@pytest.mark.parametrize("name", ["train", "evaluate", "close"])
def test_a_run_method_of_v2_names_the_trainer(name):
    with pytest.raises(AttributeError) as raised:
        getattr(MyLoop(), name)
    assert str(raised.value) == (
        f"MyLoop has no {name}: a definition does not run itself; a loops.Trainer runs it, "
        f"trainer = loops.Trainer(MyLoop(...), train_data=..., ...), and use trainer.{name} "
        "(CHANGELOG.md, 3.0.0)."
    )
    assert not hasattr(MyLoop(), name)


def test_the_refused_keywords_are_the_trainers():
    parameters = inspect.signature(loops.Trainer.__init__).parameters
    keywords = {
        name
        for name, parameter in parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY or name == "config"
    }
    assert removed_api.TRAINER_KEYWORDS == keywords | set(trainer_arguments.KEYWORDS)
    assert {name for name in removed_api.RUN_METHODS if name != "controller"} <= set(
        dir(loops.Trainer)
    )

"""Keras models the loops' binaries train."""

from loops_models.classifiers import CLASSIFIERS, build_classifier, cnn, mlp

__all__ = ["CLASSIFIERS", "build_classifier", "cnn", "mlp"]

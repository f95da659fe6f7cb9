"""The errors a run can end with that are about the run itself, not a bad argument."""


class NonFiniteError(RuntimeError):
    """A step left a NaN or an inf (in its loss, gradients or the weights) and the run stopped."""


class NonFiniteWeightsError(NonFiniteError):
    """A save or an export was refused because some variables are not finite."""


class DamagedCheckpointError(ValueError):
    """A model_dir holds checkpoint files, and none of them can be read."""

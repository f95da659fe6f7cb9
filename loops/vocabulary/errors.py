"""The errors a run can end with that are about the run itself, not a bad argument."""


class NonFiniteError(RuntimeError):
    """A step left a NaN or an inf (in its loss, gradients or the weights) and the run stopped."""


class NonFiniteWeightsError(NonFiniteError):
    """A save or an export was refused because some variables are not finite."""


class LossSpikeError(RuntimeError):
    """A step's loss stayed far above its moving average (`on_loss_spike`) and the run stopped."""


class DamagedCheckpointError(ValueError):
    """A model_dir holds checkpoint files, and none of them can be read."""


class ClusterTaskLostError(RuntimeError):
    """A task of the run's cluster stopped answering, so the run stopped; the message names it.

    Every step up to the last checkpoint is saved: starting every task again
    with the same command continues the run from there.
    """

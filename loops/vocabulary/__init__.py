"""The words every layer shares: the settings' declarations, the choices, the errors,
the exit codes and the one whole-number check."""

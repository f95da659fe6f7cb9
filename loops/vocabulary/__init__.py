"""The words every layer shares: the settings' declarations, the choices, the errors
and the exit codes."""

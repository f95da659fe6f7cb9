"""The command line: flags generated from the settings' declarations, and the
application runner of the binaries."""

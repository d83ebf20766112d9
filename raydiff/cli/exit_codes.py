"""The exit codes of ``raydiff``: 0 success, 2 argparse's (a malformed command line)."""

EXIT_USER_ERROR = 1
"""A user's mistake with a message (bad input, existing output)."""

EXIT_RUN_FAILED = 3
"""A run that failed after its automatic restarts (``RunFailedError``): running it again
continues it."""

EXIT_INTERRUPTED = 130
"""A command stopped by Ctrl-C (a sweep or a training run continues with --resume / the same
command), as shells report SIGINT."""

EXIT_TERMINATED = 143
"""A command sent SIGTERM (as a pod's stop sends it), stopped as Ctrl-C stops it (a run or
sweep continues with the same command or --resume); as shells report SIGTERM."""

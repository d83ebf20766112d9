"""The exit codes of ``raydiff``: 0 success, 2 argparse's (a malformed command line)."""

EXIT_USER_ERROR = 1
"""A user's mistake with a message (bad input, existing output)."""

EXIT_RUN_FAILED = 3
"""A run that failed after its automatic restarts (``RunFailedError``): running it again
continues it."""

EXIT_INTERRUPTED = 130
"""A sweep or a training run stopped by Ctrl-C (continue it with --resume / the same command),
as shells report SIGINT."""

EXIT_TERMINATED = 143
"""A training run or a sweep whose driver was sent SIGTERM (as a pod's stop sends it), stopped
as Ctrl-C stops it; as shells report SIGTERM."""

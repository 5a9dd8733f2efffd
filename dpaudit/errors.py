"""The one error type that the command line turns into exit status 2, and the exit statuses."""

from enum import IntEnum


class InputError(ValueError):
    """Bad input from the user: a config key, a file, a flag. The message is one line
    that names what is wrong; the command line prints it and exits with status 2."""


class ExitCode(IntEnum):
    """The command line's exit statuses (DESIGN.md, section 4)."""

    OK = 0  # done, or every audit consistent (or nothing to audit)
    VIOLATION = 1  # an audit found a violation
    USAGE = 2  # bad input or usage
    INCONCLUSIVE = 3  # an audit could not have seen a violation of its claim
    FAILED = 4  # a model of the run failed (its error is in the report)

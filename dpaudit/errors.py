"""The one error type that the command line turns into exit status 2."""


class InputError(ValueError):
    """Bad input from the user: a config key, a file, a flag. The message is one line
    that names what is wrong; the command line prints it and exits with status 2."""

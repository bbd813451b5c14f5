"""Errors that name what was wrong with the input; the CLI turns them into exit code 2."""


class InputError(ValueError):
    """Bad input: a flow, a parameter, a file, a variable or a dimension that is not as expected."""

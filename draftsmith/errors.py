"""Errors a user can cause. The CLI prints their message as one line and exits with code 2."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix, in one line."""

"""The one exception type users see: a message that says what was wrong and what to do.

The CLI and the server turn a `SpecdecError` into a clear message (exit code 1, or an HTTP 4xx);
anything else is a bug and keeps its traceback.
"""


class SpecdecError(ValueError):
    """Bad input or an unusable setup, with a message written for the person who caused it."""

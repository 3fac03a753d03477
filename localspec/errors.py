"""Errors that reach the user as a message, never as a traceback.

Every front door (CLI, TUI, server) catches `LocalspecError` and shows `str(error)`; anything else is
a bug and is reported as one.
"""


class LocalspecError(Exception):
    """A problem the user can act on; the message says what happened and what to do."""


class UnknownIdError(LocalspecError):
    pass


class ModelFileError(LocalspecError):
    """A GGUF file is missing, truncated, corrupt or not loadable."""


class PullError(LocalspecError):
    pass


class ChecksumError(PullError):
    pass


class SourceUnreachableError(PullError):
    pass


class IncompatiblePairError(LocalspecError):
    pass


class ContextOverflowError(LocalspecError):
    """The prompt does not fit the context window."""


class EngineUnavailableError(LocalspecError):
    """The engine cannot serve right now (an RPC worker is down or stopped answering); a later request
    may succeed once it is back. The server answers these with 503."""

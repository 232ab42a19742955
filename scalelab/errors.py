"""Domain errors. Library code raises these; tasks.py turns them into one clear line."""


class ScalelabError(Exception):
    """Base of every error scalelab reports to the user as one line."""


class InputError(ScalelabError):
    """A value given by the user is malformed or out of range."""


class NotRootError(ScalelabError):
    """The operation needs root privileges."""


class ClusterError(ScalelabError):
    """A cluster could not be created, changed, found or destroyed."""


class ProvisionError(ClusterError):
    """A provisioning step failed; everything it created was removed."""


class CommandError(ScalelabError):
    """An external command failed; carries its stderr."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr

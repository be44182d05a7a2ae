"""Error types that the CLI turns into one clear line and a non-zero exit code."""


class FedpersError(Exception):
    """Base class for every error fedpers reports to a user without a traceback."""


class ConfigError(FedpersError):
    """A config key is unknown, mistyped or out of range (the message names the key)."""


class DataError(FedpersError):
    """A dataset is missing, malformed, or cannot be partitioned as asked."""


class ClientUpdateError(FedpersError):
    """A message from the server to a client (or back) does not match the local model."""

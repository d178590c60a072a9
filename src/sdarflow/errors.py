"""Typed errors a user can cause. Each message says what is wrong, the value, and the fix; only the CLI turns
them into one line and an exit code."""


class SdarflowError(Exception):
    """Base class: the CLI prints ``str(err)`` on one line and exits with ``exit_code``."""

    exit_code = 2


class ConfigError(SdarflowError):
    """A stage config is malformed or inconsistent."""


class SchemaError(SdarflowError):
    """A dataset does not match its table contract."""


class StorageError(SdarflowError):
    """Storage is unreachable, or a dataset/artifact is missing or incomplete."""


class ModelError(SdarflowError):
    """A model or adapter folder is missing, corrupt, or does not match the base model."""


class CheckpointError(SdarflowError):
    """A checkpoint is missing, unreadable, or belongs to a different run."""

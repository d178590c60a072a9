"""The registry's errors; each has its own exit code, so automation tells "the gate said no" (3) and "lost a
race, retry" (4) from plain user errors (2)."""

from __future__ import annotations

from sdarflow.errors import SdarflowError


class RegistryError(SdarflowError):
    """A registry operation the user asked for cannot be done (version exists, nothing to roll back to, ...)."""


class GateRefused(RegistryError):
    """The promotion gate refused a candidate: it is not better than production on every criterion."""

    exit_code = 3


class RegistryConflict(RegistryError):
    """A conditional write lost a race: someone else changed the object since it was read. Retrying is safe."""

    exit_code = 4

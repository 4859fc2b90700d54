"""The exception hierarchy: one root, a few precise subclasses.

Every error carries a one-line message meant for a person; the CLI prints it
as ``fastci: <message>`` and exits with the class's exit code.
"""

from __future__ import annotations


class FastCIError(Exception):
    """Root of every error FastCI raises on purpose."""

    exit_code = 2


class PlanError(FastCIError):
    """A plan file is missing, unreadable, or does not follow the schema."""


class ConfigError(FastCIError):
    """``fastci.yaml`` or an environment setting is invalid."""


class StoreError(FastCIError):
    """The evidence store cannot be opened or has another schema version."""


class TraceError(FastCIError):
    """A trace file is truncated, corrupt, or from an unknown format."""


class GitError(FastCIError):
    """A git command failed (missing revision, not a repository...)."""


class BazelError(FastCIError):
    """A ``bazel`` invocation failed in a way FastCI cannot work around."""

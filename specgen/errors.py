"""Typed errors: the CLI turns each into a one-line message and exit code 1."""


class SpecgenError(Exception):
    """Base class of every error specgen reports to the user."""


class InputError(SpecgenError):
    """The prompt or an option is unusable (empty, unreadable, too long...)."""


class ConfigError(SpecgenError):
    """A models.toml file is malformed."""


class ModelError(SpecgenError):
    """A model could not be found, downloaded or loaded."""

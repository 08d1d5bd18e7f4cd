"""Typed errors: the CLI turns each into a one-line message and exit code 1.

Library errors name the parameter they are about (`SettingError.param`); the CLI maps it to its
flag.
"""

import json


class SpecgenError(Exception):
    """Base class of every error specgen reports to the user."""


class InputError(SpecgenError):
    """The prompt or an option is unusable (empty, unreadable, too long...)."""


class SettingError(InputError):
    """A setting that cannot be used: `param` (the library's name for it) `requirement`, and
    the `value` it got, if that says more."""

    def __init__(self, param: str, requirement: str, value=None):
        self.param, self.requirement, self.value = param, requirement, value
        super().__init__(self.naming(param))

    def naming(self, name: str) -> str:
        """The message with the setting called `name` (a CLI flag, say)."""
        got = "" if self.value is None else f" (got {shown(self.value)})"
        return f"{name} {self.requirement}{got}"


def shown(value, most: int = 60) -> str:
    """`value` as a message shows it: a string quoted (so "5" is not read as the number 5), and
    cut to `most` characters (a hostile value may be megabytes)."""
    text = json.dumps(value) if isinstance(value, str) else str(value)
    return text if len(text) <= most else text[:most - 3] + "..."


class ConfigError(SpecgenError):
    """A models.toml file is malformed."""


class ModelError(SpecgenError):
    """A model could not be found, downloaded or loaded."""


class DistributedError(SpecgenError):
    """A group was asked for (by mlx.launch) but could not be formed or used."""

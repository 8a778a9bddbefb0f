"""``--target user@host[:port]|labgrid://PLACE`` and its SSH options, shared by ``rtvirt probe``/``stress``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = ["target_options", "pop_target"]

F = TypeVar("F", bound=Callable[..., Any])
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_NAMES = ("target", "ssh_config", "known_hosts", "identity")


def target_options(command: F) -> F:
    """Add the target options; the command gets them among its ``**values`` (see :func:`pop_target`)."""
    for decorator in reversed((
        click.option("--target", metavar="USER@HOST[:PORT]",
                     help="run on this SSH target instead of here (host may be a ~/.ssh/config alias; "
                          "labgrid://PLACE: a labgrid place's NetworkService, coordinator from LG_COORDINATOR)"),
        click.option("--ssh-config", type=_FILE, help="OpenSSH client config to read [default: ~/.ssh/config]"),
        click.option("--known-hosts", type=_FILE, help="known_hosts file [default: ~/.ssh/known_hosts]"),
        click.option("--identity", type=_FILE, help="private key [default: ssh-agent, ~/.ssh/id_*]"),
    )):
        command = decorator(command)
    return command


def pop_target(values: dict[str, Any]) -> Any:
    """Remove the target options from ``values``; the SshTarget they name, or None to run here."""
    text, ssh_config, known_hosts, identity = (values.pop(name, None) for name in _NAMES)
    if text is None:
        for option, value in (("--ssh-config", ssh_config), ("--known-hosts", known_hosts), ("--identity", identity)):
            if value is not None:
                raise click.UsageError(f"option {option} needs --target")
        return None
    from ..remote.target import parse_target

    fields = {"ssh_config": ssh_config, "known_hosts": known_hosts, "identity_file": identity}
    return parse_target(text, **{name: value for name, value in fields.items() if value is not None})

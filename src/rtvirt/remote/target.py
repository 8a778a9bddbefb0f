"""What an SSH target is: a validated description, from a scenario file or from ``--target user@host[:port]``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ..errors import InputError, first_validation_error
from .labgrid import LABGRID_SCHEME, is_labgrid, resolve_place

__all__ = ["REMOTE_DIR_PATTERN", "RemoteDir", "SshOptions", "SshTarget", "SshTargetFields", "parse_target"]

REMOTE_DIR_PATTERN = r"^/[A-Za-z0-9_./-]{1,200}$"  # where agents go: absolute; ".." components are refused separately


def _no_parent_components(value: str) -> str:
    if ".." in value.split("/"):
        raise ValueError("remote_dir must not contain '..'")
    return value


# a directory on another machine for rtvirt's files (agents, images, stream copies): absolute, no ".."
RemoteDir = Annotated[str, StringConstraints(pattern=REMOTE_DIR_PATTERN), AfterValidator(_no_parent_components)]

# host names, ~/.ssh/config aliases, IPv4 and bracket-less IPv6 literals; nothing a shell would care about
HOST_PATTERN = r"^[A-Za-z0-9_.:%-]{1,253}$"
USER_PATTERN = r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$"
_HOP = r"([A-Za-z0-9_.-]+@)?[A-Za-z0-9_.:%-]+(:[0-9]{1,5})?"
JUMP_PATTERN = rf"^{_HOP}(,{_HOP})*$"


class SshOptions(BaseModel):
    """How to connect to a machine whose address is given elsewhere (a target's ``host``, a KVM host's
    ``user@host[:port]``). Unset fields come from ``~/.ssh/config`` and then from OpenSSH's defaults; host keys
    are always verified against known_hosts."""

    identity_file: Path | None = Field(None, description="private key (default: ssh-agent and ~/.ssh/id_*)")
    known_hosts: Path | None = Field(None, description="known_hosts file (default: ~/.ssh/known_hosts)")
    proxy_jump: str | None = Field(None, pattern=JUMP_PATTERN, description="[user@]host[:port][,...] to hop through")
    ssh_config: Path | None = Field(None, description="OpenSSH client config to read (default: ~/.ssh/config)")
    connect_timeout: float = Field(15.0, gt=0, le=600, description="seconds to establish the connection")


class SshTargetFields(SshOptions):
    """How to reach one target. Unset fields come from ``~/.ssh/config`` (aliases, Port, User, IdentityFile,
    ProxyJump) and then from OpenSSH's defaults; host keys are always verified against known_hosts.
    Shared by :class:`SshTarget` and the ``ssh`` environment's configuration."""

    host: str = Field(pattern=HOST_PATTERN, description="host name, address or ~/.ssh/config alias")
    port: int | None = Field(None, ge=1, le=65535, description="SSH port (default: ~/.ssh/config, else 22)")
    user: str | None = Field(None, pattern=USER_PATTERN, description="login (default: ~/.ssh/config, else yours)")

    def ssh_target(self) -> SshTarget:
        return SshTarget.model_validate({name: getattr(self, name) for name in SshTargetFields.model_fields})


class SshTarget(SshTargetFields):
    """One target to connect to (see :class:`SshTargetFields`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    place: str | None = Field(default=None, description="the labgrid place it was resolved from (labels only)")

    @property
    def label(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        address = f"{user}{self.host}{port}"
        return f"labgrid://{self.place} ({address})" if self.place else address


_TARGET_TEXT = re.compile(r"^(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:@]+)(?::(?P<port>[0-9]+))?$")


def parse_target(text: str, option: str = "--target", **fields: object) -> SshTarget:
    """``user@host[:port]`` (IPv6 as ``[addr]:port``) as an :class:`SshTarget`, or ``labgrid://PLACE[/NAME]``
    resolved through the labgrid coordinator (``LG_COORDINATOR``); bad text names ``option``."""
    text = text.strip()
    if is_labgrid(text):
        place = text[len(LABGRID_SCHEME):]
        values: dict[str, object] = {**resolve_place(place, option=option), "place": place, **fields}
    else:
        match = _TARGET_TEXT.match(text)
        if not match:
            raise InputError(f"option {option}: {text[:100]!r} is not user@host[:port] or labgrid://PLACE")
        values = {"host": match["host"].strip("[]"), **fields}
        if match["user"]:
            values["user"] = match["user"]
        if match["port"]:
            values["port"] = int(match["port"])
    try:
        return SshTarget.model_validate(values)
    except ValidationError as exc:
        field, message = first_validation_error(exc)
        raise InputError(f"option {option}: {field}: {message}") from None

"""Who may reach the live view: the address it listens on and the token it then asks for (no server imported
here: `rtvirt run --serve` checks both before it measures anything)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

__all__ = ["Listen", "parse_listen", "access", "DEFAULT_PORT", "TOKEN_ENV", "MIN_TOKEN"]

DEFAULT_PORT = 8340
TOKEN_ENV = "RTVIRT_SERVE_TOKEN"
MIN_TOKEN = 16  # characters


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def local(self) -> bool:
        """Only this machine can connect (loopback)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: not known to be this machine alone
            return False

    def url(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}/"


def parse_listen(text: str) -> Listen:
    """``HOST[:PORT]`` or ``[IPv6][:PORT]`` (port 0: any free one); ValueError says what is wrong."""
    host, port = text, str(DEFAULT_PORT)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError("expected [IPv6]:PORT")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected HOST[:PORT] with a port from 0 to 65535")
    return Listen(host, int(port))


def access(listen: str, token_file: Path | None) -> tuple[Listen, str | None]:
    """The address and the token (from ``token_file``, else the environment), checked: a bad address, an
    unreadable or short token, or an address beyond loopback without a token is an InputError naming the
    option (exit 2). A token never comes from the command line, which `ps` shows to every user."""
    try:
        address = parse_listen(listen)
    except ValueError as exc:
        raise InputError(f"option --listen {listen}: {exc}") from None
    token, where = None, ""
    if token_file is not None:
        where = f"option --token-file {token_file}"
        try:
            token = token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    elif os.environ.get(TOKEN_ENV):
        token, where = os.environ[TOKEN_ENV].strip(), f"environment variable {TOKEN_ENV}"
    if token is not None and len(token) < MIN_TOKEN:
        raise InputError(f"{where}: the token must be at least {MIN_TOKEN} characters")
    if not address.local and token is None:
        raise InputError(f"option --listen {listen}: not a loopback address, so a token is needed: --token-file "
                         f"FILE or the environment variable {TOKEN_ENV} (never on the command line)")
    return address, token

"""labgrid places as targets: a place's ``NetworkService`` read through labgrid's own client API.

A lab that manages its boards with labgrid names them as places on its coordinator; the place you have
acquired (``labgrid-client -p PLACE acquire``) carries a ``NetworkService`` resource (address, username,
port) exported for the board. rtvirt asks the coordinator for it and then connects with its own SSH path
(asyncssh, host keys verified against known_hosts, keys or ssh-agent): labgrid's password field and its
SSH proxying are not used. labgrid is imported only when a place is resolved.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from ..errors import InputError, RunError

__all__ = ["LABGRID_SCHEME", "PLACE_PATTERN", "coordinator_address", "is_labgrid", "resolve_place"]

LABGRID_SCHEME = "labgrid://"
PLACE_PATTERN = r"^[A-Za-z0-9_.-]{1,128}(/[A-Za-z0-9_.-]{1,128})?$"  # PLACE or PLACE/RESOURCE-NAME
DEFAULT_COORDINATOR = "127.0.0.1:20408"  # labgrid's own default
SERVICE = "NetworkService"


def is_labgrid(text: str) -> bool:
    return text.startswith(LABGRID_SCHEME)


def coordinator_address(explicit: str | None = None) -> str:
    """The coordinator to ask: given, else ``LG_COORDINATOR`` (labgrid's own variable), else its default."""
    return explicit or os.environ.get("LG_COORDINATOR") or DEFAULT_COORDINATOR


def resolve_place(place: str, coordinator: str | None = None, *, option: str = "--target",
                  timeout: float = 30.0) -> dict[str, Any]:
    """SSH fields (host, port, user) of the ``NetworkService`` of ``place`` (``PLACE[/NAME]``).

    The place must be acquired by this user on this host, as ``labgrid-client ssh`` requires. Errors
    name ``option``: an unknown or unacquired place, no NetworkService, a coordinator that cannot be reached.
    """
    if not re.match(PLACE_PATTERN, place):
        raise InputError(f"option {option}: {place[:100]!r} is not a labgrid place name (PLACE or PLACE/RESOURCE)")
    try:
        import labgrid.remote.client  # noqa: F401 - fail early and clearly if missing
    except ImportError:
        raise InputError(f"option {option}: labgrid places need labgrid (pip install 'labgrid>=24')") from None
    address = coordinator_address(coordinator)
    name, _, resource = place.partition("/")
    outcome: dict[str, Any] = {}
    # labgrid's session runs its own event loop, bound to the thread that starts it: give it a fresh one
    worker = threading.Thread(target=_ask, args=(address, name, resource or None, outcome), daemon=True,
                              name="rtvirt-labgrid")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RunError(f"labgrid coordinator {address}: no answer within {timeout:g} s")
    error = outcome.get("error")
    if isinstance(error, InputError):
        raise InputError(f"option {option}: {error}") from None
    if error is not None:
        raise error
    fields: dict[str, Any] = outcome["fields"]
    return fields


def _ask(address: str, place: str, resource: str | None, outcome: dict[str, Any]) -> None:
    from labgrid.remote.client import Error, UserError, start_session

    root = logging.getLogger()
    if not root.handlers:  # labgrid logs a failed coordinator stream with a traceback; our error says it
        root.addHandler(logging.NullHandler())
    session = None
    try:
        session = start_session(address)
        found = session.get_acquired_place(place)
        services = {name: entry for (name, cls), entry in session.get_target_resources(found).items()
                    if cls == SERVICE}
        outcome["fields"] = _service_fields(place, resource, services)
    except UserError as exc:
        message = str(exc).removeprefix("Error: ")[:300]
        hint = f" (acquire it first: labgrid-client -p {place} acquire)" if "not acquired" in message else ""
        outcome["error"] = InputError(f"labgrid place {place}: {message}{hint}")
    except Error as exc:
        outcome["error"] = RunError(f"labgrid coordinator {address}: {str(exc).removeprefix('Error: ')[:300]}")
    except (InputError, RunError) as exc:
        outcome["error"] = exc
    except Exception as exc:  # noqa: BLE001 - grpc's errors have many types; the thread must report them
        outcome["error"] = RunError(f"labgrid coordinator {address}: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        if session is not None:
            try:
                session.loop.run_until_complete(session.stop())
                session.loop.run_until_complete(session.close())
            finally:
                session.loop.close()


def _service_fields(place: str, wanted: str | None, services: dict[str, Any]) -> dict[str, Any]:
    if wanted is not None:
        services = {name: entry for name, entry in services.items() if name == wanted}
    if len(services) != 1:
        what = f"a {SERVICE} named {wanted!r}" if wanted else f"exactly one {SERVICE}"
        raise InputError(f"labgrid place {place}: needs {what} among its acquired resources "
                         f"(found: {', '.join(sorted(services))[:200] or 'none'}); "
                         f"choose one with labgrid://{place}/NAME")
    (name, entry), = services.items()
    if not entry.avail:
        raise RunError(f"labgrid place {place}: its {name} is not available (exporter offline?)")
    args = entry.args
    fields: dict[str, Any] = {"host": str(args.get("address", ""))}
    if args.get("port"):
        fields["port"] = int(args["port"])
    if args.get("username"):
        fields["user"] = str(args["username"])
    return fields

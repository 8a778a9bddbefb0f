"""A campaign on a shared store publishes its progress there each time it saves its state (the one place the
live state is published: rtvirt.campaign.state.CampaignState.on_save), so that a live view of the store shows
every machine's campaigns. Publishing never stops a campaign: a store that is away is asked again a minute later,
one that refuses is told once and left alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import RtvirtError
from ..stores.postgres import SharedStore, StoreUnavailable
from .progress import campaign_record

__all__ = ["campaign_publisher", "RETRY_S"]

RETRY_S = 60.0  # after the store was unreachable, the next attempt waits this long (no connect timeout per save)


def campaign_publisher(store: SharedStore, machine: str,
                       warn: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    """The ``on_save`` of a campaign's state: publishes the campaign's record (rtvirt.live.progress)."""
    retry_at = 0.0
    refused = False

    def publish(document: dict[str, Any]) -> None:
        nonlocal retry_at, refused
        if refused or time.monotonic() < retry_at:
            return
        try:
            store.publish_campaign(campaign_record(document, machine))
        except StoreUnavailable:
            retry_at = time.monotonic() + RETRY_S
        except (RtvirtError, ValueError) as exc:
            refused = True
            warn(f"the campaign's progress is not published to {store.label} ({str(exc)[:300]}); its runs are "
                 "delivered all the same")

    return publish

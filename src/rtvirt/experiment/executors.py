"""Where an experiment's chunks run: a local process pool (default: one worker per core, started and stopped
by rtvirt) or an existing Dask cluster (``--cluster tcp://HOST:8786`` or a scheduler file). Dask schedules,
retries and scales; rtvirt only submits chunks and writes what comes back. dask is imported here, only when
a cluster is asked for."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from ..errors import InputError

__all__ = ["Pool", "LocalPool", "DaskPool", "open_pool", "pool_map"]

_CONNECT_TIMEOUT_S = 10
_RETRIES = 3  # a chunk whose worker died is rerun elsewhere; this bounds chunks that fail by themselves


class Pool(Protocol):
    workers: int

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def first_done(self, futures: Iterable[Any]) -> set[Any]: ...

    def close(self) -> None: ...


def _ignore_interrupts() -> None:
    # Ctrl-C is the driver's to handle: it cancels what is queued and keeps what is written
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class LocalPool:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._executor = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                                                initializer=_ignore_interrupts)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._executor.submit(fn, *args)

    def first_done(self, futures: Iterable[Any]) -> set[Any]:
        done, _ = cf.wait(list(futures), return_when=cf.FIRST_COMPLETED)
        return set(done)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class DaskPool:
    def __init__(self, address: str) -> None:
        from distributed import Client

        try:
            if Path(address).is_file():
                self._client = Client(scheduler_file=address, timeout=_CONNECT_TIMEOUT_S)
            else:
                self._client = Client(address, timeout=_CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"option --cluster: cannot reach the Dask scheduler at {address!r} "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        threads = self._client.nthreads()
        self.workers = max(1, sum(threads.values()))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._client.submit(fn, *args, pure=False, retries=_RETRIES)

    def first_done(self, futures: Iterable[Any]) -> set[Any]:
        from distributed import wait

        return set(wait(list(futures), return_when="FIRST_COMPLETED").done)

    def close(self) -> None:
        self._client.close()


def open_pool(cluster: str | None, workers: int | None) -> Pool:
    if cluster is not None:
        return DaskPool(cluster)
    return LocalPool(workers or multiprocessing.cpu_count())


def pool_map(pool: Pool, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
    """``fn(*args)`` for every args of ``calls`` on the pool, results in the order of ``calls``."""
    futures = [pool.submit(fn, *args) for args in calls]
    return [future.result() for future in futures]

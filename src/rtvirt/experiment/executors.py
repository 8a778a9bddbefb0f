"""Where an experiment's chunks run: a local Dask cluster (default: one single-threaded worker process per core,
started and stopped by rtvirt) or an existing Dask cluster (``--cluster tcp://HOST:8786`` or a scheduler file).
Dask schedules, retries and scales; rtvirt only submits chunks and writes what comes back. dask is imported
here, only when a command runs work on workers (the CLI itself starts without it)."""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from ..errors import InputError
from ..procs import owned_temp_dir

__all__ = ["Pool", "LocalDaskPool", "DaskPool", "open_pool", "pool_map"]

_CONNECT_TIMEOUT_S = 10
_RETRIES = 3  # a chunk whose worker died is rerun elsewhere; this bounds chunks that fail by themselves
SCRATCH_PREFIX = "rtvirt-dask-"


class Pool(Protocol):
    workers: int

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def first_done(self, futures: Iterable[Any]) -> set[Any]: ...

    def close(self) -> None: ...


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


class LocalDaskPool(DaskPool):
    """A dask.distributed LocalCluster of ``workers`` processes, closed (every process gone) by ``close``."""

    def __init__(self, workers: int) -> None:
        import dask
        from distributed import Client, LocalCluster

        # Dask's scheduler and workers keep lock files in a scratch directory that outlives them
        # (TMPDIR/dask-scratch-space by default): ours is removed with the cluster.
        self._scratch = owned_temp_dir(SCRATCH_PREFIX)
        # Ctrl-C is the driver's to handle (it keeps what is finished, then closes the cluster): worker
        # processes started while SIGINT is ignored keep ignoring it, so they do not die mid-chunk with a traceback.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with dask.config.set({"temporary-directory": self._scratch.name}):
                self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                             dashboard_address=None, silence_logs=logging.ERROR,
                                             local_directory=self._scratch.name)
            self._client = Client(self._cluster)
        except BaseException:
            self._scratch.cleanup()
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
        self.workers = workers

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            try:
                self._cluster.close()
            finally:
                self._scratch.cleanup()


def open_pool(cluster: str | None, workers: int | None) -> Pool:
    if cluster is not None:
        return DaskPool(cluster)
    return LocalDaskPool(workers or multiprocessing.cpu_count())


def pool_map(pool: Pool, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
    """``fn(*args)`` for every args of ``calls`` on the pool, results in the order of ``calls``."""
    futures = [pool.submit(fn, *args) for args in calls]
    try:
        return [future.result() for future in futures]
    except KeyboardInterrupt:
        # Calls may write into the store themselves (sim --sweep): let them finish rather than leave half a run.
        # The workers ignore SIGINT; a second Ctrl-C stops the wait.
        for future in futures:
            future.exception()
        raise

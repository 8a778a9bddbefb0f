"""The shared results store: a PostgreSQL catalog (one row per run: provenance, statistics, manifest) with the
run directories on storage every machine mounts (NFS, CephFS, SMB), named by a URL::

    postgresql://[user@]host[:port]/dbname?data=/mnt/lab/rtvirt[&spool=DIR][&libpq options]

Credentials come from libpq's usual places (PGPASSWORD, ~/.pgpass, a service file via ``service=``); a password
in the URL works but is never shown, logged or recorded. Writers write runs into a local spool (an ordinary
results directory) and deliver each finished run: its directory is copied under DATA/incoming and renamed
into DATA/runs (atomic), then its row is inserted in one transaction; readers see only committed rows, so a
run is visible complete or not at all. The run id is the primary key: a retried delivery adds nothing. A
campaign delivers each run as it ends (:meth:`SharedStore.deliver` with ``keep``) and publishes its progress into a
second table, ``rtvirt_campaigns`` (one row per campaign), that the live view reads (docs/live.md).
Design and measurements: docs/shared-store.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import InputError, RtvirtError
from .base import Delivery
from .provenance import COLUMNS, content_sha256, run_row

if TYPE_CHECKING:
    from ..store import StoredRun

__all__ = ["SharedStore", "StoreUnavailable", "redact_url", "SCHEMES", "TABLE", "CAMPAIGNS"]

SCHEMES = ("postgresql", "postgres")
TABLE = "rtvirt_runs"
CAMPAIGNS = "rtvirt_campaigns"  # one row per campaign: its live progress (rtvirt.live.progress)
# in a spool run directory: this run is in the store already (delivered as it ended); the copy stays until the
# command ends because the campaign's report is written from the spool
DELIVERED_MARK = ".delivered"
_SCHEMA_LOCK = 0x72747669  # pg_advisory_xact_lock key: first writers create the table one at a time
_CONNECT_TIMEOUT_S = 5
_AUTH_WORDS = ("password authentication failed", "no password supplied", "authentication failed",
               "does not exist", "permission denied", "not permitted to log in", "pg_hba.conf")


class StoreUnavailable(RtvirtError):
    """The store's server did not answer (down, unreachable): writers keep spooling; readers stop (exit 2)."""

    exit_code = 2


def redact_url(url: str) -> str:
    """The URL as given, with any password (user:PASSWORD@ or password=) replaced by ***."""
    url = re.sub(r"(?<=[?&])password=[^&#]*", "password=***", url)
    scheme, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        user, _, host = authority.rpartition("@")
        if ":" in user:
            authority = f"{user.split(':', 1)[0]}:***@{host}"
    return f"{scheme}{sep}{authority}{slash}{tail}"


class SharedStore:
    shared = True

    def __init__(self, url: str, spool: Path | None = None, read_only: bool = False) -> None:
        self.label = redact_url(url)
        self.read_only = read_only  # every transaction read-only (the live view's server)
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise InputError(f"results store {self.label}: not a postgresql:// URL")
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        data = options.pop("data", None)
        spool_option = options.pop("spool", None)
        if not data:
            raise InputError(f"results store {self.label}: no data=DIR (the shared directory of the runs' files)")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number from 1 to 65535
        except ValueError as exc:
            raise InputError(f"results store {self.label}: not a valid PostgreSQL URL ({exc})") from None
        self.data = Path(data)
        self._secret = parts.password
        self._conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(options), ""))
        key = hashlib.sha256(self.label.encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        self.write_dir = Path(spool or spool_option or os.environ.get("RTVIRT_SPOOL") or
                              cache / "rtvirt" / "spool" / key)
        self._connection: Any = None
        self._campaigns_ready = False
        self._delivered_live: set[str] = set()  # runs this process delivered as they ended

    # -- connection -------------------------------------------------------------------------------------------
    def _scrub(self, text: object) -> str:
        text = " ".join(str(text).split())[:400]
        return text.replace(self._secret, "***") if self._secret else text

    def _connect(self) -> Any:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        import psycopg  # only where a shared store is used: the CLI starts without it

        try:
            self._connection = psycopg.connect(self._conninfo, connect_timeout=_CONNECT_TIMEOUT_S,
                                               application_name="rtvirt")
        except psycopg.ProgrammingError as exc:  # a malformed URL or option
            raise InputError(f"results store {self.label}: not a valid PostgreSQL URL ({self._scrub(exc)})") \
                from None
        except psycopg.OperationalError as exc:
            message = self._scrub(exc)
            if any(word in message for word in _AUTH_WORDS):
                raise InputError(f"results store {self.label}: access refused ({message})") from None
            raise StoreUnavailable(f"results store {self.label}: unreachable ({message})") from None
        try:
            self._ensure_schema()
        except psycopg.Error as exc:  # e.g. a role that may read but not create the catalog of a new store
            self.close()
            raise InputError(f"results store {self.label}: cannot create its catalog ({self._scrub(exc)})") \
                from None
        self._connection.read_only = self.read_only
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def check(self) -> None:
        """Connect now (and create the catalog table if this is a new store): bad URLs and refused credentials
        are told before any measuring starts. The connection is not kept: a delivery hours later (after a
        server restart) connects afresh."""
        self._connect()
        self.close()

    def _ensure_schema(self) -> None:
        from psycopg import sql

        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind)) for name, kind in COLUMNS.items()
            if name != "run_id")
        found = self._connection.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()
        self._connection.commit()
        if found is not None and found[0] is not None:
            self._upgrade()
            return  # an existing store: readers need no right to create anything
        with self._connection.transaction():
            self._connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            self._connection.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (run_id text PRIMARY KEY, {}, files text NOT NULL, "
                "manifest_sha256 text NOT NULL, manifest jsonb NOT NULL, "
                "delivered timestamptz NOT NULL DEFAULT now())").format(sql.Identifier(TABLE), columns))
            self._indexes()

    def _indexes(self) -> None:
        from psycopg import sql

        self._connection.execute(sql.SQL(
            "CREATE INDEX IF NOT EXISTS {} ON {} ((coalesce(config, name)), machine, created)").format(
            sql.Identifier(f"{TABLE}_history"), sql.Identifier(TABLE)))
        self._connection.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (identity, machine, created)").format(
            sql.Identifier(f"{TABLE}_identity"), sql.Identifier(TABLE)))

    def _upgrade(self) -> None:
        """Bring a catalog an older rtvirt created up to COLUMNS: the columns it lacks (units, identity, the
        statistics in the run's unit) are added and every row's columns recomputed from its manifest (which
        also empties the *_ns columns of runs whose values are not times). Once, by the first writer or reader
        allowed to alter the table; others wait for it on the schema lock."""
        from psycopg import sql

        def missing() -> list[str]:
            present = {row[0] for row in self._connection.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                "AND NOT attisdropped", (TABLE,)).fetchall()}
            return [name for name in COLUMNS if name not in present]

        if not missing():
            self._connection.commit()
            return
        with self._connection.transaction():
            self._connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            lacking = missing()  # another process may have upgraded it while this one waited
            for name in lacking:
                self._connection.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    sql.Identifier(TABLE), sql.Identifier(name), sql.SQL(COLUMNS[name])))
            if lacking:
                assignments = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(name))
                                                 for name in COLUMNS if name != "run_id")
                update = sql.SQL("UPDATE {} SET {} WHERE run_id = %s").format(sql.Identifier(TABLE), assignments)
                rows = [run_row(json.loads(manifest)) for (manifest,) in
                        self._connection.execute(f"SELECT manifest::text FROM {TABLE}").fetchall()]
                with self._connection.cursor() as cursor:
                    cursor.executemany(update, [[*(v for k, v in row.items() if k != "run_id"), row["run_id"]]
                                                for row in rows])
                self._indexes()
        # the query of missing() opened the transaction the block above ran in (as a savepoint): end it, so the
        # connection can be made read-only (the live view's) and its later work starts afresh
        self._connection.commit()

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        import psycopg

        connection = self._connect()
        try:
            with connection.cursor() as cursor:
                yield cursor
            connection.commit()
        except psycopg.OperationalError as exc:
            self.close()
            raise StoreUnavailable(f"results store {self.label}: lost ({self._scrub(exc)})") from None
        except psycopg.Error as exc:
            connection.rollback()
            raise InputError(f"results store {self.label}: {self._scrub(exc)}") from None

    # -- reading ----------------------------------------------------------------------------------------------
    def list_runs(self) -> list[StoredRun]:
        from ..store import StoredRun

        with self._cursor() as cursor:
            cursor.execute(f"SELECT files, manifest::text FROM {TABLE} ORDER BY created, run_id")
            return [StoredRun(self.data / files, json.loads(manifest)) for files, manifest in cursor.fetchall()]

    def find_run(self, run_id: str) -> StoredRun | None:
        from ..store import StoredRun

        with self._cursor() as cursor:
            cursor.execute(f"SELECT files, manifest::text FROM {TABLE} WHERE run_id = %s", (run_id,))
            found = cursor.fetchone()
        return None if found is None else StoredRun(self.data / found[0], json.loads(found[1]))

    def rows(self, *, config: str | None = None, machine: str | None = None,
             identity: str | None = None) -> list[dict[str, Any]]:
        names = list(COLUMNS)
        # only the filters given: a plan that uses the (configuration, machine, created) or (identity, machine,
        # created) index
        where = [clause for clause, value in (("coalesce(config, name) = %(config)s", config),
                                              ("identity = %(identity)s", identity),
                                              ("machine = %(machine)s", machine)) if value is not None]
        with self._cursor() as cursor:
            cursor.execute(f"SELECT {', '.join(names)} FROM {TABLE} "
                           + (f"WHERE {' AND '.join(where)} " if where else "") + "ORDER BY created, run_id",
                           {"config": config, "machine": machine, "identity": identity})
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def runs_table(self, manifests: bool = True) -> Any:
        """Every run's catalog row, its directory and manifest (JSON text; NULL unless ``manifests``) as an
        Arrow table, straight from the catalog's columns (no manifest parsed)."""
        import pyarrow as pa

        names = [*COLUMNS, "path", "manifest"]
        manifest = "manifest::text" if manifests else "NULL::text"
        with self._cursor() as cursor:
            cursor.execute(f"SELECT {', '.join(COLUMNS)}, %s || '/' || files, {manifest} FROM {TABLE} "
                           "ORDER BY created, run_id", (str(self.data),))
            columns = list(zip(*cursor.fetchall(), strict=True)) or [()] * len(names)
        kinds = {"text": pa.string(), "bigint": pa.int64(), "double precision": pa.float64()}
        types = [kinds[kind] for kind in COLUMNS.values()] + [pa.string(), pa.string()]
        return pa.table({name: pa.array(values, kind) for name, values, kind in zip(names, columns, types,
                                                                                  strict=True)})

    # -- writing ----------------------------------------------------------------------------------------------
    def _place_files(self, run: StoredRun) -> str:
        """Copy the run directory into DATA/runs/<run_id> (complete or not at all); its path under DATA."""
        relative = f"runs/{run.run_id}"
        target = self.data / relative
        if (target / "manifest.json").is_file():
            return relative  # an earlier delivery copied it and then lost the server before its insert
        incoming = self.data / "incoming" / f"{run.run_id}.{secrets.token_hex(4)}"
        try:
            (self.data / "runs").mkdir(parents=True, exist_ok=True)
            shutil.copytree(run.path, incoming)
            try:
                os.rename(incoming, target)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                shutil.rmtree(incoming)  # another deliverer placed the same run first
        except OSError as exc:
            shutil.rmtree(incoming, ignore_errors=True)
            raise StoreUnavailable(f"results store {self.label}: cannot write {self.data} ({exc.strerror})") \
                from None
        return relative

    def _insert(self, run: StoredRun, files: str) -> bool:
        """Insert the run's row; False when the run was delivered before."""
        from psycopg.types.json import Jsonb

        row = run_row(run.manifest)
        digest = content_sha256(run.manifest)
        names = [*COLUMNS, "files", "manifest_sha256", "manifest"]
        values = [*row.values(), files, digest, Jsonb(run.manifest)]
        with self._cursor() as cursor:
            cursor.execute(f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))}) "
                           "ON CONFLICT (run_id) DO NOTHING RETURNING run_id", values)
            if cursor.fetchone() is not None:
                return True
            cursor.execute(f"SELECT manifest_sha256 FROM {TABLE} WHERE run_id = %s", (run.run_id,))
            stored = cursor.fetchone()
        if stored is not None and stored[0] != digest:
            raise InputError(f"run {run.run_id}: the store {self.label} holds another run with this id")
        return False

    def deliver(self, keep: bool = False) -> Delivery:
        """Deliver every finished run of the spool (one with a manifest), oldest first; delivered runs leave the
        spool. Safe to repeat and to run on several machines at once.

        ``keep``: a campaign delivering each run as it ends (so a machine that dies later loses none of them):
        the delivered runs' spool copies stay, marked, because the campaign's report is written from the spool;
        the delivery at the command's end removes them."""
        from ..store import list_runs

        delivery = Delivery()
        if not (self.write_dir / "runs").is_dir():
            return delivery
        with (self.write_dir / ".deliver.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two commands of one machine deliver its spool in turn
            pending = list_runs(self.write_dir)
            for index, run in enumerate(pending):
                if (run.path / DELIVERED_MARK).exists():  # delivered as its run ended: only the copy is left
                    if not keep:
                        (delivery.delivered if run.run_id in self._delivered_live else delivery.already).append(
                            run.run_id)
                        shutil.rmtree(run.path, ignore_errors=True)
                    continue
                try:
                    inserted = self._insert(run, self._place_files(run))
                except StoreUnavailable as exc:
                    delivery.error = str(exc)
                    delivery.kept = [r.run_id for r in pending[index:] if not (r.path / DELIVERED_MARK).exists()]
                    return delivery
                (delivery.delivered if inserted else delivery.already).append(run.run_id)
                if keep:
                    (run.path / DELIVERED_MARK).touch()
                    self._delivered_live.add(run.run_id)
                else:
                    shutil.rmtree(run.path, ignore_errors=True)
        return delivery

    # -- live view: campaigns' progress, and the page's own queries ---------------------------------------------
    def publish_campaign(self, record: dict[str, Any]) -> None:
        """Insert or replace one campaign's row (``record``: rtvirt.live.progress.campaign_record)."""
        from psycopg.types.json import Jsonb

        with self._cursor() as cursor:
            if not self._campaigns_ready:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                cursor.execute(
                    f"CREATE TABLE IF NOT EXISTS {CAMPAIGNS} (campaign_id text PRIMARY KEY, machine text NOT NULL, "
                    "scenario text, finished boolean NOT NULL, updated timestamptz NOT NULL, document jsonb NOT NULL)")
                cursor.execute(f"CREATE INDEX IF NOT EXISTS {CAMPAIGNS}_recent ON {CAMPAIGNS} (machine, updated)")
                self._campaigns_ready = True
            cursor.execute(
                f"INSERT INTO {CAMPAIGNS} (campaign_id, machine, scenario, finished, updated, document) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (campaign_id) DO UPDATE SET machine = EXCLUDED.machine, "
                "scenario = EXCLUDED.scenario, finished = EXCLUDED.finished, updated = EXCLUDED.updated, "
                "document = EXCLUDED.document",
                (record["campaign_id"], record["machine"], record["scenario"], record["finished"],
                 record["updated"], Jsonb(record)))

    def fetch(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement on the catalog (the live view pushes its questions here rather
        than fetching every row); values reach SQL as parameters only."""
        with self._cursor() as cursor:
            cursor.execute(statement, params)
            return list(cursor.fetchall())

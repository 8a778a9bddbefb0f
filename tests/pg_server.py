"""A real PostgreSQL server for tests: Debian's initdb/pg_ctl run from a temporary directory, listening on
127.0.0.1:<free port> (and a socket in that directory), with one password-protected role. As root, the server
runs as the ``postgres`` system user (initdb refuses root). ``stop()`` stops it and removes the directory::

    with PgServer() as server:
        url = server.url(data=tmp_path / "store")   # postgresql://rtvirt@127.0.0.1:PORT/store1?data=…
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from rtvirt.environments.lab_machine import free_port

USER = "rtvirt"
PASSWORD = "s3cret-Pw"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (scripts/setup.sh installs postgresql)")
    return found[-1]


class PgServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rtvirt-pg-"))
        self.port = free_port()
        self._databases = 0
        self._as_root = os.geteuid() == 0

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["runuser", "-u", "postgres", "--", *argv] if self._as_root else list(argv)
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=check)

    def start(self) -> PgServer:
        if self._as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        password_file = self.dir / "pw"
        password_file.write_text(PASSWORD + "\n")
        if self._as_root:
            shutil.chown(password_file, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.dir / "data"), "-U", USER, "--pwfile", str(password_file),
                  "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--no-sync")
        (self.dir / "data" / "postgresql.auto.conf").write_text(
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.dir}'\n"
            "fsync = off\nmax_connections = 50\nshared_buffers = 32MB\n")
        self.resume()
        return self

    def resume(self) -> None:
        """(Re)start the server on the same port and data."""
        self._run(_bin("pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w", "-t", "60",
                  "start")

    def pause(self) -> None:
        """Stop the server (fast: open connections are cut), keeping its data."""
        self._run(_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop", check=False)

    def create_database(self) -> str:
        """A new, empty database: each store of a test gets its own catalog."""
        self._databases += 1
        name = f"store{self._databases}"
        subprocess.run([_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", "postgres", "-qc",
                        f"CREATE DATABASE {name}"], env=self.env(), check=True, capture_output=True, timeout=60)
        return name

    def url(self, data: Path, user: str = USER, password: str | None = None, database: str | None = None,
            **options: str) -> str:
        """The URL of a store whose files go to ``data``; its catalog is a new database unless ``database``."""
        secret = f":{password}" if password else ""
        query = "&".join([f"data={data}", *(f"{k}={v}" for k, v in options.items())])
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database or self.create_database()}?{query}"

    def env(self) -> dict[str, str]:
        """The environment a user of the store has: the password where libpq looks for it."""
        return {**os.environ, "PGPASSWORD": PASSWORD}

    def stop(self) -> None:
        self.pause()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

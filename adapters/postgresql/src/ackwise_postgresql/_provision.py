"""Private PostgreSQL clusters for the conformance suite (entry point, loaded by it only).

Registered under ``ackwise.conformance.provisioners`` in this package's ``pyproject.toml``;
nothing in ``ackwise_postgresql`` imports this module, so the adapter never imports the suite.

``initdb`` makes the cluster on first start; ``postgres`` runs it on the slot's port, with a
Unix socket in the cluster's directory.  PostgreSQL refuses to run as root: as root, the
cluster lives in a directory of the ``postgres`` user outside the suite's private temporary
directory (which that user cannot enter), removed when the process exits.  The server runs
under :mod:`ackwise_postgresql._pg_runner`, which makes the suite's SIGTERM a fast shutdown.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from ackwise_conformance.provisioning import (
    BrokerUnavailable,
    LocalServer,
    Provisioner,
    Slot,
)

__all__ = ["PostgreSQLProvisioner"]

_made: list[Path] = []


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise BrokerUnavailable(f"{name} is not on PATH nor in /usr/lib/postgresql/*/bin")
    return found


def _cleanup() -> None:
    for path in _made:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_cleanup)


class PostgreSQLProvisioner(Provisioner):
    name = "postgresql"
    ready_timeout = 30.0
    stop_timeout = 20.0

    def local(self, slot: Slot) -> LocalServer:
        if slot.config:
            raise BrokerUnavailable("the postgresql provisioner takes no configuration lines")
        initdb, postgres = _binary("initdb"), _binary("postgres")
        as_root = os.geteuid() == 0
        data = slot.data_dir / "pgdata"
        if as_root:
            key = hashlib.sha1(str(slot.data_dir).encode()).hexdigest()[:12]
            data = Path(tempfile.gettempdir()) / f"ackwise-pg-{key}"
        if not (data / "PG_VERSION").exists():
            data.mkdir(parents=True, exist_ok=True)
            prefix: list[str] = []
            if as_root:
                shutil.chown(data, "postgres", "postgres")
                _made.append(data)
                setpriv = shutil.which("setpriv")
                if setpriv is None:
                    raise BrokerUnavailable("running as root, and setpriv is not on PATH")
                prefix = [setpriv, "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
            init = subprocess.run(
                [*prefix, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                capture_output=True,
                text=True,
                check=False,
            )
            if init.returncode != 0:
                raise BrokerUnavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
        # fsync off for a broker the suite never restarts (a restart test asks for durable).
        durability = (
            ["-c", "fsync=on", "-c", "synchronous_commit=on"]
            if slot.durable
            else ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        )
        argv = [
            sys.executable, "-m", "ackwise_postgresql._pg_runner", str(data), "--",
            postgres,
            "-D", str(data),
            "-p", str(slot.port),
            "-c", f"listen_addresses={slot.host}",
            "-c", f"unix_socket_directories={data}",
            "-c", "max_connections=200",
            *durability,
        ]  # fmt: skip
        return LocalServer(argv=argv, url=f"postgresql://postgres@{slot.host}:{slot.port}/postgres")

    def ready(self, host: str, port: int) -> bool:
        """True when the server accepts a session (not "the database system is starting up")."""
        try:
            with psycopg.connect(
                f"postgresql://postgres@{host}:{port}/postgres", connect_timeout=2
            ) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

"""Shared fixtures for floe's Iceberg interop tests.

Run with the test venv made by scripts/test-env.sh:

    scripts/test-env.sh install && scripts/test-env.sh start
    eval "$(scripts/test-env.sh env)"
    FLOE_BIN=target/debug/floe "$FLOE_TEST_PYTHON" -m pytest -p no:cacheprovider tests/interop

Environment:
    FLOE_BIN            path to the floe binary (required)
    FLOE_REST_URI       Iceberg REST catalog (default http://127.0.0.1:8181)
    FLOE_S3_ENDPOINT    S3 endpoint (default http://127.0.0.1:8333)
    FLOE_TEST_TIMEOUT   seconds one floe invocation may take (default 300)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pytest

REST_URI = os.environ.get("FLOE_REST_URI", "http://127.0.0.1:8181")
S3_ENDPOINT = os.environ.get("FLOE_S3_ENDPOINT", "http://127.0.0.1:8333")
REST_WAREHOUSE = "s3://warehouse"
REST_CREDENTIAL = "admin:adminsecret"
S3_ACCESS_KEY = "admin"
S3_SECRET_KEY = "adminsecret"
S3_REGION = "us-east-1"
START_SERVERS_MSG = "start the test servers: scripts/test-env.sh install && scripts/test-env.sh start"
FLOE_TIMEOUT_S = float(os.environ.get("FLOE_TEST_TIMEOUT", "300"))


# --------------------------------------------------------------------------- floe runner


class FloeError(AssertionError):
    pass


def _floe_bin() -> Path:
    raw = os.environ.get("FLOE_BIN")
    if not raw:
        pytest.fail(
            "FLOE_BIN is not set: point it at the floe binary, e.g. "
            "FLOE_BIN=$PWD/target/debug/floe",
            pytrace=False,
        )
    path = Path(raw).expanduser().resolve()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"FLOE_BIN={raw!r}: no executable file at {path}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def floe_bin() -> Path:
    return _floe_bin()


def parse_ndjson(stdout: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise FloeError(f"floe stdout line {n} is not JSON ({e}): {line!r}\n--- stdout ---\n{stdout}")
        if not isinstance(row, dict):
            raise FloeError(f"floe stdout line {n} is not a JSON object: {line!r}")
        rows.append(row)
    return rows


def _describe(cmd: list[str], sql: Sequence[str]) -> str:
    stmts = "\n".join(f"  -c {s}" for s in sql)
    return f"$ {shlex.join(cmd[: len(cmd) - 2 * len(sql)])} \\\n{stmts}"


def run_floe_in(floe: Path, cwd: Path, *sql: str) -> list[dict[str, Any]]:
    """Run `floe -q --format ndjson -c SQL -c SQL ...` in one session; return result rows."""
    cmd = [str(floe), "-q", "--format", "ndjson"]
    for s in sql:
        cmd += ["-c", s]
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=FLOE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise FloeError(
            f"floe timed out after {FLOE_TIMEOUT_S}s\n{_describe(cmd, sql)}\n"
            f"--- stdout ---\n{e.stdout}\n--- stderr ---\n{e.stderr}"
        )
    if proc.returncode != 0:
        raise FloeError(
            f"floe exited with {proc.returncode}\n{_describe(cmd, sql)}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return parse_ndjson(proc.stdout)


@pytest.fixture
def run_floe(floe_bin: Path, tmp_path: Path) -> Callable[..., list[dict[str, Any]]]:
    """run_floe(*sql) -> rows. Runs in tmp_path so any state floe keeps in the cwd stays there."""
    workdir = tmp_path / "floe-cwd"
    workdir.mkdir(exist_ok=True)

    def run(*sql: str) -> list[dict[str, Any]]:
        return run_floe_in(floe_bin, workdir, *sql)

    return run


# --------------------------------------------------------------------------- SQL helpers


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def sql_literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return sql_str(v)
    if isinstance(v, dt.datetime):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    raise TypeError(f"no SQL literal for {v!r}")


def sql_values(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    return ", ".join("(" + ", ".join(sql_literal(r[c]) for c in columns) + ")" for r in rows)


def options_sql(props: dict[str, str]) -> str:
    """A WITH (...) option bag's body: 'key' = 'value', ..."""
    return ", ".join(f"{sql_str(k)} = {sql_str(v)}" for k, v in props.items())


# --------------------------------------------------------------------------- catalogs


@dataclass
class SqlLake:
    """A sqlite-backed Iceberg SQL catalog named `name`, shared by floe and pyiceberg."""

    root: Path
    name: str = "lake"

    @property
    def db(self) -> Path:
        return self.root / "catalog.db"

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse"

    def ddl(self) -> str:
        props = {
            "type": "iceberg",
            "catalog-type": "sql",
            "uri": f"sqlite:{self.db}",
            "warehouse": str(self.warehouse),
        }
        return f"CREATE CATALOG {self.name} WITH ({options_sql(props)})"

    def pyiceberg(self):
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(
            self.name,
            uri=f"sqlite:///{self.db}",
            warehouse=f"file://{self.warehouse}",
        )


@pytest.fixture
def lake(tmp_path: Path) -> SqlLake:
    root = tmp_path / "lake"
    (root / "warehouse").mkdir(parents=True)
    return SqlLake(root=root.resolve())


@pytest.fixture
def run_lake(run_floe, lake: SqlLake) -> Callable[..., list[dict[str, Any]]]:
    """Like run_floe, with the sqlite catalog declared first (catalogs are session state)."""

    def run(*sql: str) -> list[dict[str, Any]]:
        return run_floe(lake.ddl(), *sql)

    return run


@pytest.fixture
def duck(tmp_path: Path):
    import duckdb
    import duckdb_extensions

    # Extensions come from the duckdb-extension-* wheels; a private extension directory keeps
    # ~/.duckdb untouched, and autoinstall off stops any attempt to download.
    con = duckdb.connect(
        config={
            "extension_directory": str(tmp_path / "duckdb-ext"),
            "autoinstall_known_extensions": False,
        }
    )
    # iceberg needs avro for manifests: install and load both explicitly.
    for ext in ("avro", "iceberg"):
        duckdb_extensions.import_extension(ext, con=con)
        con.execute(f"LOAD {ext}")
    yield con
    con.close()


MOTO_URI = os.environ.get("FLOE_MOTO", "http://127.0.0.1:5000")
MOTO_REGION = "us-east-1"
MOTO_KEY = "testing"


def glue_client():
    """boto3's Glue client on moto (the Data Catalog and the Schema Registry)."""
    import boto3

    return boto3.client(
        "glue",
        endpoint_url=MOTO_URI,
        region_name=MOTO_REGION,
        aws_access_key_id=MOTO_KEY,
        aws_secret_access_key=MOTO_KEY,
    )


def rest_catalog_props() -> dict[str, str]:
    return {
        "uri": REST_URI,
        "warehouse": REST_WAREHOUSE,
        "credential": REST_CREDENTIAL,
        "s3.endpoint": S3_ENDPOINT,
        "s3.access-key-id": S3_ACCESS_KEY,
        "s3.secret-access-key": S3_SECRET_KEY,
        "s3.region": S3_REGION,
        "s3.path-style-access": "true",
    }


def drop_rest_namespace(catalog, ns: str, tables: Sequence[str]) -> None:
    """Best effort: purge `tables` of namespace `ns` and drop it (the REST server is shared
    between runs; names are unique anyway)."""
    for table in tables:
        try:
            catalog.purge_table((ns, table))
        except Exception:
            pass
    try:
        catalog.drop_namespace(ns)
    except Exception:
        pass


def rest_catalog_ddl(name: str = "rest") -> str:
    props = {"type": "iceberg", "catalog-type": "rest", **rest_catalog_props()}
    return f"CREATE CATALOG {name} WITH ({options_sql(props)})"


def rest_server_answers() -> bool:
    try:
        with urllib.request.urlopen(f"{REST_URI}/v1/config", timeout=3) as resp:
            return resp.status == 200
    except Exception:
        return False


def require_rest_server() -> None:
    """Fail (never skip) when the SeaweedFS REST catalog is not running."""
    if not rest_server_answers():
        pytest.fail(START_SERVERS_MSG, pytrace=False)


@pytest.fixture
def rest_catalog_factory() -> Callable[[], Any]:
    """Returns a function building a pyiceberg RestCatalog on the SeaweedFS server.

    Lazy, so that a missing server fails inside the test (FAILED, not a setup ERROR)."""

    def make():
        require_rest_server()
        from pyiceberg.catalog.rest import RestCatalog

        # pyiceberg warns unless the token endpoint is given explicitly.
        return RestCatalog(
            "rest", **rest_catalog_props(), **{"oauth2-server-uri": f"{REST_URI}/v1/oauth/tokens"}
        )

    return make


# --------------------------------------------------------------------------- value comparison


def norm_ts(v: Any) -> dt.datetime | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = dt.datetime.fromisoformat(v.strip().replace(" ", "T", 1))
    if not isinstance(v, dt.datetime):
        raise AssertionError(f"not a timestamp: {v!r}")
    if v.tzinfo is not None:
        v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return v


def norm_date(v: Any) -> dt.date | None:
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        return v.date()
    if isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        return dt.date.fromisoformat(v.strip()[:10])
    raise AssertionError(f"not a date: {v!r}")


def norm_float(v: Any) -> float | None:
    return None if v is None else float(v)


def norm_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, str):  # some JSON writers quote 64-bit ints
        return int(v)
    return int(v)


def norm_str(v: Any) -> str | None:
    return None if v is None else str(v)


NORMALIZERS = {
    "long": norm_int,
    "int": norm_int,
    "string": norm_str,
    "double": norm_float,
    "timestamp": norm_ts,
    "date": norm_date,
}


def normalize_rows(
    rows: Iterable[dict[str, Any]], types: dict[str, str], sort_by: str | None = "id"
) -> list[dict[str, Any]]:
    """Project rows to `types`' columns, normalizing values; a missing key means NULL."""
    out = [{c: NORMALIZERS[t](r.get(c)) for c, t in types.items()} for r in rows]
    if sort_by is not None:
        out.sort(key=lambda r: r[sort_by])
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_text(port: int) -> str:
    """floe's Prometheus metrics served on `port` (`--metrics`), or "" when not answering."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except Exception:
        return ""


class MetricsJob:
    """`floe -q --metrics ADDR -f script` running in `cwd`, with its Prometheus metrics at hand.

    Use as a context manager: a floe still running at the end is killed."""

    def __init__(self, floe_bin: Path, script: Path, cwd: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(floe_bin), "-q", "--metrics", f"127.0.0.1:{self.port}", "-f", str(script)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def metrics(self) -> str:
        return metrics_text(self.port)

    def wait_for(self, text: str, timeout: float) -> None:
        """Until the metrics contain `text`; fails if floe exits first or time runs out."""
        import time

        deadline = time.time() + timeout
        while text not in self.metrics():
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.time() < deadline, f"no {text!r} in the metrics after {timeout} s:\n{self.metrics()}"
            time.sleep(0.1)

    def finish(self, timeout: float) -> None:
        """Wait for floe to end, and fail unless it exited 0."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"floe failed:\n{out}\n{err}"

    def __enter__(self) -> "MetricsJob":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def paused_before_commit(floe_bin: Path, lake: "SqlLake", workdir: Path, sql: str) -> subprocess.Popen:
    """floe running `sql` (after `lake`'s DDL) with FLOE_PAUSE: returned once it has
    stopped for 3 s before its commit (a maintenance procedure's or a DML statement's)."""
    proc = subprocess.Popen(
        [str(floe_bin), "-q", "--format", "ndjson", "-c", lake.ddl(), "-c", sql],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FLOE_PAUSE": "maintenance-commit:3000"},
    )
    seen = []
    while not seen or "paused at maintenance-commit" not in seen[-1]:
        line = proc.stderr.readline()
        assert line, f"floe did not pause before its commit: {seen}"
        seen.append(line)
    return proc

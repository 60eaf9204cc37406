"""`floe serve`: psql and psycopg (the extended protocol) drive a server that owns its jobs:
DDL, queries, parameters, errors that leave the connection usable, a cancel, jobs that run on
after their client disconnects and resume after the server is killed, exactly once (checked
through pyiceberg)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from conftest import SqlLake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FloeServer:
    """`floe serve` on a free loopback port, its state in `state`; started and killed at will."""

    def __init__(self, floe_bin: Path, workdir: Path, *args: str, host: str = "127.0.0.1"):
        self.floe_bin = floe_bin
        self.workdir = workdir
        self.args = args
        self.host = host
        self.state = workdir / "server-state"
        self.port = free_port()
        self.dashboard = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "server.log"

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [str(self.floe_bin), "serve", "--listen", f"{self.host}:{self.port}",
                 "--state-dir", str(self.state), "--dashboard", f"{self.host}:{self.dashboard}",
                 *self.args],
                cwd=self.workdir, stdout=log, stderr=log,
            )
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.proc.poll() is None, f"floe serve exited: {self.log.read_text()}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"floe serve did not listen: {self.log.read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def connect(self, **kw) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="floe", dbname="floe",
                               autocommit=kw.pop("autocommit", True), **kw)

    def psql(self, *args: str, input: str | None = None, password: str | None = None,
             user: str = "floe", sslmode: str = "prefer") -> subprocess.CompletedProcess:
        env = {**os.environ, "PGCONNECT_TIMEOUT": "10", "PGSSLMODE": sslmode}
        if password is not None:
            env["PGPASSWORD"] = password
        return subprocess.run(
            ["psql", "-X", "-w", "-h", "127.0.0.1", "-p", str(self.port), "-U", user, "floe",
             *args],
            input=input, capture_output=True, text=True, timeout=120, env=env,
        )


@pytest.fixture
def server(floe_bin: Path, tmp_path: Path):
    s = FloeServer(floe_bin, tmp_path)
    s.start()
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.kill()


def rows(conn: psycopg.Connection, sql: str, params=None) -> list[tuple]:
    """The rows of `sql` (none for a statement without rows)."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def test_psql_runs_ddl_queries_and_an_error_leaves_the_session_usable(
    server: FloeServer, lake: SqlLake
):
    script = f"""
{lake.ddl()};
CREATE SCHEMA lake.shop;
CREATE TABLE lake.shop.orders (id BIGINT NOT NULL, customer STRING, amount DECIMAL(10, 2),
  paid BOOLEAN, ts TIMESTAMP);
INSERT INTO lake.shop.orders VALUES (1, 'ann', 19.99, true, TIMESTAMP '2024-05-01 09:15:00'),
  (2, 'bob', 5.00, false, NULL);
SELECT * FROM lake.shop.nope;
SELECT id, customer, amount, paid, ts FROM lake.shop.orders ORDER BY id;
"""
    out = server.psql("--csv", "-f", "-", input=script)
    assert out.returncode == 0, out.stderr
    # The bad statement is an error naming the table; the next statement still runs.
    assert "ERROR:" in out.stderr and "nope" in out.stderr, out.stderr
    assert "id,customer,amount,paid,ts\n1,ann,19.99,t,2024-05-01 09:15:00\n2,bob,5.00,f,\n" in out.stdout, out.stdout
    # Written through the server, read by another Iceberg implementation.
    table = lake.pyiceberg().load_table("shop.orders")
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2]
    # The catalog outlives the connection: a new psql sees it.
    again = server.psql("--csv", "-c", "SELECT count(*) AS n FROM lake.shop.orders")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "n\n2\n", again.stdout
    # Several statements in one query; an error stops the rest with SQLSTATE shown.
    multi = server.psql("-v", "VERBOSITY=verbose", "-c", "SELECT 1 AS a; SELEC 2; SELECT 3 AS c")
    assert "42601" in multi.stderr, multi.stderr


def test_psycopg_binds_parameters_and_errors_carry_sqlstate(server: FloeServer, lake: SqlLake):
    with server.connect() as conn:
        rows(conn, lake.ddl())
        rows(conn, "CREATE SCHEMA lake.s")
        rows(conn, "CREATE TABLE lake.s.t (id BIGINT, name STRING, score DOUBLE)")
        with conn.cursor() as cur:
            cur.execute("INSERT INTO lake.s.t VALUES (1, 'a', 1.5), (2, 'b''s', 2.5), (3, NULL, 0)")
        # Parameters of several types, bound as values (a quote is a character, not SQL).
        assert rows(conn, "SELECT id, name FROM lake.s.t WHERE name = %s", ("b's",)) == [(2, "b's")]
        assert rows(conn, "SELECT id FROM lake.s.t WHERE id > %s AND score < %s ORDER BY id",
                    (1, 3.0)) == [(2,), (3,)]
        assert rows(conn, "SELECT count(*) FROM lake.s.t WHERE name = %s OR name IS NULL",
                    ("x' OR '1'='1",)) == [(1,)]
        # A prepared statement, run again with other values.
        with conn.cursor() as cur:
            for k, want in [(1, "a"), (2, "b's")]:
                cur.execute("SELECT name FROM lake.s.t WHERE id = %s", (k,), prepare=True)
                assert cur.fetchone() == (want,)
        # Types come back as PostgreSQL types.
        (row,) = rows(conn, "SELECT CAST(1 AS INT) AS i, CAST(2.50 AS DECIMAL(5,2)) AS d, "
                            "DATE '2024-05-01' AS day, true AS b, 'x' AS s")
        import datetime, decimal
        assert row == (1, decimal.Decimal("2.50"), datetime.date(2024, 5, 1), True, "x"), row
        # An error carries its SQLSTATE and leaves the connection usable.
        with pytest.raises(psycopg.Error) as e:
            rows(conn, "SELECT * FROM lake.s.nope")
        assert e.value.sqlstate is not None and e.value.sqlstate.startswith("42"), e.value.sqlstate
        with pytest.raises(psycopg.errors.SyntaxError):
            rows(conn, "SELEC 1")
        assert rows(conn, "SELECT count(*) FROM lake.s.t") == [(3,)]
        # floe's own statements over the extended protocol.
        names = [r[0] for r in rows(conn, "SHOW CATALOGS")]
        assert "lake" in names, names
    # A client in transaction mode (psycopg's default) gets its BEGIN and COMMIT.
    with server.connect(autocommit=False) as conn:
        assert rows(conn, "SELECT count(*) FROM lake.s.t") == [(3,)]
        conn.commit()


def test_a_cancel_stops_only_the_running_query(server: FloeServer):
    with server.connect() as conn, server.connect() as other:
        errors = []

        def slow() -> None:
            try:
                rows(conn, "SELECT count(DISTINCT value % 1000003) FROM range(1, 2000000000)")
            except psycopg.Error as e:
                errors.append(e)

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(1.0)
        began = time.time()
        conn.cancel()
        t.join(timeout=60)
        assert not t.is_alive(), "the cancelled query did not end"
        assert time.time() - began < 30
        assert errors and isinstance(errors[0], psycopg.errors.QueryCanceled), errors
        # The cancelled connection and the other one go on.
        assert rows(conn, "SELECT 1") == [(1,)]
        assert rows(other, "SELECT 2") == [(2,)]


ORDERS = ("(order_id BIGINT, customer_id BIGINT, product STRING, quantity INT, price DOUBLE, "
          "region STRING, status STRING, order_time TIMESTAMP)")


def orders(conn: psycopg.Connection, table: str, source: str, options: str) -> None:
    """lake.s.`table`, with the columns of generated orders, and source `source` generating
    them with `options` (SQL, after the connector's)."""
    rows(conn, f"CREATE TABLE lake.s.{table} {ORDERS}")
    rows(conn, f"CREATE SOURCE {source} WITH ('connector' = 'datagen', 'profile' = 'orders', "
               f"{options})")


def start_job(conn: psycopg.Connection, name: str, table: str, source: str) -> str:
    with conn.cursor() as cur:
        cur.execute(f"SET 'pipeline.name' = '{name}'")
        cur.execute(f"INSERT INTO {table} SELECT * FROM {source}")
        return cur.statusmessage


def orders_job(server: FloeServer, lake: SqlLake, job: str, options: str,
               *settings: str) -> None:
    """The lake, lake.s.t and a source g of generated orders (`options`), and job `job`
    writing them to lake.s.t after `settings` (SET statements), started from a client that
    is gone when this returns."""
    with server.connect() as conn:
        rows(conn, lake.ddl())
        rows(conn, "CREATE SCHEMA lake.s")
        orders(conn, "t", "g", options)
        for s in settings:
            rows(conn, s)
        assert start_job(conn, job, "lake.s.t", "g") == f"job '{job}' started"


def jobs(conn: psycopg.Connection) -> dict[str, str]:
    return {r[0]: r[1] for r in rows(conn, "SELECT name, state FROM floe.jobs")}


def wait_for(what, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting: {what()}")


def test_jobs_outlive_their_client_and_resume_after_the_server_is_killed(
    server: FloeServer, lake: SqlLake
):
    n = 24_000
    with server.connect() as conn:
        rows(conn, lake.ddl())
        rows(conn, "CREATE SCHEMA lake.s")
        for t in ("a", "b"):
            orders(conn, t, f"g{t}", f"'number-of-rows' = '{n}', 'rows-per-second' = '2000'")
        rows(conn, "SET 'checkpoint.interval' = '300ms'")
        # A job returns at once with its name.
        assert start_job(conn, "ja", "lake.s.a", "ga") == "job 'ja' started"
        assert start_job(conn, "jb", "lake.s.b", "gb") == "job 'jb' started"
    # The client is gone; the jobs run on, seen from another client, which queries their
    # tables while they write.
    with server.connect() as conn:
        assert set(jobs(conn)) == {"ja", "jb"}
        wait_for(lambda: all(int(r[0]) > 0 for r in rows(
            conn, "SELECT records_out FROM floe.jobs")))
        seen = wait_for(lambda: rows(conn, "SELECT count(*) FROM lake.s.a")[0][0])
        assert 0 < seen < n, seen
    time.sleep(2)
    server.kill()
    server.start()
    with server.connect() as conn:
        # Both jobs were started again, from their last checkpoints, and run to their end.
        wait_for(lambda: jobs(conn) == {"ja": "finished", "jb": "finished"})
    catalog = lake.pyiceberg()
    for t in ("a", "b"):
        ids = catalog.load_table(f"s.{t}").scan().to_arrow().column("order_id").to_pylist()
        assert len(ids) == n and len(set(ids)) == n, (t, len(ids), len(set(ids)))
    # Done jobs are not started again.
    wait_for(lambda: not list((server.state / "jobs").iterdir()))
    assert server.stop() == 0


def test_a_job_stopped_by_a_client_is_not_resumed_until_resume_job(
    server: FloeServer, lake: SqlLake
):
    orders_job(server, lake, "forever", "'rows-per-second' = '500'")
    with server.connect() as conn:
        wait_for(lambda: jobs(conn).get("forever") == "running")
        with conn.cursor() as cur:
            cur.execute("STOP JOB forever")
            assert cur.statusmessage == "job 'forever' stopped", cur.statusmessage
    server.kill()
    server.start()
    with server.connect() as conn:
        # The catalog and the source are back; the stopped job is not.
        assert jobs(conn) == {}
        assert rows(conn, "SELECT count(*) > 0 FROM lake.s.t") == [(True,)]
        names = [r[0] for r in rows(conn, "SHOW SOURCES")]
        assert names == ["g"], names
        before = rows(conn, "SELECT count(*) FROM lake.s.t")[0][0]
        # RESUME JOB starts it again from its last checkpoint, with its own statements.
        with conn.cursor() as cur:
            cur.execute("RESUME JOB forever")
            assert cur.statusmessage == "job 'forever' started", cur.statusmessage
        wait_for(lambda: rows(conn, "SELECT count(*) FROM lake.s.t")[0][0] > before)
        # A running job is not resumed twice; RESTART JOB stops and starts it.
        with pytest.raises(psycopg.Error) as e:
            rows(conn, "RESUME JOB forever")
        assert "RESTART JOB" in str(e.value), e.value
        with conn.cursor() as cur:
            cur.execute("RESTART JOB forever")
            assert cur.statusmessage == "job 'forever' started", cur.statusmessage
        assert jobs(conn)["forever"] in ("starting", "running")
        with pytest.raises(psycopg.Error) as e:
            rows(conn, "RESUME JOB nope")
        assert e.value.sqlstate == "42704", e.value.sqlstate
    # Resumed, it is the server's again: a restart starts it.
    server.kill()
    server.start()
    with server.connect() as conn:
        wait_for(lambda: jobs(conn).get("forever") == "running")


def test_a_server_without_a_password_refuses_a_non_loopback_address(
    floe_bin: Path, tmp_path: Path
):
    env = {k: v for k, v in os.environ.items() if k != "FLOE_SERVER_PASSWORD"}
    out = subprocess.run([str(floe_bin), "serve", "--listen", "0.0.0.0:0", "--state-dir",
                          str(tmp_path / "s")], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode != 0
    assert "without a password" in out.stderr and "loopback" in out.stderr, out.stderr


def self_signed(dir: Path) -> tuple[Path, Path]:
    cert, key = dir / "server.crt", dir / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_a_password_is_checked_with_scram_and_tls_encrypts(floe_bin: Path, tmp_path: Path):
    secret = tmp_path / "password"
    secret.write_text("s3cret pass\n")
    cert, key = self_signed(tmp_path)
    # With a password the server may listen on every address.
    server = FloeServer(floe_bin, tmp_path, "--password-file", str(secret), "--tls-cert",
                        str(cert), "--tls-key", str(key), host="0.0.0.0")
    server.start()
    try:
        wrong = server.psql("-c", "SELECT 1", password="nope")
        assert wrong.returncode != 0
        assert "password authentication failed" in wrong.stderr.lower(), wrong.stderr
        stranger = server.psql("-c", "SELECT 1", password="s3cret pass", user="mallory")
        assert stranger.returncode != 0, stranger.stdout
        missing = server.psql("-c", "SELECT 1")
        assert missing.returncode != 0, missing.stdout
        for sslmode in ("require", "disable"):
            right = server.psql("--csv", "-c", "SELECT 41 + 1 AS n", password="s3cret pass",
                                sslmode=sslmode)
            assert right.returncode == 0, (sslmode, right.stderr)
            assert right.stdout == "n\n42\n", right.stdout
        # The dashboard takes the same login.
        dashboard = f"http://127.0.0.1:{server.dashboard}/api/state"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(dashboard, timeout=10)
        assert refused.value.code == 401
        token = base64.b64encode(b"floe:s3cret pass").decode()
        login = urllib.request.Request(dashboard, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(login, timeout=10) as r:
            assert json.load(r)["jobs"] == []
        with psycopg.connect(host="127.0.0.1", port=server.port, user="floe",
                             password="s3cret pass", dbname="floe", sslmode="require",
                             autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            assert rows(conn, "SELECT %s::BIGINT * 2", (21,)) == [(42,)]
    finally:
        server.kill()


ARTIFACTS = Path(__file__).parent / "artifacts"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "headless Chromium is not installed: run scripts/test-env.sh install"
    return found


def browse(url: str, *args: str) -> str:
    """What headless Chromium makes of `url` after its scripts ran for a while."""
    out = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=4000", *args, url],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def field(dom: str, job: str, name: str) -> str:
    m = re.search(rf'<td data-job="{re.escape(job)}" data-field="{name}"[^>]*>([^<]*)</td>', dom)
    assert m, f"no {name} of job {job} on the page:\n{dom[:3000]}"
    return m.group(1)


def test_the_dashboard_shows_the_jobs_with_their_rate_in_a_browser(
    server: FloeServer, lake: SqlLake
):
    orders_job(server, lake, "dash", "'rows-per-second' = '3000'",
               "SET 'checkpoint.interval' = '500ms'")
    with server.connect() as conn:
        wait_for(lambda: jobs(conn).get("dash") == "running")
    base = f"http://127.0.0.1:{server.dashboard}"

    def state() -> dict:
        with urllib.request.urlopen(base + "/api/state", timeout=10) as r:
            return json.load(r)

    # The API: the job, its history (a sample a second) and its checkpoints.
    s = wait_for(lambda: (lambda s: s if s["jobs"] and len(s["jobs"][0]["history"]) >= 3
                          and s["jobs"][0]["checkpoints"] and s["jobs"][0]["tables"]
                          else None)(state()), timeout=60)
    (job,) = s["jobs"]
    assert job["name"] == "dash" and job["state"] == "running", job
    outs = [h["records_out"] for h in job["history"]]
    assert outs == sorted(outs) and outs[-1] > outs[0], outs
    assert all(c["duration_ms"] >= c["commit_ms"] >= 0 for c in job["checkpoints"])
    assert job["tables"][0]["table"].endswith("s.t"), job["tables"]
    # The page, rendered by a browser: the job's figures, rising, and its rate plotted.
    first = browse(base + "/", "--dump-dom")
    assert field(first, "dash", "state") == "running"
    n1 = int(field(first, "dash", "records_out").replace(",", ""))
    assert int(field(first, "dash", "rate").replace(",", "")) > 0
    # The rate plot (the first) has the job's line; the lag plot has none (datagen has no lag).
    points = re.findall(r'<polyline data-job="dash" data-points="(\d+)"', first)
    assert len(points) == 2 and int(points[0]) >= 2 and points[1] == "0", (points, first[:3000])
    assert re.search(r'<rect data-job="dash" data-checkpoint="\d+"', first), "no checkpoint bars"
    assert 'data-table="' in first, "no table rows"
    time.sleep(2)
    second = browse(base + "/", "--dump-dom")
    n2 = int(field(second, "dash", "records_out").replace(",", ""))
    assert n2 > n1, (n1, n2)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    browse(base + "/", f"--screenshot={shot}", "--window-size=1000,1000")
    assert shot.exists() and shot.stat().st_size > 10_000, shot
    print(f"dashboard screenshot: {shot}")
    # Prometheus metrics are served here too.
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'floe_job_records_out_total{job="dash"}' in text, text

"""A catalog that goes away: a job writing to the REST catalog (SeaweedFS) keeps going while
the server is down -- `retrying` in its metrics -- and, once the server is back, ends with
every row exactly once (checked through pyiceberg).

The server is killed and restarted with its own command line and data, so the rest of the
suite finds it as it was.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from conftest import (
    MetricsJob,
    FLOE_TIMEOUT_S,
    REST_URI,
    rest_catalog_ddl,
    require_rest_server,
    rest_server_answers,
)

FLOE_TEST_HOME = Path(os.environ.get("FLOE_TEST_HOME", Path.home() / ".cache" / "floe-test"))
PIDFILE = FLOE_TEST_HOME / "weed.pid"
ROWS = 60_000


def _kill_server() -> tuple[list[str], dict[str, str], str]:
    """Kill SeaweedFS; return what it takes to start it again as it was."""
    pid = int(PIDFILE.read_text().strip())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    env_items = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
    env = dict(e.decode().split("=", 1) for e in env_items if b"=" in e)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    deadline = time.time() + 10
    while rest_server_answers() and time.time() < deadline:
        time.sleep(0.1)
    assert not rest_server_answers(), "SeaweedFS did not go away"
    return [a.decode() for a in argv], env, cwd


def _start_server(argv: list[str], env: dict[str, str], cwd: str) -> None:
    log = open(FLOE_TEST_HOME / "weed.log", "ab")
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=log, stderr=log, start_new_session=True
    )
    PIDFILE.write_text(f"{proc.pid}\n")
    deadline = time.time() + 60
    while not rest_server_answers() and time.time() < deadline:
        time.sleep(0.2)
    assert rest_server_answers(), "SeaweedFS did not come back"


def test_a_job_rides_out_a_catalog_outage(floe_bin: Path, tmp_path: Path, rest_catalog_factory):
    require_rest_server()
    ns = f"outage_{uuid.uuid4().hex[:10]}"
    script = tmp_path / "job.sql"
    script.write_text(
        f"""
        {rest_catalog_ddl("rest")};
        CREATE SCHEMA rest.{ns};
        CREATE TABLE rest.{ns}.orders (order_id BIGINT, region STRING);
        CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
          'number-of-rows' = '{ROWS}', 'rows-per-second' = '8000');
        SET 'pipeline.name' = 'outage'; SET 'checkpoint.interval' = '300ms';
        INSERT INTO rest.{ns}.orders SELECT order_id, region FROM gen;
        """
    )
    saw_retrying = False
    with MetricsJob(floe_bin, script, tmp_path) as job:
        # Wait for the first commits, then take the catalog away for a while.
        job.wait_for('floe_job_last_checkpoint{job="outage"} 2', timeout=30)
        argv, env, cwd = _kill_server()
        try:
            deadline = time.time() + 20
            while time.time() < deadline and not saw_retrying:
                saw_retrying = 'state="retrying"' in job.metrics()
                time.sleep(0.2)
        finally:
            _start_server(argv, env, cwd)
        job.finish(timeout=FLOE_TIMEOUT_S)
    assert saw_retrying, "the job never showed 'retrying' while the catalog was down"

    table = rest_catalog_factory().load_table(f"{ns}.orders")
    rows = table.scan().to_arrow()
    ids = rows.column("order_id").to_pylist()
    assert len(ids) == ROWS, f"{len(ids)} rows, expected {ROWS}"
    assert len(set(ids)) == ROWS, "duplicated rows"

"""A REST catalog's `header.*` options are sent with every request floe makes to it, by
iceberg-catalog-rest (loads, creates) and by floe's own committer (appends) alike, and are
masked in SHOW CATALOGS.

A small recording proxy stands between floe and the SeaweedFS REST catalog on 127.0.0.1: it
forwards each request and keeps the method, path and headers it saw."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
import uuid

from conftest import (
    REST_URI,
    options_sql,
    require_rest_server,
    rest_catalog_props,
)

HEADER = "X-Floe-Probe"


class _Recorder(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()


class _Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.seen.append(
                (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            )  # type: ignore[attr-defined]
        req = urllib.request.Request(REST_URI + self.path, data=body, method=self.command, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, data, reply = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as e:
            status, data, reply = e.code, e.read(), e.headers
        self.send_response(status)
        for k, v in reply.items():
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, *args) -> None:  # quiet
        pass


def test_rest_headers_reach_every_request_and_are_masked(run_floe):
    require_rest_server()
    proxy = _Recorder()
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        props = {
            "type": "iceberg",
            "catalog-type": "rest",
            **rest_catalog_props(),
            "uri": f"http://127.0.0.1:{proxy.server_address[1]}",
            f"header.{HEADER}": "probe-secret",
        }
        ddl = f"CREATE CATALOG rest WITH ({options_sql(props)})"
        ns = f"floe_hdr_{uuid.uuid4().hex[:12]}"
        run_floe(
            ddl,
            f"CREATE SCHEMA rest.{ns}",
            f"CREATE TABLE rest.{ns}.t (id BIGINT, s STRING)",
            f"INSERT INTO rest.{ns}.t VALUES (1, 'a'), (2, 'b')",
        )
        rows = run_floe(ddl, f"SELECT count(*) AS n FROM rest.{ns}.t", "SHOW CATALOGS")
        assert int(rows[0]["n"]) == 2, rows
        shown = str(rows[1:])
        assert "probe-secret" not in shown, shown
        assert f"header.{HEADER.lower()}=****" in shown.lower(), shown

        with proxy.lock:
            seen = list(proxy.seen)
        assert seen, "floe sent nothing through the proxy"
        missing = [(m, p) for m, p, h in seen if h.get(HEADER.lower()) != "probe-secret"]
        assert not missing, f"requests without {HEADER}: {missing}"
        # floe's own committer posts the append to the table itself.
        commits = [p for m, p, _ in seen if m == "POST" and p.rstrip("/").endswith(f"/namespaces/{ns}/tables/t")]
        assert commits, [(m, p) for m, p, _ in seen]
    finally:
        proxy.shutdown()
        proxy.server_close()

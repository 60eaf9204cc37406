#!/usr/bin/env python3
"""A test fixture that answers like a Confluent schema registry, for floe's tests and examples.

    schema-registry.py [--host 127.0.0.1] [--port 8081] [--user-info user:password]

No Confluent-compatible registry installs from the package registries this project may use, so
the tests serve the endpoints a producer and floe need from this small in-memory server:

    POST /subjects/<subject>/versions   {"schema": "..."}  ->  {"id": N}   (same schema, same id)
    GET  /schemas/ids/<id>                                  ->  {"schema": "..."}   or 404 40403
    GET  /subjects/<subject>/versions/latest                ->  {"subject", "version", "id", "schema"}
    GET  /subjects                                          ->  ["subject", ...]

With --user-info, every request needs that HTTP basic auth (401 otherwise). It is not a
registry: no compatibility checks, no persistence, no deletes.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.schemas: list[str] = []  # id - 1 -> schema text
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version

    def register(self, subject: str, schema: str) -> int:
        with self.lock:
            if schema in self.schemas:
                sid = self.schemas.index(schema) + 1
            else:
                self.schemas.append(schema)
                sid = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid


def handler(registry: Registry, user_info: str | None):
    expected = "Basic " + base64.b64encode(user_info.encode()).decode() if user_info else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def reply(self, code: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            if expected and self.headers.get("Authorization") != expected:
                self.reply(401, {"error_code": 401, "message": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            if not self.authorized():
                return
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if parts == ["subjects"]:
                return self.reply(200, sorted(registry.subjects))
            if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                sid = int(parts[2])
                if 1 <= sid <= len(registry.schemas):
                    return self.reply(200, {"schema": registry.schemas[sid - 1]})
                return self.reply(404, {"error_code": 40403, "message": "Schema not found"})
            if len(parts) == 4 and parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
                versions = registry.subjects.get(parts[1])
                if not versions:
                    return self.reply(404, {"error_code": 40401, "message": "Subject not found"})
                sid = versions[-1]
                return self.reply(
                    200,
                    {
                        "subject": parts[1],
                        "version": len(versions),
                        "id": sid,
                        "schema": registry.schemas[sid - 1],
                    },
                )
            self.reply(404, {"error_code": 404, "message": "Not found"})

        def do_POST(self) -> None:
            if not self.authorized():
                return
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                schema = body.get("schema")
                if not isinstance(schema, str):
                    return self.reply(422, {"error_code": 42201, "message": "Invalid schema"})
                return self.reply(200, {"id": registry.register(parts[1], schema)})
            self.reply(404, {"error_code": 404, "message": "Not found"})

    return Handler


def serve(host: str, port: int, user_info: str | None = None) -> ThreadingHTTPServer:
    """A running registry fixture (in a daemon thread); `.server_address` has its port."""
    server = ThreadingHTTPServer((host, port), handler(Registry(), user_info))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--user-info")
    args = ap.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), handler(Registry(), args.user_info))
    print(f"schema registry fixture on http://{args.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

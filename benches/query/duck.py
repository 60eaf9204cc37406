"""DuckDB's side of `cargo bench --bench query`: the queries of a file run over iceberg_scan of
a table's metadata, each once to warm up and then `repeat` times; prints a JSON line per
query: its name, its best time in seconds, and its rows (values as text; floats as numbers).

    python duck.py METADATA_JSON QUERIES_SQL REPEAT

Needs duckdb with the iceberg and avro extensions from the duckdb-extension-* wheels, as the
test environment installs them (scripts/test-env.sh install).
"""

import datetime as dt
import json
import sys
import tempfile
import time

import duckdb
import duckdb_extensions


def statements(text: str) -> list[tuple[str, str]]:
    """(name, sql) of each statement: its name is the `-- name ...` comment that starts it."""
    out, name, lines = [], None, []
    for line in text.splitlines():
        if line.startswith("--"):
            if not lines:
                name = line[2:].split()[0] if line[2:].split() else None
            continue
        if line.strip():
            lines.append(line)
        if line.rstrip().endswith(";"):
            out.append((name, "\n".join(lines).rstrip().rstrip(";")))
            name, lines = None, []
    return out


def value(v):
    if isinstance(v, float) or isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    return None if v is None else str(v)


def main() -> None:
    metadata, queries, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with tempfile.TemporaryDirectory() as ext:
        con = duckdb.connect(
            config={"extension_directory": ext, "autoinstall_known_extensions": False}
        )
        for name in ("avro", "iceberg"):
            duckdb_extensions.import_extension(name, con=con)
            con.execute(f"LOAD {name}")
        con.execute(f"CREATE VIEW orders AS SELECT * FROM iceberg_scan('{metadata}')")
        with open(queries) as f:
            for name, sql in statements(f.read()):
                con.execute(sql).fetchall()
                best = float("inf")
                for _ in range(repeat):
                    start = time.perf_counter()
                    rows = con.execute(sql).fetchall()
                    best = min(best, time.perf_counter() - start)
                print(
                    json.dumps(
                        {
                            "name": name,
                            "seconds": best,
                            "rows": [[value(v) for v in row] for row in rows],
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""`floe serve` as clients find their way around it: psql's meta-commands (`\\l`, `\\dn`,
`\\dt`, `\\d table`), JDBC's DatabaseMetaData (what DBeaver and other JDBC tools read) with a
prepared statement, and `floe --connect` (the REPL and scripts as clients of a server)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from conftest import SqlLake
from test_server import ORDERS, FloeServer, jobs, rows, wait_for

SHOP = """
CREATE SCHEMA lake.shop;
CREATE TABLE lake.shop.orders (id BIGINT NOT NULL, customer STRING, amount DECIMAL(10, 2),
  paid BOOLEAN, ts TIMESTAMP);
INSERT INTO lake.shop.orders VALUES (1, 'ann', 19.99, true, TIMESTAMP '2024-05-01 09:15:00'),
  (2, 'bob', 5.00, false, NULL);
CREATE SCHEMA lake.hr;
CREATE TABLE lake.hr.people (name STRING);
"""


@pytest.fixture
def shop(floe_bin: Path, tmp_path: Path, lake: SqlLake):
    """A server whose catalog `lake` holds shop.orders (two rows) and hr.people."""
    s = FloeServer(floe_bin, tmp_path)
    s.start()
    out = s.psql("-v", "ON_ERROR_STOP=1", "-f", "-", input=f"{lake.ddl()};\n{SHOP}")
    assert out.returncode == 0, out.stderr
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.kill()


def psql(server: FloeServer, database: str, *args: str,
         input: str | None = None) -> subprocess.CompletedProcess:
    """psql on `database` (a floe catalog), unaligned output; errors stop it."""
    return subprocess.run(
        ["psql", "-X", "-w", "-A", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
         str(server.port), "-U", "floe", database, *args],
        input=input, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
    )


def test_psql_meta_commands_list_catalogs_schemas_tables_and_columns(shop: FloeServer):
    # \l: every catalog is a database.
    out = psql(shop, "lake", "-c", r"\l")
    assert out.returncode == 0, out.stderr
    names = {line.split("|")[0] for line in out.stdout.splitlines()}
    assert {"lake", "datafusion"} <= names, out.stdout
    # \dn: the catalog's namespaces (psql hides pg_catalog and information_schema).
    out = psql(shop, "lake", "-c", r"\dn")
    assert out.returncode == 0, out.stderr
    assert "hr|floe" in out.stdout and "shop|floe" in out.stdout, out.stdout
    assert "pg_catalog" not in out.stdout, out.stdout
    # \dt: every table of the catalog, with its schema, kind and owner.
    out = psql(shop, "lake", "-c", r"\dt")
    assert out.returncode == 0, out.stderr
    assert "hr|people|table|floe" in out.stdout, out.stdout
    assert "shop|orders|table|floe" in out.stdout, out.stdout
    out = psql(shop, "lake", "-c", r"\dt shop.*")
    assert out.returncode == 0, out.stderr
    assert "shop|orders|table|floe" in out.stdout and "people" not in out.stdout, out.stdout
    # \d table: its columns, typed as PostgreSQL names them, NOT NULL where required.
    out = psql(shop, "lake", "-c", r"\d shop.orders")
    assert out.returncode == 0, out.stderr
    assert 'Table "shop.orders"' in out.stdout, out.stdout
    for line in ["id|bigint||not null|", "customer|text|||", "amount|numeric(10,2)|||",
                 "paid|boolean|||", "ts|timestamp without time zone|||"]:
        assert line in out.stdout, (line, out.stdout)
    # A table psql cannot find is psql's own message, not an error of the server.
    out = psql(shop, "lake", "-c", r"\d shop.nope")
    assert "Did not find any relation named" in out.stderr, out.stderr
    # The database chosen is the current catalog: names resolve in it.
    out = psql(shop, "lake", "-c", "SELECT current_database(), count(*) FROM shop.orders")
    assert out.returncode == 0, out.stderr
    assert "lake|2" in out.stdout, out.stdout
    # The search path's first schema is where unqualified names resolve.
    out = psql(shop, "lake", "-f", "-", input="SET search_path TO shop, public;\n"
               "SELECT count(*) AS n FROM orders;\nSHOW search_path;\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["SET", "n", "2", "(1 row)", "search_path", "shop",
                                       "(1 row)"], out.stdout


def test_psycopg_reads_pg_catalog_like_a_postgresql_server(shop: FloeServer):
    with psycopg.connect(host="127.0.0.1", port=shop.port, user="floe", dbname="lake",
                         autocommit=True) as conn:
        tables = rows(conn, "SELECT schemaname, tablename FROM pg_catalog.pg_tables "
                            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
                            "ORDER BY 1, 2")
        assert tables == [("hr", "people"), ("shop", "orders")], tables
        # A table's oid is the same in every query: looked up by name, then used.
        (oid,) = rows(conn, "SELECT 'shop.orders'::regclass")[0]
        cols = rows(conn, "SELECT attname, format_type(atttypid, atttypmod), attnotnull "
                          "FROM pg_attribute WHERE attrelid = %s ORDER BY attnum", (oid,))
        assert cols[0] == ("id", "bigint", True) and cols[2] == ("amount", "numeric(10,2)", False), cols
        # A table created meanwhile is there at once.
        rows(conn, "CREATE TABLE shop.refunds (id BIGINT)")
        assert rows(conn, "SELECT count(*) FROM pg_class WHERE relname = 'refunds'") == [(1,)]
        # What drivers send on connect is answered.
        rows(conn, "SET extra_float_digits = 3")
        rows(conn, "SET application_name = 'a tool'")
        assert rows(conn, "SHOW TRANSACTION ISOLATION LEVEL") == [("read committed",)]
        assert rows(conn, "SELECT current_schema(), current_user")[0][1] == "floe"
        # Timestamps in PostgreSQL's text: whole seconds bare, a zone for timestamptz.
        import datetime
        (a, b), = rows(conn, "SELECT TIMESTAMP '2024-05-01 09:15:00.5' AS a, arrow_cast("
                             "TIMESTAMP '2024-05-01 09:15:00', "
                             "'Timestamp(Microsecond, Some(\"+00:00\"))') AS b")
        assert a == datetime.datetime(2024, 5, 1, 9, 15, 0, 500000), a
        assert b == datetime.datetime(2024, 5, 1, 9, 15, tzinfo=datetime.timezone.utc), b


def test_jdbc_reads_the_servers_metadata_and_reuses_a_prepared_statement(
    shop: FloeServer, tmp_path: Path
):
    jar = os.environ.get("FLOE_PGJDBC", "/usr/share/java/postgresql.jar")
    if not Path(jar).is_file():
        pytest.fail(f"pgjdbc not found at {jar}: run scripts/test-env.sh install "
                    "(Debian: apt-get install libpostgresql-jdbc-java)", pytrace=False)
    program = Path(__file__).parent / "jdbc" / "FloeJdbc.java"
    url = f"jdbc:postgresql://127.0.0.1:{shop.port}/lake?user=floe"
    out = subprocess.run(["java", "-cp", jar, str(program), url], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    facts: dict[str, list[list[str]]] = {}
    for line in out.stdout.splitlines():
        kind, *fields = line.split("\t")
        facts.setdefault(kind, []).append(fields)
    assert facts["product"][0][0] == "PostgreSQL", facts["product"]
    assert ["lake"] in facts["catalog"], facts["catalog"]
    assert ["shop"] in facts["schema"] and ["hr"] in facts["schema"], facts["schema"]
    assert facts["table"] == [["shop", "orders", "TABLE"]], facts["table"]
    columns = {c[0]: c[1:] for c in facts["column"]}
    # java.sql.Types: BIGINT -5, VARCHAR 12, NUMERIC 2, BIT -7, TIMESTAMP 93.
    assert columns["id"] == ["int8", "-5", "NO", "1"], columns
    assert columns["customer"] == ["text", "12", "YES", "2"], columns
    assert columns["amount"] == ["numeric", "2", "YES", "3"], columns
    assert columns["paid"][:2] == ["bool", "-7"], columns
    assert columns["ts"][:2] == ["timestamp", "93"], columns
    assert facts["result_column"] == [["id", "int8"], ["customer", "text"],
                                      ["amount", "numeric"]], facts["result_column"]
    assert facts["row"] == [["1", "ann", "19.99"], ["2", "bob", "5.00"]], facts["row"]
    assert facts["error"][0][0].startswith("42"), facts["error"]
    assert facts["count"] == [["2"]], facts["count"]
    # floe's own statements: DDL, SHOW described before it runs (as JDBC's getMetaData asks).
    assert ["jdbc"] in facts["floe_schema"], facts["floe_schema"]
    assert facts["show_described"] == [["3"]], facts["show_described"]
    assert facts["show_row"] == [["orders"]], facts["show_row"]


def floe_connect(floe_bin: Path, server: FloeServer, database: str, *args: str,
                 input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(floe_bin), "--connect", f"postgres://floe@127.0.0.1:{server.port}/{database}",
         *args],
        input=input, capture_output=True, text=True, timeout=120,
    )


def test_floe_connect_runs_statements_and_scripts_on_the_server(
    floe_bin: Path, shop: FloeServer, tmp_path: Path, lake: SqlLake
):
    # -c: rows printed as floe prints them, names resolved in the database's catalog.
    out = floe_connect(floe_bin, shop, "lake", "--format", "csv", "-c",
                       "SELECT id, customer, amount, paid FROM shop.orders ORDER BY id")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == ["id,customer,amount,paid", "1,ann,19.99,true",
                                           "2,bob,5.00,false"], out.stdout
    # A script: floe's statements run on the server; a job it starts outlives the client.
    script = tmp_path / "job.sql"
    script.write_text(
        f"CREATE TABLE lake.shop.gen {ORDERS};\n"
        "CREATE SOURCE g WITH ('connector' = 'datagen', 'profile' = 'orders', "
        "'number-of-rows' = '3000', 'rows-per-second' = '1000');\n"
        "SET 'pipeline.name' = 'remote';\n"
        "SET 'checkpoint.interval' = '300ms';\n"
        "INSERT INTO lake.shop.gen SELECT * FROM g;\n"
        "SHOW JOBS;\n")
    out = floe_connect(floe_bin, shop, "floe", "-f", str(script))
    assert out.returncode == 0, out.stderr
    assert "job 'remote' started" in out.stdout, out.stdout
    with psycopg.connect(host="127.0.0.1", port=shop.port, user="floe", dbname="floe",
                         autocommit=True) as conn:
        wait_for(lambda: jobs(conn).get("remote") == "finished")
        assert rows(conn, "SELECT count(*), count(DISTINCT order_id) FROM lake.shop.gen") \
            == [(3000, 3000)]
    # An error: its message, a failing exit code, and the statements before it ran.
    out = floe_connect(floe_bin, shop, "lake", "-c",
                       "CREATE SCHEMA lake.more; SELECT * FROM shop.nope")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "nope" in out.stderr, out.stderr
    out = floe_connect(floe_bin, shop, "lake", "--format", "csv", "-c", "SHOW SCHEMAS IN lake")
    assert "more" in out.stdout, out.stdout
    # A server that is not there: a message that names it.
    shop.kill()
    out = floe_connect(floe_bin, shop, "lake", "-c", "SELECT 1")
    assert out.returncode == 2 and f"127.0.0.1:{shop.port}" in out.stderr, out.stderr


def test_floe_connect_cancels_the_running_statement_on_ctrl_c(
    floe_bin: Path, shop: FloeServer
):
    import signal

    proc = subprocess.Popen(
        [str(floe_bin), "--connect", f"postgres://floe@127.0.0.1:{shop.port}/lake", "-c",
         "SELECT count(*) FROM (SELECT a.v FROM generate_series(1, 200000) a(v) "
         "CROSS JOIN generate_series(1, 200000) b(v))"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "cancelled" in err, (out, err)
    # The server goes on serving.
    again = psql(shop, "lake", "-c", "SELECT count(*) FROM shop.orders")
    assert again.returncode == 0 and "2" in again.stdout, again.stderr


def test_views_are_kept_by_the_server_and_listed(shop: FloeServer):
    def connect() -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=shop.port, user="floe", dbname="floe",
                               autocommit=True)

    with connect() as conn:
        rows(conn, "CREATE VIEW big_orders AS "
                   "SELECT id, amount FROM lake.shop.orders WHERE amount > 10")
        rows(conn, "CREATE VIEW small_orders AS SELECT id FROM lake.shop.orders")
        rows(conn, "DROP VIEW small_orders")
    # psql lists it, in the default catalog's schema.
    out = psql(shop, "datafusion", "-c", r"\dv")
    assert out.returncode == 0, out.stderr
    assert "public|big_orders|view|floe" in out.stdout and "small" not in out.stdout, out.stdout
    # A restarted server has it again (after the catalog it reads); the dropped one is gone.
    shop.kill()
    shop.start()
    with connect() as conn:
        assert rows(conn, "SELECT id FROM big_orders") == [(1,)]
        with pytest.raises(psycopg.Error):
            rows(conn, "SELECT * FROM small_orders")


# What DBeaver's PostgreSQL plugin sends (read from its source: PostgreDataSource,
# PostgreExecutionContext, PostgreDatabase, PostgreSchema, PostgreTableBase), after pgjdbc's
# own `SET`s: on connect, then browsing a schema's tables, a table's columns, constraints and
# indexes. `%s` are the values it binds.
DBEAVER_CONNECT = [
    ("SET extra_float_digits = 3", None),
    ("SET application_name = 'DBeaver 24.2.3 - Metadata lake'", None),
    ("SELECT current_schema(),session_user", None),
    ("SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 "
     "AND d.classoid='pg_namespace'::regclass\n ORDER BY nspname", None),
    ("SHOW search_path", None),
    ("SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=%s", ("lake",)),
    ("select * from pg_catalog.pg_settings where name=%s", ("standard_conforming_strings",)),
    ("select string_agg(word, ',') from pg_catalog.pg_get_keywords() "
     "where word <> ALL ('{a,abs,absolute,action}'::text[])", None),
    ("SELECT version()", None),
    ("SELECT * FROM pg_catalog.pg_enum WHERE 1<>1 LIMIT 1", None),
    ("SELECT reltype FROM pg_catalog.pg_class WHERE 1<>1 LIMIT 1", None),
    ("SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as "
     "base_type_name, d.description\nFROM pg_catalog.pg_type t\n"
     "LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem \n"
     "LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid\n"
     "WHERE t.typname IS NOT NULL\n"
     "AND (c.relkind IS NULL OR c.relkind = 'c') AND (et.typcategory IS NULL OR "
     "et.typcategory <> 'C')", None),
    ("SELECT * FROM pg_catalog.pg_enum", None),
    ("SELECT am.oid,am.* FROM pg_catalog.pg_am am \nORDER BY am.oid", None),
]


def dbeaver_browse(schema_oid: int, table_oid: int) -> list[tuple[str, tuple]]:
    return [
        ("SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as "
         "partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key \n"
         "FROM pg_catalog.pg_class c\n"
         "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
         "AND d.classoid='pg_class'::regclass\n"
         "WHERE c.relnamespace=%s AND c.relkind not in ('i','I','c')", (schema_oid,)),
        ("select c.oid,pg_catalog.pg_total_relation_size(c.oid) as total_rel_size,"
         "pg_catalog.pg_relation_size(c.oid) as rel_size\nFROM pg_class c\n"
         "WHERE c.relnamespace=%s", (schema_oid,)),
        ("SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as "
         "def_value,dsc.description,dep.objid\nFROM pg_catalog.pg_attribute a\n"
         "INNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)\n"
         "LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND "
         "a.attnum = ad.adnum)\n"
         "LEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND "
         "a.attnum = dsc.objsubid)\n"
         "LEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' "
         "and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid\n"
         "WHERE NOT a.attisdropped AND c.relkind not in ('i','I','c') AND c.oid=%s\n"
         "ORDER BY a.attnum", (table_oid,)),
        ("SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,"
         "d.description, case when c.contype='c' then \"substring\"(pg_get_constraintdef("
         "c.oid), 7) else null end consrc_copy\nFROM pg_catalog.pg_constraint c\n"
         "INNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid\n"
         "LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid\n"
         "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 "
         "AND d.classoid='pg_constraint'::regclass\nWHERE c.conrelid=%s\nORDER BY c.oid",
         (table_oid,)),
        ("SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,c.reltablespace,"
         "tc.relname as tabrelname,dsc.description,pg_catalog.pg_get_expr(i.indpred, "
         "i.indrelid) as pred_expr,pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as "
         "expr,pg_catalog.pg_relation_size(i.indexrelid) as index_rel_size,"
         "pg_catalog.pg_stat_get_numscans(i.indexrelid) as index_num_scans\n"
         "FROM pg_catalog.pg_index i\nINNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid\n"
         "INNER JOIN pg_catalog.pg_class tc ON tc.oid=i.indrelid\n"
         "LEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid=dsc.objoid\n"
         "WHERE  i.indrelid=%s ORDER BY c.relname", (table_oid,)),
    ]


def test_dbeavers_queries_on_connect_and_browsing_answer(shop: FloeServer):
    with psycopg.connect(host="127.0.0.1", port=shop.port, user="floe", dbname="lake",
                         autocommit=True) as conn:
        answers = {}
        for sql, params in DBEAVER_CONNECT:
            with conn.cursor() as cur:
                try:
                    cur.execute(sql, params)
                except psycopg.Error as e:
                    raise AssertionError(f"{sql}\n-> {e}") from e
                answers[sql] = (cur.fetchall() if cur.description else [],
                                [d.name for d in cur.description or []])
        schemas, columns = answers[DBEAVER_CONNECT[3][0]]
        names = [r[columns.index("nspname")] for r in schemas]
        assert {"shop", "hr", "pg_catalog"} <= set(names), names
        shop_oid = schemas[names.index("shop")][columns.index("oid")]
        (database,), columns = answers[DBEAVER_CONNECT[5][0]]
        assert database[columns.index("datname")] == "lake", database
        keywords = answers[DBEAVER_CONNECT[7][0]][0][0][0]
        assert "select" in keywords.split(",") and "abs" not in keywords.split(","), keywords
        types, columns = answers[DBEAVER_CONNECT[11][0]]
        assert "int8" in [t[columns.index("typname")] for t in types], types
        (table_oid,) = rows(conn, "SELECT 'shop.orders'::regclass")[0]
        browsed = []
        for sql, params in dbeaver_browse(shop_oid, table_oid):
            with conn.cursor() as cur:
                try:
                    cur.execute(sql, params)
                except psycopg.Error as e:
                    raise AssertionError(f"{sql}\n-> {e}") from e
                browsed.append((cur.fetchall(), [d.name for d in cur.description]))
        (tables, columns), _, (attributes, acolumns), (constraints, _), (indexes, _) = browsed
        assert [t[columns.index("relname")] for t in tables] == ["orders"], tables
        assert [a[acolumns.index("attname")] for a in attributes] == [
            "id", "customer", "amount", "paid", "ts"], attributes
        assert constraints == [] and indexes == [], (constraints, indexes)

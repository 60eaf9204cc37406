"""DELETE, UPDATE and MERGE INTO on lake tables, checked through pyiceberg and DuckDB against a
model of the rows kept here in Python; compaction folding the deletes in; and the races of a
statement changing rows with a compaction of the same files. Each runs on a format-version 2
table (position delete files) and a version 3 one (deletion vectors in Puffin files)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import fastavro
import pyarrow.parquet as pq
import pytest
from pyiceberg.table.puffin import PuffinFile

from conftest import SqlLake, paused_before_commit, run_floe_in

KEYS = 2_000


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def version(request) -> int:
    """The format version of the tables a test creates."""
    return request.param


def with_version(version: int, *properties: str) -> str:
    listed = ", ".join((f"'format-version' = '{version}'",) + properties)
    return f"WITH ({listed})"


def deleted_by(file: dict) -> set[str]:
    """The data files whose rows the delete file `file` (a row of `$files`) deletes."""
    local = file["file_path"].removeprefix("file://")
    if file["file_format"] == "PUFFIN":
        with open(local, "rb") as f:
            vectors = PuffinFile(f.read()).to_vector()
        return set(vectors)
    return set(pq.read_table(local)["file_path"].to_pylist())


def check_delete_files(table, version: int) -> list[dict]:
    """The table's live delete files, checked to be what its version says: position delete
    files (v2) or deletion vectors (v3, at most one per data file), each naming its one data
    file as readers need to tie it to that file alone."""
    files = table.inspect.files().to_pylist()
    deletes = [f for f in files if f["content"] == 1]
    if version == 2:
        for f in deletes:
            assert f["file_format"] == "PARQUET", f
            assert f["lower_bounds"] and f["upper_bounds"], f
    else:
        for f in deletes:
            assert f["file_format"] == "PUFFIN", f
        # pyiceberg's entries lack the v3 fields: read the manifests themselves.
        named = []
        for m in table.current_snapshot().manifests(table.io):
            with open(m.manifest_path.removeprefix("file://"), "rb") as f:
                for e in fastavro.reader(f):
                    d = e["data_file"]
                    if e["status"] == 2 or d["content"] != 1:
                        continue
                    named.append(d["referenced_data_file"])
                    # The entry's offset and length are its blob's, as DuckDB reads it.
                    with open(d["file_path"].removeprefix("file://"), "rb") as p:
                        p.seek(d["content_offset"])
                        blob = p.read(d["content_size_in_bytes"])
                    assert blob[4:8] == bytes([0xD1, 0xD3, 0x39, 0x64]), d
        assert all(named), "every deletion vector names its data file"
        assert len(named) == len(set(named)), "one deletion vector per data file"
    return deletes


def create_customers(
    floe_bin: Path,
    lake: SqlLake,
    workdir: Path,
    version: int,
    statements: list[str],
    *properties: str,
) -> None:
    """Create lake.shop.customers (id key, bucketed, with table `properties`) and run
    `statements` after, in one floe process."""
    run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        "CREATE SCHEMA lake.shop",
        "CREATE TABLE lake.shop.customers (id BIGINT, name STRING, score INT, "
        "PRIMARY KEY (id) NOT ENFORCED) PARTITIONED BY (bucket(4, id)) "
        + with_version(version, *properties),
        *statements,
    )


def customers(
    floe_bin: Path, lake: SqlLake, workdir: Path, batches: int = 4, version: int = 2
) -> dict:
    """lake.shop.customers (id key, bucketed) with KEYS rows over `batches` inserts; the
    model: id -> (name, score)."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = {i: (f"n{i}", i % 100) for i in range(KEYS)}
    per = KEYS // batches
    inserts = []
    for b in range(batches):
        values = ", ".join(
            f"({i}, '{model[i][0]}', {model[i][1]})" for i in range(b * per, (b + 1) * per)
        )
        inserts.append(f"INSERT INTO lake.shop.customers VALUES {values}")
    create_customers(floe_bin, lake, workdir, version, inserts)
    return model


def rows_everywhere(lake: SqlLake, floe_bin: Path, workdir: Path, duck) -> list:
    """The table's rows as pyiceberg, DuckDB and floe read them: all three must agree."""
    table = lake.pyiceberg().load_table("shop.customers")
    py = sorted(
        (r["id"], r["name"], r["score"]) for r in table.scan().to_arrow().to_pylist()
    )
    dk = sorted(
        duck.execute(
            f"SELECT id, name, score FROM iceberg_scan('{table.metadata_location}')"
        ).fetchall()
    )
    fl = sorted(
        (r["id"], r["name"], r["score"])
        for r in run_floe_in(floe_bin, workdir, lake.ddl(), "SELECT * FROM lake.shop.customers")
    )
    assert py == dk, "pyiceberg and DuckDB disagree"
    assert py == fl, "pyiceberg and floe disagree"
    return py


def expected(model: dict) -> list:
    return sorted((k, n, s) for k, (n, s) in model.items())


def test_changes_match_a_model_in_every_reader(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    workdir = tmp_path / "work"
    model = customers(floe_bin, lake, workdir, version=version)
    rng = random.Random(16)
    statements = []
    counts = []
    for step in range(12):
        kind = step % 3
        if kind == 0:
            # DELETE a random residue class of the keys still there.
            m = rng.choice([7, 11, 13])
            r = rng.randrange(m)
            gone = [k for k in model if k % m == r and model[k][1] < 50]
            for k in gone:
                del model[k]
            statements.append(
                f"DELETE FROM lake.shop.customers WHERE id % {m} = {r} AND score < 50"
            )
            counts.append(len(gone))
        elif kind == 1:
            lo = rng.randrange(KEYS - 300)
            changed = [k for k in model if lo <= k < lo + 300]
            for k in changed:
                name, score = model[k]
                model[k] = (name + "u", score + 1)
            statements.append(
                "UPDATE lake.shop.customers SET name = name || 'u', score = score + 1 "
                f"WHERE id >= {lo} AND id < {lo + 300}"
            )
            counts.append(len(changed))
        else:
            # MERGE a batch of changes: deletes, updates, and inserts of new keys.
            changes = []
            for _ in range(60):
                k = rng.randrange(KEYS + 500)
                op = rng.choice("dui")
                changes.append((k, op))
            # One change per key (a key matched twice is an error, tested in dml.slt).
            changes = list(dict(changes).items())
            values = ", ".join(f"({k}, '{op}')" for k, op in changes)
            statements.append(f"CREATE TABLE lake.shop.changes_{step} (id BIGINT, op STRING)")
            statements.append(f"INSERT INTO lake.shop.changes_{step} VALUES {values}")
            counts.append(len(changes))
            n = 0
            for k, op in changes:
                if k in model and op == "d":
                    del model[k]
                    n += 1
                elif k in model:
                    model[k] = (model[k][0] + "m", model[k][1])
                    n += 1
                elif op != "d":
                    model[k] = (f"new{k}", -1)
                    n += 1
            statements.append(
                f"MERGE INTO lake.shop.customers c USING lake.shop.changes_{step} s "
                "ON c.id = s.id "
                "WHEN MATCHED AND s.op = 'd' THEN DELETE "
                "WHEN MATCHED THEN UPDATE SET name = c.name || 'm' "
                "WHEN NOT MATCHED AND s.op <> 'd' THEN "
                "INSERT (id, name, score) VALUES (s.id, 'new' || CAST(s.id AS VARCHAR), -1)"
            )
            counts.append(n)
    out = run_floe_in(floe_bin, workdir, lake.ddl(), *statements)
    got = [r["count"] for r in out if "count" in r]
    assert got == counts, (got, counts)
    assert rows_everywhere(lake, floe_bin, workdir, duck) == expected(model)
    table = lake.pyiceberg().load_table("shop.customers")
    assert table.schema().identifier_field_ids == [1], "the primary key is the identifier field"
    assert check_delete_files(table, version), "the changes are delete files"
    # Travelling back to an earlier snapshot applies the deletes it had.
    history = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    middle = history[len(history) // 2].snapshot_id
    then = sorted(
        (r["id"], r["name"], r["score"])
        for r in table.scan(snapshot_id=middle).to_arrow().to_pylist()
    )
    travelled = sorted(
        (r["id"], r["name"], r["score"])
        for r in run_floe_in(
            floe_bin, workdir, lake.ddl(),
            f"SELECT * FROM lake.shop.customers FOR VERSION AS OF {middle}",
        )
    )
    assert travelled == then, "floe and pyiceberg disagree on an earlier snapshot"
    ops = [s.summary.operation.value for s in table.snapshots()]
    assert ops.count("delete") == 4 and ops.count("overwrite") == 8, ops


def test_manifests_merged_as_commits_accumulate_read_alike_everywhere(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    """A table committed to often: the commit that finds 100 small manifests of a kind (its
    commit.manifest.min-count-to-merge) lists their files in one (as Iceberg's merge append does), for inserts and deletes
    alike. Every reader reads the same rows from the merged manifests (their entries keep
    the sequence numbers deletes are applied by), and the table keeps few manifests."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    model = {i: (f"n{i}", i % 100) for i in range(130)}
    statements = [
        f"INSERT INTO lake.shop.customers VALUES ({i}, 'n{i}', {i % 100})" for i in model
    ]
    # A delete file per deleted row's file: 105 deletes, each a commit of its own.
    gone = list(range(0, 130, 2)) + list(range(1, 80, 2))
    statements += [f"DELETE FROM lake.shop.customers WHERE id = {i}" for i in gone]
    create_customers(
        floe_bin,
        lake,
        workdir,
        version,
        statements,
        "'commit.manifest.min-count-to-merge' = '100'",
    )
    for i in gone:
        del model[i]
    assert rows_everywhere(lake, floe_bin, workdir, duck) == expected(model)
    table = lake.pyiceberg().load_table("shop.customers")
    check_delete_files(table, version)
    manifests = table.current_snapshot().manifests(table.io)
    data = [m for m in manifests if m.content == 0]
    deletes = [m for m in manifests if m.content == 1]
    # 130 appends: 100 merged into one by the 101st, 29 since, and its own; 105 deletes
    # the same way: one merged, four since and the last's own.
    assert (len(data), len(deletes)) == (31, 6), [m.manifest_path for m in manifests]
    existing = sum(m.existing_files_count or 0 for m in manifests)
    assert existing == 200, "the merged manifests list their files as existing ones"
    assert len(table.snapshots()) == 130 + 105


def test_compaction_folds_deletes_in(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    workdir = tmp_path / "work"
    model = customers(floe_bin, lake, workdir, batches=8, version=version)
    run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        "DELETE FROM lake.shop.customers WHERE id % 10 = 3",
        "UPDATE lake.shop.customers SET score = 1000 WHERE id % 10 = 4",
    )
    for k in list(model):
        if k % 10 == 3:
            del model[k]
        elif k % 10 == 4:
            model[k] = (model[k][0], 1000)
    before = rows_everywhere(lake, floe_bin, workdir, duck)
    assert before == expected(model)
    table = lake.pyiceberg().load_table("shop.customers")
    files = table.inspect.files().to_pylist()
    assert check_delete_files(table, version)
    (done,) = run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        "CALL lake.system.rewrite_data_files(table => 'shop.customers')",
    )
    assert done["rewritten_data_files_count"] == sum(1 for f in files if f["content"] == 0)
    assert rows_everywhere(lake, floe_bin, workdir, duck) == before
    table = lake.pyiceberg().load_table("shop.customers")
    after = table.inspect.files().to_pylist()
    assert [f for f in after if f["content"] != 0] == [], "the deletes were folded in"
    assert len(after) == 4, "one file per bucket"
    assert sum(f["record_count"] for f in after) == len(model)
    summary = table.current_snapshot().summary
    assert summary.operation.value == "replace"
    assert summary["total-delete-files"] == "0", summary


def test_a_compaction_racing_a_delete_carries_it_over_by_key(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    workdir = tmp_path / "work"
    model = customers(floe_bin, lake, workdir, version=version)
    # Rows deleted before the rewrite reads are not copied; a deletion vector written while
    # it runs holds them again, and they must not be carried (the keys live on elsewhere).
    run_floe_in(
        floe_bin, workdir, lake.ddl(),
        "DELETE FROM lake.shop.customers WHERE id >= 10 AND id < 20",
        "INSERT INTO lake.shop.customers VALUES " + ", ".join(
            f"({k}, 'again{k}', {k})" for k in range(10, 20)
        ),
    )
    for k in range(10, 20):
        model[k] = (f"again{k}", k)
    rewrite = paused_before_commit(
        floe_bin, lake, workdir,
        "CALL lake.system.rewrite_data_files(table => 'shop.customers', min_input_files => 2)",
    )
    # A DELETE of rows of the files the rewrite read commits first.
    (deleted,) = run_floe_in(
        floe_bin, workdir, lake.ddl(), "DELETE FROM lake.shop.customers WHERE id < 10"
    )
    assert deleted["count"] == 10
    out, err = rewrite.communicate(timeout=120)
    assert rewrite.returncode == 0, err
    # The table has a primary key: the rewrite found the deleted keys in its new files and
    # deleted them there. No deleted row came back.
    for k in range(10):
        del model[k]
    assert rows_everywhere(lake, floe_bin, workdir, duck) == expected(model)
    table = lake.pyiceberg().load_table("shop.customers")
    history = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    assert [s.summary.operation.value for s in history][-2:] == ["delete", "replace"]
    assert history[-1].summary["added-position-deletes"] == "10", history[-1].summary
    check_delete_files(table, version)
    # Compacted again, the carried deletes are folded in.
    run_floe_in(
        floe_bin, workdir, lake.ddl(),
        "CALL lake.system.rewrite_data_files(table => 'shop.customers', min_input_files => 1)",
    )
    assert rows_everywhere(lake, floe_bin, workdir, duck) == expected(model)


def test_a_compaction_racing_a_delete_of_a_table_without_a_key_gives_up(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_floe_in(
        floe_bin, workdir, lake.ddl(), "CREATE SCHEMA lake.shop",
        "CREATE TABLE lake.shop.t (id BIGINT, v STRING) " + with_version(version),
        *[f"INSERT INTO lake.shop.t VALUES ({i}, 'a'), ({i + 100}, 'b')" for i in range(5)],
    )
    rewrite = paused_before_commit(
        floe_bin, lake, workdir,
        "CALL lake.system.rewrite_data_files(table => 'shop.t', min_input_files => 2)",
    )
    run_floe_in(floe_bin, workdir, lake.ddl(), "DELETE FROM lake.shop.t WHERE id = 2")
    out, err = rewrite.communicate(timeout=120)
    assert rewrite.returncode != 0, out
    assert "had rows deleted while it ran; nothing was committed" in err, err
    table = lake.pyiceberg().load_table("shop.t")
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == [0, 1, 3, 4, 100, 101, 102, 103, 104]
    assert "replace" not in [s.summary.operation.value for s in table.snapshots()]
    (n,) = duck.execute(f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}')").fetchone()
    assert n == 9


def test_a_delete_racing_a_compaction_runs_again(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    workdir = tmp_path / "work"
    model = customers(floe_bin, lake, workdir, version=version)
    delete = paused_before_commit(
        floe_bin, lake, workdir, "DELETE FROM lake.shop.customers WHERE id % 100 = 0"
    )
    # The compaction replaces every file whose rows the DELETE found, first.
    (done,) = run_floe_in(
        floe_bin, workdir, lake.ddl(),
        "CALL lake.system.rewrite_data_files(table => 'shop.customers', min_input_files => 2)",
    )
    assert done["rewritten_data_files_count"] > 0
    out, err = delete.communicate(timeout=120)
    assert delete.returncode == 0, err
    # The DELETE noticed, read the compacted files and deleted the rows there.
    assert '"count":20' in out.replace(" ", ""), out
    for k in range(0, KEYS, 100):
        del model[k]
    assert rows_everywhere(lake, floe_bin, workdir, duck) == expected(model)
    table = lake.pyiceberg().load_table("shop.customers")
    history = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    ops = [s.summary.operation.value for s in history]
    assert ops[-2:] == ["replace", "delete"], ops
    # The delete files name the compacted files, not the replaced ones.
    live = {f["file_path"] for f in table.inspect.files().to_pylist() if f["content"] == 0}
    for f in check_delete_files(table, version):
        named = deleted_by(f)
        assert named <= live, (named, live)


def test_a_job_into_a_keyed_table_keeps_the_last_row_of_each_key(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    """Three jobs, each over a file of changes with repeated keys, into one table with a
    primary key: one row per key, the last one, in every reader."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    rng = random.Random(3)
    model: dict = {}
    statements = [
        lake.ddl(),
        "CREATE SCHEMA lake.shop",
        "CREATE TABLE lake.shop.customers (id BIGINT, name STRING, score INT, "
        "PRIMARY KEY (id) NOT ENFORCED) PARTITIONED BY (bucket(4, id)) "
        + with_version(version),
        "SET 'table.dml-sync' = 'true'",
    ]
    for run in range(3):
        lines = []
        for i in range(5_000):
            k = rng.randrange(1_500)
            row = {"id": k, "name": f"r{run}-{i}", "score": i}
            model[k] = (row["name"], row["score"])
            lines.append(json.dumps(row))
        (workdir / f"changes{run}.jsonl").write_text("\n".join(lines) + "\n")
        statements += [
            f"CREATE SOURCE changes{run} (id BIGINT, name STRING, score INT) WITH "
            f"('connector' = 'filesystem', 'path' = 'changes{run}.jsonl', 'format' = 'json')",
            f"SET 'pipeline.name' = 'changes{run}'",
            f"INSERT INTO lake.shop.customers SELECT * FROM changes{run}",
        ]
    run_floe_in(floe_bin, workdir, *statements)
    assert rows_everywhere(lake, floe_bin, workdir, duck) == expected(model)
    table = lake.pyiceberg().load_table("shop.customers")
    ops = [s.summary.operation.value for s in sorted(table.snapshots(), key=lambda s: s.sequence_number)]
    # The first commit finds no earlier rows; the next two delete the rows they replace.
    assert ops == ["append", "overwrite", "overwrite"], ops
    check_delete_files(table, version)
    assert table.current_snapshot().summary["floe.job"] == "changes2"

//! One row per key in tables with identifier fields (a primary key): rows written for keys
//! the table holds replace the rows it holds.
//!
//! ```text
//! a checkpoint's rows ─ last_per_key ─> data files (one row per key whose last change is
//!                                      not a delete), a file of the keys deleted
//! at commit: the keys of those files ─> the table's live rows with those keys
//!            (lake::read::positioned) ─> position delete files (lake::deletes)
//!            ─> one row delta: the new files and the deletes (lake::commit::row_delta)
//! ```
//!
//! The rows to delete are found at commit, on the table as it is then, so a commit that
//! loses a race (or runs again after a crash) finds them again: the table is the truth,
//! and the key index that finds them (`lake::key_index`) is rebuilt from it whenever it
//! does not reflect the snapshot committed on.

use std::collections::{BTreeMap, HashMap, HashSet};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array,
};
use datafusion::arrow::compute::{filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::parquet::arrow::ArrowWriter;
use futures::TryStreamExt;
use iceberg::spec::{DataFile, Schema};
use iceberg::table::Table;

use super::deletes::{self, Target};
use super::key_index::{self, Key, Update};
use super::read;
use crate::error::{Error, Result};

/// The names of `schema`'s identifier fields (its primary key), in field id order: the same
/// order for every instance of the schema (iceberg-rust keeps the ids in a hash set, whose
/// order differs from one instance to the next), so that keys encoded from two loads of
/// the table compare equal.
pub fn key_names(schema: &Schema) -> Vec<String> {
    let mut ids: Vec<i32> = schema.identifier_field_ids().collect();
    ids.sort_unstable();
    ids.into_iter()
        .filter_map(|id| schema.field_by_id(id).map(|f| f.name.clone()))
        .collect()
}

/// The key columns of batches, compared as rows.
pub struct Keys {
    names: Vec<String>,
    converter: Option<RowConverter>,
}

impl Keys {
    pub fn new(names: &[String]) -> Self {
        Self {
            names: names.to_vec(),
            converter: None,
        }
    }

    /// The key of every row of `batch`: a single integer column's values as they are (no
    /// allocation per row), other keys in Arrow's row encoding.
    pub fn of(&mut self, batch: &RecordBatch) -> Result<Vec<Key>> {
        let columns: Vec<ArrayRef> =
            self.names
                .iter()
                .map(|n| {
                    batch.column_by_name(n).cloned().ok_or_else(|| {
                        Error::Internal(format!("rows without their key column '{n}'"))
                    })
                })
                .collect::<Result<_>>()?;
        if let [one] = columns.as_slice()
            && one.null_count() == 0
        {
            let ints: Option<Vec<Key>> = match one.data_type() {
                DataType::Int64 => Some(
                    one.as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .map(|&v| Key::Int(v))
                        .collect(),
                ),
                DataType::Int32 => Some(
                    one.as_primitive::<Int32Type>()
                        .values()
                        .iter()
                        .map(|&v| Key::Int(i64::from(v)))
                        .collect(),
                ),
                _ => None,
            };
            if let Some(ints) = ints {
                return Ok(ints);
            }
        }
        if self.converter.is_none() {
            let fields = columns
                .iter()
                .map(|c| SortField::new(c.data_type().clone()))
                .collect();
            self.converter = Some(
                RowConverter::new(fields)
                    .map_err(|e| Error::Internal(format!("comparing keys: {e}")))?,
            );
        }
        let converter = self.converter.as_ref().expect("set above");
        let rows = converter
            .convert_columns(&columns)
            .map_err(|e| Error::Internal(format!("comparing keys: {e}")))?;
        Ok(rows.iter().map(|r| Key::Row(r.as_ref().into())).collect())
    }
}

/// `batch` with only the last row of each key (`keys` are its columns), in their order:
/// several changes of one key within a checkpoint collapse to the last.
pub fn last_per_key(batch: &RecordBatch, keys: &[String]) -> Result<RecordBatch> {
    let all = Keys::new(keys).of(batch)?;
    let mut seen = HashSet::with_capacity(all.len());
    let mut keep: Vec<u32> = Vec::with_capacity(all.len());
    for (i, k) in all.iter().enumerate().rev() {
        if seen.insert(k) {
            keep.push(i as u32);
        }
    }
    if keep.len() == batch.num_rows() {
        return Ok(batch.clone());
    }
    keep.reverse();
    take_record_batch(batch, &UInt32Array::from(keep))
        .map_err(|e| Error::Internal(format!("keeping the last row of each key: {e}")))
}

/// The last change of each key among a checkpoint's `batches` (`deletes` says which rows
/// of each delete their key): last in `seqs` order where every batch has one (a source's
/// offsets: its rows came in groups, not in order), else in the batches' order. The rows to
/// write (keys whose last change is not a delete), batch by batch without joining them, and
/// the key columns of the keys whose last change is (`None` when there are none).
pub fn last_changes(
    batches: &[RecordBatch],
    deletes: &[BooleanArray],
    seqs: &[Option<Int64Array>],
    keys: &[String],
) -> Result<(Vec<RecordBatch>, Option<RecordBatch>)> {
    let fail = |e: ArrowError| Error::Internal(format!("a checkpoint's changes: {e}"));
    let mut converter = Keys::new(keys);
    let all: Vec<Vec<Key>> = batches
        .iter()
        .map(|b| converter.of(b))
        .collect::<Result<_>>()?;
    let mut last: Vec<Vec<bool>> = all.iter().map(|k| vec![false; k.len()]).collect();
    let ordered: Option<Vec<&Int64Array>> = (seqs.len() == batches.len())
        .then(|| seqs.iter().map(Option::as_ref).collect())
        .flatten();
    if let Some(seqs) = ordered {
        // The highest sequence of each key (the later batch on a tie).
        let mut best: HashMap<&Key, (i64, usize, usize)> = HashMap::new();
        for (b, ks) in all.iter().enumerate() {
            for (r, k) in ks.iter().enumerate() {
                let seq = seqs[b].value(r);
                let entry = best.entry(k).or_insert((seq, b, r));
                if seq >= entry.0 {
                    *entry = (seq, b, r);
                }
            }
        }
        for (_, b, r) in best.into_values() {
            last[b][r] = true;
        }
    } else {
        // The last row of each key, found from the end.
        let mut seen: HashSet<&Key> = HashSet::new();
        for (b, ks) in all.iter().enumerate().rev() {
            for (r, k) in ks.iter().enumerate().rev() {
                if seen.insert(k) {
                    last[b][r] = true;
                }
            }
        }
    }
    let mut upserts = Vec::with_capacity(batches.len());
    let mut deleted = Vec::new();
    for ((batch, flags), last) in batches.iter().zip(deletes).zip(last) {
        let upsert = BooleanArray::from_iter(
            last.iter()
                .enumerate()
                .map(|(r, &l)| Some(l && !flags.value(r))),
        );
        let rows = filter_record_batch(batch, &upsert).map_err(fail)?;
        if rows.num_rows() > 0 {
            upserts.push(rows);
        }
        if flags.true_count() > 0 {
            let delete = BooleanArray::from_iter(
                last.iter()
                    .enumerate()
                    .map(|(r, &l)| Some(l && flags.value(r))),
            );
            let key_columns: Vec<usize> = keys
                .iter()
                .map(|k| batch.schema().index_of(k).map_err(fail))
                .collect::<Result<_>>()?;
            let keys = filter_record_batch(&batch.project(&key_columns).map_err(fail)?, &delete)
                .map_err(fail)?;
            if keys.num_rows() > 0 {
                deleted.push(keys);
            }
        }
    }
    let deleted = match deleted.first() {
        None => None,
        Some(first) => Some(
            datafusion::arrow::compute::concat_batches(&first.schema(), &deleted).map_err(fail)?,
        ),
    };
    Ok((upserts, deleted))
}

/// Write `keys` (key columns of rows deleted) to a file beside `table`'s data, for a
/// checkpoint to find at its commit (and after a crash); not part of the table. Its path.
pub async fn write_keys(table: &Table, keys: &RecordBatch) -> Result<String> {
    let path = format!(
        "{}/data/{}-deleted-keys.parquet",
        table.metadata().location(),
        uuid::Uuid::new_v4()
    );
    let fail = |e: String| Error::Internal(format!("writing {path}: {e}"));
    let mut buffer = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut buffer, keys.schema(), None).map_err(|e| fail(e.to_string()))?;
    writer.write(keys).map_err(|e| fail(e.to_string()))?;
    writer.close().map_err(|e| fail(e.to_string()))?;
    table
        .file_io()
        .new_output(&path)?
        .write(bytes::Bytes::from(buffer))
        .await?;
    Ok(path)
}

/// The delete files (position deletes or deletion vectors) removing `table`'s live rows whose keys (`keys`, its key
/// columns) are those of the rows in `added` (data files not in the table yet) or in the
/// files `deleted` ([`write_keys`]), written but not committed, each with its spec id; and
/// the change to the table's key index once they are committed ([`committed`]), and how
/// many of the keys deleted the table does not hold (those deletes change nothing). The
/// rows are found with the index (`lake::key_index`), made to reflect the table as it is.
pub async fn superseded(
    table: &Table,
    keys: &[String],
    added: &[DataFile],
    deleted: &[String],
) -> Result<(Vec<(DataFile, i32)>, Update, u64)> {
    let base = table.metadata().current_snapshot_id();
    let mut converter = Keys::new(keys);
    let mut update = Update {
        base,
        ..Update::default()
    };
    let key_schema = read::columns_of(table, keys)?;
    for f in added {
        let file = update.files.len() as u32;
        update.files.push(f.file_path().to_string());
        let mut pos = 0u64;
        for batch in read::conformed(table.file_io(), &key_schema, f.file_path()).await? {
            for k in converter.of(&batch)? {
                update.rows.push((k, file, pos));
                pos += 1;
            }
        }
    }
    for path in deleted {
        for batch in read::parquet(table.file_io(), path, "file of deleted keys").await? {
            update.deleted.extend(converter.of(&batch)?);
        }
    }
    if base.is_none() {
        let unknown = update.deleted.len() as u64;
        return Ok((Vec::new(), update, unknown));
    }
    let index = key_index::of(table);
    let mut index = index.lock().await;
    index.reflect(table, keys, &mut converter).await?;
    let mut positions: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let unknown;
    if index.is_over_budget() {
        drop(index);
        update.found_in = "table";
        let (found, missing) = scan_for(table, keys, &update, &mut converter).await?;
        positions = found;
        unknown = missing;
    } else {
        let wanted: Vec<&Key> = update.keys().collect();
        let found = index.find_all(&wanted)?;
        let found_in = if index.is_spilled() { "disk" } else { "memory" };
        for places in &found {
            for &(file, pos) in places {
                positions
                    .entry(index.file(file).to_string())
                    .or_default()
                    .push(pos as i64);
            }
        }
        // (The deleted keys come first in `update.keys()`.)
        unknown = found[..update.deleted.len()]
            .iter()
            .filter(|places| places.is_empty())
            .count() as u64;
        drop(index);
        update.found_in = found_in;
    }
    if positions.is_empty() {
        return Ok((Vec::new(), update, unknown));
    }
    let targets = data_files(table, positions.keys()).await?;
    let mut changes = Vec::with_capacity(positions.len());
    for (path, mut ps) in positions {
        ps.sort_unstable();
        ps.dedup();
        let Some(target) = targets.get(&path) else {
            return Err(Error::Internal(format!(
                "the key index names data file {path}, which table {} does not hold",
                table.identifier()
            )));
        };
        changes.push((target.clone(), ps));
    }
    let out = deletes::write_all(table, &changes).await?;
    Ok((out, update, unknown))
}

/// The live rows of `update`'s keys found by reading the table's key columns (an index
/// over its memory budget holds none), by data file; and how many deleted keys have none.
async fn scan_for(
    table: &Table,
    keys: &[String],
    update: &Update,
    converter: &mut Keys,
) -> Result<(BTreeMap<String, Vec<i64>>, u64)> {
    let wanted: HashSet<&Key> = update.keys().collect();
    let mut seen: HashSet<&Key> = HashSet::new();
    let mut positions: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    live_keys(table, keys, converter, |k, file, pos| {
        if let Some(w) = wanted.get(&k) {
            seen.insert(w);
            positions.entry(file.to_string()).or_default().push(pos);
        }
        true
    })
    .await?;
    let unknown = update.deleted.iter().filter(|k| !seen.contains(k)).count() as u64;
    Ok((positions, unknown))
}

/// Call `f` with the key, data file and position of every live row of `table` (its key
/// columns `keys` only are read), until it returns false.
pub async fn live_keys(
    table: &Table,
    keys: &[String],
    converter: &mut Keys,
    mut f: impl FnMut(Key, &str, i64) -> bool,
) -> Result<()> {
    let tasks = read::plan_all(table).await?;
    let mut rows = read::positioned_columns(table, tasks, Some(keys))?;
    while let Some(batch) = rows.try_next().await? {
        let found = converter.of(&batch)?;
        let (Some(file), Some(pos)) = (
            batch.column_by_name(read::FILE_COLUMN),
            batch.column_by_name(read::POS_COLUMN),
        ) else {
            return Err(Error::Internal("positioned rows without positions".into()));
        };
        let (file, pos) = (file.as_string::<i32>(), pos.as_primitive::<Int64Type>());
        for (i, k) in found.into_iter().enumerate() {
            if !f(k, file.value(i), pos.value(i)) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// After the commit of what [`superseded`] found, as `snapshot`: the table's key index
/// follows it.
pub async fn committed(table: &Table, update: Update, snapshot: Option<i64>) {
    key_index::of(table)
        .lock()
        .await
        .committed(update, snapshot);
}

/// The live data files of `table` among `paths`, as delete files name them.
async fn data_files<'a>(
    table: &Table,
    paths: impl Iterator<Item = &'a String>,
) -> Result<BTreeMap<String, Target>> {
    let wanted: HashSet<&String> = paths.collect();
    Ok(read::plan_all(table)
        .await?
        .iter()
        .filter(|t| wanted.contains(&t.data_file_path))
        .map(|t| (t.data_file_path.clone(), Target::of(t)))
        .collect())
}

/// Delete delete files written for a commit that did not happen.
pub async fn discard(table: &Table, files: &[(DataFile, i32)]) {
    deletes::discard(table.file_io(), files).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[test]
    fn key_names_follow_field_ids_whatever_the_instance() {
        use iceberg::spec::{NestedField, PrimitiveType, Type};
        let field = |id, name: &str| {
            NestedField::required(id, name, Type::Primitive(PrimitiveType::String)).into()
        };
        for _ in 0..20 {
            // Each build holds the ids in a hash set of its own.
            let schema = Schema::builder()
                .with_fields(vec![
                    field(1, "a"),
                    field(2, "b"),
                    field(3, "c"),
                    field(4, "d"),
                ])
                .with_identifier_field_ids([4, 2, 3, 1])
                .build()
                .unwrap();
            assert_eq!(key_names(&schema), ["a", "b", "c", "d"]);
        }
    }

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema};

    use super::*;

    fn batch(ids: &[i64], regions: &[&str], values: &[&str]) -> RecordBatch {
        let schema = Arc::new(ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("region", DataType::Utf8, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(regions.to_vec())),
                Arc::new(StringArray::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn the_last_row_of_each_key_is_kept_in_order() {
        let b = batch(
            &[1, 2, 1, 3, 2, 1],
            &["a", "a", "a", "a", "b", "a"],
            &["x1", "y1", "x2", "z1", "y2", "x3"],
        );
        let one = last_per_key(&b, &["id".to_string()]).unwrap();
        let v = one.column(2).as_string::<i32>();
        let got: Vec<&str> = (0..one.num_rows()).map(|i| v.value(i)).collect();
        assert_eq!(got, ["z1", "y2", "x3"]);
        // A key of two columns: (2, a) and (2, b) are two keys.
        let two = last_per_key(&b, &["id".to_string(), "region".to_string()]).unwrap();
        let v = two.column(2).as_string::<i32>();
        let got: Vec<&str> = (0..two.num_rows()).map(|i| v.value(i)).collect();
        assert_eq!(got, ["y1", "z1", "y2", "x3"]);
    }

    /// The third column's values of `batches`, in order.
    fn values_of(batches: &[RecordBatch]) -> Vec<String> {
        batches
            .iter()
            .flat_map(|u| {
                let v = u.column(2).as_string::<i32>().clone();
                (0..u.num_rows()).map(move |i| v.value(i).to_string())
            })
            .collect()
    }

    #[test]
    fn the_last_change_of_each_key_across_batches_wins() {
        let a = batch(&[1, 2, 3], &["a", "a", "a"], &["x1", "y1", "z1"]);
        let b = batch(&[2, 1, 4], &["a", "a", "a"], &["y2", "x2", "w1"]);
        // 2 is deleted last, 1 updated last, 3 deleted then not changed again.
        let deletes = [
            BooleanArray::from(vec![false, false, true]),
            BooleanArray::from(vec![true, false, false]),
        ];
        let keys = ["id".to_string()];
        let (upserts, deleted) =
            last_changes(&[a.clone(), b.clone()], &deletes, &[], &keys).unwrap();
        let values = values_of(&upserts);
        assert_eq!(values, ["x2", "w1"]);
        let deleted = deleted.unwrap();
        let ids = deleted
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [3, 2]);
        assert_eq!(deleted.num_columns(), 1, "the key columns only");
        // The same batches with their records' offsets: b's changes of 1 and 2 came first
        // (their rows were decoded in another group), so a's win for them.
        let seqs = [
            Some(Int64Array::from(vec![10, 11, 12])),
            Some(Int64Array::from(vec![5, 6, 13])),
        ];
        let (upserts, deleted) = last_changes(&[a, b], &deletes, &seqs, &keys).unwrap();
        let values = values_of(&upserts);
        assert_eq!(values, ["x1", "y1", "w1"]);
        let ids = deleted
            .unwrap()
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [3]);
    }

    #[test]
    fn a_batch_without_repeated_keys_is_kept_as_it_is() {
        let b = batch(&[1, 2, 3], &["a", "a", "a"], &["x", "y", "z"]);
        let out = last_per_key(&b, &["id".to_string()]).unwrap();
        assert_eq!(out, b);
        assert!(last_per_key(&b, &["nope".to_string()]).is_err());
    }
}

//! The manifest lists of the snapshots floe wrote, kept in memory so that the next commit to
//! the same table does not read back what this process wrote one commit earlier.
//!
//! A routed job commits every table it touched at every checkpoint; each commit starts from
//! the current snapshot's manifests. Read through iceberg-rust, every such read parses the
//! list's Avro schema from the file's header and decodes its entries: with 10,000 tables that
//! was 5% of a job's time. The list a commit writes is known exactly when it is written (the
//! manifests with the sequence numbers and first row ids [`assign`] gives them, which the
//! list writer then serializes unchanged), so it is kept under its path, and the parent's is
//! dropped (a table's next commit starts from the new list). A list file is never rewritten,
//! so a kept list cannot go stale; a list this process did not write (another writer's, or
//! from before a restart) is read from storage.
//!
//! floe also encodes the lists it writes (iceberg-rust's writer serializes each list's Avro
//! schema into the file's header through generic Avro values, and each entry the same way:
//! 2-4% of a job routing to 10,000 tables). As with manifests (`super::manifest`), once per
//! format version iceberg-rust writes a list of sample manifests in memory, floe encodes the
//! same, and floe's encoding is used only if the entries' bytes are equal; the Avro schema
//! text in the header is the one iceberg-rust wrote.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use iceberg::spec::{
    FieldSummary, FormatVersion, ManifestContentType, ManifestFile, ManifestListWriter,
    SnapshotRef, UNASSIGNED_SEQUENCE_NUMBER,
};
use iceberg::table::Table;

use super::manifest::{array, bytes, container, lock, long, optional, read_container};
use crate::error::{Error, Result};

/// How many manifests the kept lists may name in all before they are dropped (each a few
/// hundred bytes: 10,000 tables of a few manifests each fit many times over).
const MAX_MANIFESTS: usize = 200_000;

#[derive(Default)]
struct Kept {
    by_path: HashMap<String, Arc<[ManifestFile]>>,
    manifests: usize,
}

static KEPT: LazyLock<Mutex<Kept>> = LazyLock::new(Mutex::default);

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    // (A panic while holding the lock leaves the map whole: the count only bounds memory.)
    lock(&KEPT)
}

/// The manifests `snapshot`'s list names, from memory when this process wrote the list.
pub async fn load(table: &Table, snapshot: &SnapshotRef) -> Result<Arc<[ManifestFile]>> {
    if let Some(list) = kept().by_path.get(snapshot.manifest_list()) {
        return Ok(list.clone());
    }
    let list = table.manifest_list_reader(snapshot).load().await?;
    Ok(list.consume_entries().into_iter().collect())
}

/// The manifests of `table`'s current snapshot (none without one).
pub async fn current(table: &Table) -> Result<Arc<[ManifestFile]>> {
    match table.metadata().current_snapshot() {
        Some(s) => load(table, s).await,
        None => Ok(Arc::new([])),
    }
}

/// Keep `manifests` (as [`assign`] left them) as the content of the list at `path`, written
/// for a snapshot whose parent's list is `parent`, which is dropped.
pub fn keep(path: &str, parent: Option<&str>, manifests: Vec<ManifestFile>) {
    let mut kept = kept();
    if let Some(old) = parent.and_then(|p| kept.by_path.remove(p)) {
        kept.manifests -= old.len();
    }
    if kept.manifests + manifests.len() > MAX_MANIFESTS {
        kept.by_path.clear();
        kept.manifests = 0;
    }
    kept.manifests += manifests.len();
    if let Some(old) = kept.by_path.insert(path.to_string(), manifests.into()) {
        kept.manifests -= old.len();
    }
}

/// What a manifest list's header says besides its schema: the snapshot it is of.
pub struct ListHeader {
    pub format: FormatVersion,
    pub snapshot_id: i64,
    pub parent_snapshot_id: Option<i64>,
    pub sequence_number: i64,
    /// Format v3: the table's next row id when the snapshot began.
    pub first_row_id: Option<u64>,
}

/// The bytes of the manifest list of `manifests` (as [`assign`] left them), if floe encodes
/// lists of this format version exactly as iceberg-rust does (else `None`: iceberg-rust's
/// writer is used).
pub async fn encode(header: &ListHeader, manifests: &[ManifestFile]) -> Result<Option<Vec<u8>>> {
    let Some(schema) = list_schema(header.format).await? else {
        return Ok(None);
    };
    let mut block = Vec::new();
    for m in manifests {
        entry(&mut block, header.format, m)?;
    }
    let or_null = |v: Option<String>| v.unwrap_or_else(|| "null".to_string());
    let (snapshot_id, sequence_number) = (
        header.snapshot_id.to_string(),
        header.sequence_number.to_string(),
    );
    let parent = or_null(header.parent_snapshot_id.map(|p| p.to_string()));
    let first_row_id = or_null(header.first_row_id.map(|p| p.to_string()));
    let version = (header.format as u8).to_string();
    let mut metadata: Vec<(&str, &[u8])> = vec![
        ("avro.schema", &schema),
        ("avro.codec", b"null"),
        ("snapshot-id", snapshot_id.as_bytes()),
        ("sequence-number", sequence_number.as_bytes()),
        ("format-version", version.as_bytes()),
        ("parent-snapshot-id", parent.as_bytes()),
    ];
    if header.format >= FormatVersion::V3 {
        metadata.push(("first-row-id", first_row_id.as_bytes()));
    }
    Ok(Some(container(&metadata, manifests.len() as u64, &block)))
}

/// One manifest's entry in a list of format v2 or v3, in the schema's field order.
fn entry(b: &mut Vec<u8>, format: FormatVersion, m: &ManifestFile) -> Result<()> {
    let count = |v: Option<u32>, what: &str| {
        v.ok_or_else(|| Error::Internal(format!("manifest {} has no {what}", m.manifest_path)))
    };
    let rows = |v: Option<u64>, what: &str| -> Result<i64> {
        let v = v.ok_or_else(|| {
            Error::Internal(format!("manifest {} has no {what}", m.manifest_path))
        })?;
        i64::try_from(v).map_err(|_| Error::Internal(format!("{what} {v} does not fit a long")))
    };
    bytes(b, m.manifest_path.as_bytes());
    long(b, m.manifest_length);
    long(b, i64::from(m.partition_spec_id));
    long(b, m.content as i64);
    long(b, m.sequence_number);
    long(b, m.min_sequence_number);
    long(b, m.added_snapshot_id);
    long(
        b,
        i64::from(count(m.added_files_count, "added files count")?),
    );
    long(
        b,
        i64::from(count(m.existing_files_count, "existing files count")?),
    );
    long(
        b,
        i64::from(count(m.deleted_files_count, "deleted files count")?),
    );
    long(b, rows(m.added_rows_count, "added rows count")?);
    long(b, rows(m.existing_rows_count, "existing rows count")?);
    long(b, rows(m.deleted_rows_count, "deleted rows count")?);
    optional(b, m.partitions.as_deref(), |b, fields| {
        array(b, fields, |b, f| {
            b.push(u8::from(f.contains_null));
            optional(b, f.contains_nan, |b, nan| b.push(u8::from(nan)));
            optional(b, f.lower_bound.as_deref(), |b, v| bytes(b, v));
            optional(b, f.upper_bound.as_deref(), |b, v| bytes(b, v));
        })
    });
    let key = m.key_metadata.as_deref().filter(|k| !k.is_empty());
    optional(b, key, bytes);
    if format >= FormatVersion::V3 {
        let first = m.first_row_id.map(|v| v as i64);
        optional(b, first, long);
    }
    Ok(())
}

/// The Avro schema text of lists of `format`, if floe encodes them as iceberg-rust does.
static LIST_SCHEMAS: LazyLock<Mutex<HashMap<u8, Option<AvroSchema>>>> =
    LazyLock::new(Mutex::default);

/// An Avro schema's JSON text.
type AvroSchema = Arc<[u8]>;

async fn list_schema(format: FormatVersion) -> Result<Option<AvroSchema>> {
    if format < FormatVersion::V2 {
        return Ok(None);
    }
    if let Some(known) = lock(&LIST_SCHEMAS).get(&(format as u8)) {
        return Ok(known.clone());
    }
    let schema = probe(format).await?;
    lock(&LIST_SCHEMAS).insert(format as u8, schema.clone());
    Ok(schema)
}

/// Manifests for a probe: every optional field set in one, unset in another, an empty
/// partition summary list in a third.
fn samples(snapshot_id: i64) -> Vec<ManifestFile> {
    let full = ManifestFile {
        manifest_path: "memory:///floe-list-probe/m0.avro".to_string(),
        manifest_length: 4242,
        partition_spec_id: 3,
        content: ManifestContentType::Data,
        sequence_number: 9,
        min_sequence_number: 2,
        added_snapshot_id: snapshot_id,
        added_files_count: Some(70),
        existing_files_count: Some(1 << 20),
        deleted_files_count: Some(0),
        added_rows_count: Some(1 << 40),
        existing_rows_count: Some(5),
        deleted_rows_count: Some(64),
        partitions: Some(vec![
            FieldSummary {
                contains_null: true,
                contains_nan: Some(false),
                lower_bound: Some(vec![1, 2].into()),
                upper_bound: Some(vec![200; 70].into()),
            },
            FieldSummary {
                contains_null: false,
                contains_nan: Some(true),
                lower_bound: None,
                upper_bound: None,
            },
            FieldSummary::default(),
        ]),
        key_metadata: Some(vec![7; 3]),
        first_row_id: Some(1 << 33),
    };
    let bare = ManifestFile {
        manifest_path: "memory:///floe-list-probe/m1.avro".to_string(),
        content: ManifestContentType::Deletes,
        added_snapshot_id: 5,
        partitions: None,
        key_metadata: None,
        first_row_id: None,
        ..full.clone()
    };
    let empty = ManifestFile {
        manifest_path: "memory:///floe-list-probe/m2.avro".to_string(),
        partitions: Some(Vec::new()),
        first_row_id: Some(0),
        ..full.clone()
    };
    vec![full, bare, empty]
}

/// iceberg-rust's Avro schema text for lists of `format`, if floe's encoding of the sample
/// manifests is the entry block iceberg-rust writes for them.
async fn probe(format: FormatVersion) -> Result<Option<AvroSchema>> {
    let io = iceberg::io::FileIO::new_with_memory();
    let path = "memory:///floe-list-probe.avro";
    let (snapshot_id, parent, sequence_number) = (11, Some(10), 9);
    let out = io.new_output(path)?.writer().await?;
    let mut theirs = match format {
        FormatVersion::V3 => {
            ManifestListWriter::v3(out, snapshot_id, parent, sequence_number, Some(1 << 34))
        }
        _ => ManifestListWriter::v2(out, snapshot_id, parent, sequence_number),
    };
    let samples = samples(snapshot_id);
    theirs.add_manifests(samples.iter().cloned())?;
    theirs.close().await?;
    let written = io.new_input(path)?.read().await?;
    let Some((mut metadata, block)) = read_container(&written) else {
        return Ok(None);
    };
    let Some(schema) = metadata.remove("avro.schema") else {
        return Ok(None);
    };
    let mut ours = Vec::new();
    for m in &samples {
        entry(&mut ours, format, m)?;
    }
    // (Unequal: floe encodes lists of this version otherwise; iceberg-rust's writer stays.)
    Ok((ours == block).then(|| schema.into()))
}

/// Give `manifests` what the list of snapshot `snapshot_id` (sequence number `sequence`)
/// records for them, as iceberg-rust's list writer would and as a reader gets them back:
/// unassigned sequence numbers become the snapshot's (only for manifests the snapshot
/// added), data manifests without a first row id get the next ones from `next_row_id`
/// (format v3: `Some` of the table's next row id), delete manifests and format-v2 lists
/// have none, and empty key metadata is none. Returns the table's next row id after them.
pub fn assign(
    format: FormatVersion,
    snapshot_id: i64,
    sequence: i64,
    mut next_row_id: Option<u64>,
    manifests: &mut [ManifestFile],
) -> Result<Option<u64>> {
    for m in manifests {
        for n in [&mut m.sequence_number, &mut m.min_sequence_number] {
            if *n == UNASSIGNED_SEQUENCE_NUMBER {
                if m.added_snapshot_id != snapshot_id {
                    return Err(Error::Internal(format!(
                        "manifest {} of snapshot {} has no sequence number",
                        m.manifest_path, m.added_snapshot_id
                    )));
                }
                *n = sequence;
            }
        }
        if m.key_metadata.as_ref().is_some_and(Vec::is_empty) {
            m.key_metadata = None;
        }
        if format < FormatVersion::V3 || m.content == ManifestContentType::Deletes {
            m.first_row_id = None;
            continue;
        }
        match (next_row_id, m.first_row_id) {
            (Some(next), None) => {
                let rows = |n: Option<u64>, what: &str| {
                    n.ok_or_else(|| {
                        Error::Internal(format!(
                            "manifest {} has no {what} row count, which row lineage needs",
                            m.manifest_path
                        ))
                    })
                };
                let rows =
                    rows(m.existing_rows_count, "existing")? + rows(m.added_rows_count, "added")?;
                m.first_row_id = Some(next);
                next_row_id = Some(next + rows);
            }
            (None, Some(_)) => {
                return Err(Error::Internal(format!(
                    "manifest {} has a first row id in a table without row lineage",
                    m.manifest_path
                )));
            }
            _ => {}
        }
    }
    Ok(next_row_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::io::FileIO;
    use iceberg::spec::{
        DataFileFormat, FieldSummary, ManifestListWriter, NestedField, PartitionSpec,
        PrimitiveType, Schema, Type,
    };

    fn manifest(n: u32, content: ManifestContentType, seq: i64, snapshot: i64) -> ManifestFile {
        ManifestFile {
            manifest_path: format!("memory:///t/metadata/m{n}.avro"),
            manifest_length: 1000 + n as i64,
            partition_spec_id: 0,
            content,
            sequence_number: seq,
            min_sequence_number: seq,
            added_snapshot_id: snapshot,
            added_files_count: Some(n),
            existing_files_count: Some(1),
            deleted_files_count: Some(0),
            added_rows_count: Some(10 * n as u64),
            existing_rows_count: Some(7),
            deleted_rows_count: Some(0),
            partitions: Some(vec![FieldSummary {
                contains_null: n.is_multiple_of(2),
                contains_nan: Some(false),
                lower_bound: Some(vec![1, 0, 0, 0].into()),
                upper_bound: None,
            }]),
            key_metadata: Some(Vec::new()),
            first_row_id: None,
        }
    }

    async fn table(format: FormatVersion) -> Table {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            ])
            .build()
            .unwrap();
        super::super::new_table(
            schema,
            PartitionSpec::unpartition_spec().into_unbound(),
            "memory:///t".to_string(),
            format,
            FileIO::new_with_memory(),
        )
    }

    /// What floe keeps for a list equals what a reader gets back from the file, for lists
    /// mixing new, earlier (v3: with first row ids) and delete manifests.
    #[tokio::test]
    async fn kept_lists_equal_the_files_read_back() {
        for format in [FormatVersion::V2, FormatVersion::V3] {
            let table = table(format).await;
            let io = table.file_io();
            let (id, parent, seq) = (42, 41, 5);
            let mut earlier = manifest(1, ManifestContentType::Data, 3, parent);
            if format == FormatVersion::V3 {
                earlier.first_row_id = Some(100);
            }
            let mut manifests = vec![
                earlier,
                manifest(2, ManifestContentType::Deletes, 4, parent),
                manifest(3, ManifestContentType::Data, UNASSIGNED_SEQUENCE_NUMBER, id),
                manifest(
                    4,
                    ManifestContentType::Deletes,
                    UNASSIGNED_SEQUENCE_NUMBER,
                    id,
                ),
                manifest(5, ManifestContentType::Data, UNASSIGNED_SEQUENCE_NUMBER, id),
            ];
            let first = (format == FormatVersion::V3).then_some(200);
            let next = assign(format, id, seq, first, &mut manifests).unwrap();
            let path = format!(
                "memory:///t/metadata/snap-{format}.{}",
                DataFileFormat::Avro
            );
            let out = io.new_output(&path).unwrap().writer().await.unwrap();
            let mut list = match first {
                Some(first) => ManifestListWriter::v3(out, id, Some(parent), seq, Some(first)),
                None => ManifestListWriter::v2(out, id, Some(parent), seq),
            };
            list.add_manifests(manifests.iter().cloned()).unwrap();
            list.close().await.unwrap();
            let theirs = io.new_input(&path).unwrap().read().await.unwrap();
            let header = ListHeader {
                format,
                snapshot_id: id,
                parent_snapshot_id: Some(parent),
                sequence_number: seq,
                first_row_id: first,
            };
            let ours = encode(&header, &manifests)
                .await
                .unwrap()
                .expect("floe's encoder");
            for bytes in [&theirs[..], &ours[..]] {
                let read = iceberg::spec::ManifestList::parse_with_version(bytes, format).unwrap();
                assert_eq!(read.entries(), &manifests[..], "{format}");
            }
            // The same header: schema, codec, snapshot, parent, sequence number, version, and
            // (v3) first row id.
            let (their_header, their_block) = read_container(&theirs).unwrap();
            let (our_header, our_block) = read_container(&ours).unwrap();
            assert_eq!(our_header, their_header, "{format}");
            assert_eq!(our_block, their_block, "{format}");
            match format {
                // Manifest 3 (37 rows) from 200, manifest 5 (57 rows) from 237.
                FormatVersion::V3 => {
                    assert_eq!(next, Some(294));
                    assert_eq!(manifests[2].first_row_id, Some(200));
                    assert_eq!(manifests[4].first_row_id, Some(237));
                }
                _ => assert_eq!(next, None),
            }
            assert_eq!(manifests[2].sequence_number, seq);
            assert_eq!(manifests[0].sequence_number, 3);
        }
    }

    #[test]
    fn an_earlier_manifest_without_a_sequence_number_is_refused() {
        let mut manifests = vec![manifest(
            1,
            ManifestContentType::Data,
            UNASSIGNED_SEQUENCE_NUMBER,
            7,
        )];
        let err = assign(FormatVersion::V2, 8, 1, None, &mut manifests).unwrap_err();
        assert!(err.to_string().contains("no sequence number"), "{err}");
    }

    #[test]
    fn a_new_list_replaces_its_parents() {
        let m = manifest(1, ManifestContentType::Data, 1, 1);
        keep("memory:///k/snap-1.avro", None, vec![m.clone()]);
        keep(
            "memory:///k/snap-2.avro",
            Some("memory:///k/snap-1.avro"),
            vec![m.clone(), m],
        );
        let kept = kept();
        assert!(!kept.by_path.contains_key("memory:///k/snap-1.avro"));
        assert_eq!(kept.by_path["memory:///k/snap-2.avro"].len(), 2);
    }
}

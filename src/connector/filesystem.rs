//! `filesystem`: JSON-lines or CSV files under a path.
//!
//! ```text
//! 'connector' = 'filesystem'
//! 'path'   = 'data/' | 'data/file.json'
//! 'format' = 'json' | 'csv'
//! 'source.monitor-interval' = '5s'   keep watching for new files (default: read what is
//!                                    there, then finish)
//! 'csv.header' = 'true'              the first line of each CSV file is a header (default false)
//! 'csv.delimiter' = ';'              (default ',')
//! 'format' = 'raw'                   each line into the one declared column
//! ```
//!
//! Columns are declared. Declare `_file STRING` and `_line BIGINT` to get each record's file
//! and 1-based line number. Files are read in name order; each file's offset is the number
//! of its lines consumed. Files are taken as immutable once they appear.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{BadRecord, Offsets, Poll, SourceReader, data_schema, source_rows};
use crate::error::{Error, Reject, Result};
use crate::format::{Decoder, Format};
use crate::sql::Options;

/// Parsed `filesystem` options.
#[derive(Debug, Clone)]
pub struct FilesystemOptions {
    pub path: PathBuf,
    pub decoder: Decoder,
    pub monitor_interval: Option<Duration>,
    pub csv_header: bool,
}

const FILE_COLUMN: &str = "_file";
const LINE_COLUMN: &str = "_line";

fn metadata_columns() -> [(&'static str, DataType); 2] {
    [
        (FILE_COLUMN, DataType::Utf8),
        (LINE_COLUMN, DataType::Int64),
    ]
}

impl FilesystemOptions {
    pub fn try_new(schema: &SchemaRef, options: &mut Options) -> Result<Self> {
        let path = PathBuf::from(options.require_str("path")?);
        let format = options.require_str("format")?;
        let data_schema = data_schema(schema, &metadata_columns())?;
        let decoder = Decoder::try_new(&format, options, data_schema)?;
        let monitor_interval = options.take_duration("source.monitor-interval")?;
        let csv_header = options.take_bool("csv.header")?.unwrap_or(false);
        Ok(Self {
            path,
            decoder,
            monitor_interval,
            csv_header,
        })
    }
}

/// Reads the files of one filesystem source.
pub struct FilesystemReader {
    schema: SchemaRef,
    options: FilesystemOptions,
    /// Lines consumed per file (the offsets).
    consumed: BTreeMap<String, u64>,
    /// The file being read and its lines.
    current: Option<(String, Vec<Vec<u8>>)>,
    last_listing: Option<Instant>,
}

impl FilesystemReader {
    pub fn new(schema: SchemaRef, options: FilesystemOptions) -> Self {
        Self {
            schema,
            options,
            consumed: BTreeMap::new(),
            current: None,
            last_listing: None,
        }
    }

    fn list(&self) -> Result<Vec<PathBuf>> {
        let path = &self.options.path;
        if path.is_file() {
            return Ok(vec![path.clone()]);
        }
        let entries = std::fs::read_dir(path)
            .map_err(|e| Error::io(format!("listing source path {}", path.display()), e))?;
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| !n.starts_with('.') && !n.starts_with('_'))
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// Open the next file with unread lines, if any.
    fn open_next(&mut self) -> Result<bool> {
        for file in self.list()? {
            let key = file.to_string_lossy().into_owned();
            let done = self.consumed.get(&key).copied().unwrap_or(0);
            let lines = read_lines(&file)?;
            let csv = matches!(self.options.decoder.format(), Format::Csv { .. });
            let skip = usize::from(csv && self.options.csv_header);
            if done == 0 && skip > 0 && !lines.is_empty() {
                self.consumed.insert(key.clone(), skip as u64);
            }
            let done = self.consumed.get(&key).copied().unwrap_or(0);
            if (done as usize) < lines.len() {
                self.current = Some((key, lines));
                return Ok(true);
            }
            self.consumed.entry(key).or_insert(lines.len() as u64);
        }
        Ok(false)
    }

    /// Decode `lines` (starting at 0-based line `first_line` of `file`); lines that do not
    /// decode are returned as rejects, the others as a batch with metadata columns.
    async fn decode(&self, file: &str, first_line: u64, lines: &[Vec<u8>]) -> Result<Poll> {
        let records: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        let decoded = self.options.decoder.decode(&records).await?;
        let number = |i: usize| first_line + i as u64 + 1;
        let rejects = decoded
            .errors
            .iter()
            .map(|(i, e)| BadRecord {
                partition: file.to_string(),
                offset: number(*i),
                payload: records[*i].to_vec(),
                reject: Reject::new(format!(
                    "{file} line {}: cannot decode the record: {e}",
                    number(*i)
                )),
            })
            .collect();
        let inferred = self.options.decoder.is_inferred();
        let batches = source_rows(&self.schema, &decoded, inferred, |name, rows| match name {
            FILE_COLUMN => Some(Arc::new(StringArray::from(vec![file; rows.len()])) as ArrayRef),
            LINE_COLUMN => Some(Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|&i| number(i) as i64),
            )) as ArrayRef),
            _ => None,
        })?;
        Ok(Poll::Records { batches, rejects })
    }
}

/// The non-blank lines of `file`, as bytes: a line that is not valid UTF-8 is one bad
/// record (the decoder rejects it with its place), not a file that cannot be read.
fn read_lines(file: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes =
        std::fs::read(file).map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    Ok(bytes
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.trim_ascii().is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

#[async_trait]
impl SourceReader for FilesystemReader {
    async fn poll(&mut self, max_rows: usize) -> Result<Poll> {
        if self.current.is_none() {
            if let (Some(interval), Some(last)) = (self.options.monitor_interval, self.last_listing)
                && last.elapsed() < interval
            {
                tokio::time::sleep(Duration::from_millis(50).min(interval)).await;
                return Ok(Poll::Idle);
            }
            self.last_listing = Some(Instant::now());
            if !self.open_next()? {
                return Ok(if self.options.monitor_interval.is_some() {
                    Poll::Idle
                } else {
                    Poll::Finished
                });
            }
        }
        let Some((file, lines)) = self.current.take() else {
            return Ok(Poll::Idle);
        };
        let done = self.consumed.get(&file).copied().unwrap_or(0) as usize;
        let end = (done + max_rows.max(1)).min(lines.len());
        let poll = self.decode(&file, done as u64, &lines[done..end]).await?;
        self.consumed.insert(file.clone(), end as u64);
        if end < lines.len() {
            self.current = Some((file, lines));
        }
        Ok(poll)
    }

    fn offsets(&self) -> Offsets {
        self.consumed
            .iter()
            .map(|(f, n)| (f.clone(), n.to_string()))
            .collect()
    }

    fn seek(&mut self, offsets: &Offsets) -> Result<()> {
        self.consumed = offsets
            .iter()
            .map(|(f, n)| {
                n.parse::<u64>().map(|n| (f.clone(), n)).map_err(|_| {
                    Error::Internal(format!("line offset '{n}' of {f} is not a number"))
                })
            })
            .collect::<Result<_>>()?;
        self.current = None;
        self.last_listing = None;
        Ok(())
    }

    fn is_bounded(&self) -> bool {
        self.options.monitor_interval.is_none()
    }

    /// Lines left in the file being read (files not opened yet are not counted).
    fn lag(&self) -> Option<u64> {
        let (file, lines) = self.current.as_ref()?;
        let done = self.consumed.get(file).copied().unwrap_or(0);
        Some((lines.len() as u64).saturating_sub(done))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;

    fn reader(dir: &Path, format: &str, extra: &[(&str, &str)]) -> FilesystemReader {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("_line", DataType::Int64, true),
        ]));
        let mut pairs = vec![
            ("path".to_string(), dir.display().to_string()),
            ("format".to_string(), format.to_string()),
        ];
        pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut o = Options::try_new("test", pairs).unwrap();
        let opts = FilesystemOptions::try_new(&schema, &mut o).unwrap();
        o.finish().unwrap();
        FilesystemReader::new(schema, opts)
    }

    async fn ids(r: &mut FilesystemReader, max: usize) -> Vec<i64> {
        let mut out: Vec<i64> = Vec::new();
        loop {
            match r.poll(max).await.unwrap() {
                Poll::Records { batches, .. } => {
                    for b in batches {
                        out.extend(b.column(0).as_primitive::<Int64Type>().values())
                    }
                }
                _ => return out,
            }
        }
    }

    #[tokio::test]
    async fn csv_with_header_in_file_order_and_seek() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.csv"), "id,name\n3,c\n4,d\n").unwrap();
        std::fs::write(dir.path().join("a.csv"), "id,name\n1,a\n2,b\n").unwrap();
        std::fs::write(dir.path().join(".hidden.csv"), "id,name\n9,z\n").unwrap();
        let mut r = reader(dir.path(), "csv", &[("csv.header", "true")]);
        assert_eq!(ids(&mut r, 1).await, vec![1, 2, 3, 4]);
        assert!(matches!(r.poll(10).await.unwrap(), Poll::Finished));

        // Resume after the first record of b.csv.
        let mut offsets = r.offsets();
        let b = dir.path().join("b.csv").to_string_lossy().into_owned();
        offsets.insert(b, "2".to_string());
        let mut again = reader(dir.path(), "csv", &[("csv.header", "true")]);
        again.seek(&offsets).unwrap();
        assert_eq!(ids(&mut again, 10).await, vec![4]);
    }

    #[tokio::test]
    async fn bad_lines_are_rejected_with_their_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("x.json"),
            "{\"id\": 1}\n{\"id\": \"one\"}\nnot json\n{\"id\": 4}\n",
        )
        .unwrap();
        let mut r = reader(dir.path(), "json", &[]);
        let Poll::Records {
            batches: batch,
            rejects,
        } = r.poll(10).await.unwrap()
        else {
            panic!()
        };
        let batch = crate::connector::concat(&batch);
        assert_eq!(
            batch.column(0).as_primitive::<Int64Type>().values(),
            &[1, 4]
        );
        assert_eq!(
            batch.column(2).as_primitive::<Int64Type>().values(),
            &[1, 4],
            "_line"
        );
        let lines: Vec<u64> = rejects.iter().map(|r| r.offset).collect();
        assert_eq!(lines, vec![2, 3]);
        assert_eq!(rejects[1].payload, b"not json");
        assert!(
            rejects[0].reject.reason.contains("x.json line 2"),
            "{}",
            rejects[0].reject.reason
        );
    }

    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_one_bad_record_and_the_files_after_it_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = b"{\"id\": 1}\r\n{\"id\": \"\xff\xfe\"}\n{\"id\": 3}\n".to_vec();
        bad.extend_from_slice(b"\n   \n");
        std::fs::write(dir.path().join("1.json"), &bad).unwrap();
        std::fs::write(dir.path().join("2.json"), "{\"id\": 4}\n").unwrap();
        let mut r = reader(dir.path(), "json", &[]);
        let mut ids = Vec::new();
        let mut rejects = Vec::new();
        loop {
            match r.poll(10).await.unwrap() {
                Poll::Records {
                    batches,
                    rejects: r,
                } => {
                    for b in &batches {
                        ids.extend_from_slice(b.column(0).as_primitive::<Int64Type>().values());
                    }
                    rejects.extend(r);
                }
                Poll::Finished => break,
                Poll::Idle => {}
            }
        }
        assert_eq!(ids, vec![1, 3, 4]);
        assert_eq!(rejects.len(), 1, "{rejects:?}");
        assert_eq!(rejects[0].offset, 2);
        assert_eq!(rejects[0].payload, b"{\"id\": \"\xff\xfe\"}");
        assert!(
            rejects[0].reject.reason.contains("1.json line 2"),
            "{:?}",
            rejects[0]
        );
    }

    #[tokio::test]
    async fn monitoring_picks_up_new_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("1.json"), "{\"id\": 1, \"name\": \"a\"}\n").unwrap();
        let mut r = reader(dir.path(), "json", &[("source.monitor-interval", "10ms")]);
        assert!(!r.is_bounded());
        let Poll::Records { batches: b, .. } = r.poll(10).await.unwrap() else {
            panic!()
        };
        let b = crate::connector::concat(&b);
        assert_eq!(b.num_rows(), 1);
        assert_eq!(b.column(2).as_primitive::<Int64Type>().value(0), 1, "_line");
        assert!(matches!(r.poll(10).await.unwrap(), Poll::Idle));
        std::fs::write(dir.path().join("2.json"), "{\"id\": 2}\n{\"id\": 3}\n").unwrap();
        let mut got: Vec<i64> = Vec::new();
        for _ in 0..100 {
            if let Poll::Records { batches: b, .. } = r.poll(10).await.unwrap() {
                let b = crate::connector::concat(&b);
                got.extend(b.column(0).as_primitive::<Int64Type>().values());
            }
            if got.len() == 2 {
                break;
            }
        }
        assert_eq!(got, vec![2, 3]);
    }
}

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
//! and 1-based line number. Files are read in name order, each from where the last read
//! stopped (see [`FilesystemReader`]). Files are taken as immutable once they appear.

use std::collections::{BTreeSet, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use super::{BadRecord, Offsets, Poll, RecordOrigins, SourceReader, data_schema, source_rows};
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

/// Offsets key: the last file read to its end in name order (every file whose path sorts
/// at or before it is done).
const DONE: &str = "done";
/// Offsets keys: the file being read, its lines consumed and the byte after them, and
/// whether it is a late file (see below).
const FILE: &str = "file";
const LINE: &str = "line";
const BYTE: &str = "byte";
const FILE_LATE: &str = "file.late";
/// Offsets key prefix: a file read out of order, because it appeared after files sorting
/// after it were read (`late:<path>`); kept while the file is there.
const LATE: &str = "late:";

/// Lines read from a file at most per poll, in bytes (a poll also stops at its row count).
const POLL_BYTES: usize = 16 << 20;

/// Bytes read from a file at once.
const READ_BYTES: usize = 256 << 10;

/// Reads the files of one filesystem source, in name order, each from where the last read
/// stopped (a byte offset: resuming reads no file again).
///
/// ```text
/// offsets: done = <path>                      every file sorting at or before it is read
///          file = <path>, line = n, byte = b  the file in progress
///          late:<path> = read                 read out of order (it appeared late)
/// ```
///
/// The offsets stay this size however many files are read. A file that appears with a name
/// sorting before one already read is read when the job sees it appear (and kept as `late:`
/// while it exists); one that appears so while the job is not running is taken as read.
pub struct FilesystemReader {
    schema: SchemaRef,
    options: FilesystemOptions,
    done: Option<String>,
    late: BTreeSet<String>,
    current: Option<OpenFile>,
    /// The files sorting at or before `done` when this reader first listed: read before.
    known: Option<HashSet<String>>,
    last_listing: Option<Instant>,
    buffers: Buffers,
}

/// A poll's lines of a file: their bytes one after another, and each line's 1-based number
/// and place in them.
struct Lines {
    text: Buffer,
    lines: Vec<(u64, Range<usize>)>,
}

/// Polls' buffers, taken again once nothing refers to them: a poll's rows keep their
/// records' bytes (for dead letters) until they are written, on another thread, and a fresh
/// buffer costs the system a page fault per 4 KiB it fills (the allocator gives freed
/// memory back to the system within 100 ms, see `process::tune_allocator`): several
/// percent of a job's time.
#[derive(Default)]
struct Buffers(Arc<Mutex<Vec<Vec<u8>>>>);

/// Buffers kept for the polls to come, at most: more than a routed job holds at once (it
/// gathers 262,144 rows, eight polls of 32,768, before it routes them). They are let go
/// when the source has nothing to read ([`Buffers::release`]).
const KEEP_BUFFERS: usize = 16;

impl Buffers {
    /// An empty buffer with room for `capacity` bytes.
    fn take(&self, capacity: usize) -> Buffer {
        let kept = self.0.lock().ok().and_then(|mut kept| kept.pop());
        let bytes = kept
            .filter(|b| b.capacity() >= capacity)
            .unwrap_or_else(|| Vec::with_capacity(capacity));
        Buffer {
            bytes,
            home: Arc::downgrade(&self.0),
        }
    }

    /// Let the buffers kept go (the source is idle).
    fn release(&self) {
        if let Ok(mut kept) = self.0.lock() {
            kept.clear();
        }
    }
}

/// A poll's buffer: back to its [`Buffers`] when dropped (if they still need one).
struct Buffer {
    bytes: Vec<u8>,
    home: Weak<Mutex<Vec<Vec<u8>>>>,
}

impl std::ops::Deref for Buffer {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade()
            && let Ok(mut kept) = home.lock()
            && kept.len() < KEEP_BUFFERS
        {
            let mut bytes = std::mem::take(&mut self.bytes);
            bytes.clear();
            kept.push(bytes);
        }
    }
}

/// The file being read.
struct OpenFile {
    path: String,
    /// Lines consumed (blank ones too: `_line` is the line's number in the file).
    line: u64,
    /// The byte after them.
    byte: u64,
    /// Open at `byte` between polls; `None` until the first read.
    reader: Option<std::fs::File>,
    /// Non-blank lines still to skip before reading (offsets written by an older floe
    /// counted those, without a byte offset).
    skip_records: u64,
    late: bool,
}

impl OpenFile {
    /// The line at `at` in `text` (its end of line not included), `bytes` long in the file
    /// (its end of line and what was not kept of it included): taken unless it is blank or
    /// a record still to skip.
    fn take_line(
        &mut self,
        lines: &mut Vec<(u64, Range<usize>)>,
        text: &[u8],
        at: Range<usize>,
        bytes: usize,
    ) {
        self.byte += bytes as u64;
        self.line += 1;
        let line = &text[at.clone()];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.trim_ascii().is_empty() {
            return;
        }
        if self.skip_records > 0 {
            self.skip_records -= 1;
            return;
        }
        lines.push((self.line, at.start..at.start + line.len()));
    }
}

impl FilesystemReader {
    pub fn new(schema: SchemaRef, options: FilesystemOptions) -> Self {
        Self {
            schema,
            options,
            done: None,
            late: Default::default(),
            current: None,
            known: None,
            last_listing: None,
            buffers: Buffers::default(),
        }
    }

    fn list(&self) -> Result<Vec<String>> {
        let path = &self.options.path;
        if path.is_file() {
            return Ok(vec![path.to_string_lossy().into_owned()]);
        }
        let entries = std::fs::read_dir(path)
            .map_err(|e| Error::io(format!("listing source path {}", path.display()), e))?;
        let mut files: Vec<String> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| !n.starts_with('.') && !n.starts_with('_'))
            })
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        files.sort();
        Ok(files)
    }

    /// The next file to read, if any: the first after `done`, or one that appeared late.
    fn open_next(&mut self) -> Result<bool> {
        let files = self.list()?;
        // Late files no longer there need no entry.
        self.late.retain(|f| files.binary_search(f).is_ok());
        let done = self.done.clone();
        let before = |f: &String| done.as_ref().is_some_and(|d| f <= d);
        let known = self
            .known
            .get_or_insert_with(|| files.iter().filter(|f| before(f)).cloned().collect());
        let late = files
            .iter()
            .find(|f| before(f) && !known.contains(*f) && !self.late.contains(*f));
        let next = late.or_else(|| files.iter().find(|f| !before(f)));
        let Some(path) = next.cloned() else {
            return Ok(false);
        };
        self.current = Some(OpenFile {
            late: before(&path),
            path,
            line: 0,
            byte: 0,
            reader: None,
            skip_records: u64::from(self.skips_header()),
        });
        Ok(true)
    }

    /// Read the next lines of the open file: at most `max_rows` records or [`POLL_BYTES`]
    /// bytes. Returns the non-blank lines, each with its number; `true` when the file is at
    /// its end.
    ///
    /// The file is read straight into the poll's buffer, [`READ_BYTES`] at a time, and its
    /// lines are found in place; the file is then put back after the last line taken (what
    /// was read past it is read again by the next poll), so that where it stands is always
    /// the `byte` of the offsets.
    fn read_lines(
        file: &mut OpenFile,
        buffers: &Buffers,
        max_rows: usize,
        max_line: usize,
    ) -> Result<(Lines, bool)> {
        use std::io::{Seek, SeekFrom};
        let io = |what: &str, path: &str, e| Error::io(format!("{what} {path}"), e);
        let mut f = match file.reader.take() {
            Some(f) => f,
            None => {
                let mut f =
                    std::fs::File::open(&file.path).map_err(|e| io("opening", &file.path, e))?;
                f.seek(SeekFrom::Start(file.byte))
                    .map_err(|e| io("seeking in", &file.path, e))?;
                f
            }
        };
        // Room for a poll's bytes, the line being read when it is full (at most a record's
        // size, the rest of a longer line is not kept) and one read (pages not written are
        // not taken): the buffer is never copied to grow.
        let mut read = Lines {
            text: buffers.take(POLL_BYTES + max_line + 1 + READ_BYTES),
            lines: Vec::new(),
        };
        let Lines { text, lines } = &mut read;
        let max_rows = max_rows.max(1);
        let full = |lines: &Vec<_>, start: usize| lines.len() >= max_rows || start >= POLL_BYTES;
        let read_more = |f: &mut std::fs::File, text: &mut Vec<u8>| {
            use std::io::Read;
            f.take(READ_BYTES as u64).read_to_end(text)
        };
        // `text[..start]` holds the lines passed, `text[start..]` the start of the next.
        let mut start = 0;
        let at_end = loop {
            while !full(lines, start) {
                let Some(n) = memchr::memchr(b'\n', &text[start..]) else {
                    break;
                };
                // Of a line longer than a record may be, one byte more than that is kept.
                let kept = n.min(max_line + 1);
                file.take_line(lines, text, start..start + kept, n + 1);
                start += n + 1;
            }
            if full(lines, start) {
                break false;
            }
            if text.len() - start > max_line {
                // Longer than a record may be, with no end in sight: keep one byte more than
                // that (a bad record) and let the rest of the line go as it is read.
                let kept = start + max_line + 1;
                let mut dropped = text.len() - kept;
                text.truncate(kept);
                let ended = loop {
                    let n = read_more(&mut f, text).map_err(|e| io("reading", &file.path, e))?;
                    if n == 0 {
                        break false;
                    }
                    match memchr::memchr(b'\n', &text[kept..]) {
                        Some(i) => {
                            dropped += i + 1;
                            text.copy_within(kept + i + 1.., kept);
                            let len = text.len() - i - 1;
                            text.truncate(len);
                            break true;
                        }
                        None => {
                            dropped += n;
                            text.truncate(kept);
                        }
                    }
                };
                file.take_line(lines, text, start..kept, kept - start + dropped);
                start = kept;
                if !ended {
                    break true;
                }
                continue;
            }
            if read_more(&mut f, text).map_err(|e| io("reading", &file.path, e))? == 0 {
                // The last line may have no end of line.
                if text.len() > start {
                    let end = text.len();
                    file.take_line(lines, text, start..end, end - start);
                }
                break true;
            }
        };
        if !at_end && text.len() > start {
            text.truncate(start);
            f.seek(SeekFrom::Start(file.byte))
                .map_err(|e| io("seeking in", &file.path, e))?;
        }
        file.reader = Some(f);
        Ok((read, at_end))
    }

    /// Decode `lines` of `file`; lines that do not decode are returned as rejects, the
    /// others as a batch with metadata columns.
    async fn decode(&self, file: &str, lines: Lines) -> Result<Poll> {
        let Lines { text, lines } = lines;
        let records: Vec<&[u8]> = lines.iter().map(|(_, at)| &text[at.clone()]).collect();
        let decoded = self.options.decoder.decode(&records).await?;
        let number = |i: usize| lines[i].0;
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
        drop(records);
        let file = file.to_string();
        let origins = RecordOrigins::new(lines, decoded.group_rows(), move |(n, at)| {
            Some((file.clone(), *n, text[at.clone()].to_vec()))
        });
        Ok(Poll::Records {
            batches,
            rejects,
            origins: Some(Arc::new(origins)),
        })
    }

    /// Whether the first line of each file is a header to skip.
    fn skips_header(&self) -> bool {
        matches!(self.options.decoder.format(), Format::Csv { .. }) && self.options.csv_header
    }
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
                self.buffers.release();
                return Ok(if self.options.monitor_interval.is_some() {
                    Poll::Idle
                } else {
                    Poll::Finished
                });
            }
        }
        let Some(mut file) = self.current.take() else {
            return Ok(Poll::Idle);
        };
        let max_line = self.options.decoder.max_record_size();
        let (lines, at_end) = Self::read_lines(&mut file, &self.buffers, max_rows, max_line)?;
        let poll = self.decode(&file.path, lines).await?;
        if !at_end {
            self.current = Some(file);
            return Ok(poll);
        }
        if let Some(known) = &mut self.known {
            known.insert(file.path.clone());
        }
        if file.late {
            self.late.insert(file.path);
        } else {
            self.done = Some(file.path);
        }
        Ok(poll)
    }

    fn offsets(&self) -> Offsets {
        let mut offsets = Offsets::new();
        if let Some(done) = &self.done {
            offsets.insert(DONE.to_string(), done.clone());
        }
        for path in &self.late {
            offsets.insert(format!("{LATE}{path}"), "read".to_string());
        }
        if let Some(f) = &self.current {
            offsets.insert(FILE.to_string(), f.path.clone());
            offsets.insert(LINE.to_string(), f.line.to_string());
            offsets.insert(BYTE.to_string(), f.byte.to_string());
            if f.late {
                offsets.insert(FILE_LATE.to_string(), "true".to_string());
            }
        }
        offsets
    }

    fn seek(&mut self, offsets: &Offsets) -> Result<()> {
        let number = |key: &str| {
            let v = offsets.get(key).map_or("0", String::as_str);
            v.parse::<u64>().map_err(|_| {
                Error::Internal(format!("filesystem offset {key} = '{v}' is not a number"))
            })
        };
        self.done = offsets.get(DONE).cloned();
        self.current = None;
        self.known = None;
        self.last_listing = None;
        self.late = offsets
            .keys()
            .filter_map(|k| k.strip_prefix(LATE))
            .map(str::to_string)
            .collect();
        if let Some(path) = offsets.get(FILE) {
            let line = number(LINE)?;
            self.current = Some(OpenFile {
                path: path.clone(),
                line,
                byte: number(BYTE)?,
                reader: None,
                skip_records: u64::from(line == 0 && self.skips_header()),
                late: offsets.contains_key(FILE_LATE),
            });
        }
        // Offsets of an older floe: non-blank lines consumed per file, read in name order,
        // so every file but the last was read to its end.
        let reserved = [DONE, FILE, LINE, BYTE, FILE_LATE];
        let mut legacy: Vec<&String> = offsets
            .keys()
            .filter(|k| !reserved.contains(&k.as_str()) && !k.starts_with(LATE))
            .collect();
        if let Some(last) = legacy.pop() {
            self.done = legacy.pop().cloned();
            self.current = Some(OpenFile {
                path: last.clone(),
                line: 0,
                byte: 0,
                reader: None,
                skip_records: number(last)?,
                late: false,
            });
        }
        Ok(())
    }

    fn is_bounded(&self) -> bool {
        self.options.monitor_interval.is_none()
    }

    /// Records left are not known without reading the files.
    fn lag(&self) -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;
    use std::path::Path;

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

    /// Poll until the reader has nothing: the ids read (stops at `Idle` too).
    async fn drain(r: &mut FilesystemReader) -> Vec<i64> {
        let mut out = Vec::new();
        for _ in 0..20 {
            match r.poll(10).await.unwrap() {
                Poll::Records { batches, .. } => {
                    for b in batches {
                        out.extend(b.column(0).as_primitive::<Int64Type>().values())
                    }
                }
                _ => break,
            }
        }
        out
    }

    /// A poll's buffer is taken again by a later poll once its rows are gone (not while
    /// they are kept), and let go when the source has nothing more to read.
    #[tokio::test]
    async fn poll_buffers_are_reused_once_their_rows_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let lines: String = (0..6).map(|i| format!("{{\"id\": {i}}}\n")).collect();
        std::fs::write(dir.path().join("a.json"), &lines).unwrap();
        let mut r = reader(dir.path(), "json", &[]);
        let kept = |r: &FilesystemReader| r.buffers.0.lock().unwrap().len();
        // The first poll's rows are held: the second poll needs a buffer of its own.
        let first = r.poll(2).await.unwrap();
        let second = r.poll(2).await.unwrap();
        assert_eq!(kept(&r), 0);
        drop(first);
        drop(second);
        assert_eq!(kept(&r), 2);
        // The third poll takes one of them, and gives it back when dropped.
        let third = r.poll(2).await.unwrap();
        assert_eq!(kept(&r), 1);
        let Poll::Records { batches, .. } = &third else {
            panic!("records expected")
        };
        assert_eq!(
            batches[0].column(0).as_primitive::<Int64Type>().values(),
            &[4, 5]
        );
        drop(third);
        assert_eq!(kept(&r), 2);
        // Nothing more to read (the file's end is found by a poll of no rows): the buffers go.
        while !matches!(r.poll(2).await.unwrap(), Poll::Finished) {}
        assert_eq!(kept(&r), 0);
    }

    /// A poll stops at its byte budget without its buffer growing (and copying what it
    /// holds): the buffer has room for the budget and one more line of the largest size.
    #[test]
    fn a_poll_of_long_lines_fits_its_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        // Lines of a little more than 1 MiB: the sixteenth passes the budget (16 MiB).
        let line = format!("{{\"name\": \"{}\"}}\n", "x".repeat(1 << 20));
        std::fs::write(&path, line.repeat(20)).unwrap();
        let mut file = OpenFile {
            path: path.display().to_string(),
            line: 0,
            byte: 0,
            reader: None,
            skip_records: 0,
            late: false,
        };
        let buffers = Buffers::default();
        let max_line = 2 << 20;
        let (read, at_end) =
            FilesystemReader::read_lines(&mut file, &buffers, 100, max_line).unwrap();
        assert!(!at_end);
        assert_eq!(read.lines.len(), 16);
        assert!(read.text.len() > POLL_BYTES);
        assert_eq!(read.text.capacity(), POLL_BYTES + max_line + 1 + READ_BYTES);
    }

    /// A reader read ahead gives the same polls, and its offsets are those after the poll
    /// taken, not after the ones read ahead: a checkpoint names only the records it took.
    #[tokio::test]
    async fn read_ahead_offsets_are_the_polls_taken() {
        use crate::connector::prefetch::Prefetched;
        let dir = tempfile::tempdir().unwrap();
        let lines: String = (0..10).map(|i| format!("{{\"id\": {i}}}\n")).collect();
        std::fs::write(dir.path().join("a.json"), &lines).unwrap();
        std::fs::write(dir.path().join("b.json"), r#"{"id": 10}"#).unwrap();
        let mut plain = reader(dir.path(), "json", &[]);
        let mut ahead = Prefetched::new(Box::new(reader(dir.path(), "json", &[])), 3, 2);
        let start = ahead.offsets();
        assert_eq!(start, plain.offsets());
        let mut taken: Vec<i64> = Vec::new();
        loop {
            let (a, p) = (ahead.poll(3).await.unwrap(), plain.poll(3).await.unwrap());
            // Read ahead by now (a channel of two): still the offsets after this poll.
            tokio::task::yield_now().await;
            assert_eq!(ahead.offsets(), plain.offsets());
            match (a, p) {
                (Poll::Records { batches: a, .. }, Poll::Records { batches: p, .. }) => {
                    assert_eq!(a, p);
                    for b in a {
                        taken.extend(b.column(0).as_primitive::<Int64Type>().values());
                    }
                }
                (Poll::Finished, Poll::Finished) => break,
                _ => panic!("the polls differ"),
            }
        }
        assert_eq!(taken, (0..=10).collect::<Vec<i64>>());
        assert_ne!(ahead.offsets(), start);
        // Nothing after the end; a read-ahead reader does not seek.
        assert!(ahead.poll(3).await.is_err());
        assert!(ahead.seek(&start).is_err());
    }

    #[tokio::test]
    async fn csv_with_header_in_file_order_and_seek() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.csv"), "id,name\n3,c\n4,d\n").unwrap();
        std::fs::write(dir.path().join("a.csv"), "id,name\n1,a\n2,b\n").unwrap();
        std::fs::write(dir.path().join(".hidden.csv"), "id,name\n9,z\n").unwrap();
        let header = [("csv.header", "true")];
        let mut r = reader(dir.path(), "csv", &header);
        assert_eq!(ids(&mut r, 1).await, vec![1, 2, 3, 4]);
        assert!(matches!(r.poll(10).await.unwrap(), Poll::Finished));

        // Resume after three records: in b.csv, after its first.
        let mut r = reader(dir.path(), "csv", &header);
        let mut first = Vec::new();
        while first.len() < 3 {
            first.extend(drain_one(&mut r).await);
        }
        assert_eq!(first, vec![1, 2, 3]);
        let mut again = reader(dir.path(), "csv", &header);
        again.seek(&r.offsets()).unwrap();
        assert_eq!(ids(&mut again, 10).await, vec![4]);

        // Offsets of an older floe: non-blank lines per file (header included).
        let a = dir.path().join("a.csv").to_string_lossy().into_owned();
        let b = dir.path().join("b.csv").to_string_lossy().into_owned();
        let legacy = Offsets::from([(a, "3".to_string()), (b, "2".to_string())]);
        let mut old = reader(dir.path(), "csv", &header);
        old.seek(&legacy).unwrap();
        assert_eq!(ids(&mut old, 10).await, vec![4]);
    }

    async fn drain_one(r: &mut FilesystemReader) -> Vec<i64> {
        match r.poll(1).await.unwrap() {
            Poll::Records { batches, .. } => batches
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect(),
            other => panic!("{:?}", matches!(other, Poll::Finished)),
        }
    }

    #[tokio::test]
    async fn resuming_reads_from_the_byte_it_stopped_at_and_offsets_stay_small() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..50 {
            let name = dir.path().join(format!("{i:03}.json"));
            std::fs::write(name, format!("{{\"id\": {i}}}\n")).unwrap();
        }
        let big = dir.path().join("100.json");
        std::fs::write(&big, "{\"id\": 100}\n\n{\"id\": 101}\n{\"id\": 102}\n").unwrap();
        let mut r = reader(dir.path(), "json", &[]);
        let mut got = Vec::new();
        while got.len() < 52 {
            got.extend(drain_one(&mut r).await);
        }
        let offsets = r.offsets();
        assert!(offsets.len() <= 4, "one entry per file: {offsets:?}");
        assert_eq!(
            offsets.get(LINE).map(String::as_str),
            Some("3"),
            "{offsets:?}"
        );
        // What was read is overwritten: a resumed reader that read the file again would see it.
        let mut bytes = std::fs::read(&big).unwrap();
        let read = offsets[BYTE].parse::<usize>().unwrap();
        bytes[..read].fill(b'x');
        std::fs::write(&big, bytes).unwrap();
        let mut again = reader(dir.path(), "json", &[]);
        again.seek(&offsets).unwrap();
        let Poll::Records {
            batches, rejects, ..
        } = again.poll(10).await.unwrap()
        else {
            panic!()
        };
        assert!(rejects.is_empty(), "{rejects:?}");
        let b = crate::connector::concat(&batches);
        assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[102]);
        assert_eq!(
            b.column(2).as_primitive::<Int64Type>().values(),
            &[4],
            "_line"
        );
        assert!(matches!(again.poll(10).await.unwrap(), Poll::Finished));
    }

    /// Polls cut by their row count anywhere in a file's reads: every line once, in order,
    /// with its number, whether read on or resumed from the offsets after any poll.
    #[tokio::test]
    async fn polls_of_any_size_read_each_line_once_across_reads() {
        let dir = tempfile::tempdir().unwrap();
        // ~1.3 MiB of lines of different lengths (several reads), blank and CRLF ones among
        // them, and no end of line after the last.
        let mut text = String::new();
        let mut want = Vec::new();
        for i in 0..20_000i64 {
            let pad = "y".repeat((i as usize * 37) % 90);
            match i % 500 {
                7 => text.push_str("  \n"),
                8 => text.push_str(&format!("{{\"id\": {i}, \"name\": \"{pad}\"}}\r\n")),
                _ => text.push_str(&format!("{{\"id\": {i}, \"name\": \"{pad}\"}}\n")),
            }
            if i % 500 != 7 {
                want.push((i, i + 1));
            }
        }
        text.push_str("{\"id\": 20000}");
        want.push((20_000, 20_001));
        std::fs::write(dir.path().join("a.json"), text).unwrap();
        for rows in [1_000, 4_099] {
            let mut r = reader(dir.path(), "json", &[]);
            let mut got = Vec::new();
            let mut polls = 0;
            loop {
                // Every third poll by a new reader from the offsets: the file put back
                // where the poll's lines end.
                if polls % 3 == 2 {
                    let offsets = r.offsets();
                    r = reader(dir.path(), "json", &[]);
                    r.seek(&offsets).unwrap();
                }
                polls += 1;
                match r.poll(rows).await.unwrap() {
                    Poll::Records {
                        batches, rejects, ..
                    } => {
                        assert!(rejects.is_empty(), "{rejects:?}");
                        for b in batches {
                            let ids = b.column(0).as_primitive::<Int64Type>().values();
                            let lines = b.column(2).as_primitive::<Int64Type>().values();
                            got.extend(ids.iter().copied().zip(lines.iter().copied()));
                        }
                    }
                    Poll::Finished => break,
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(got.len(), want.len(), "{rows} rows a poll");
            assert!(
                got == want,
                "{rows} rows a poll: lines out of order or numbered wrong"
            );
        }
    }

    /// A line longer than a record may be, spanning several reads, is one bad record of one
    /// byte more than the bound, and the lines after it (the last without an end of line)
    /// are read as they are.
    #[tokio::test]
    async fn a_line_longer_than_several_reads_is_one_bad_record() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!(
            "{{\"id\": 2, \"name\": \"{}\"}}",
            "x".repeat(3 * READ_BYTES)
        );
        let text = format!("{{\"id\": 1}}\n{long}\n{{\"id\": 3}}\n{long}\n{{\"id\": 5}}\n{long}");
        std::fs::write(dir.path().join("1.json"), text).unwrap();
        let mut r = reader(dir.path(), "json", &[("record.max-size", "100")]);
        let (mut ids, mut bad): (Vec<i64>, Vec<(u64, usize)>) = (Vec::new(), Vec::new());
        loop {
            match r.poll(2).await.unwrap() {
                Poll::Records {
                    batches, rejects, ..
                } => {
                    for b in batches {
                        ids.extend(b.column(0).as_primitive::<Int64Type>().values().iter());
                    }
                    bad.extend(rejects.iter().map(|r| (r.offset, r.payload.len())));
                }
                Poll::Finished => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(ids, [1, 3, 5]);
        assert_eq!(bad, [(2, 101), (4, 101), (6, 101)]);
    }

    #[tokio::test]
    async fn a_record_larger_than_the_bound_is_one_bad_record() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("{{\"id\": 2, \"name\": \"{}\"}}", "x".repeat(5000));
        let text = format!("{{\"id\": 1}}\n{long}\n{{\"id\": 3}}\n");
        std::fs::write(dir.path().join("1.json"), text).unwrap();
        let mut r = reader(dir.path(), "json", &[("record.max-size", "64")]);
        let Poll::Records {
            batches, rejects, ..
        } = r.poll(10).await.unwrap()
        else {
            panic!()
        };
        let b = crate::connector::concat(&batches);
        assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[1, 3]);
        assert_eq!(rejects.len(), 1);
        assert_eq!(rejects[0].offset, 2);
        assert_eq!(rejects[0].payload.len(), 65, "no more of it is held");
        assert!(
            rejects[0]
                .reject
                .reason
                .contains("larger than 'record.max-size' (64 bytes)"),
            "{}",
            rejects[0].reject.reason
        );
    }

    #[tokio::test]
    async fn a_file_that_appears_late_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("2.json"), "{\"id\": 2}\n").unwrap();
        let monitor = [("source.monitor-interval", "1ms")];
        let mut r = reader(dir.path(), "json", &monitor);
        assert_eq!(drain(&mut r).await, vec![2]);
        std::fs::write(dir.path().join("1.json"), "{\"id\": 1}\n").unwrap();
        std::fs::write(dir.path().join("3.json"), "{\"id\": 3}\n").unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut got = drain(&mut r).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        got.extend(drain(&mut r).await);
        assert_eq!(got, vec![1, 3]);
        let offsets = r.offsets();
        let late = format!("{LATE}{}", dir.path().join("1.json").display());
        assert!(offsets.contains_key(&late), "{offsets:?}");
        let mut again = reader(dir.path(), "json", &monitor);
        again.seek(&offsets).unwrap();
        assert_eq!(drain(&mut again).await, Vec::<i64>::new());
        // Once the late file is gone, so is its entry.
        std::fs::remove_file(dir.path().join("1.json")).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(drain(&mut again).await, Vec::<i64>::new());
        assert!(!again.offsets().contains_key(&late));
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
            ..
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
                    ..
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

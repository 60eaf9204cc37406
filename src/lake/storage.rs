//! Local warehouse storage whose file system calls run on tokio's blocking threads.
//!
//! iceberg-rust's `LocalFsStorage` calls `std::fs` inside its async methods, so every file a
//! job creates, writes, syncs or reads would stop the async worker until the disk answers;
//! a checkpoint committing many tables would wait on each file in turn. This storage keeps
//! `LocalFsStorage`'s behaviour (path forms, sync on close) and moves each call to the
//! blocking pool, where several run at once while the worker goes on. Unlike `tokio::fs`, a
//! writer keeps no buffer between writes (a job holds one open file per table).
//!
//! Every file written is durable before a catalog (or a checkpoint record) can name it. A
//! file written through a table's own file IO is synced, with the directories that name it
//! (the ones created for it and the existing one above them), before its write returns or
//! its writer closes: iceberg-rust's catalogs point at metadata right after writing it.
//! floe's own commit path writes through a [`deferring`] file IO instead (data files,
//! manifests, manifest lists, metadata): those files are synced together by
//! [`sync_written`], which every commit (and every checkpoint record) calls before it names
//! them. A checkpoint of a thousand tables then syncs its few thousand files in one call
//! per file system (`syncfs`) rather than a thousand times four files and their folders.
//!
//! ```text
//! table.file_io()         write -> sync file + new dirs -> return        (DDL, iceberg-rust)
//! deferring(file_io, ..)  write -> listed as written    -> return        (floe's commits)
//! sync_written()          the listed files: fsync each (few) or syncfs (many) -> commit
//! ```

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::executor::block_on;
use futures::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage,
    OutputFile, Storage, StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Builds [`LocalStorage`] for `file:` locations and plain paths.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorageFactory;

/// The file IO property that makes [`LocalStorage`] leave syncing to [`sync_written`].
const DEFER_SYNC: &str = "floe.local.defer-sync";

#[typetag::serde(name = "FloeLocalStorageFactory")]
impl StorageFactory for LocalStorageFactory {
    fn build(&self, config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalStorage {
            defer_sync: config.get(DEFER_SYNC).is_some_and(|v| v == "true"),
        }))
    }
}

/// `LocalFsStorage` with its calls on the blocking pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorage {
    /// Files written are listed for [`sync_written`] rather than synced as they close.
    #[serde(default)]
    defer_sync: bool,
}

/// `io` for files under `location` (a table's), writing local files without syncing each:
/// whoever names them in a commit calls [`sync_written`] first. Other storage is `io`.
pub fn deferring(io: &FileIO, location: &str) -> FileIO {
    if location.contains("://") && !location.starts_with("file:") {
        return io.clone();
    }
    FileIOBuilder::new(Arc::new(LocalStorageFactory))
        .with_props(io.config().props().clone())
        .with_prop(DEFER_SYNC, "true")
        .build()
}

/// Local files written through a [`deferring`] file IO and not synced yet, with the
/// directories created for them.
#[derive(Default)]
struct Unsynced {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

static UNSYNCED: std::sync::Mutex<Unsynced> = std::sync::Mutex::new(Unsynced {
    files: Vec::new(),
    dirs: Vec::new(),
});

/// One sync at a time: a caller that waits for another's finds its files synced by it, or
/// syncs them together with those of everyone else who came meanwhile.
static SYNC_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// From this many files on, [`sync_written`] syncs their file systems whole (`syncfs`):
/// one call writes them all, where syncing each writes its inode and folder on its own.
const SYNCFS_FROM: usize = 16;

/// Make every file written so far through a [`deferring`] file IO durable, and the
/// directories that name them: call before a catalog (or a checkpoint record) names any.
pub async fn sync_written() -> Result<()> {
    let _turn = SYNC_TURN.lock().await;
    let pending = std::mem::take(&mut *UNSYNCED.lock().unwrap_or_else(|e| e.into_inner()));
    if pending.files.is_empty() {
        return Ok(());
    }
    blocking(move || sync_files(pending)).await
}

fn sync_files(pending: Unsynced) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let failed = |what: &Path, e: std::io::Error| {
        Error::new(
            ErrorKind::Unexpected,
            format!("syncing {}: {e}", what.display()),
        )
    };
    // A file (or folder) deleted since, by a failed commit or a dropped table, needs nothing.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    if pending.files.len() < SYNCFS_FROM {
        for file in &pending.files {
            match std::fs::File::open(file).and_then(|f| f.sync_all()) {
                Err(e) if !gone(&e) => return Err(failed(file, e)),
                _ => {}
            }
        }
        let mut dirs = pending.dirs;
        dirs.sort();
        dirs.dedup();
        for dir in &dirs {
            match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
                Err(e) if !gone(&e) => return Err(failed(dir, e)),
                _ => {}
            }
        }
        return Ok(());
    }
    let mut devices: std::collections::HashMap<u64, &Path> = Default::default();
    for file in &pending.files {
        match std::fs::metadata(file) {
            Ok(m) => {
                devices.entry(m.dev()).or_insert(file);
            }
            Err(e) if gone(&e) => {}
            Err(e) => return Err(failed(file, e)),
        }
    }
    for file in devices.into_values() {
        let f = std::fs::File::open(file).map_err(|e| failed(file, e))?;
        // SAFETY: syncfs takes an open descriptor, which `f` holds for the call.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
            return Err(failed(file, std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

thread_local! {
    /// This thread's file system calls run right here.
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Make the file system calls of this thread run on it rather than on another of the
/// blocking pool: for the write runtime's workers ([`super::runtime`]), which are meant to
/// be busy (fewer threads, each of which keeps allocator memory of its own).
pub fn run_io_inline() {
    INLINE.set(true);
}

/// Run `f` on the blocking pool (or right here, see [`run_io_inline`]). `LocalFsStorage`'s
/// futures never wait on anything but the file system, so they are driven to completion
/// right there.
async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    if INLINE.get() {
        return f();
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::new(
            ErrorKind::Unexpected,
            format!("a file system call did not finish: {e}"),
        )
    })?
}

#[async_trait]
#[typetag::serde(name = "FloeLocalStorage")]
impl Storage for LocalStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let path = path.to_string();
        blocking(move || block_on(LocalFsStorage.exists(&path))).await
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let path = path.to_string();
        blocking(move || block_on(LocalFsStorage.metadata(&path))).await
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let path = path.to_string();
        blocking(move || block_on(LocalFsStorage.read(&path))).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let path = path.to_string();
        let inner = blocking(move || block_on(LocalFsStorage.reader(&path))).await?;
        Ok(Box::new(Reader(Arc::new(inner))))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let (path, defer) = (path.to_string(), self.defer_sync);
        blocking(move || {
            let mut file = LocalFile::create(&path, defer)?;
            file.write(&bs)?;
            file.close()
        })
        .await
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let (path, defer) = (path.to_string(), self.defer_sync);
        let file = blocking(move || LocalFile::create(&path, defer)).await?;
        Ok(Box::new(Writer(Some(file))))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let path = path.to_string();
        blocking(move || block_on(LocalFsStorage.delete(&path))).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let path = path.to_string();
        blocking(move || block_on(LocalFsStorage.delete_prefix(&path))).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> Result<()> {
        let paths: Vec<String> = paths.collect().await;
        blocking(move || {
            for path in paths {
                block_on(LocalFsStorage.delete(&path))?;
            }
            Ok(())
        })
        .await
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// A local file's reader; each read runs on the blocking pool.
struct Reader(Arc<Box<dyn FileRead>>);

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let inner = self.0.clone();
        blocking(move || block_on(inner.read(range))).await
    }
}

/// A local file as a path (`file:///p`, `file:/p` and `/p` are the same file).
fn local_path(location: &str) -> PathBuf {
    let path = location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location);
    match location.starts_with("file:") && !path.starts_with('/') {
        true => PathBuf::from(format!("/{path}")),
        false => PathBuf::from(path),
    }
}

/// The folder that holds `path` (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The directories to sync once a new file at `path` is: its parent and every ancestor that
/// does not exist yet (their names are new too), then the first that does.
fn dirs_naming(path: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut next = path.parent();
    while let Some(dir) = next {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        dirs.push(dir.to_path_buf());
        if dir.exists() {
            break;
        }
        next = dir.parent();
    }
    dirs
}

/// Sync `dirs`, so that the names of the files (and directories) in them are durable.
fn sync_dirs(dirs: &[PathBuf]) -> Result<()> {
    for dir in dirs {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unexpected,
                    format!("syncing directory {}: {e}", dir.display()),
                )
            })?;
    }
    Ok(())
}

/// A local file being written: synced when it closes (and the directories naming it), or,
/// written through a [`deferring`] file IO, listed for [`sync_written`].
///
/// Between the writes of a [`Writer`] it holds no descriptor: each write opens the file to
/// append. A routed job keeps a file open per table for the whole checkpoint, a row group
/// written now and then; ten thousand tables would otherwise hold ten thousand descriptors
/// (or have their files closed and new ones started, many small files per table).
struct LocalFile {
    /// The descriptor of the file just created or written, until the writer lets it go.
    file: Option<std::fs::File>,
    path: PathBuf,
    /// The directories that name it (see [`dirs_naming`]).
    dirs: Vec<PathBuf>,
    defer_sync: bool,
    closed: bool,
}

impl LocalFile {
    /// The file at `location`, created with the directories it needs. Most files go into a
    /// folder that exists (a table's data folder, written to a file at a time): the file is
    /// created first, and only when its folder is missing are the folders looked at.
    fn create(location: &str, defer_sync: bool) -> Result<Self> {
        let path = local_path(location);
        let (file, dirs) = match std::fs::File::create(&path) {
            Ok(file) => (file, vec![folder_of(&path)]),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dirs = dirs_naming(&path);
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| io_failed("creating directory", parent, e))?;
                }
                let file = std::fs::File::create(&path)
                    .map_err(|e| io_failed("creating file", &path, e))?;
                (file, dirs)
            }
            Err(e) => return Err(io_failed("creating file", &path, e)),
        };
        Ok(Self {
            file: Some(file),
            path,
            dirs,
            defer_sync,
            closed: false,
        })
    }

    fn write(&mut self, bs: &[u8]) -> Result<()> {
        use std::io::Write;
        if self.closed {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                "cannot write to a closed file",
            ));
        }
        let file = match &mut self.file {
            Some(file) => file,
            // Appending to the file created (a file deleted since is an error).
            None => self.file.insert(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&self.path)
                    .map_err(|e| io_failed("opening", &self.path, e))?,
            ),
        };
        file.write_all(bs)
            .map_err(|e| io_failed("writing", &self.path, e))
    }

    /// Let the descriptor go until the next write.
    fn release(&mut self) {
        self.file = None;
    }

    fn close(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.closed, true) {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                "the file is closed already",
            ));
        }
        let file = self.file.take();
        if self.defer_sync {
            drop(file);
            let mut unsynced = UNSYNCED.lock().unwrap_or_else(|e| e.into_inner());
            unsynced.files.push(std::mem::take(&mut self.path));
            unsynced.dirs.append(&mut self.dirs);
            return Ok(());
        }
        let file = match file {
            Some(file) => file,
            None => {
                std::fs::File::open(&self.path).map_err(|e| io_failed("opening", &self.path, e))?
            }
        };
        file.sync_all()
            .map_err(|e| io_failed("syncing", &self.path, e))?;
        sync_dirs(&self.dirs)
    }
}

/// An error of a file system call on `path`.
fn io_failed(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("{what} {}: {e}", path.display()),
    )
}

/// A local file's writer; each write and the close run on the blocking pool, and the file
/// holds no descriptor between them (see [`LocalFile`]).
struct Writer(Option<LocalFile>);

impl Writer {
    async fn with<F>(&mut self, f: F) -> Result<()>
    where
        F: FnOnce(&mut LocalFile) -> Result<()> + Send + 'static,
    {
        let mut inner = self
            .0
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "a failed file write was reused"))?;
        let (inner, result) = blocking(move || {
            let result = f(&mut inner);
            Ok((inner, result))
        })
        .await?;
        self.0 = Some(inner);
        result
    }
}

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.with(move |w| {
            let written = w.write(&bs);
            w.release();
            written
        })
        .await
    }

    async fn close(&mut self) -> Result<()> {
        self.with(LocalFile::close).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_round_trip_off_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let path = format!("file://{}/a/b/data.bin", dir.path().display());
        let storage = LocalStorage::default();
        let mut w = storage.writer(&path).await.unwrap();
        w.write(Bytes::from_static(b"hello ")).await.unwrap();
        // No descriptor is held between writes (a job keeps a file open per table).
        let held = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|fd| std::fs::read_link(fd.unwrap().path()).ok())
                .filter(|target| target.ends_with("a/b/data.bin"))
                .count()
        };
        assert_eq!(held(), 0);
        w.write(Bytes::from_static(b"world")).await.unwrap();
        assert_eq!(held(), 0);
        w.close().await.unwrap();
        assert!(w.close().await.is_err(), "a closed file cannot close again");
        let closed = w.write(Bytes::from_static(b"!")).await.unwrap_err();
        assert!(closed.to_string().contains("closed"), "{closed}");
        assert!(storage.exists(&path).await.unwrap());
        assert_eq!(storage.metadata(&path).await.unwrap().size, 11);
        let r = storage.reader(&path).await.unwrap();
        assert_eq!(&r.read(6..11).await.unwrap()[..], b"world");
        storage.delete(&path).await.unwrap();
        assert!(!storage.exists(&path).await.unwrap());
        let missing = storage.read(&path).await.unwrap_err();
        assert!(missing.to_string().contains("data.bin"), "{missing}");
        let whole = format!("file:{}/c/metadata.json", dir.path().display());
        storage
            .write(&whole, Bytes::from_static(b"{}"))
            .await
            .unwrap();
        assert_eq!(&storage.read(&whole).await.unwrap()[..], b"{}");
    }

    fn listed(path: &Path) -> bool {
        UNSYNCED.lock().unwrap().files.iter().any(|f| f == path)
    }

    #[tokio::test]
    async fn a_deferring_io_leaves_its_files_to_sync_written() {
        let dir = tempfile::tempdir().unwrap();
        let table = format!("{}/t", dir.path().display());
        let io = FileIOBuilder::new(Arc::new(LocalStorageFactory)).build();
        let deferred = deferring(&io, &table);
        assert_eq!(
            deferred.config().get(DEFER_SYNC).map(String::as_str),
            Some("true")
        );
        // Object storage needs nothing of the kind: its io is the table's.
        let s3 = deferring(&io, "s3://bucket/t");
        assert!(s3.config().get(DEFER_SYNC).is_none());
        let (data, meta, own) = (
            dir.path().join("t/data/a.parquet"),
            dir.path().join("t/metadata/00001.metadata.json"),
            dir.path().join("t/metadata/00000.metadata.json"),
        );
        {
            // No sync takes the list meanwhile.
            let _turn = SYNC_TURN.lock().await;
            let mut w = deferred
                .new_output(data.to_str().unwrap())
                .unwrap()
                .writer()
                .await
                .unwrap();
            w.write(Bytes::from_static(b"rows")).await.unwrap();
            w.close().await.unwrap();
            deferred
                .new_output(format!("file://{}", meta.display()))
                .unwrap()
                .write(Bytes::from_static(b"{}"))
                .await
                .unwrap();
            io.new_output(own.to_str().unwrap())
                .unwrap()
                .write(Bytes::from_static(b"{}"))
                .await
                .unwrap();
            assert!(listed(&data) && listed(&meta), "deferred files are listed");
            assert!(!listed(&own), "the table's own io syncs as it writes");
            let pending = UNSYNCED.lock().unwrap();
            assert!(pending.dirs.contains(&dir.path().join("t/data")));
            assert!(pending.dirs.contains(&dir.path().join("t")));
        }
        sync_written().await.unwrap();
        assert!(!listed(&data) && !listed(&meta));
        assert_eq!(std::fs::read(&data).unwrap(), b"rows");
    }

    #[test]
    fn syncing_few_files_or_many_or_deleted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let files = |n: usize| -> Unsynced {
            let files: Vec<PathBuf> = (0..n)
                .map(|i| {
                    let p = dir.path().join(format!("f{n}-{i}"));
                    std::fs::write(&p, b"x").unwrap();
                    p
                })
                .collect();
            Unsynced {
                files,
                dirs: vec![dir.path().to_path_buf(), dir.path().to_path_buf()],
            }
        };
        sync_files(files(3)).unwrap();
        sync_files(files(SYNCFS_FROM)).unwrap();
        let mut gone = files(2);
        gone.files.push(dir.path().join("deleted-since"));
        sync_files(gone).unwrap();
        // A folder deleted since (its table dropped) names nothing any more.
        let mut missing_dir = files(1);
        missing_dir.dirs.push(dir.path().join("no-such-dir"));
        sync_files(missing_dir).unwrap();
    }

    #[test]
    fn a_new_file_syncs_the_directories_that_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("t")).unwrap();
        let file = root.join("t/data/region=eu/f.parquet");
        assert_eq!(
            dirs_naming(&file),
            [
                root.join("t/data/region=eu"),
                root.join("t/data"),
                root.join("t")
            ]
        );
        assert_eq!(dirs_naming(Path::new("f.json")), [PathBuf::from(".")]);
        // A file's folders are made when missing; a second file in them names its folder only.
        let first = LocalFile::create(file.to_str().unwrap(), true).unwrap();
        assert!(file.exists());
        assert_eq!(
            first.dirs,
            [
                root.join("t/data/region=eu"),
                root.join("t/data"),
                root.join("t")
            ]
        );
        let second = LocalFile::create(
            &format!(
                "file://{}",
                root.join("t/data/region=eu/g.parquet").display()
            ),
            true,
        )
        .unwrap();
        assert_eq!(second.dirs, [root.join("t/data/region=eu")]);
        assert_eq!(local_path("file:///a/b"), PathBuf::from("/a/b"));
        assert_eq!(local_path("file:/a/b"), PathBuf::from("/a/b"));
        assert_eq!(local_path("file://a/b"), PathBuf::from("/a/b"));
        assert_eq!(local_path("lake/a"), PathBuf::from("lake/a"));
    }
}

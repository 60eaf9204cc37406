//! Local warehouse storage whose file system calls run on tokio's blocking threads.
//!
//! iceberg-rust's `LocalFsStorage` calls `std::fs` inside its async methods, so every file a
//! job creates, writes, syncs or reads would stop the async worker until the disk answers;
//! a checkpoint committing many tables would wait on each file in turn. This storage keeps
//! `LocalFsStorage`'s behaviour (path forms, sync on close) and moves each call to the
//! blocking pool, where several run at once while the worker goes on. Unlike `tokio::fs`, a
//! writer keeps no buffer between writes (a job holds one open file per table).
//!
//! Every file written is durable before its write returns (`write`) or its writer closes:
//! the file is synced, and so are the directories that name it (the ones created for it and
//! the existing one above them). A catalog is pointed at metadata only after it is written,
//! so a power loss cannot leave it pointing at a file (or a manifest, or a data file) that is
//! not there.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::executor::block_on;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Builds [`LocalStorage`] for `file:` locations and plain paths.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorageFactory;

#[typetag::serde(name = "FloeLocalStorageFactory")]
impl StorageFactory for LocalStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalStorage))
    }
}

/// `LocalFsStorage` with its calls on the blocking pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorage;

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
        let path = path.to_string();
        blocking(move || {
            let dirs = dirs_naming(&local_path(&path));
            let mut writer = block_on(LocalFsStorage.writer(&path))?;
            block_on(writer.write(bs))?;
            block_on(writer.close())?;
            sync_dirs(&dirs)
        })
        .await
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let path = path.to_string();
        let (inner, dirs) = blocking(move || {
            let dirs = dirs_naming(&local_path(&path));
            Ok((block_on(LocalFsStorage.writer(&path))?, dirs))
        })
        .await?;
        Ok(Box::new(Writer(Some(inner), Some(dirs))))
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

/// A local file's writer; each write (and the closing sync) runs on the blocking pool. The
/// directories naming the file are synced when it closes.
struct Writer(Option<Box<dyn FileWrite>>, Option<Vec<PathBuf>>);

impl Writer {
    async fn with<F>(&mut self, f: F) -> Result<()>
    where
        F: FnOnce(&mut Box<dyn FileWrite>) -> Result<()> + Send + 'static,
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
        self.with(move |w| block_on(w.write(bs))).await
    }

    async fn close(&mut self) -> Result<()> {
        let dirs = self.1.take().unwrap_or_default();
        self.with(move |w| {
            block_on(w.close())?;
            sync_dirs(&dirs)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_round_trip_off_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let path = format!("file://{}/a/b/data.bin", dir.path().display());
        let storage = LocalStorage;
        let mut w = storage.writer(&path).await.unwrap();
        w.write(Bytes::from_static(b"hello ")).await.unwrap();
        w.write(Bytes::from_static(b"world")).await.unwrap();
        w.close().await.unwrap();
        assert!(w.close().await.is_err(), "a closed file cannot close again");
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
        assert_eq!(local_path("file:///a/b"), PathBuf::from("/a/b"));
        assert_eq!(local_path("file:/a/b"), PathBuf::from("/a/b"));
        assert_eq!(local_path("file://a/b"), PathBuf::from("/a/b"));
        assert_eq!(local_path("lake/a"), PathBuf::from("lake/a"));
    }
}

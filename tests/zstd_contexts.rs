//! zstd contexts kept and given again as new (`src/zstd_contexts.rs`): this binary is linked
//! as `build.rs` links every binary of the package, and nothing else in it uses zstd.
#![cfg(target_os = "linux")]

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use floe::zstd_contexts::contexts_asked_and_made;
use zstd_sys::{
    ZSTD_CCtx, ZSTD_CCtx_setParameter, ZSTD_cParameter, ZSTD_compress, ZSTD_compress2,
    ZSTD_compressBound, ZSTD_createCCtx, ZSTD_freeCCtx, ZSTD_isError,
};

/// The tests count and compare contexts of one process: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A small file of 11 zstd columns, as a routed job writes one per table, and read back.
fn write_and_read(i: i64) -> RecordBatch {
    let columns: Vec<(String, ArrayRef)> = (0..11)
        .map(|c| {
            let array: ArrayRef = if c % 2 == 0 {
                Arc::new(Int64Array::from_iter_values((0..150).map(|r| r * c + i)))
            } else {
                Arc::new(StringArray::from_iter_values(
                    (0..150).map(|r| format!("value {r} of {c} in {i}")),
                ))
            };
            (format!("c{c}"), array)
        })
        .collect();
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
        .build();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
        .unwrap()
        .build()
        .unwrap();
    let read: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    assert_eq!(read, [batch], "file {i} reads back as written");
    read.into_iter().next().unwrap()
}

#[test]
fn small_parquet_files_reuse_their_zstd_contexts_and_read_back_the_same() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Each file makes two contexts per column written and two per column read.
    let (asked_before, made_before) = contexts_asked_and_made();
    for i in 0..200 {
        write_and_read(i);
    }
    let (asked, made) = contexts_asked_and_made();
    let (asked, made) = (asked - asked_before, made - made_before);
    assert_eq!(
        asked, 8_800,
        "200 files of 11 columns, each asked for here: is the binary linked with --wrap \
         (build.rs)?"
    );
    assert!(made <= 4 * 11, "{made} zstd contexts made for 8,800 asked");
}

/// `data` compressed by `context` with the parameters it has.
///
/// # Safety
/// `context` is a live compression context.
unsafe fn compressed(context: *mut ZSTD_CCtx, data: &[u8]) -> Vec<u8> {
    unsafe {
        let mut out = vec![0u8; ZSTD_compressBound(data.len())];
        let n = ZSTD_compress2(
            context,
            out.as_mut_ptr().cast(),
            out.len(),
            data.as_ptr().cast(),
            data.len(),
        );
        assert_eq!(ZSTD_isError(n), 0);
        out.truncate(n);
        out
    }
}

#[test]
fn a_kept_context_comes_back_as_new() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let data: Vec<u8> = (0..50_000u32)
        .flat_map(|i| format!("{} {} ", i % 97, i % 1013).into_bytes())
        .collect();
    // SAFETY: contexts made, used and freed as zstd's API describes; buffers sized by it.
    unsafe {
        let mut out = vec![0u8; ZSTD_compressBound(data.len())];
        let n = ZSTD_compress(
            out.as_mut_ptr().cast(),
            out.len(),
            data.as_ptr().cast(),
            data.len(),
            3,
        );
        out.truncate(n);
        let first = ZSTD_createCCtx();
        let level = ZSTD_cParameter::ZSTD_c_compressionLevel;
        assert_eq!(ZSTD_isError(ZSTD_CCtx_setParameter(first, level, 1)), 0);
        let at_1 = compressed(first, &data);
        assert_ne!(at_1, out, "level 1 compresses otherwise than 3");
        ZSTD_freeCCtx(first);
        let (asked, made) = contexts_asked_and_made();
        let again = ZSTD_createCCtx();
        assert_eq!(
            contexts_asked_and_made(),
            (asked + 1, made),
            "kept, not made"
        );
        assert_eq!(again, first, "the context freed is the one given");
        // zstd's default level (3), not the 1 its last owner set.
        assert_eq!(compressed(again, &data), out);
        ZSTD_freeCCtx(again);
    }
}

//! Writing a journal: [`Journaled`] passes every call on to the operator it wraps after
//! handing it to the subtask's journal thread ([`JournalWriter`]), which encodes, compresses
//! and appends it to the current segment ([`SegmentWriter`]); a segment staged on local disk
//! (the store is a bucket) goes into the store when it ends. The task thread only copies a
//! batch into a recycled buffer: compressing and writing the page cache cost as much as a
//! window step's own work, and on the task thread they would slow the whole pipeline.
//!
//! The journal is a debugging aid, so it never fails the job: a write that fails (a full disk,
//! a bucket that refuses a segment, or the subtask's `debug.journal_max_mb` reached) stops this
//! subtask's journal with a warning, and the segment ends at its last whole frame, which a
//! replay reads as the end of what was recorded. A journal thread that falls behind holds the
//! task back at [`QUEUED_BATCHES`], so its memory is bounded.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use eddy_checkpoint::{CheckpointStore, OperatorSnapshot};
use eddy_core::RecordBatch;
use eddy_plan::JournalCompression;
use eddy_runtime::{Component, Output};

use super::format::{Frame, encode, encode_batch};
use super::{JournalHeader, segment_name, segments, subtask_prefix};
use crate::operator::{OperatorError, StreamOperator};

/// Entries queued for the journal thread at most.
const QUEUED_BATCHES: usize = 16;

/// Frames gather in memory up to this many bytes before they go to the file.
const WRITE_BYTES: usize = 1 << 20;
/// And at the latest after this long, so a killed process loses at most this much of its tail.
const WRITE_EVERY_MS: i64 = 200;

/// The journal thread's side: the open segment and what the next segment's header says.
struct SegmentWriter {
    store: CheckpointStore,
    /// The subtask's prefix in the store.
    prefix: String,
    /// Where the open segment is written: in the store itself for a directory, else a local
    /// staging directory, from which each segment is put into the store when it ends.
    dir: PathBuf,
    header: JournalHeader,
    /// `None` once a write failed: the journal stopped.
    file: Option<File>,
    pending: Vec<u8>,
    /// A batch's body before compression.
    scratch: Vec<u8>,
    compression: JournalCompression,
    written_ms: i64,
    /// What the subtask's kept segments may fill.
    max_bytes: u64,
    /// What its other kept segments hold (counted when a segment starts, so segments the
    /// checkpoint thread pruned meanwhile no longer count).
    kept_bytes: u64,
    /// The checkpoint the open segment follows (the header's may have moved on to the next).
    segment_after: u64,
    /// What the open segment holds.
    segment_bytes: u64,
}

fn store_error(e: eddy_checkpoint::CheckpointError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl SegmentWriter {
    /// Starts the segment `header` describes in `store` (staged in `staging` unless the store is
    /// a directory), deleting segments after it that an earlier attempt left (they are not
    /// what the subtask will see now).
    fn open(
        store: CheckpointStore,
        staging: &Path,
        header: JournalHeader,
        max_bytes: u64,
        compression: JournalCompression,
    ) -> std::io::Result<Self> {
        let prefix = subtask_prefix(&header.step, header.slot.index);
        let dir = store.local_root().unwrap_or(staging).join(&prefix);
        std::fs::create_dir_all(&dir)?;
        for stale in segments(&store, &header.step, header.slot.index).map_err(store_error)? {
            if stale.after > header.after_checkpoint {
                store.delete(&stale.path).map_err(store_error)?;
            }
        }
        let written_ms = header.processing_time_ms;
        let pending = Vec::with_capacity(WRITE_BYTES);
        let mut writer = Self {
            store,
            prefix,
            dir,
            header,
            file: None,
            pending,
            scratch: Vec::new(),
            compression,
            written_ms,
            max_bytes,
            kept_bytes: 0,
            segment_after: 0,
            segment_bytes: 0,
        };
        writer.start_segment()?;
        Ok(writer)
    }

    fn start_segment(&mut self) -> std::io::Result<()> {
        self.segment_after = self.header.after_checkpoint;
        let kept = segments(&self.store, &self.header.step, self.header.slot.index).map_err(store_error)?;
        self.kept_bytes = kept.iter().filter(|s| s.after != self.segment_after).map(|s| s.bytes).sum();
        self.file = Some(File::create(self.dir.join(segment_name(self.segment_after)))?);
        self.segment_bytes = 0;
        self.pending.clear();
        encode(&Frame::Header(Box::new(self.header.clone())), &mut self.pending);
        self.write_out()
    }

    /// Writes the rest of the open segment and, when it is staged, puts it into the store.
    fn end_segment(&mut self) -> std::io::Result<()> {
        self.write_out()?;
        if self.store.local_root().is_some() {
            return Ok(());
        }
        let name = segment_name(self.segment_after);
        let local = self.dir.join(&name);
        self.file = None;
        self.store.put_file(&format!("{}/{name}", self.prefix), File::open(&local)?).map_err(store_error)?;
        std::fs::remove_file(local)
    }

    fn write_out(&mut self) -> std::io::Result<()> {
        let after = self.kept_bytes + self.segment_bytes + self.pending.len() as u64;
        if after > self.max_bytes {
            return Err(std::io::Error::other(format!(
                "it would hold {after} bytes, over its limit of {} MiB (`debug.journal_max_mb`)",
                self.max_bytes >> 20
            )));
        }
        if let Some(file) = &mut self.file {
            file.write_all(&self.pending)?;
        }
        self.segment_bytes += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Runs a write; a failure stops the journal (the job goes on).
    fn guarded(&mut self, write: impl FnOnce(&mut Self) -> std::io::Result<()>) {
        if self.file.is_none() {
            return;
        }
        if let Err(e) = write(self) {
            tracing::warn!(
                step = %self.header.step,
                subtask = self.header.slot.index,
                at = %format!("{}/{}", self.store.describe(), self.prefix),
                "the input journal stopped: {e}; the job goes on, and a replay ends where the journal did"
            );
            self.file = None;
            self.pending = Vec::new();
        }
    }

    fn appended(&mut self) {
        if self.pending.len() >= WRITE_BYTES {
            self.guarded(Self::write_out);
        }
    }

    fn batch(&mut self, batch: &RecordBatch, channel: Option<u32>) {
        if self.file.is_some() {
            encode_batch(batch, channel, self.compression, &mut self.pending, &mut self.scratch);
            self.appended();
        }
    }

    fn frame(&mut self, frame: &Frame) {
        if self.file.is_some() {
            encode(frame, &mut self.pending);
            self.appended();
        }
    }

    fn tick(&mut self, now_ms: i64) {
        self.frame(&Frame::ProcessingTime(now_ms));
        self.header.processing_time_ms = now_ms;
        if now_ms - self.written_ms >= WRITE_EVERY_MS {
            self.written_ms = now_ms;
            self.guarded(Self::write_out);
        }
    }

    /// Ends the segment at checkpoint `id`'s barrier and starts the one after it, recording
    /// the code the operator goes on with (a live swap changes it at this barrier).
    fn barrier(&mut self, id: u64, artifact: Option<&str>) {
        self.frame(&Frame::Barrier(id));
        self.header.after_checkpoint = id;
        if let Some(a) = artifact {
            a.clone_into(&mut self.header.artifact);
        }
        self.guarded(|w| {
            w.end_segment()?;
            w.start_segment()
        });
    }

    fn finish(&mut self) {
        self.frame(&Frame::Finish);
        self.guarded(Self::write_out);
    }

    /// Writes what the task hands over until it hangs up, then the rest.
    fn run(mut self, entries: Receiver<Entry>, spare: SyncSender<RecordBatch>, stopped: Arc<AtomicBool>) {
        for entry in entries {
            match entry {
                Entry::Batch(batch, channel) => {
                    self.batch(&batch, channel);
                    // A full pool drops the buffer; the task allocates another.
                    let _ = spare.try_send(batch);
                }
                Entry::Frame(Frame::ProcessingTime(now_ms)) => self.tick(now_ms),
                Entry::Frame(Frame::Finish) => self.finish(),
                Entry::Frame(frame) => self.frame(&frame),
                Entry::Barrier(id, artifact) => self.barrier(id, artifact.as_deref()),
            }
            if self.file.is_none() {
                stopped.store(true, Ordering::Relaxed);
            }
        }
        self.guarded(Self::end_segment);
    }
}

/// What the task hands the journal thread.
enum Entry {
    /// Records, and the input channel they came over.
    Batch(RecordBatch, Option<u32>),
    Frame(Frame),
    /// A checkpoint's barrier, and the code the operator goes on with.
    Barrier(u64, Option<String>),
}

/// The task's side of one subtask's journal.
pub(crate) struct JournalWriter {
    /// Where the segments go, for messages.
    at: String,
    entries: Option<SyncSender<Entry>>,
    spare: Receiver<RecordBatch>,
    stopped: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl JournalWriter {
    /// Starts the segment `header` describes in `store` (staged in `staging` unless the store
    /// is a directory; deleting later segments an earlier attempt left) and the thread that
    /// writes it.
    pub(crate) fn open(
        store: CheckpointStore,
        staging: &Path,
        header: JournalHeader,
        max_bytes: u64,
        compression: JournalCompression,
    ) -> std::io::Result<Self> {
        let name = format!("eddy-journal-{}-{}", header.step, header.slot.index);
        let writer = SegmentWriter::open(store, staging, header, max_bytes, compression)?;
        let at = format!("{}/{}", writer.store.describe(), writer.prefix);
        let (entries, queued) = sync_channel(QUEUED_BATCHES);
        let (recycle, spare) = sync_channel(QUEUED_BATCHES);
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || writer.run(queued, recycle, flag))?;
        Ok(Self { at, entries: Some(entries), spare, stopped, thread: Some(thread) })
    }

    fn send(&mut self, entry: Entry) {
        if self.stopped.load(Ordering::Relaxed) {
            return;
        }
        if let Some(entries) = &self.entries
            && entries.send(entry).is_err()
        {
            self.stopped.store(true, Ordering::Relaxed);
        }
    }

    fn batch(&mut self, batch: &RecordBatch, channel: Option<u32>) {
        if self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let mut copy = self.spare.try_recv().unwrap_or_default();
        copy.clear();
        // A batch the task holds fits a batch; a refusal would be a bug upstream, not here.
        if copy.try_extend(batch).is_ok() {
            self.send(Entry::Batch(copy, channel));
        }
    }

    fn frame(&mut self, frame: Frame) {
        self.send(Entry::Frame(frame));
    }

    fn barrier(&mut self, id: u64, artifact: Option<&str>) {
        self.send(Entry::Barrier(id, artifact.map(str::to_owned)));
    }

    /// Where the segments go.
    pub(crate) fn at(&self) -> &str {
        &self.at
    }
}

impl Drop for JournalWriter {
    /// Hangs up and waits for the thread to write the rest, so a replay right after the job
    /// ends sees everything.
    fn drop(&mut self) {
        self.entries = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An operator whose input is journaled.
pub(crate) struct Journaled {
    inner: Box<dyn StreamOperator>,
    journal: JournalWriter,
    /// The input channel of the next batch, when the task said.
    channel: Option<u32>,
}

impl Journaled {
    pub(crate) fn new(inner: Box<dyn StreamOperator>, journal: JournalWriter) -> Self {
        tracing::info!(step = %inner.name(), journal = %journal.at(), "journaling the step's input");
        Self { inner, journal, channel: None }
    }
}

impl StreamOperator for Journaled {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn process(&mut self, batch: &RecordBatch) -> Result<Output, OperatorError> {
        self.journal.batch(batch, self.channel.take());
        self.inner.process(batch)
    }

    fn input_channel(&mut self, channel: u32) {
        self.channel = Some(channel);
    }

    fn on_watermark(&mut self, watermark: i64) -> Result<Output, OperatorError> {
        self.journal.frame(Frame::Watermark(watermark));
        self.inner.on_watermark(watermark)
    }

    fn on_processing_time(&mut self, now_ms: i64) -> Result<Output, OperatorError> {
        self.journal.frame(Frame::ProcessingTime(now_ms));
        self.inner.on_processing_time(now_ms)
    }

    fn finish(&mut self) -> Result<Output, OperatorError> {
        self.journal.frame(Frame::Finish);
        self.inner.finish()
    }

    fn late_records(&self) -> u64 {
        self.inner.late_records()
    }

    fn wasm_memory_bytes(&mut self) -> u64 {
        self.inner.wasm_memory_bytes()
    }

    fn snapshot(&mut self, staging: &Path) -> Result<OperatorSnapshot, OperatorError> {
        self.inner.snapshot(staging)
    }

    fn after_snapshot(&mut self, checkpoint: u64) -> Result<(), OperatorError> {
        self.journal.barrier(checkpoint, self.inner.artifact());
        self.inner.after_snapshot(checkpoint)
    }

    fn artifact(&self) -> Option<&str> {
        self.inner.artifact()
    }

    fn declared_states(&self) -> Vec<eddy_state::DeclaredState> {
        self.inner.declared_states()
    }

    fn swap_code(self: Box<Self>, component: &Component) -> Result<Box<dyn StreamOperator>, OperatorError> {
        let Self { inner, journal, channel } = *self;
        Ok(Box::new(Self { inner: inner.swap_code(component)?, journal, channel }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{JOURNAL_VERSION, JournalSlot, Segment, parse_segment};

    fn header() -> JournalHeader {
        let yaml =
            "name: p\nsources: [{type: generator, name: g}]\nsteps: [{name: s, wasm: s.wasm}]\nsink: {type: print}\n";
        JournalHeader {
            version: JOURNAL_VERSION,
            step: "s".into(),
            slot: JournalSlot { task: 0, index: 0, position: 0, task_parallelism: 1, keyed: false },
            after_checkpoint: 0,
            artifact: "sha256:0".into(),
            processing_time_ms: 0,
            spec: eddy_plan::PipelineSpec::from_yaml(yaml).expect("spec"),
        }
    }

    /// 64 records of 1 000 bytes that do not compress (a simple generator's bytes).
    fn noise(seed: u64) -> RecordBatch {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut batch = RecordBatch::default();
        for _ in 0..64 {
            let value: Vec<u8> = (0..1000)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            batch.push(None, &value, Some(1));
        }
        batch
    }

    fn write(store: CheckpointStore, staging: &Path, max_bytes: u64, batches: u64) {
        let mut journal =
            JournalWriter::open(store, staging, header(), max_bytes, JournalCompression::Lz4).expect("open");
        for i in 0..batches {
            journal.batch(&noise(i), Some(0));
            journal.frame(Frame::ProcessingTime(i as i64 * 1_000));
        }
        journal.frame(Frame::Finish);
    }

    /// The one segment `write` leaves, read back from `store`, and its size there.
    fn written(store: &CheckpointStore) -> (Segment, u64) {
        let found = segments(store, "s", 0).expect("list");
        assert_eq!(found.iter().map(|s| s.after).collect::<Vec<_>>(), [0], "one segment, from the start");
        let bytes = store.get(&found[0].path).expect("read");
        (parse_segment(&bytes, &found[0].path).expect("parse"), found[0].bytes)
    }

    #[test]
    fn a_journal_keeps_every_frame_under_its_limit_and_stops_at_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = || CheckpointStore::local(&dir.path().join("checkpoints")).expect("store");
        write(store(), &dir.path().join("unused"), 4 << 20, 20);
        let (whole, _) = written(&store());
        assert_eq!(whole.frames.len(), 41, "20 batches, 20 ticks and the end");
        assert_eq!(whole.frames.first(), Some(&Frame::Batch { channel: Some(0), batch: noise(0) }));
        assert_eq!(whole.frames.last(), Some(&Frame::Finish));
        assert!(!dir.path().join("unused").exists(), "a directory store is written in place");

        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(dir.path()).expect("store");
        let limit = 200 << 10;
        write(CheckpointStore::local(dir.path()).expect("store"), dir.path(), limit, 20);
        let (cut, size) = written(&store);
        assert!(size <= limit, "{size} bytes stored, over the {limit} allowed");
        assert!(!cut.frames.is_empty() && cut.frames.len() < 41, "{} frames", cut.frames.len());
        assert!(!cut.frames.contains(&Frame::Finish), "nothing after the limit is written");
    }

    /// In a store that is not a directory (here, in memory) a segment is staged on local disk
    /// and put into the store when its barrier passes or the subtask ends; the staged files go.
    #[test]
    fn a_bucket_receives_each_segment_when_it_ends_and_the_staging_directory_empties() {
        let dir = tempfile::tempdir().expect("tempdir");
        let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let store = || CheckpointStore::over(memory.clone(), "memory".into()).expect("store");
        let mut journal =
            JournalWriter::open(store(), dir.path(), header(), 4 << 20, JournalCompression::None).expect("open");
        journal.batch(&noise(1), None);
        journal.barrier(3, None);
        journal.batch(&noise(2), None);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let listed =
            |s: &CheckpointStore| segments(s, "s", 0).expect("list").iter().map(|s| s.after).collect::<Vec<_>>();
        assert_eq!(listed(&store()), [0], "the open segment is not in the store yet");
        drop(journal);
        assert_eq!(listed(&store()), [0, 3], "the subtask's end puts the last one");
        let second = segments(&store(), "s", 0).expect("list").remove(1);
        let segment = parse_segment(&store().get(&second.path).expect("read"), "after-3").expect("parse");
        assert_eq!(segment.header.after_checkpoint, 3);
        assert_eq!(segment.frames, [Frame::Batch { channel: None, batch: noise(2) }]);
        let staged = std::fs::read_dir(dir.path().join(subtask_prefix("s", 0))).expect("staging").count();
        assert_eq!(staged, 0, "nothing is left staged");

        // A run that restores checkpoint 0's state again drops what came after it.
        drop(JournalWriter::open(store(), dir.path(), header(), 4 << 20, JournalCompression::None).expect("open"));
        assert_eq!(listed(&store()), [0], "an earlier attempt's later segments are deleted");
    }
}

//! Writing a journal: [`Journaled`] passes every call on to the operator it wraps after
//! appending it to the subtask's current segment ([`JournalWriter`]).
//!
//! The journal is a debugging aid, so it never fails the job: a write that fails (a full disk)
//! stops this subtask's journal with a warning, and the segment ends at its last whole frame,
//! which a replay reads as the end of what was recorded.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use eddy_checkpoint::OperatorSnapshot;
use eddy_core::RecordBatch;
use eddy_runtime::{Component, Output};

use super::format::{Frame, encode, encode_batch};
use super::{JournalHeader, segment_path, segments};
use crate::operator::{OperatorError, StreamOperator};

/// Frames gather in memory up to this many bytes before they go to the file.
const WRITE_BYTES: usize = 1 << 20;
/// And at the latest after this long, so a killed process loses at most this much of its tail.
const WRITE_EVERY_MS: i64 = 200;

/// One subtask's journal: the open segment and what the next segment's header says.
pub(crate) struct JournalWriter {
    dir: PathBuf,
    header: JournalHeader,
    /// `None` once a write failed: the journal stopped.
    file: Option<File>,
    pending: Vec<u8>,
    written_ms: i64,
}

impl JournalWriter {
    /// Starts the segment `header` describes in `dir`, deleting segments after it that an
    /// earlier attempt left (they are not what the subtask will see now).
    pub(crate) fn open(dir: PathBuf, header: JournalHeader) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        for (_, stale) in segments(&dir)?.into_iter().filter(|(id, _)| *id > header.after_checkpoint) {
            std::fs::remove_file(stale)?;
        }
        let written_ms = header.processing_time_ms;
        let mut writer = Self { dir, header, file: None, pending: Vec::with_capacity(WRITE_BYTES), written_ms };
        writer.start_segment()?;
        Ok(writer)
    }

    fn start_segment(&mut self) -> std::io::Result<()> {
        let path = segment_path(&self.dir, self.header.after_checkpoint);
        self.file = Some(File::create(&path)?);
        self.pending.clear();
        encode(&Frame::Header(Box::new(self.header.clone())), &mut self.pending);
        self.write_out()
    }

    fn write_out(&mut self) -> std::io::Result<()> {
        if let Some(file) = &mut self.file {
            file.write_all(&self.pending)?;
        }
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
                dir = %self.dir.display(),
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

    fn batch(&mut self, batch: &RecordBatch) {
        if self.file.is_some() {
            encode_batch(batch, &mut self.pending);
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
            w.write_out()?;
            w.start_segment()
        });
    }

    fn finish(&mut self) {
        self.frame(&Frame::Finish);
        self.guarded(Self::write_out);
    }

    /// Where the segments go.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for JournalWriter {
    fn drop(&mut self) {
        self.guarded(Self::write_out);
    }
}

/// An operator whose input is journaled.
pub(crate) struct Journaled {
    inner: Box<dyn StreamOperator>,
    journal: JournalWriter,
}

impl Journaled {
    pub(crate) fn new(inner: Box<dyn StreamOperator>, journal: JournalWriter) -> Self {
        tracing::info!(step = %inner.name(), journal = %journal.dir().display(), "journaling the step's input");
        Self { inner, journal }
    }
}

impl StreamOperator for Journaled {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn process(&mut self, batch: &RecordBatch) -> Result<Output, OperatorError> {
        self.journal.batch(batch);
        self.inner.process(batch)
    }

    fn on_watermark(&mut self, watermark: i64) -> Result<Output, OperatorError> {
        self.journal.frame(&Frame::Watermark(watermark));
        self.inner.on_watermark(watermark)
    }

    fn on_processing_time(&mut self, now_ms: i64) -> Result<Output, OperatorError> {
        self.journal.tick(now_ms);
        self.inner.on_processing_time(now_ms)
    }

    fn finish(&mut self) -> Result<Output, OperatorError> {
        self.journal.finish();
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
        let Self { inner, journal } = *self;
        Ok(Box::new(Self { inner: inner.swap_code(component)?, journal }))
    }
}

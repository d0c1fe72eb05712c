//! The file source: one file read line by line, as text, JSON lines or CSV.
//!
//! The position is counted in whole lines: a line is consumed (and the position moves past it)
//! only once it has become a record or been skipped, so a checkpointed position always sits at
//! a line start and resuming there neither repeats nor loses a record.
//!
//! A line may hold at most `max_line_bytes` bytes before its `\n`. The limit is checked as the
//! line is read, so a longer line (or a file with no newline at all) fails the source after at
//! most that many bytes of memory, never by reading the whole line first.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use eddy_core::RecordBatch;
use serde_json::Value;

use super::{OrderedObject, SourceError, SourcePosition, SourceStatus, timestamp_of};
use eddy_plan::SourceFormat;

/// Large enough that a batch of short lines is one `read` system call.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What the file source needs from its [`eddy_plan::SourceSpec::File`].
#[derive(Debug, Clone)]
pub(super) struct FileOptions {
    /// The source's name, for errors.
    pub name: String,
    /// The file (with `object`, where the object is, for errors).
    pub path: PathBuf,
    /// An object of a bucket to read instead, and its key: downloaded at open (from the
    /// resumed position on, see [`download`]).
    pub object: Option<(eddy_plan::S3Spec, String)>,
    /// How lines become records.
    pub format: SourceFormat,
    /// JSON pointer to the event time.
    pub timestamp: Option<String>,
    /// Wait for more at EOF instead of ending.
    pub follow: bool,
    /// The longest line accepted, not counting its `\n`.
    pub max_line_bytes: usize,
    /// Open `path` only as a regular file under this directory, following no link on the way
    /// ([`open_beneath`]).
    pub beneath: Option<PathBuf>,
}

/// Opens `path` for reading as a regular file under `root`, one component at a time with
/// `O_NOFOLLOW`, so no symbolic link on the way is followed (`root` itself may be one: the
/// server's own directory). A link, a directory, a device or a FIFO in the place of a file is
/// refused with why, and a FIFO cannot make the open wait.
pub(super) fn open_beneath(root: &Path, path: &Path) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags, openat};
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_owned());
    let relative = path.strip_prefix(root).map_err(|_| refused("it is not in the directory it must be read from"))?;
    let mut names = relative.components().peekable();
    let mut dir: std::os::fd::OwnedFd = File::open(root)?.into();
    let nofollow = |e: rustix::io::Errno| {
        if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
            refused("it is, or lies behind, a symbolic link (or a non-directory): only regular files are read")
        } else {
            std::io::Error::from(e)
        }
    };
    while let Some(name) = names.next() {
        let std::path::Component::Normal(name) = name else {
            return Err(refused("its path leaves the directory"));
        };
        if names.peek().is_some() {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            dir = openat(&dir, name, flags, Mode::empty()).map_err(nofollow)?;
            continue;
        }
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let file = File::from(openat(&dir, name, flags, Mode::empty()).map_err(nofollow)?);
        if !file.metadata()?.is_file() {
            return Err(refused("it is not a regular file"));
        }
        // Reads block as usual from here on (a regular file never would anyway).
        rustix::fs::fcntl_setfl(&file, OFlags::RDONLY)?;
        return Ok(file);
    }
    Err(refused("it names the directory itself"))
}

/// Reads one file; see the module docs.
#[derive(Debug)]
pub(super) struct FileSource {
    opts: FileOptions,
    reader: BufReader<File>,
    /// Lines consumed (header and skipped lines included).
    line: u64,
    /// Byte offset just after the consumed lines.
    byte: u64,
    /// The bytes of the line being read. It outlives a poll when the line is not complete yet
    /// (follow mode, the writer is mid-line) or when it was rejected (a retried poll meets the
    /// same error instead of reading on).
    pending: Vec<u8>,
    /// The CSV header's field names, once read.
    header: Option<Vec<String>>,
    /// Reused for each record's JSON.
    scratch: Vec<u8>,
}

impl FileSource {
    /// Opens the file, resuming at `start` when given.
    pub(super) fn open(opts: FileOptions, start: Option<&SourcePosition>) -> Result<Self, SourceError> {
        let file = match &opts.object {
            None => match &opts.beneath {
                Some(root) => open_beneath(root, &opts.path),
                None => File::open(&opts.path),
            },
            Some((s3, key)) => eddy_checkpoint::CheckpointStore::s3(s3)
                .map_err(std::io::Error::other)
                .and_then(|store| download(&store, key, &opts, start)),
        }
        .map_err(|source| io_error(&opts, source))?;
        Self::over(opts, file, start)
    }

    /// Reads `file` (opened from `opts`), resuming at `start` when given.
    fn over(opts: FileOptions, file: File, start: Option<&SourcePosition>) -> Result<Self, SourceError> {
        let mut src = FileSource {
            opts,
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, file),
            line: 0,
            byte: 0,
            pending: Vec::new(),
            header: None,
            scratch: Vec::new(),
        };
        match start {
            None => {}
            Some(&SourcePosition::File { line, byte }) => src.resume(line, byte)?,
            Some(other) => return Err(src.bad_position(other.clone(), "it is not a file position")),
        }
        Ok(src)
    }

    fn resume(&mut self, line: u64, byte: u64) -> Result<(), SourceError> {
        let position = SourcePosition::File { line, byte };
        if (line == 0) != (byte == 0) {
            return Err(self.bad_position(position, "a position before any line has both line and byte 0"));
        }
        let len = self.reader.get_ref().metadata().map_err(|e| self.io(e))?.len();
        if byte > len {
            return Err(
                self.bad_position(position, &format!("the file has only {len} bytes (was it truncated or replaced?)"))
            );
        }
        // A position is always just after a newline, except after a final line without one
        // that a non-following reader consumed at the end of the file.
        if byte > 0 && byte < len {
            self.seek(byte - 1)?;
            let mut before = [0u8];
            self.reader.read_exact(&mut before).map_err(|e| self.io(e))?;
            if before[0] != b'\n' {
                return Err(self.bad_position(position, "it is not at the start of a line"));
            }
        }
        if self.opts.format == SourceFormat::Csv && line > 0 {
            // Rows are objects named by the header, so a resumed reader needs it again.
            self.seek(0)?;
            let mut header = Vec::new();
            self.read_line(1, &mut header)?;
            if header.len() as u64 > byte {
                return Err(self.bad_position(position, "it is inside the CSV header line"));
            }
            self.header = Some(self.parse_header(1, strip_line_end(&header, 1))?);
        }
        self.seek(byte)?;
        self.line = line;
        self.byte = byte;
        Ok(())
    }

    /// Appends line `line_no` to `line`, up to and including its `\n`, or to the end of the
    /// file; returns the bytes read. Fails once the line holds more than `max_line_bytes` bytes
    /// before its `\n`, having taken at most that many into `line`: what is read stays in the
    /// reader, so a retried call meets the same error.
    fn read_line(&mut self, line_no: u64, line: &mut Vec<u8>) -> Result<usize, SourceError> {
        let limit = self.opts.max_line_bytes;
        let mut read = 0;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(&self.opts, e)),
            };
            if available.is_empty() {
                return Ok(read);
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let content = line.len() + newline.unwrap_or(take);
            if content > limit {
                let problem = format!(
                    "is longer than the limit of {limit} bytes (`max_line_bytes` of the source): raise the limit, or split the input into shorter lines"
                );
                return Err(self.bad_input(line_no, problem));
            }
            let needed = line.len() + take;
            if needed > line.capacity() {
                // Grow as a Vec does, but never past the limit: it bounds memory, not only length.
                let target = line.capacity().saturating_mul(2).min(limit.saturating_add(1)).max(needed);
                line.reserve_exact(target - line.len());
            }
            line.extend_from_slice(&available[..take]);
            self.reader.consume(take);
            read += take;
            if newline.is_some() {
                return Ok(read);
            }
        }
    }

    fn seek(&mut self, byte: u64) -> Result<(), SourceError> {
        self.reader.seek(SeekFrom::Start(byte)).map(drop).map_err(|e| self.io(e))
    }

    /// Turns one line (without its line end) into at most one record.
    fn take_line(&mut self, line_no: u64, text: &[u8], out: &mut RecordBatch) -> Result<(), SourceError> {
        let is_blank = text.iter().all(u8::is_ascii_whitespace);
        match self.opts.format {
            SourceFormat::Lines => {
                let text = std::str::from_utf8(text).map_err(|e| self.bad_input(line_no, not_utf8(e)))?;
                let timestamp = match &self.opts.timestamp {
                    // Lines are JSON strings, so a pointer finds nothing; still say so per line.
                    Some(p) => Some(self.timestamp(line_no, Value::String(text.to_string()).pointer(p), p)?),
                    None => None,
                };
                self.scratch.clear();
                serde_json::to_writer(&mut self.scratch, text).map_err(|e| self.bad_input(line_no, e.to_string()))?;
                out.push(None, &self.scratch, timestamp);
            }
            SourceFormat::JsonLines if is_blank => {}
            SourceFormat::JsonLines => {
                let timestamp = match &self.opts.timestamp {
                    Some(p) => {
                        let value: Value =
                            serde_json::from_slice(text).map_err(|e| self.bad_input(line_no, json_problem(&e)))?;
                        Some(self.timestamp(line_no, value.pointer(p), p)?)
                    }
                    None => {
                        serde_json::from_slice::<serde::de::IgnoredAny>(text)
                            .map_err(|e| self.bad_input(line_no, json_problem(&e)))?;
                        None
                    }
                };
                // The line's own bytes, minus insignificant whitespace, rather than a
                // re-serialized `Value`: that would sort object keys and round big numbers.
                self.scratch.clear();
                minify_json(text, &mut self.scratch);
                out.push(None, &self.scratch, timestamp);
            }
            // The header is strictly the first line (a resumed reader re-reads line 1 for it),
            // so a blank first line is an error, not skipped.
            SourceFormat::Csv if self.header.is_none() => self.header = Some(self.parse_header(line_no, text)?),
            SourceFormat::Csv if is_blank => {}
            SourceFormat::Csv => match &self.header {
                None => {}
                Some(header) => {
                    let fields = self.parse_csv(line_no, text)?;
                    if fields.len() != header.len() {
                        return Err(self.bad_input(
                            line_no,
                            format!("has {} fields but the header (line 1) names {}", fields.len(), header.len()),
                        ));
                    }
                    let row: Vec<(&str, Value)> =
                        header.iter().map(String::as_str).zip(fields.into_iter().map(infer_csv_value)).collect();
                    let timestamp = match &self.opts.timestamp {
                        Some(p) => Some(self.timestamp(line_no, csv_field(&row, p), p)?),
                        None => None,
                    };
                    self.scratch.clear();
                    serde_json::to_writer(&mut self.scratch, &OrderedObject(&row))
                        .map_err(|e| self.bad_input(line_no, e.to_string()))?;
                    out.push(None, &self.scratch, timestamp);
                }
            },
        }
        Ok(())
    }

    fn timestamp(&self, line_no: u64, value: Option<&Value>, pointer: &str) -> Result<i64, SourceError> {
        timestamp_of(value, pointer).map_err(|problem| self.bad_input(line_no, problem))
    }

    fn parse_header(&self, line_no: u64, text: &[u8]) -> Result<Vec<String>, SourceError> {
        if text.iter().all(u8::is_ascii_whitespace) {
            return Err(self.bad_input(line_no, "the CSV header line (the field names) is empty".into()));
        }
        let names = self.parse_csv(line_no, text)?;
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(self.bad_input(line_no, format!("the CSV header names the field `{name}` twice")));
            }
        }
        Ok(names)
    }

    /// Splits one CSV line into its (unquoted) fields.
    fn parse_csv(&self, line_no: u64, text: &[u8]) -> Result<Vec<String>, SourceError> {
        // Positions count lines, so a record must not span lines. In well-formed CSV quotes
        // come in pairs (`""` escapes one), so an odd count means a quoted field runs on.
        if text.iter().filter(|&&b| b == b'"').count() % 2 == 1 {
            return Err(self.bad_input(
                line_no,
                "a quoted field does not end on this line (fields spanning lines are not supported)".into(),
            ));
        }
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .buffer_capacity(text.len().max(64))
            .from_reader(text);
        let mut record = csv::ByteRecord::new();
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => return Ok(Vec::new()),
            Err(e) => return Err(self.bad_input(line_no, format!("is not valid CSV: {e}"))),
        }
        record
            .iter()
            .enumerate()
            .map(|(i, field)| {
                String::from_utf8(field.to_vec())
                    .map_err(|e| self.bad_input(line_no, format!("field {} {}", i + 1, not_utf8(e.utf8_error()))))
            })
            .collect()
    }

    fn bad_input(&self, line: u64, problem: String) -> SourceError {
        SourceError::BadInput { source_name: self.opts.name.clone(), path: self.opts.path.clone(), line, problem }
    }

    fn bad_position(&self, position: SourcePosition, problem: &str) -> SourceError {
        SourceError::BadPosition { source_name: self.opts.name.clone(), position, problem: problem.to_string() }
    }

    fn io(&self, source: std::io::Error) -> SourceError {
        io_error(&self.opts, source)
    }
}

impl super::Source for FileSource {
    fn poll(&mut self, out: &mut RecordBatch, max: usize) -> Result<SourceStatus, SourceError> {
        let before = out.len();
        let mut at_eof = false;
        while out.len() - before < max {
            if self.pending.last() != Some(&b'\n') {
                // Appends to a partial line left by an earlier poll, if any.
                let mut pending = std::mem::take(&mut self.pending);
                let read = self.read_line(self.line + 1, &mut pending);
                self.pending = pending;
                let read = read?;
                at_eof = read == 0 || self.pending.last() != Some(&b'\n');
                // The writer may be mid-line: wait for its newline before consuming the line.
                if at_eof && (self.opts.follow || self.pending.is_empty()) {
                    break;
                }
            }
            let line_no = self.line + 1;
            let line = std::mem::take(&mut self.pending);
            let result = self.take_line(line_no, strip_line_end(&line, line_no), out);
            self.pending = line;
            result?;
            self.line = line_no;
            self.byte += self.pending.len() as u64;
            self.pending.clear();
            if at_eof {
                break;
            }
        }
        Ok(if out.len() > before {
            SourceStatus::Ready
        } else if at_eof && !self.opts.follow {
            SourceStatus::End
        } else {
            SourceStatus::Idle
        })
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::File { line: self.line, byte: self.byte }
    }
}

/// Object `key` of `store` in an unnamed temporary file (gone when closed, even when the
/// process is killed), ready to read from `start`. The file has the object's size and offsets,
/// but a source resuming at byte `b` reads only the object from `b - 1` (the newline before its
/// position, which it checks) and, for CSV, the header line: only those are fetched, and the
/// rest is a hole. So a restart costs the part not read yet, not the whole object again.
fn download(
    store: &eddy_checkpoint::CheckpointStore,
    key: &str,
    opts: &FileOptions,
    start: Option<&SourcePosition>,
) -> std::io::Result<File> {
    let mut file = tempfile::tempfile()?;
    let from = match start {
        Some(&SourcePosition::File { byte, .. }) => byte.saturating_sub(1),
        _ => 0,
    };
    let size = store.download(key, from, &mut file, |_| false).map_err(std::io::Error::other)?;
    if from > 0 && opts.format == SourceFormat::Csv {
        // Up to the header's newline, or past the line limit (which then fails it, as read).
        let (mut fetched, limit) = (0, opts.max_line_bytes as u64 + 1);
        let header_read = |chunk: &[u8]| {
            fetched += chunk.len() as u64;
            chunk.contains(&b'\n') || fetched > limit
        };
        store.download(key, 0, &mut file, header_read).map_err(std::io::Error::other)?;
    }
    // A hole to the end when the position lies past it, so that resuming says how long it is.
    file.set_len(size)?;
    file.seek(SeekFrom::Start(0))?;
    tracing::info!(store = store.describe(), key, size, from, "downloaded a file source's object");
    Ok(file)
}

fn io_error(opts: &FileOptions, source: std::io::Error) -> SourceError {
    SourceError::Io { source_name: opts.name.clone(), path: opts.path.clone(), source }
}

/// Drops a trailing `\n` or `\r\n`, and a UTF-8 byte order mark before the first line.
fn strip_line_end(line: &[u8], line_no: u64) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line_no == 1 { line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line) } else { line }
}

fn not_utf8(e: std::str::Utf8Error) -> String {
    format!("is not valid UTF-8 (bad byte at offset {})", e.valid_up_to())
}

/// serde_json's message without its "at line 1 column N" (always line 1 here: one line is
/// parsed at a time), replaced by the column alone.
fn json_problem(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let message = message.rfind(" at line ").map_or(message.as_str(), |i| &message[..i]);
    format!("is not valid JSON (column {}): {message}", e.column())
}

/// Copies valid JSON without the whitespace between tokens.
fn minify_json(json: &[u8], out: &mut Vec<u8>) {
    let mut in_string = false;
    let mut escaped = false;
    for &b in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        out.push(b);
    }
}

/// A CSV field as JSON: an integer if it parses fully as `i64`, else a float if it parses as
/// a finite `f64` (JSON has no NaN or infinity), else the text.
fn infer_csv_value(field: String) -> Value {
    if let Ok(i) = field.parse::<i64>() {
        return Value::from(i);
    }
    if let Some(n) = field.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
        return Value::Number(n);
    }
    Value::String(field)
}

/// Resolves a JSON pointer against a CSV row, which is a flat object: only `/<field>` can
/// name anything (with `~1` for `/` and `~0` for `~`, as in any JSON pointer).
fn csv_field<'a>(row: &'a [(&str, Value)], pointer: &str) -> Option<&'a Value> {
    let token = pointer.strip_prefix('/')?;
    if token.contains('/') {
        return None;
    }
    let name = token.replace("~1", "/").replace("~0", "~");
    row.iter().find(|(field, _)| *field == name).map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;

    use eddy_core::Record;
    use proptest::prelude::*;

    use super::*;
    use crate::source::{Source, open_source};
    use eddy_checkpoint::CheckpointStore;
    use eddy_plan::SourceSpec;

    fn spec(path: &Path, format: SourceFormat, timestamp: Option<&str>, follow: bool) -> SourceSpec {
        SourceSpec::File {
            name: "input".into(),
            path: path.to_path_buf(),
            format,
            timestamp: timestamp.map(str::to_string),
            follow,
            max_line_bytes: 16 << 20,
            s3: None,
            beneath: None,
        }
    }

    /// A tenant's files area holding a link to a host file, a link to a host directory, a FIFO
    /// and a real file: only the real file is read (before, the link to `/etc/hostname` was).
    #[test]
    fn a_file_under_a_root_is_read_only_when_no_link_is_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("files"), dir.path().join("host"));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "host secret\n").unwrap();
        std::fs::write(root.join("sub/real.txt"), "tenant line\n").unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), root.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("linked-dir")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let read = |name: &str| -> Result<Vec<String>, String> {
            let mut spec = spec(&root.join(name), SourceFormat::Lines, None, false);
            if let SourceSpec::File { beneath, .. } = &mut spec {
                *beneath = Some(root.clone());
            }
            let mut source = open_source(&spec, 0, 1, None).map_err(|e| e.to_string())?;
            let mut batch = eddy_core::RecordBatch::default();
            source.poll(&mut batch, 16).map_err(|e| e.to_string())?;
            Ok(batch.iter().map(|r| String::from_utf8_lossy(r.value).into_owned()).collect())
        };
        assert_eq!(read("sub/real.txt").expect("a regular file"), ["\"tenant line\""]);
        for refused in ["link.txt", "linked-dir/secret", "fifo", "sub"] {
            let err = read(refused).expect_err(refused);
            assert!(!err.contains("host secret"), "{refused}: {err}");
            assert!(err.contains("symbolic link") || err.contains("regular file"), "{refused}: {err}");
        }
        // Without a root (a local `eddy run`), links are the user's own business.
        let mut followed =
            open_source(&spec(&root.join("link.txt"), SourceFormat::Lines, None, false), 0, 1, None).unwrap();
        let mut batch = eddy_core::RecordBatch::default();
        followed.poll(&mut batch, 16).unwrap();
        assert_eq!(batch.len(), 1);
    }

    fn with_max_line_bytes(mut spec: SourceSpec, limit: usize) -> SourceSpec {
        if let SourceSpec::File { max_line_bytes, .. } = &mut spec {
            *max_line_bytes = limit;
        }
        spec
    }

    #[test]
    fn a_line_over_the_limit_fails_naming_the_file_the_line_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{}\n{}\nafter\n", "a".repeat(50), "b".repeat(51));
        let path = write_file(&dir, &text);
        let lines = with_max_line_bytes(spec(&path, SourceFormat::Lines, None, false), 50);
        let mut src = open_source(&lines, 0, 1, None).unwrap();
        let mut batch = RecordBatch::default();
        for _ in 0..2 {
            // A retried poll meets the same line, not the one after it.
            let err = src.poll(&mut batch, 100).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, SourceError::BadInput { line: 2, .. }), "{text}");
            assert!(text.contains(&path.display().to_string()) && text.contains("line 2"), "{text}");
            assert!(text.contains("limit of 50 bytes") && text.contains("max_line_bytes"), "{text}");
            assert_eq!(src.position(), SourcePosition::File { line: 1, byte: 51 }, "line 1 (exactly 50 bytes) passed");
        }
        assert_eq!(records(&batch), vec![rec(&format!("\"{}\"", "a".repeat(50)), None)]);

        // The CSV header a resumed reader re-reads is held to the limit too.
        let path = write_file(&dir, &format!("{}\n1\n2\n", "h".repeat(51)));
        let csv = with_max_line_bytes(spec(&path, SourceFormat::Csv, None, false), 50);
        let err = open_source(&csv, 0, 1, Some(&SourcePosition::File { line: 2, byte: 54 })).err().unwrap();
        assert!(matches!(err, SourceError::BadInput { line: 1, .. }), "{err}");
    }

    #[test]
    fn an_over_long_line_is_never_read_whole() {
        const LIMIT: usize = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        for (follow, newline) in [(false, "\n"), (true, "")] {
            // Three times the limit; followed, the writer is still mid-line.
            let path = write_file(&dir, &format!("{}{newline}", "x".repeat(3 * LIMIT)));
            let options = FileOptions {
                name: "input".into(),
                path: path.clone(),
                object: None,
                format: SourceFormat::Lines,
                timestamp: None,
                follow,
                max_line_bytes: LIMIT,
                beneath: None,
            };
            let mut src = FileSource::open(options, None).unwrap();
            let err = src.poll(&mut RecordBatch::default(), 100).unwrap_err();
            assert!(matches!(err, SourceError::BadInput { line: 1, .. }), "follow {follow}: {err}");
            assert!(src.pending.capacity() <= LIMIT + 1, "follow {follow}: {} bytes held", src.pending.capacity());
        }
    }

    /// An object source in a directory store (the same `CheckpointStore` calls as on S3).
    fn object_source(dir: &tempfile::TempDir, contents: &str, format: SourceFormat) -> (CheckpointStore, FileOptions) {
        let store = CheckpointStore::local(&dir.path().join("bucket")).unwrap();
        store.put("files/in", contents.as_bytes().to_vec()).unwrap();
        let s3 = eddy_plan::S3Spec {
            bucket: "unused".into(),
            prefix: String::new(),
            endpoint: None,
            region: String::new(),
            allow_http: false,
        };
        let options = FileOptions {
            name: "input".into(),
            path: "files/in".into(),
            object: Some((s3, "files/in".into())),
            format,
            timestamp: None,
            follow: false,
            max_line_bytes: 16 << 20,
            beneath: None,
        };
        (store, options)
    }

    /// A restart fetches the object from its position on (and the CSV header), not again whole,
    /// and reads from there exactly the rows a reader of the whole file reads.
    #[test]
    fn a_resumed_object_source_fetches_only_the_header_and_the_rest_and_reads_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<String> = (0..20_000).map(|i| format!("u{i},{i}\n")).collect();
        let contents = format!("name,n\n{}", rows.concat());
        let (store, options) = object_source(&dir, &contents, SourceFormat::Csv);
        // After the header and 15 000 rows: byte offsets summed from the text, not read back.
        let byte = "name,n\n".len() + rows[..15_000].iter().map(String::len).sum::<usize>();
        let position = SourcePosition::File { line: 15_001, byte: byte as u64 };

        let mut file = download(&store, "files/in", &options, Some(&position)).unwrap();
        let mut local = Vec::new();
        file.read_to_end(&mut local).unwrap();
        assert_eq!(local.len(), contents.len(), "the object's size and offsets");
        assert_eq!(&local[..7], b"name,n\n", "the header");
        assert_eq!(&local[byte - 1..], &contents.as_bytes()[byte - 1..], "from the newline before the position");
        // The header's read stops after its first chunk (8 KiB from a directory store, far less
        // than 64 KiB): the ~107 KB from there to the position were not fetched.
        assert!(local[64 << 10..byte - 1].iter().all(|&b| b == 0), "rows before the position were fetched");

        file.seek(SeekFrom::Start(0)).unwrap();
        let mut src = FileSource::over(options, file, Some(&position)).unwrap();
        let mut batch = RecordBatch::default();
        while src.poll(&mut batch, 1_000).unwrap() != SourceStatus::End {}
        let expected: Vec<Record> =
            (15_000..20_000).map(|i| rec(&format!(r#"{{"name":"u{i}","n":{i}}}"#), None)).collect();
        assert_eq!(records(&batch), expected);
        assert_eq!(src.position(), SourcePosition::File { line: 20_001, byte: contents.len() as u64 });
    }

    /// A position past the end of the object (it was replaced by a shorter one) is refused as a
    /// local file's would be, naming the object's real size.
    #[test]
    fn a_position_past_the_end_of_the_object_is_refused_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let (store, options) = object_source(&dir, "a\nb\n", SourceFormat::Lines);
        let position = SourcePosition::File { line: 3, byte: 9 };
        let file = download(&store, "files/in", &options, Some(&position)).unwrap();
        let err = FileSource::over(options, file, Some(&position)).err().unwrap().to_string();
        assert!(err.contains("the file has only 4 bytes"), "{err}");
    }

    fn write_file(dir: &tempfile::TempDir, contents: &str) -> PathBuf {
        let path = dir.path().join("in.txt");
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn records(batch: &RecordBatch) -> Vec<Record> {
        batch.iter().map(|r| r.to_owned()).collect()
    }

    /// Polls with `max` until the source ends (bounded files only).
    fn drain(src: &mut dyn Source, max: usize) -> Result<Vec<Record>, SourceError> {
        let mut batch = RecordBatch::default();
        loop {
            let before = batch.len();
            match src.poll(&mut batch, max)? {
                SourceStatus::Ready => assert!(batch.len() > before && batch.len() - before <= max),
                SourceStatus::End => {
                    assert_eq!(batch.len(), before, "End appended records");
                    return Ok(records(&batch));
                }
                SourceStatus::Idle => panic!("a bounded file went idle"),
            }
        }
    }

    fn read_all(spec: &SourceSpec) -> Result<Vec<Record>, SourceError> {
        drain(open_source(spec, 0, 1, None)?.as_mut(), 1000)
    }

    fn rec(value: &str, timestamp: Option<i64>) -> Record {
        Record { key: None, value: value.as_bytes().to_vec(), timestamp }
    }

    #[test]
    fn lines_become_json_strings_and_keep_empty_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(&dir, "hello world\r\n\nsay \"hi\"\\\nlast");
        let got = read_all(&spec(&path, SourceFormat::Lines, None, false)).unwrap();
        assert_eq!(
            got,
            vec![
                rec(r#""hello world""#, None),
                rec(r#""""#, None),
                rec(r#""say \"hi\"\\""#, None),
                rec(r#""last""#, None)
            ]
        );
    }

    #[test]
    fn json_lines_are_compacted_in_their_own_key_order_with_timestamps() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(
            &dir,
            concat!(
                "{ \"z\": 1, \"a\": \"x y\\\" z\", \"ts\": 1000 }\r\n\n   \n",
                "[1, 2.50, 123456789012345678901234567890]\t\n{\"ts\": \"-5\"}",
            ),
        );
        let got = read_all(&spec(&path, SourceFormat::JsonLines, None, false)).unwrap();
        assert_eq!(
            got,
            vec![
                rec(r#"{"z":1,"a":"x y\" z","ts":1000}"#, None),
                rec("[1,2.50,123456789012345678901234567890]", None),
                rec(r#"{"ts":"-5"}"#, None),
            ]
        );
        let path = write_file(&dir, "{\"ts\": 1000, \"v\": 1}\n{\"v\": 2, \"ts\": \"-5\"}\n");
        let got = read_all(&spec(&path, SourceFormat::JsonLines, Some("/ts"), false)).unwrap();
        assert_eq!(got, vec![rec(r#"{"ts":1000,"v":1}"#, Some(1000)), rec(r#"{"v":2,"ts":"-5"}"#, Some(-5))]);
    }

    #[test]
    fn csv_rows_become_objects_in_header_order_with_inferred_types() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(
            &dir,
            "\u{feff}name,age,score,note,when\r\n\
             alice,30,1.5,\"hello, world\",1000\r\n\
             \r\n\
             \"bob \"\"b\"\"\",-7,1e3,,\"2000\"\n\
             carol,+4,NaN,007x,3000",
        );
        let got = read_all(&spec(&path, SourceFormat::Csv, Some("/when"), false)).unwrap();
        assert_eq!(
            got,
            vec![
                rec(r#"{"name":"alice","age":30,"score":1.5,"note":"hello, world","when":1000}"#, Some(1000)),
                rec(r#"{"name":"bob \"b\"","age":-7,"score":1000.0,"note":"","when":2000}"#, Some(2000)),
                rec(r#"{"name":"carol","age":4,"score":"NaN","note":"007x","when":3000}"#, Some(3000)),
            ]
        );
    }

    #[test]
    fn bad_json_names_source_file_and_line_and_resume_meets_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(&dir, "{\"a\":1}\n\n{\"a\": }\n{\"a\":3}\n");
        let spec = spec(&path, SourceFormat::JsonLines, None, false);
        let mut src = open_source(&spec, 0, 1, None).unwrap();
        let mut batch = RecordBatch::default();
        let err = src.poll(&mut batch, 10).unwrap_err().to_string();
        assert!(err.contains("source `input`"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("line 3") && err.contains("not valid JSON (column 7)"), "{err}");
        assert!(!err.contains("line 1 column"), "{err}");
        assert_eq!(records(&batch), vec![rec(r#"{"a":1}"#, None)]);
        // The bad line is not consumed: a retry and a resumed reader both fail on it.
        assert_eq!(src.position(), SourcePosition::File { line: 2, byte: 9 });
        assert!(src.poll(&mut batch, 10).unwrap_err().to_string().contains("line 3"));
        let mut resumed = open_source(&spec, 0, 1, Some(&src.position())).unwrap();
        assert!(resumed.poll(&mut batch, 10).unwrap_err().to_string().contains("line 3"));
    }

    #[test]
    fn timestamp_errors_name_line_and_pointer() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                SourceFormat::JsonLines,
                "/t/ms",
                "{\"t\":{\"ms\":1}}\n{\"ms\":2}\n",
                "line 2: timestamp `/t/ms` is missing",
            ),
            (
                SourceFormat::JsonLines,
                "/t/ms",
                "{\"t\":{\"ms\":1}}\n\n{\"t\":{\"ms\":\"soon\"}}\n",
                "line 3: timestamp `/t/ms` is the string \"soon\", not an integer",
            ),
            (
                SourceFormat::JsonLines,
                "/t/ms",
                "{\"t\":{\"ms\":1.5}}\n",
                "line 1: timestamp `/t/ms` is 1.5, not an integer",
            ),
            (SourceFormat::Csv, "/t~1ms", "a,t/ms\n1,2\n3,x\n", "line 3: timestamp `/t~1ms` is the string \"x\""),
            (SourceFormat::Csv, "/t~1ms", "a,b\n1,2\n", "line 2: timestamp `/t~1ms` is missing"),
            (SourceFormat::Lines, "/ts", "12\n", "line 1: timestamp `/ts` is missing"),
        ];
        for (format, pointer, text, needle) in cases {
            let path = write_file(&dir, text);
            let err = read_all(&spec(&path, format, Some(pointer), false)).unwrap_err().to_string();
            assert!(err.contains(needle), "{format:?} {text:?}: {err}");
            assert!(matches!(read_all(&spec(&path, format, Some(pointer), false)), Err(SourceError::BadInput { .. })));
        }
        // The CSV pointer `/t~1ms` names the field `t/ms`.
        let path = write_file(&dir, "a,t/ms\n1,2\n");
        let got = read_all(&spec(&path, SourceFormat::Csv, Some("/t~1ms"), false)).unwrap();
        assert_eq!(got, vec![rec(r#"{"a":1,"t/ms":2}"#, Some(2))]);
    }

    #[test]
    fn bad_csv_is_rejected_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&[u8], &str); 5] = [
            (b"a,b\n1,2\n1,2,3\n", "line 3: has 3 fields but the header (line 1) names 2"),
            (b"a,b\n1,\"2\n3\"\n", "line 2: a quoted field does not end on this line"),
            (b"a,a\n1,2\n", "line 1: the CSV header names the field `a` twice"),
            (b"\na\n", "line 1: the CSV header line (the field names) is empty"),
            (b"a\n\xC3\x28\n", "line 2: field 1 is not valid UTF-8"),
        ];
        for (bytes, needle) in cases {
            let path = dir.path().join("in.csv");
            std::fs::write(&path, bytes).unwrap();
            let err = read_all(&spec(&path, SourceFormat::Csv, None, false)).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn missing_file_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.txt");
        let err = read_all(&spec(&path, SourceFormat::Lines, None, false)).unwrap_err();
        assert!(matches!(err, SourceError::Io { .. }));
        let err = err.to_string();
        assert!(err.contains("source `input`") && err.contains("absent.txt"), "{err}");
    }

    #[test]
    fn bad_start_positions_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(&dir, "ab\ncd\n");
        let spec = spec(&path, SourceFormat::Lines, None, false);
        let cases = [
            (SourcePosition::File { line: 1, byte: 2 }, "not at the start of a line"),
            (SourcePosition::File { line: 3, byte: 7 }, "only 6 bytes"),
            (SourcePosition::File { line: 0, byte: 3 }, "both line and byte 0"),
            (SourcePosition::Generator { next_index: 0 }, "not a file position"),
        ];
        for (position, needle) in cases {
            let err = open_source(&spec, 0, 1, Some(&position)).err().unwrap();
            assert!(matches!(err, SourceError::BadPosition { .. }));
            assert!(err.to_string().contains(needle), "{position:?}: {err}");
        }
        // The end of the file and a line start are fine.
        for (line, byte, rest) in [(2, 6, vec![]), (1, 3, vec![rec(r#""cd""#, None)])] {
            let mut src = open_source(&spec, 0, 1, Some(&SourcePosition::File { line, byte })).unwrap();
            assert_eq!(drain(src.as_mut(), 5).unwrap(), rest);
            assert_eq!(src.position(), SourcePosition::File { line: 2, byte: 6 });
        }
    }

    #[test]
    fn follow_sees_appended_lines_but_not_a_half_written_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(&dir, "a\nb");
        let follow = spec(&path, SourceFormat::Lines, None, true);
        let mut src = open_source(&follow, 0, 1, None).unwrap();
        let mut batch = RecordBatch::default();
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Ready);
        assert_eq!(records(&batch), vec![rec(r#""a""#, None)]);
        assert_eq!(src.position(), SourcePosition::File { line: 1, byte: 2 });
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Idle);
        assert_eq!(src.position(), SourcePosition::File { line: 1, byte: 2 });

        append(&path, "c\nd");
        batch.clear();
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Ready);
        assert_eq!(records(&batch), vec![rec(r#""bc""#, None)]);
        assert_eq!(src.position(), SourcePosition::File { line: 2, byte: 5 });
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Idle);

        // A reader resumed at the same position waits for the same newline.
        let mut resumed = open_source(&follow, 0, 1, Some(&src.position())).unwrap();
        assert_eq!(resumed.poll(&mut batch, 10).unwrap(), SourceStatus::Idle);

        append(&path, "\n\ne\n");
        for reader in [&mut src, &mut resumed] {
            batch.clear();
            assert_eq!(reader.poll(&mut batch, 2).unwrap(), SourceStatus::Ready);
            assert_eq!(records(&batch), vec![rec(r#""d""#, None), rec(r#""""#, None)]);
            assert_eq!(reader.poll(&mut batch, 2).unwrap(), SourceStatus::Ready);
            assert_eq!(batch.len(), 3);
            assert_eq!(reader.poll(&mut batch, 2).unwrap(), SourceStatus::Idle);
            assert_eq!(reader.position(), SourcePosition::File { line: 5, byte: 10 });
        }

        // Without follow, the same unterminated last line is a record, then the file ends.
        append(&path, "f");
        let bounded = read_all(&spec(&path, SourceFormat::Lines, None, false)).unwrap();
        assert_eq!(bounded.len(), 6);
        assert_eq!(bounded[5], rec(r#""f""#, None));
    }

    #[test]
    fn follow_csv_waits_for_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(&dir, "x,y");
        let mut src = open_source(&spec(&path, SourceFormat::Csv, None, true), 0, 1, None).unwrap();
        let mut batch = RecordBatch::default();
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Idle);
        assert_eq!(src.position(), SourcePosition::File { line: 0, byte: 0 });
        append(&path, "\n1,2\n");
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Ready);
        assert_eq!(records(&batch), vec![rec(r#"{"x":1,"y":2}"#, None)]);
        assert_eq!(src.position(), SourcePosition::File { line: 2, byte: 8 });
        assert_eq!(src.poll(&mut batch, 10).unwrap(), SourceStatus::Idle);
    }

    /// One generated input line: its text and the record it should become (if any).
    fn input_line(format: SourceFormat, n: i64, s: &str, empty: bool) -> (String, Option<String>) {
        if empty {
            let kept = (format == SourceFormat::Lines).then(|| "\"\"".to_string());
            return (String::new(), kept);
        }
        let json_s = serde_json::to_string(s).unwrap();
        match format {
            SourceFormat::Lines => {
                let text = format!("{n} {s}");
                let value = serde_json::to_string(&text).unwrap();
                (text, Some(value))
            }
            SourceFormat::JsonLines => {
                (format!("{{\"n\": {n}, \"s\" : {json_s} }}"), Some(format!(r#"{{"n":{n},"s":{json_s}}}"#)))
            }
            SourceFormat::Csv => {
                (format!("{n},\"{}\"", s.replace('"', "\"\"")), Some(format!(r#"{{"n":{n},"s":{json_s}}}"#)))
            }
        }
    }

    fn format_strategy() -> impl Strategy<Value = SourceFormat> {
        prop_oneof![Just(SourceFormat::Lines), Just(SourceFormat::JsonLines), Just(SourceFormat::Csv)]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        /// Reading in any batch sizes, stopping after any number of polls and resuming at the
        /// (checkpointed) position yields exactly the records of one uninterrupted read.
        #[test]
        fn resume_at_any_position_yields_exactly_the_rest(
            format in format_strategy(),
            rows in prop::collection::vec((any::<i64>(), "[a-z ,\"]{0,6}", prop::bool::weighted(0.2)), 0..25),
            crlf in any::<bool>(),
            final_newline in any::<bool>(),
            batch_sizes in prop::collection::vec(1usize..5, 1..8),
            polls_before in 0usize..30,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let end = if crlf { "\r\n" } else { "\n" };
            let mut text = String::new();
            let mut expected = Vec::new();
            if format == SourceFormat::Csv {
                text.push_str("n,s");
                text.push_str(end);
            }
            for (i, (n, s, empty)) in rows.iter().enumerate() {
                let (line, record) = input_line(format, *n, s, *empty);
                text.push_str(&line);
                if i + 1 < rows.len() || final_newline {
                    text.push_str(end);
                }
                // An empty last line without newline is no line at all.
                if !(line.is_empty() && i + 1 == rows.len() && !final_newline) {
                    expected.extend(record.map(|v| rec(&v, None)));
                }
            }
            let path = write_file(&dir, &text);
            let spec = spec(&path, format, None, false);
            let all = read_all(&spec).unwrap();
            prop_assert_eq!(&all, &expected);

            let mut src = open_source(&spec, 0, 1, None).unwrap();
            let mut batch = RecordBatch::default();
            for i in 0..polls_before {
                let max = batch_sizes[i % batch_sizes.len()];
                let before = batch.len();
                let status = src.poll(&mut batch, max).unwrap();
                prop_assert!(batch.len() - before <= max);
                if status == SourceStatus::End {
                    break;
                }
            }
            // A checkpoint stores the position as JSON.
            let stored = serde_json::to_string(&src.position()).unwrap();
            let position: SourcePosition = serde_json::from_str(&stored).unwrap();
            let mut resumed = open_source(&spec, 0, 1, Some(&position)).unwrap();
            let mut got = records(&batch);
            got.extend(drain(resumed.as_mut(), batch_sizes[0]).unwrap());
            prop_assert_eq!(got, all);
        }
    }
}

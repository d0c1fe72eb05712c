//! Every size limit that two parts of Eddy must agree on, in one table.
//!
//! A limit chosen in one crate and relied on in another drifts: a spec the service accepted
//! once produced a deployment larger than the control protocol takes, and the worker lost its
//! session over it. So the limits that cross a boundary live here, each derived from the ones
//! it must hold, and each crate takes its value from here. The architecture page's "Security
//! model" lists them with their defaults.
//!
//! The derivations are checked at compile time (the `const` assertions at the end), so a
//! change that breaks one does not build.

// ---- Records -------------------------------------------------------------------------------

/// The largest key a guest may pass to state or emit (the sandbox's `max_key_bytes` default).
pub const MAX_KEY_BYTES: usize = 64 << 10;

/// The largest value (or list item) a guest may store or emit (the sandbox's
/// `max_value_bytes` default), and the longest line a file source may read.
pub const MAX_VALUE_BYTES: usize = 16 << 20;

// ---- Pipeline specs ------------------------------------------------------------------------
//
// `eddy_plan::PipelineSpec::parse` checks the text's shape (bytes, nesting, nodes; no anchors,
// aliases or merge keys) event by event before any value is built, and `validate` the rest.

/// The largest pipeline spec text the service accepts (and `PipelineSpec::parse` reads).
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// The deepest nesting (mappings and sequences, block or flow) a spec may have, its own levels
/// included (a step's `config` starts 3 deep). Real specs nest a handful of levels (a step's
/// `config` a few more); the YAML parser slows down faster than linearly with depth, so the
/// check stops at the first level past this.
pub const MAX_SPEC_NESTING: usize = 64;

/// YAML nodes (scalars, sequences, mappings; every mapping key too) a spec may have: far more
/// than any real spec, few enough that building them costs little (about 170 bytes of memory
/// each while parsing, measured: some 17 MB for a spec at the limit). Aliases are refused, so
/// every node is written out in the text and this counts what is built.
pub const MAX_SPEC_NODES: usize = 100_000;

/// The largest `config` of one step, serialized as compact JSON (what the guest's `open`
/// receives).
pub const MAX_STEP_CONFIG_BYTES: usize = 256 << 10;

/// Sources a pipeline may read.
pub const MAX_SOURCES: usize = 64;

/// Steps a pipeline may have.
pub const MAX_STEPS: usize = 64;

/// The longest name of a pipeline, step, source or side output (a window's `late_output`).
/// Names are identifiers (ASCII letters, digits, `_`, `-`, `.`, starting with a letter or
/// digit), as they become metric labels, log fields and file names.
pub const MAX_NAME_BYTES: usize = 64;

// ---- Control protocol (coordinator <-> worker) ---------------------------------------------

/// The largest control message. A deployment (the placed spec as JSON, its assignment and the
/// workers' addresses) is the largest there is; JSON may render a spec's text several times
/// longer (escapes, flow sequences), so the service computes each job's deployment at submit
/// and refuses one larger than this (422 naming the limit), and the sender refuses to send a
/// larger message rather than lose its session over it.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 8 << 20;

// ---- Frames and peers (transport) ----------------------------------------------------------
//
// A frame is `len u32 | kind u8 | body` (`eddy_transport::Frame`); `len` counts the kind and
// the body, and so does every frame size here: it is what a receiver checks before it reads a
// body.

/// The most a data frame spends on a record besides its key and value: its record table entry
/// (parts u8, key and value lengths as u32 varints, the event time's difference to the previous
/// one as a u64 varint), 3-5 bytes as batches run. A channel buffer counts only keys and values
/// towards `buffer_bytes`, so a frame of tiny records is mostly these entries (32 KiB of 1-byte
/// values is 32 768 records and up to 704 KiB of frame), and records with empty values never
/// fill a buffer at all: frames are cut by what they may cost on the wire
/// ([`FRAME_TARGET_BYTES`]), not by their payload.
pub const FRAME_BYTES_PER_RECORD: usize = 1 + 5 + 5 + 10;

/// The most a data frame spends besides its records' keys, values and table entries: kind (1),
/// flags (1), backlog (4), watermark (8), side output name length (2) and name (the encoding
/// cuts it at `u16::MAX` bytes; the runtime allows 256), record count (4), data length (4).
pub const MAX_FRAME_OVERHEAD_BYTES: usize = 1 + 1 + 4 + 8 + 2 + u16::MAX as usize + 4 + 4;

/// The size a sender packs a channel's batch into: a batch whose frame would be larger is cut
/// into frames of at most this (records in order, the watermark on the last), and only a frame
/// of a single record may be larger. Large enough that a default buffer (32 KiB of keys and
/// values plus the record that filled it) crosses whole even at one byte per record, since
/// cutting copies the records; small enough that a receiver's credit (8 buffers by default)
/// means a few MiB per channel, not 8 of the largest frames.
pub const FRAME_TARGET_BYTES: usize = 1 << 20;

/// The largest frame of one record: a key and a value at their limits ([`MAX_KEY_BYTES`],
/// [`MAX_VALUE_BYTES`]), its table entry, and the largest overhead.
pub const MAX_RECORD_FRAME_BYTES: usize =
    MAX_FRAME_OVERHEAD_BYTES + MAX_KEY_BYTES + MAX_VALUE_BYTES + FRAME_BYTES_PER_RECORD;

/// The largest frame a receiver reads (16 908 332 bytes, 16 MiB and 128 KiB): the larger of a
/// cut frame and a frame of one record. A frame announcing more is refused before its body is
/// read, and its peer is dropped; a sender refuses to send one (a record past the key and value
/// limits) rather than lose its connection over it.
pub const MAX_FRAME_BYTES: usize =
    if MAX_RECORD_FRAME_BYTES > FRAME_TARGET_BYTES { MAX_RECORD_FRAME_BYTES } else { FRAME_TARGET_BYTES };

/// The most records one data frame holds. A record decodes to a table entry of its own
/// ([`DECODED_RECORD_BYTES`]) however few bytes it took on the wire (2 at least: a frame's
/// entries are varints), so a frame's size does not bound what its records cost decoded: this
/// does. A sender cuts a batch of more records into frames of this many; a default buffer
/// (32 KiB of 1-byte records) still crosses as one frame.
pub const MAX_FRAME_RECORDS: usize = 1 << 15;

/// What a received record costs besides its key and value: its entry in the batch's table.
pub const DECODED_RECORD_BYTES: usize = std::mem::size_of::<crate::RecordMeta>();

/// The most a receiver reads from one stream at once: what it may hold past the frames it has
/// decoded, per stream.
pub const READ_CHUNK_BYTES: usize = 1 << 20;

/// The most one inbound channel can make its node hold in frames not yet consumed by the subtask:
/// `link_credit` buffers granted by the transport (`Tuning::channel_capacity`, 8 by default) plus
/// `local_buffers` in the local channel they are handed to (its credit, queue, and the buffer the
/// subtask holds: 4 + 1 + 1 by default), of which only one may be larger than
/// [`FRAME_TARGET_BYTES`] (a frame above it may only arrive once its channel's previous one was
/// taken by the subtask), plus one read chunk (and, while a frame is decoded, a second copy of it),
/// plus each buffer's decoded record table ([`MAX_FRAME_RECORDS`] entries at most). About 48 MiB by
/// default (30 MiB of frames, 17.5 MiB of tables), where every buffer could be a largest frame
/// before (8 x 64 MiB in the transport alone). A peer can make a node hold this for each channel
/// the node registered for it, and no frame at all on a stream the node did not register (see
/// [`MAX_PENDING_STREAMS`]).
pub const fn max_channel_bytes(link_credit: usize, local_buffers: usize) -> usize {
    let buffers = link_credit + local_buffers;
    MAX_FRAME_BYTES
        + buffers.saturating_sub(1) * FRAME_TARGET_BYTES
        + READ_CHUNK_BYTES
        + buffers * MAX_FRAME_RECORDS * DECODED_RECORD_BYTES
}

/// Streams a data-plane connection lets its peer have open at once (`Tuning::max_streams`):
/// one per channel, so a keyed exchange between two workers at the largest parallelism (128
/// subtasks, 64 on each) opens 64 x 64 = 4 096 in each direction, and a job has several
/// exchanges and a worker several jobs. A stream costs little while open (what it may buffer
/// is bounded by credit, [`max_channel_bytes`]); at a limit of 4 096 the next channel waited
/// for a stream to close, which a running job never does.
pub const MAX_DATA_STREAMS: u32 = 1 << 16;

/// Streams a control-plane connection lets its peer have open at once (`Tuning::control`): a
/// worker's session is one stream and each artifact fetch one more while it runs; 16 lets a
/// worker fetch a job's artifacts side by side and keeps an enrolled node from opening
/// thousands of streams that could each buffer a control message
/// ([`MAX_CONTROL_MESSAGE_BYTES`]): 16 x 8 MiB at most.
pub const MAX_CONTROL_STREAMS: u32 = 16;

/// The longest stream header: a link header (magic 4, job id length 2, attempt 8, task,
/// subtask and channel 4 each) with the longest job id (256 bytes), longer than a side
/// stream's (magic 4, name length 2, a name of at most 256 bytes). A receiver reads no more
/// than this of a stream before it knows which channel the stream is for.
pub const MAX_STREAM_HEADER_BYTES: usize = 4 + 2 + 256 + 8 + 3 * 4;

/// Streams of one connection that may wait at once for their header or for their channel to
/// be registered (`Tuning::max_pending_streams`); one more is refused at once. An upstream part
/// may open its channels before the downstream part registered them, so this is four keyed
/// exchanges at parallelism 128 between two workers (4 x 4 096) deploying at once. A waiting
/// stream costs a task, at most [`MAX_STREAM_HEADER_BYTES`] read, and quinn's stream state
/// (a few KiB in all); what its peer sends past the header stays unread inside QUIC's window
/// for the connection. A connection refused this many streams in all is closed: a peer that
/// kept more than this many waiting that often is broken or hostile, and a refused stream
/// frees its QUIC stream credit at once, so without that it could repeat for ever.
pub const MAX_PENDING_STREAMS: u32 = 16_384;

const _: () = assert!(MAX_FRAME_BYTES >= MAX_RECORD_FRAME_BYTES && MAX_FRAME_BYTES >= FRAME_TARGET_BYTES);
const _: () = assert!(MAX_FRAME_BYTES < u32::MAX as usize);
// A default buffer (`JobOptions::buffer_bytes`, 32 KiB) of 1-byte records is one frame.
const _: () = assert!(MAX_FRAME_OVERHEAD_BYTES + (32 << 10) * (1 + FRAME_BYTES_PER_RECORD) <= FRAME_TARGET_BYTES);
const _: () = assert!(MAX_FRAME_RECORDS >= 32 << 10);
const _: () = assert!(MAX_PENDING_STREAMS <= MAX_DATA_STREAMS);

// ---- Checkpoint link (job master <-> parts) ------------------------------------------------

/// The largest message between a spread job's master and its parts. A part's report is one
/// subtask's part of the metadata: its source position, its sink's pending files, and per step
/// the names of its files (state and timers are in files, never inline), so 64 MiB holds tens
/// of thousands of RocksDB files per step.
pub const MAX_CHECKPOINT_MESSAGE_BYTES: usize = 64 << 20;

// ---- Compile-time checks of the derivations ------------------------------------------------

const _: () = assert!(MAX_STEP_CONFIG_BYTES < MAX_SPEC_BYTES);
const _: () = assert!(MAX_CONTROL_MESSAGE_BYTES > 2 * MAX_SPEC_BYTES);
const _: () = assert!(MAX_CONTROL_MESSAGE_BYTES <= u32::MAX as usize);
const _: () = assert!(MAX_CHECKPOINT_MESSAGE_BYTES <= u32::MAX as usize);

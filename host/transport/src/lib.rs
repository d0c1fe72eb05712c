//! The data plane's wire format, I/O-free: what one end of a channel sends the other when the
//! two do not share a process. The QUIC transport (issue 13) writes these frames on a stream
//! per channel; the decoder never trusts what it reads (lengths, spans, kinds, names), so a
//! hostile or broken peer gets an error naming the problem, never a panic or an allocation it
//! chose.
//!
//! # Example
//!
//! ```
//! use eddy_core::RecordBatch;
//! use eddy_transport::channel::Message;
//! use eddy_transport::{Decoder, Frame};
//!
//! let mut batch = RecordBatch::default();
//! batch.push(Some(b"\"k\""), b"{\"n\":1}", Some(42));
//! let mut wire = Vec::new();
//! let data = Message::Data { side: None, batch, watermark: Some(40) };
//! Frame::Message { message: data, backlog: 2 }.encode(&mut wire);
//! Frame::Credit(3).encode(&mut wire);
//!
//! let decoder = Decoder::default();
//! let (first, used) = decoder.decode(&wire)?.expect("a whole frame");
//! assert!(matches!(first, Frame::Message { message: Message::Data { watermark: Some(40), .. }, backlog: 2 }));
//! let (second, _) = decoder.decode(&wire[used..])?.expect("a whole frame");
//! assert_eq!(second, Frame::Credit(3));
//! # Ok::<(), eddy_transport::FrameError>(())
//! ```

pub mod admission;
pub mod channel;
pub mod credit;
mod faults;
mod frame;
pub mod quic;
pub mod relay;

pub use faults::{FaultPlan, Faults, Verdict};
pub use frame::{Decoder, Frame, FrameError, MAX_FRAME_BYTES};

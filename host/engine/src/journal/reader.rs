//! Reading a journal segment back: its header, then its frames up to the last whole one.

use super::format::{Decoded, Frame, decode};
use super::{JOURNAL_VERSION, JournalHeader};

/// A segment as read.
#[derive(Debug)]
pub struct Segment {
    /// Its header.
    pub header: JournalHeader,
    /// The frames after the header.
    pub frames: Vec<Frame>,
    /// Whether it ends in a cut frame (its writer was killed mid-write).
    pub torn: bool,
}

/// Reads a segment from its bytes; a problem names the segment (`name`) and what is wrong.
pub fn parse_segment(bytes: &[u8], name: &str) -> Result<Segment, String> {
    let named = |problem: String| format!("journal segment {name}: {problem}");
    let (mut at, mut frames, mut torn) = (0, Vec::new(), false);
    loop {
        match decode(bytes, at).map_err(named)? {
            Decoded::Frame(frame, next) => {
                frames.push(frame);
                at = next;
            }
            Decoded::End => break,
            Decoded::Torn => {
                torn = true;
                break;
            }
        }
    }
    let mut frames = frames.into_iter();
    let header = match frames.next() {
        Some(Frame::Header(header)) => *header,
        Some(_) => return Err(named("it does not start with a header".into())),
        None => return Err(named("it is empty (its writer was killed before the header was written)".into())),
    };
    if header.version != JOURNAL_VERSION {
        return Err(named(format!(
            "it is journal format {}, this build reads format {JOURNAL_VERSION}; replay it with the Eddy that wrote it",
            header.version
        )));
    }
    let frames: Vec<Frame> = frames.collect();
    if frames.iter().any(|f| matches!(f, Frame::Header(_))) {
        return Err(named("it holds a second header".into()));
    }
    Ok(Segment { header, frames, torn })
}

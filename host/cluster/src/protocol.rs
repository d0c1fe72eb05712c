//! The control protocol between a worker and the coordinator: typed messages, each sent as
//! `len u32 (little-endian) | JSON`, on one QUIC stream the worker opens. The decoder refuses
//! oversized and malformed messages with the reason, so a broken peer is dropped, not obeyed.

use serde::{Deserialize, Serialize};

/// The largest control message either side accepts or sends (`eddy_core::limits`).
pub const MAX_MESSAGE_BYTES: u32 = eddy_core::limits::MAX_CONTROL_MESSAGE_BYTES as u32;
/// The largest message of a spread job's checkpoint link (`eddy_core::limits`).
pub const MAX_CHECKPOINT_MESSAGE_BYTES: u32 = eddy_core::limits::MAX_CHECKPOINT_MESSAGE_BYTES as u32;

/// What a worker tells the coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    /// The first message on a control stream.
    Register {
        /// The worker's name: must be the name in its certificate.
        name: String,
        /// Slots it offers.
        slots: u32,
        /// The host other workers dial for its data plane; `None`: the address the
        /// coordinator sees.
        advertise: Option<String>,
        /// The UDP port of its data plane.
        data_port: u16,
    },
    /// Still alive.
    Heartbeat {
        /// The incarnation the coordinator assigned at registration.
        incarnation: u64,
    },
    /// The first and only message of a fetch stream: send this artifact's bytes.
    Fetch {
        /// `sha256:<hex>`.
        digest: String,
    },
    /// The metrics of this worker's part of a job attempt, now (sent every second).
    Metrics {
        /// The job.
        job: String,
        /// The attempt.
        attempt: u64,
        /// Its subtasks' counters, by task of the plan.
        metrics: eddy_engine::MetricsSnapshot,
    },
    /// The answer to [`CoordinatorMessage::PrepareSwap`]: the new code is ready in this
    /// worker's part (`problem: None`), or why not.
    SwapPrepared {
        /// The job.
        job: String,
        /// The attempt.
        attempt: u64,
        /// The step.
        step: String,
        /// The new code's digest.
        digest: String,
        /// Why the code is not ready.
        problem: Option<String>,
    },
    /// This worker's part of a job attempt changed state.
    Part {
        /// The job.
        job: String,
        /// The attempt.
        attempt: u64,
        /// Its new state.
        state: PartState,
    },
}

/// Where a worker's part of a job attempt is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PartState {
    /// Its subtasks run.
    Running,
    /// Every subtask ended and the final checkpoint committed.
    Finished,
    /// Cancelled on the coordinator's word.
    Canceled,
    /// It failed (or could not start): the attempt is lost.
    Failed {
        /// Why.
        reason: String,
        /// The failure taken apart (absent from older workers); bounded by the coordinator.
        #[serde(default)]
        detail: eddy_engine::FailureDetail,
    },
}

/// A job attempt's part for one worker: everything it needs to run its subtasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// The job's id.
    pub job: String,
    /// Its tenant (for logs).
    pub tenant: String,
    /// The attempt: links and checkpoint streams are named after it, so a stale attempt's
    /// stream never feeds a new one.
    pub attempt: u64,
    /// The placed spec (paths as the coordinator placed them).
    pub spec: eddy_plan::PipelineSpec,
    /// The artifact digest of each step, in step order.
    pub artifacts: Vec<String>,
    /// `assignment[task][subtask]`: the worker that runs it.
    pub assignment: Vec<Vec<String>>,
    /// Each assigned worker's data plane address.
    pub addrs: std::collections::BTreeMap<String, String>,
    /// The node name of the job master (the coordinator), the only node that may open the
    /// attempt's checkpoint stream.
    pub master: String,
    /// The savepoint to start from, when the job's current generation has no checkpoint yet.
    pub restore_from: Option<eddy_plan::StoreLocation>,
    /// The tenant's CPU share for the job's operators, in millicores.
    pub cpu_millicores: Option<u32>,
    /// The linear memory one of the job's instances may hold.
    pub instance_memory_bytes: Option<u64>,
}

/// What the coordinator tells a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CoordinatorMessage {
    /// Registration accepted.
    Registered {
        /// This registration's number; heartbeats name it.
        incarnation: u64,
        /// How often to beat.
        heartbeat_interval_ms: u64,
    },
    /// The worker is not (or no longer) a member: register again on a new stream.
    Reregister {
        /// Why.
        reason: String,
    },
    /// The worker may not join; retrying will not help until the reason is fixed.
    Refused {
        /// Why.
        reason: String,
    },
    /// Run this part of a job attempt (and stop any older attempt of the job).
    Deploy(Box<Deployment>),
    /// Fetch and compile artifact `digest` and make it ready to take over `step` in this part
    /// of a job attempt (a live swap): a trigger of the job master's arms it. Answered with
    /// [`WorkerMessage::SwapPrepared`].
    PrepareSwap {
        /// The job.
        job: String,
        /// The attempt.
        attempt: u64,
        /// The step.
        step: String,
        /// The new code (`sha256:<hex>`).
        digest: String,
    },
    /// Stop this part of a job attempt.
    Cancel {
        /// The job.
        job: String,
        /// The attempt.
        attempt: u64,
    },
    /// The answer to a fetch: exactly `size` bytes of the artifact follow, then the stream ends.
    Artifact {
        /// Its length.
        size: u64,
    },
}

/// A control message that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The length prefix passes the limit.
    #[error("control message of {0} bytes announced (at most {1})")]
    TooLarge(u32, u32),
    /// Not a message of this protocol.
    #[error("malformed control message: {0}")]
    Malformed(String),
}

/// Whether `digest` has the form of an artifact digest: `sha256:` and 64 lowercase hex digits
/// (so that it can name a file, and nothing else).
pub fn is_digest(digest: &str) -> bool {
    digest
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Appends `message` to `out`, or refuses one longer than `limit`: a sender must never put on
/// the wire what its peer would drop the session for.
pub fn encode_limited<T: Serialize>(message: &T, out: &mut Vec<u8>, limit: u32) -> Result<(), ProtocolError> {
    let body = serde_json::to_vec(message).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let len = u32::try_from(body.len()).ok().filter(|len| *len <= limit);
    let Some(len) = len else {
        return Err(ProtocolError::TooLarge(u32::try_from(body.len()).unwrap_or(u32::MAX), limit));
    };
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// [`encode_limited`] at [`MAX_MESSAGE_BYTES`].
pub fn encode<T: Serialize>(message: &T, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
    encode_limited(message, out, MAX_MESSAGE_BYTES)
}

/// The first message of `buf` and the bytes it took, or `None` if more bytes are needed.
pub fn decode<T: for<'de> Deserialize<'de>>(buf: &[u8]) -> Result<Option<(T, usize)>, ProtocolError> {
    decode_limited(buf, MAX_MESSAGE_BYTES)
}

/// [`decode`] with another size limit.
pub fn decode_limited<T: for<'de> Deserialize<'de>>(
    buf: &[u8],
    limit: u32,
) -> Result<Option<(T, usize)>, ProtocolError> {
    let Some(prefix) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if len > limit {
        return Err(ProtocolError::TooLarge(len, limit));
    }
    let end = 4 + len as usize;
    let Some(body) = buf.get(4..end) else { return Ok(None) };
    let message = serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    Ok(Some((message, end)))
}

/// Reads one message from a QUIC stream, keeping what follows it in `buf`. `Ok(None)`: the
/// stream ended cleanly between messages.
pub async fn read<T: for<'de> Deserialize<'de>>(
    recv: &mut quinn::RecvStream,
    buf: &mut Vec<u8>,
) -> Result<Option<T>, String> {
    read_limited(recv, buf, MAX_MESSAGE_BYTES).await
}

/// [`read`] with another size limit.
pub async fn read_limited<T: for<'de> Deserialize<'de>>(
    recv: &mut quinn::RecvStream,
    buf: &mut Vec<u8>,
    limit: u32,
) -> Result<Option<T>, String> {
    loop {
        if let Some((message, used)) = decode_limited(buf, limit).map_err(|e| e.to_string())? {
            buf.drain(..used);
            return Ok(Some(message));
        }
        match recv.read_chunk(64 << 10, true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) if buf.is_empty() => return Ok(None),
            Ok(None) => return Err("the stream ended inside a message".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Writes one message to a QUIC stream.
pub async fn write<T: Serialize>(send: &mut quinn::SendStream, message: &T) -> Result<(), String> {
    write_limited(send, message, MAX_MESSAGE_BYTES).await
}

/// [`write`] with another size limit.
pub async fn write_limited<T: Serialize>(send: &mut quinn::SendStream, message: &T, limit: u32) -> Result<(), String> {
    let mut wire = Vec::new();
    encode_limited(message, &mut wire, limit).map_err(|e| e.to_string())?;
    send.write_all(&wire).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip_and_wait_for_their_whole_body() {
        let messages = [
            WorkerMessage::Register { name: "w1".into(), slots: 2, advertise: None, data_port: 7000 },
            WorkerMessage::Heartbeat { incarnation: 9 },
        ];
        let mut wire = Vec::new();
        for m in &messages {
            encode(m, &mut wire).expect("small");
        }
        let first_len = 4 + u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]) as usize;
        for cut in 0..first_len {
            assert_eq!(decode::<WorkerMessage>(&wire[..cut]), Ok(None));
        }
        let (a, used) = decode::<WorkerMessage>(&wire).expect("valid").expect("whole");
        let (b, _) = decode::<WorkerMessage>(&wire[used..]).expect("valid").expect("whole");
        assert_eq!([a, b], messages);
    }

    #[test]
    fn oversized_and_foreign_messages_are_refused() {
        assert_eq!(
            decode::<WorkerMessage>(&u32::MAX.to_le_bytes()),
            Err(ProtocolError::TooLarge(u32::MAX, MAX_MESSAGE_BYTES))
        );
        let mut wire = Vec::new();
        encode(&CoordinatorMessage::Refused { reason: "x".into() }, &mut wire).expect("small");
        let err = decode::<WorkerMessage>(&wire).expect_err("a coordinator message is no worker message");
        assert!(err.to_string().contains("unknown variant `refused`"), "{err}");
    }

    #[test]
    fn only_sha256_digests_name_artifacts() {
        let good = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert!(is_digest(&good));
        for bad in [
            "sha256:".to_owned(),
            good.to_uppercase(),
            format!("sha256:{}", "a".repeat(63)),
            format!("sha256:{}/", "a".repeat(63)),
            format!("md5:{}", "a".repeat(64)),
            "sha256:../../etc/passwd".to_owned(),
        ] {
            assert!(!is_digest(&bad), "{bad}");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_refused_before_it_is_sent() {
        let big = CoordinatorMessage::Refused { reason: "x".repeat(MAX_MESSAGE_BYTES as usize) };
        let mut wire = Vec::new();
        let refused = encode(&big, &mut wire).expect_err("too large");
        assert!(matches!(refused, ProtocolError::TooLarge(n, MAX_MESSAGE_BYTES) if n > MAX_MESSAGE_BYTES), "{refused}");
        assert!(wire.is_empty(), "nothing of it went out");
    }

    /// A worker's failure report naming a million causes (within the message limit) is taken
    /// as the bounded detail it may carry.
    #[test]
    fn a_part_failure_with_endless_causes_decodes_bounded() {
        let detail = format!("{{\"causes\": [{}\"last\"]}}", "\"\",".repeat(1_000_000));
        let json = format!(
            "{{\"type\": \"part\", \"job\": \"j\", \"attempt\": 1, \"state\": {{\"state\": \"failed\", \"reason\": \"r\", \"detail\": {detail}}}}}"
        );
        let mut wire = (json.len() as u32).to_le_bytes().to_vec();
        wire.extend_from_slice(json.as_bytes());
        let Ok(Some((WorkerMessage::Part { state: PartState::Failed { detail, .. }, .. }, _))) = decode(&wire) else {
            panic!("a part report decodes")
        };
        assert_eq!(detail.causes.len(), eddy_engine::MAX_CAUSES);
        assert_eq!(detail.causes.last().map(String::as_str), Some("last"));
    }

    proptest! {
        #[test]
        fn hostile_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode::<WorkerMessage>(&bytes);
            let _ = decode::<CoordinatorMessage>(&bytes);
        }
    }
}

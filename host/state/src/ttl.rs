//! State time-to-live: keyed state that expires a fixed time after it was last written.
//!
//! Semantics follow Flink's defaults: the TTL starts when a value is created and restarts on
//! every write (reads do not refresh it), and a read never returns an expired value, whether or
//! not it has been cleaned up yet. Expiry is decided by processing time from a shared
//! [`TtlClock`] the engine advances, never by the system clock, so the same inputs and ticks
//! expire the same state on every run and in every test.
//!
//! Reads only hide expired entries (they take `&self` and cannot delete); the space is reclaimed
//! by [`TtlBackend::purge_expired`], which the engine calls periodically.
//!
//! Each stored value is `write time (i64 BE, ms) | user value`. The stamp is part of the state
//! format: state written through a [`TtlBackend`] must be read back (and restored) through one.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::{StateBackend, StateError};

/// Length of the write-time stamp in front of every stored value.
const STAMP_LEN: usize = 8;

/// Processing time in milliseconds, shared between the engine that advances it and the TTL
/// backends that read it, so one tick expires state in every backend of a task at once.
#[derive(Debug, Clone)]
pub struct TtlClock {
    now_ms: Arc<AtomicI64>,
}

impl TtlClock {
    /// A clock reading `now_ms`; clones share it.
    pub fn new(now_ms: i64) -> Self {
        Self { now_ms: Arc::new(AtomicI64::new(now_ms)) }
    }

    /// Advances the clock to `now_ms`. An earlier time is ignored: if time could move backwards,
    /// a value already hidden as expired could reappear.
    pub fn set(&self, now_ms: i64) {
        // Relaxed suffices: the clock publishes no other memory, and `fetch_max` on one location
        // is monotonic in every thread's view.
        self.now_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// The current processing time in milliseconds.
    pub fn now(&self) -> i64 {
        self.now_ms.load(Ordering::Relaxed)
    }
}

/// A [`StateBackend`] whose values expire `ttl_ms` after they were last written.
///
/// It wraps any backend, so TTL works the same on the heap and on disk. `approximate_len`
/// counts expired entries that [`purge_expired`](Self::purge_expired) has not removed yet,
/// because it measures what the inner backend holds (memory, disk), not what reads can see.
pub struct TtlBackend {
    inner: Box<dyn StateBackend>,
    ttl_ms: i64,
    clock: TtlClock,
    /// Reused for stamping values, so a `put` does not allocate.
    buf: Vec<u8>,
}

impl fmt::Debug for TtlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TtlBackend")
            .field("ttl_ms", &self.ttl_ms)
            .field("clock", &self.clock)
            .field("entries", &self.inner.approximate_len())
            .finish_non_exhaustive()
    }
}

impl TtlBackend {
    /// Wraps `inner`; values written from now on expire `ttl_ms` after their write, as read from
    /// `clock`.
    ///
    /// # Panics
    ///
    /// If `ttl_ms` is not positive: such state would expire the moment it is written, which is
    /// never what a job means.
    pub fn new(inner: Box<dyn StateBackend>, ttl_ms: i64, clock: TtlClock) -> Self {
        assert!(ttl_ms > 0, "state TTL must be positive, got {ttl_ms} ms");
        Self { inner, ttl_ms, clock, buf: Vec::new() }
    }

    fn is_expired(&self, written: i64) -> bool {
        is_expired(written, self.ttl_ms, self.clock.now())
    }
}

/// Saturating, so a huge TTL means "practically never" instead of overflowing into the past.
fn is_expired(written: i64, ttl_ms: i64, now: i64) -> bool {
    written.saturating_add(ttl_ms) <= now
}

/// Splits a stored value into its write time and the user's bytes.
fn split_stamp<'a>(key: &[u8], stored: &'a [u8]) -> Result<(i64, &'a [u8]), StateError> {
    match stored.split_first_chunk::<STAMP_LEN>() {
        Some((stamp, value)) => Ok((i64::from_be_bytes(*stamp), value)),
        None => Err(StateError::Corrupt(format!(
            "TTL state value under key \"{}\" is {} bytes, shorter than its {STAMP_LEN}-byte write-time stamp",
            key.escape_ascii(),
            stored.len()
        ))),
    }
}

impl StateBackend for TtlBackend {
    /// Removes every expired entry and returns how many, so expired state does not hold memory
    /// or disk until its key happens to be written again.
    ///
    /// A corrupt entry fails the purge before anything is deleted.
    fn purge_expired(&mut self) -> Result<usize, StateError> {
        let now = self.clock.now();
        let ttl_ms = self.ttl_ms;
        let mut expired = Vec::new();
        let mut corrupt = None;
        self.inner.scan_prefix(b"", &mut |key, stored| {
            if corrupt.is_some() {
                return;
            }
            match split_stamp(key, stored) {
                Ok((written, _)) if is_expired(written, ttl_ms, now) => expired.push(key.to_vec()),
                Ok(_) => {}
                Err(e) => corrupt = Some(e),
            }
        })?;
        if let Some(e) = corrupt {
            return Err(e);
        }
        for key in &expired {
            self.inner.delete(key)?;
        }
        Ok(expired.len())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let Some(mut stored) = self.inner.get(key)? else {
            return Ok(None);
        };
        let (written, _) = split_stamp(key, &stored)?;
        if self.is_expired(written) {
            return Ok(None);
        }
        // Strip in place: the inner backend's allocation becomes the returned value.
        stored.drain(..STAMP_LEN);
        Ok(Some(stored))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.buf.clear();
        self.buf.extend_from_slice(&self.clock.now().to_be_bytes());
        self.buf.extend_from_slice(value);
        self.inner.put(key, &self.buf)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.inner.delete(key)
    }

    /// Visits the live entries under `prefix`. On a corrupt entry the scan stops visiting and
    /// returns the error; entries before it have been visited.
    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        // One reading of the clock for the whole scan, so a concurrent tick cannot make the scan
        // disagree with itself.
        let now = self.clock.now();
        let mut corrupt = None;
        self.inner.scan_prefix(prefix, &mut |key, stored| {
            if corrupt.is_some() {
                return;
            }
            match split_stamp(key, stored) {
                Ok((written, value)) if !is_expired(written, self.ttl_ms, now) => visit(key, value),
                Ok(_) => {}
                Err(e) => corrupt = Some(e),
            }
        })?;
        corrupt.map_or(Ok(()), Err)
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        self.inner.delete_prefix(prefix)
    }

    /// Counts expired entries not yet purged; see [`TtlBackend`].
    fn approximate_len(&self) -> usize {
        self.inner.approximate_len()
    }

    fn snapshot(&mut self, staging: &std::path::Path) -> Result<crate::BackendSnapshot, StateError> {
        self.inner.snapshot(staging)
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self.inner.raw_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeapStateBackend;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn ttl_backend(ttl_ms: i64, clock: &TtlClock) -> TtlBackend {
        TtlBackend::new(Box::new(HeapStateBackend::default()), ttl_ms, clock.clone())
    }

    fn scan_all(backend: &dyn StateBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        backend.scan_prefix(b"", &mut |k, v| out.push((k.to_vec(), v.to_vec()))).unwrap();
        out
    }

    #[test]
    fn clock_is_shared_and_never_moves_backwards() {
        let clock = TtlClock::new(100);
        let other = clock.clone();
        other.set(150);
        assert_eq!(clock.now(), 150);
        clock.set(120);
        assert_eq!(other.now(), 150);
    }

    #[test]
    fn expires_exactly_at_write_time_plus_ttl() {
        let clock = TtlClock::new(100);
        let mut backend = ttl_backend(10, &clock);
        backend.put(b"k", b"v").unwrap();
        clock.set(109);
        assert_eq!(backend.get(b"k").unwrap(), Some(b"v".to_vec()));
        clock.set(110);
        assert_eq!(backend.get(b"k").unwrap(), None);
    }

    #[test]
    fn write_refreshes_ttl() {
        let clock = TtlClock::new(0);
        let mut backend = ttl_backend(10, &clock);
        backend.put(b"k", b"old").unwrap();
        clock.set(8);
        backend.put(b"k", b"new").unwrap();
        clock.set(17);
        assert_eq!(backend.get(b"k").unwrap(), Some(b"new".to_vec()));
        clock.set(18);
        assert_eq!(backend.get(b"k").unwrap(), None);
    }

    #[test]
    fn write_revives_an_expired_key() {
        let clock = TtlClock::new(0);
        let mut backend = ttl_backend(10, &clock);
        backend.put(b"k", b"old").unwrap();
        clock.set(50);
        assert_eq!(backend.get(b"k").unwrap(), None);
        backend.put(b"k", b"new").unwrap();
        assert_eq!(backend.get(b"k").unwrap(), Some(b"new".to_vec()));
    }

    #[test]
    fn scan_hides_expired_and_strips_stamps() {
        let clock = TtlClock::new(0);
        let mut backend = ttl_backend(10, &clock);
        backend.put(b"a1", b"x").unwrap();
        backend.put(b"b", b"other prefix").unwrap();
        clock.set(5);
        backend.put(b"a2", b"y").unwrap();
        backend.put(b"a3", b"").unwrap();
        clock.set(10);
        let mut seen = Vec::new();
        backend.scan_prefix(b"a", &mut |k, v| seen.push((k.to_vec(), v.to_vec()))).unwrap();
        assert_eq!(seen, vec![(b"a2".to_vec(), b"y".to_vec()), (b"a3".to_vec(), Vec::new())]);
    }

    #[test]
    fn purge_removes_exactly_the_expired() {
        let clock = TtlClock::new(0);
        let mut backend = ttl_backend(10, &clock);
        backend.put(b"old1", b"1").unwrap();
        backend.put(b"old2", b"2").unwrap();
        clock.set(3);
        backend.put(b"young", b"3").unwrap();
        clock.set(10);
        assert_eq!(backend.approximate_len(), 3, "expired entries still count until purged");
        assert_eq!(backend.purge_expired().unwrap(), 2);
        assert_eq!(backend.approximate_len(), 1);
        assert_eq!(scan_all(&backend), vec![(b"young".to_vec(), b"3".to_vec())]);
        assert_eq!(backend.purge_expired().unwrap(), 0);
        clock.set(13);
        assert_eq!(backend.purge_expired().unwrap(), 1);
        assert_eq!(backend.approximate_len(), 0);
    }

    #[test]
    fn short_value_is_corrupt() {
        let mut inner = HeapStateBackend::default();
        inner.put(b"bad", b"1234567").unwrap();
        let mut backend = TtlBackend::new(Box::new(inner), 10, TtlClock::new(0));
        let err = backend.get(b"bad").unwrap_err();
        assert!(matches!(err, StateError::Corrupt(_)), "{err:?}");
        assert!(err.to_string().contains("7 bytes, shorter than its 8-byte write-time stamp"), "{err}");
        assert!(err.to_string().contains("\"bad\""), "{err}");
        assert!(matches!(backend.scan_prefix(b"", &mut |_, _| {}), Err(StateError::Corrupt(_))));
        assert!(matches!(backend.purge_expired(), Err(StateError::Corrupt(_))));
        assert_eq!(backend.approximate_len(), 1, "a failed purge deletes nothing");
    }

    #[test]
    fn huge_ttl_does_not_overflow() {
        let clock = TtlClock::new(i64::MAX - 5);
        let mut backend = ttl_backend(i64::MAX, &clock);
        backend.put(b"k", b"v").unwrap();
        clock.set(i64::MAX - 1);
        assert_eq!(backend.get(b"k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    #[should_panic(expected = "state TTL must be positive")]
    fn zero_ttl_is_rejected() {
        let _ = ttl_backend(0, &TtlClock::new(0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(Vec<u8>, Vec<u8>),
        Get(Vec<u8>),
        Delete(Vec<u8>),
        Advance(i64),
        Purge,
    }

    fn small_bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(0u8..4, 0..3)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (small_bytes(), small_bytes()).prop_map(|(k, v)| Op::Put(k, v)),
            3 => small_bytes().prop_map(Op::Get),
            1 => small_bytes().prop_map(Op::Delete),
            2 => (0i64..8).prop_map(Op::Advance),
            1 => Just(Op::Purge),
        ]
    }

    proptest! {
        /// Against a map of key -> (value, write time): reads see exactly the unexpired entries,
        /// purges remove exactly the expired ones, and the length counts what is stored.
        #[test]
        fn behaves_like_an_expiring_map(ttl_ms in 1i64..12, ops in proptest::collection::vec(op(), 0..96)) {
            let clock = TtlClock::new(1_000);
            let mut backend = ttl_backend(ttl_ms, &clock);
            let mut oracle: HashMap<Vec<u8>, (Vec<u8>, i64)> = HashMap::new();
            let live = |written: i64, now: i64| written + ttl_ms > now;
            for op in ops {
                let now = clock.now();
                match op {
                    Op::Put(k, v) => {
                        backend.put(&k, &v).unwrap();
                        oracle.insert(k, (v, now));
                    }
                    Op::Get(k) => {
                        let expected = oracle.get(&k).filter(|(_, w)| live(*w, now)).map(|(v, _)| v.clone());
                        prop_assert_eq!(backend.get(&k).unwrap(), expected);
                    }
                    Op::Delete(k) => {
                        backend.delete(&k).unwrap();
                        oracle.remove(&k);
                    }
                    Op::Advance(ms) => clock.set(now + ms),
                    Op::Purge => {
                        let before = oracle.len();
                        oracle.retain(|_, (_, w)| live(*w, now));
                        prop_assert_eq!(backend.purge_expired().unwrap(), before - oracle.len());
                    }
                }
                prop_assert_eq!(backend.approximate_len(), oracle.len());
            }
            let now = clock.now();
            let mut expected: Vec<_> =
                oracle.into_iter().filter(|(_, (_, w))| live(*w, now)).map(|(k, (v, _))| (k, v)).collect();
            expected.sort();
            prop_assert_eq!(scan_all(&backend), expected);
        }
    }
}

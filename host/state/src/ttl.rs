//! State time-to-live: keyed state that expires a fixed time after it was last written.
//!
//! Semantics follow Flink's defaults: the TTL starts when a value is created and restarts on
//! every write (reads do not refresh it), and a read never returns an expired value, whether or
//! not it has been cleaned up yet. Expiry is decided by processing time from a shared
//! [`TtlClock`] the engine advances, never by the system clock, so the same inputs and ticks
//! expire the same state on every run and in every test.
//!
//! Reads only hide expired entries (they take `&self` and cannot delete); the space is reclaimed
//! by [`TtlBackend::purge_expired`], which the engine calls on its processing-time tick. Each
//! call is one bounded step: it examines at most [`TtlBackend::purge_step_entries`] stored entries,
//! starting at a cursor key where the previous step stopped, and wraps to the first key after
//! the last; so a purge never stalls the task thread for a scan of the whole state, and repeated
//! steps reach every entry.
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
    /// False for a [`TtlClock::manual`] clock: the engine's ticks leave it alone.
    follows_ticks: bool,
}

impl TtlClock {
    /// A clock reading `now_ms`, advanced by the engine's ticks; clones share it.
    pub fn new(now_ms: i64) -> Self {
        Self { now_ms: Arc::new(AtomicI64::new(now_ms)), follows_ticks: true }
    }

    /// A clock reading `now_ms` that only the returned [`ManualTtlClock`] advances: the engine's
    /// ticks ([`set`](Self::set)) leave it alone, so a test decides when state expires instead
    /// of waiting for the wall clock.
    pub fn manual(now_ms: i64) -> (Self, ManualTtlClock) {
        let now_ms = Arc::new(AtomicI64::new(now_ms));
        (Self { now_ms: now_ms.clone(), follows_ticks: false }, ManualTtlClock { now_ms })
    }

    /// The engine's tick: advances the clock to `now_ms` (a manual clock ignores it). An earlier
    /// time is ignored: if time could move backwards, a value already hidden as expired could
    /// reappear.
    pub fn set(&self, now_ms: i64) {
        if self.follows_ticks {
            advance(&self.now_ms, now_ms);
        }
    }

    /// The current processing time in milliseconds.
    pub fn now(&self) -> i64 {
        self.now_ms.load(Ordering::Relaxed)
    }
}

/// The hand that moves a [`TtlClock::manual`] clock.
#[derive(Debug)]
pub struct ManualTtlClock {
    now_ms: Arc<AtomicI64>,
}

impl ManualTtlClock {
    /// Advances the clock to `now_ms`; an earlier time is ignored, as for [`TtlClock::set`].
    pub fn advance_to(&self, now_ms: i64) {
        advance(&self.now_ms, now_ms);
    }

    /// The time the clock reads.
    pub fn now(&self) -> i64 {
        self.now_ms.load(Ordering::Relaxed)
    }
}

fn advance(clock: &AtomicI64, now_ms: i64) {
    // Relaxed suffices: the clock publishes no other memory, and `fetch_max` on one location is
    // monotonic in every thread's view.
    clock.fetch_max(now_ms, Ordering::Relaxed);
}

/// Stored entries one purge step examines, unless [`TtlBackend::with_purge_step_entries`] says
/// otherwise: small enough that a step costs well under a millisecond on the heap, large enough
/// that a state of a million entries is swept in a thousand steps.
pub const PURGE_STEP_ENTRIES: usize = 1_000;

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
    /// The next purge step starts at this key (empty: at the first key).
    purge_cursor: Vec<u8>,
    purge_step_entries: usize,
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
        Self { inner, ttl_ms, clock, buf: Vec::new(), purge_cursor: Vec::new(), purge_step_entries: PURGE_STEP_ENTRIES }
    }

    /// Sets how many stored entries one purge step examines (at least 1).
    pub fn with_purge_step_entries(mut self, entries: usize) -> Self {
        self.purge_step_entries = entries.max(1);
        self
    }

    /// How many stored entries one purge step examines.
    pub fn purge_step_entries(&self) -> usize {
        self.purge_step_entries
    }

    /// Visits the live entries `scan` offers, stamps stripped, until `visit` returns `false`;
    /// stops at a corrupt entry and returns its error.
    fn visit_live(
        &self,
        scan: impl FnOnce(&mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StateError> {
        // One reading of the clock for the whole scan, so a concurrent tick cannot make the scan
        // disagree with itself.
        let now = self.clock.now();
        let mut corrupt = None;
        scan(&mut |key, stored| match split_stamp(key, stored) {
            Ok((written, value)) if !is_expired(written, self.ttl_ms, now) => visit(key, value),
            Ok(_) => true,
            Err(e) => {
                corrupt = Some(e);
                false
            }
        })?;
        corrupt.map_or(Ok(()), Err)
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
    /// One purge step: examines at most [`purge_step_entries`](TtlBackend::purge_step_entries)
    /// stored entries from the cursor on, removes the expired ones and returns how many, and
    /// moves the cursor past them (back to the first key once it reached the last). Expired
    /// state thus stops holding memory or disk within one sweep of the steps, whether or not its
    /// key is ever written again.
    ///
    /// A corrupt entry fails the step before it deletes anything; the cursor stays, so the next
    /// step reports it again.
    fn purge_expired(&mut self) -> Result<usize, StateError> {
        let (now, ttl_ms, budget) = (self.clock.now(), self.ttl_ms, self.purge_step_entries);
        let (mut examined, mut last) = (0, None);
        let mut expired = Vec::new();
        let mut corrupt = None;
        self.inner.scan_from(&self.purge_cursor, &mut |key, stored| {
            match split_stamp(key, stored) {
                Ok((written, _)) if is_expired(written, ttl_ms, now) => expired.push(key.to_vec()),
                Ok(_) => {}
                Err(e) => {
                    corrupt = Some(e);
                    return false;
                }
            }
            examined += 1;
            if examined == budget {
                last = Some(key.to_vec());
            }
            examined < budget
        })?;
        if let Some(e) = corrupt {
            return Err(e);
        }
        for key in &expired {
            self.inner.delete(key)?;
        }
        self.purge_cursor = match last {
            // The smallest key after the last one examined.
            Some(mut key) => {
                key.push(0);
                key
            }
            None => Vec::new(),
        };
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
        self.visit_live(
            |live| {
                let mut going = true;
                self.inner.scan_prefix(prefix, &mut |k, v| going = going && live(k, v))
            },
            &mut |k, v| {
                visit(k, v);
                true
            },
        )
    }

    /// Visits the live entries from `from` on, as [`scan_prefix`](Self::scan_prefix) does.
    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        self.visit_live(|live| self.inner.scan_from(from, live), visit)
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

    fn usage(&self) -> Option<crate::StateUsage> {
        self.inner.usage()
    }

    fn entry_measure(&self) -> crate::EntryMeasure {
        self.inner.entry_measure()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeapStateBackend;
    use crate::test_ops::Watched;
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
    fn a_manual_clock_moves_only_by_its_hand() {
        let (clock, hand) = TtlClock::manual(100);
        let mut backend = ttl_backend(10, &clock);
        backend.put(b"k", b"v").unwrap();
        clock.clone().set(1_000);
        assert_eq!((clock.now(), backend.get(b"k").unwrap()), (100, Some(b"v".to_vec())), "ticks leave it alone");
        hand.advance_to(110);
        assert_eq!(backend.get(b"k").unwrap(), None);
        hand.advance_to(50);
        assert_eq!(hand.now(), 110, "never backwards");
    }

    /// 100 entries, the even ones written at 0 and the odd ones at 5, TTL 10.
    fn hundred_entries(clock: &TtlClock, backend: &mut TtlBackend) {
        for parity in [0, 1] {
            clock.set(parity * 5);
            for i in (parity..100).step_by(2) {
                backend.put(format!("k{i:03}").as_bytes(), b"v").unwrap();
            }
        }
    }

    #[test]
    fn a_purge_step_examines_at_most_its_budget_and_steps_sweep_every_expired_entry() {
        let clock = TtlClock::new(0);
        let inner = Watched::default();
        let watch = inner.watch.clone();
        let mut backend = TtlBackend::new(Box::new(inner), 10, clock.clone()).with_purge_step_entries(7);
        hundred_entries(&clock, &mut backend);
        clock.set(10);
        let mut removed = 0;
        // 100 entries at 7 a step: 15 steps reach the end.
        for step in 0..15 {
            watch.lock().expect("a test's lock is never poisoned").visited = 0;
            removed += backend.purge_expired().unwrap();
            let examined = watch.lock().expect("a test's lock is never poisoned").visited;
            assert!(examined <= 7, "step {step} examined {examined} entries");
        }
        assert_eq!(removed, 50, "one sweep removes every expired entry");
        assert_eq!(backend.approximate_len(), 50);
        assert!(scan_all(&backend).iter().all(|(k, _)| k[3] % 2 == 1), "only the odd ones, still live, remain");
        // The cursor wraps: the next sweep finds the odd ones once they expire.
        clock.set(15);
        let removed: usize = (0..9).map(|_| backend.purge_expired().unwrap()).sum();
        assert_eq!((removed, backend.approximate_len()), (50, 0));
    }

    #[test]
    fn purge_steps_sweep_a_rocksdb_backend_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rocks = crate::RocksDbBackend::open(dir.path(), crate::RocksDbConfig::default()).expect("open");
        let clock = TtlClock::new(0);
        let mut backend = TtlBackend::new(Box::new(rocks), 10, clock.clone()).with_purge_step_entries(7);
        hundred_entries(&clock, &mut backend);
        clock.set(10);
        assert_eq!(backend.purge_expired().unwrap(), 4, "k000..k006: 4 even, 3 odd");
        let removed: usize = (0..14).map(|_| backend.purge_expired().unwrap()).sum();
        assert_eq!(removed, 46);
        assert_eq!(scan_all(&backend).len(), 50);
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
        assert!(matches!(backend.purge_expired(), Err(StateError::Corrupt(_))), "the cursor stays on it");
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
        /// a purge step removes only expired ones, a sweep of steps removes all of them, and the
        /// length counts what is stored.
        #[test]
        fn behaves_like_an_expiring_map(
            ttl_ms in 1i64..12, step_entries in 1usize..8, ops in proptest::collection::vec(op(), 0..96),
        ) {
            let clock = TtlClock::new(1_000);
            let mut backend = ttl_backend(ttl_ms, &clock).with_purge_step_entries(step_entries);
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
                        let removed = backend.purge_expired().unwrap();
                        let stored: Vec<Vec<u8>> = scan_all(&*backend.raw_mut()).into_iter().map(|(k, _)| k).collect();
                        let gone: Vec<_> = oracle.iter().filter(|(k, _)| !stored.contains(k)).collect();
                        prop_assert_eq!(gone.len(), removed);
                        prop_assert!(gone.iter().all(|(_, (_, w))| !live(*w, now)), "a step removed live state");
                        oracle.retain(|k, _| stored.contains(k));
                    }
                }
                prop_assert_eq!(backend.approximate_len(), oracle.len());
            }
            let now = clock.now();
            let mut expected: Vec<_> =
                oracle.into_iter().filter(|(_, (_, w))| live(*w, now)).map(|(k, (v, _))| (k, v)).collect();
            expected.sort();
            prop_assert_eq!(scan_all(&backend), expected.clone());
            // One sweep from wherever the cursor stands: to the end, then from the start.
            let sweep = backend.approximate_len() / step_entries + 3;
            for _ in 0..sweep {
                backend.purge_expired().unwrap();
            }
            prop_assert_eq!(backend.approximate_len(), expected.len(), "a sweep leaves only live state");
        }
    }
}

//! The window operator's state entries, held per key in a write-back buffer in front of the
//! backend.
//!
//! Windows are updated by every batch and read when they fire, and most are purged when they
//! fire: written to the backend per batch, they would cost a B-tree (or memtable) write per
//! (key, window) per batch, and a delete at the end. So the store keeps what it writes in
//! [`Held`] entries and writes them to the backend only when a snapshot is taken (the barrier:
//! the snapshot is taken after the write-back, so state stays exactly once) or when the buffer
//! passes its budget between calls; a window created and purged between two of those never
//! reaches the backend. Everything the buffer loses on a failure is after the last snapshot,
//! which is what a restore starts from anyway.
//!
//! The buffer is indexed by the record's key, each key holding its windows in order: a batch
//! finds a key once and its five windows (a 10 s window sliding every 2 s) by a search in a
//! short array, where one table of encoded state keys hashed and compared the whole entry
//! (key group, state, key hash, key, window) per window, read and again written. State keys
//! are encoded only for the backend: on a miss, and at the write-back.
//!
//! A miss reads the backend only while it may hold entries the buffer does not: after a
//! restore (it starts with state) and after the buffer was emptied past its budget. Otherwise
//! (`WindowStore::complete`) a window or session list missing from the buffer is known absent:
//! with checkpoints on, RocksDB then holds the windows written back at the last barrier in its
//! files, and a read of each new (key, window) through its filters and index was a fifth of
//! q5's window step at parallelism 2.

use eddy_plan::window::Window;
use eddy_state::{
    HashedKey, StateBackend, StateError, StateId, StateKey, allocation_bytes, decode_list, decode_state_key,
    encode_list, state_id,
};

use eddy_plan::window_state::{FIRED, NOT_FIRED};

use super::{ACC_STATE, SESSIONS_STATE, decode_window, encode_window};
use crate::operator::OperatorError;

/// Values up to this many bytes live inside their entry rather than in an allocation of their
/// own: a flag byte and a small accumulator (q5's and q11's counts with their keys take 41, q7's
/// highest bid 49). Reading one is then no second pointer chased per (key, window), which in
/// q5's window step at parallelism 2 was the most expensive load of the store.
const INLINE_VALUE: usize = 56;

/// A key's open sessions, kept decoded between batches (one or two per key in nearly every
/// session job): a batch reads and rewrites them for every key it touches, and decoding and
/// encoding the backend's list each time was a tenth of q11's window step. They are encoded
/// only for the backend, at a miss and at the write-back.
pub(super) type Sessions = smallvec::SmallVec<[Window; 2]>;

/// One entry as the buffer holds it: the value it last wrote or read (an accumulator's flag
/// byte and bytes, or a key's sessions), and where the backend stands against it.
struct Held<A: smallvec::Array = [u8; INLINE_VALUE]> {
    value: smallvec::SmallVec<A>,
    /// False: the backend was read and had nothing (so a window's first write, which follows
    /// that read, knows there is nothing to delete when it is purged unwritten).
    present: bool,
    /// The backend does not have `value` yet.
    dirty: bool,
    /// The backend holds a value under this key (an older one while `dirty`).
    stored: bool,
}

impl Held {
    fn read(backend: &dyn StateBackend, entry: &[u8]) -> Result<Self, StateError> {
        let mut value = Vec::new();
        let found = backend.read_into(entry, &mut value)?;
        Ok(Held { value: smallvec::SmallVec::from_slice(&value), present: found, dirty: false, stored: found })
    }
}

impl Held<[Window; 2]> {
    /// A key's sessions from the backend's list (see [`Sessions`]).
    fn read_sessions(backend: &dyn StateBackend, entry: &[u8]) -> Result<Self, StateError> {
        let mut list = Vec::new();
        if !backend.read_into(entry, &mut list)? {
            return Ok(Self::absent());
        }
        let value = decode_list(&list)?.iter().map(|w| decode_window(w)).collect::<Result<Sessions, _>>()?;
        Ok(Held { value, present: true, dirty: false, stored: true })
    }
}

impl<A: smallvec::Array> Held<A>
where
    A::Item: Copy,
{
    /// An entry the backend is known not to hold (as a read finding nothing).
    fn absent() -> Self {
        Held { value: smallvec::SmallVec::new(), present: false, dirty: false, stored: false }
    }

    /// Every other write follows a read of its entry in the same call, which left it held; an
    /// entry not held is a session new to its key's session set, and the backend holds no
    /// accumulator of a session outside the set (the two change together), so purging it
    /// unwritten deletes nothing there (on RocksDB, a tombstone per merged session).
    fn fresh(value: &[A::Item]) -> Self {
        Held { value: smallvec::SmallVec::from_slice(value), present: true, dirty: true, stored: false }
    }

    /// Sets the value, keeping `used` (the buffer's count of its memory) true.
    fn set(&mut self, value: &[A::Item], used: &mut usize) {
        let before = self.bytes();
        self.value.clear();
        self.value.extend_from_slice(value);
        self.present = true;
        self.dirty = true;
        *used = (*used + self.bytes()).saturating_sub(before);
    }

    /// The backend got the value.
    fn written(&mut self) {
        self.dirty = false;
        self.stored = true;
    }

    fn value(&self) -> Option<&[A::Item]> {
        self.present.then_some(self.value.as_slice())
    }

    /// Memory outside the entry: none for an inline value.
    fn bytes(&self) -> usize {
        if self.value.spilled() { allocation_bytes(self.value.capacity() * size_of::<A::Item>()) as usize } else { 0 }
    }
}

/// One key's held entries.
#[derive(Default)]
struct KeyHeld {
    /// Accumulators by window, in window order.
    accs: Vec<(Window, Held)>,
    /// The open sessions (session windows only).
    sessions: Option<Held<[Window; 2]>>,
}

impl KeyHeld {
    fn is_empty(&self) -> bool {
        self.accs.is_empty() && self.sessions.is_none()
    }

    fn accs_bytes(&self) -> usize {
        allocation_bytes(self.accs.capacity() * size_of::<(Window, Held)>()) as usize
    }

    /// What the key holds in the buffer: its slot of the table (which doubles as it grows and
    /// keeps at most 7 of 8 slots full, so up to 16/7 slots and control bytes per key), its
    /// bytes, its window array and every value.
    fn bytes(&self, key: &[u8]) -> usize {
        (size_of::<(Box<[u8]>, KeyHeld)>() + 1) * 16 / 7
            + allocation_bytes(key.len()) as usize
            + self.accs_bytes()
            + self.accs.iter().map(|(_, h)| h.bytes()).sum::<usize>()
            + self.sessions.as_ref().map_or(0, Held::bytes)
    }
}

/// The operator's state entries (see the module docs).
pub(super) struct WindowStore {
    pub(super) backend: Box<dyn StateBackend>,
    /// The state key being encoded, reused.
    entry: StateKey,
    /// The value being written, reused.
    value: Vec<u8>,
    operator: String,
    max_parallelism: u32,
    acc_state: StateId,
    sessions_state: StateId,
    held: hashbrown::HashMap<Box<[u8]>, KeyHeld, foldhash::fast::RandomState>,
    /// Memory `held` takes, as [`KeyHeld::bytes`] counts it; a job's memory demand reserves
    /// the budget per window subtask.
    used: usize,
    budget: usize,
    /// The backend holds no entry the buffer does not hold (so a miss reads nothing). False
    /// until the first scan of the backend ([`Self::windows`]) finds only what the buffer
    /// holds, and again once the buffer is emptied past its budget.
    complete: bool,
}

/// One key's entries in the store, found once for all the windows a batch gives it.
pub(super) struct KeyEntries<'s> {
    key: &'s [u8],
    held: &'s mut KeyHeld,
    backend: &'s dyn StateBackend,
    entry: &'s mut StateKey,
    value: &'s mut Vec<u8>,
    used: &'s mut usize,
    operator: &'s str,
    max_parallelism: u32,
    acc_state: StateId,
    complete: bool,
}

impl KeyEntries<'_> {
    /// The window's fired flag and accumulator, if it has state: read from the backend into
    /// the buffer if the buffer does not hold it.
    pub(super) fn acc(&mut self, window: &Window) -> Result<Option<(bool, &[u8])>, OperatorError> {
        let at = match self.held.accs.binary_search_by(|(w, _)| w.cmp(window)) {
            Ok(at) => at,
            Err(at) => {
                let held = if self.complete {
                    Held::absent()
                } else {
                    let entry = self.entry.encode(
                        HashedKey::new(self.key, self.max_parallelism),
                        self.acc_state,
                        &encode_window(window),
                    );
                    Held::read(self.backend, entry).map_err(|e| error(self.operator, e))?
                };
                self.insert_acc(at, *window, held);
                at
            }
        };
        match self.held.accs[at].1.value().map(<[u8]>::split_first) {
            None => Ok(None),
            Some(Some((&flag @ (NOT_FIRED | FIRED), acc))) => Ok(Some((flag == FIRED, acc))),
            Some(_) => Err(error(
                self.operator,
                StateError::Corrupt(format!(
                    "accumulator of window [{}, {}) has no valid flag byte",
                    window.start, window.end
                )),
            )),
        }
    }

    /// Sets the window's accumulator (the backend gets it at the next write-back).
    pub(super) fn put_acc(&mut self, window: &Window, fired: bool, acc: &[u8]) {
        self.value.clear();
        self.value.push(if fired { FIRED } else { NOT_FIRED });
        self.value.extend_from_slice(acc);
        match self.held.accs.binary_search_by(|(w, _)| w.cmp(window)) {
            Ok(at) => self.held.accs[at].1.set(self.value, self.used),
            Err(at) => self.insert_acc(at, *window, Held::fresh(self.value)),
        }
    }

    /// Drops the window's accumulator from the buffer. True if the backend may hold one, which
    /// the caller then deletes there ([`WindowStore::delete_stored_acc`]).
    pub(super) fn remove_acc(&mut self, window: &Window) -> bool {
        let Ok(at) = self.held.accs.binary_search_by(|(w, _)| w.cmp(window)) else { return true };
        let (_, held) = self.held.accs.remove(at);
        *self.used = self.used.saturating_sub(held.bytes());
        held.stored
    }

    /// Sets the key's open sessions, at least one (none is [`WindowStore::put_sessions`]'s).
    pub(super) fn put_sessions(&mut self, sessions: &[Window]) {
        match &mut self.held.sessions {
            Some(held) => held.set(sessions, self.used),
            slot @ None => {
                let held = Held::fresh(sessions);
                *self.used += held.bytes();
                *slot = Some(held);
            }
        }
    }

    pub(super) fn corrupt(&self, problem: String) -> OperatorError {
        error(self.operator, StateError::Corrupt(problem))
    }

    /// Puts `held` at `at` of the key's window array, counting it and the array's growth.
    fn insert_acc(&mut self, at: usize, window: Window, held: Held) {
        let before = self.held.accs_bytes();
        *self.used += held.bytes();
        self.held.accs.insert(at, (window, held));
        *self.used = (*self.used + self.held.accs_bytes()).saturating_sub(before);
    }
}

fn error(operator: &str, source: StateError) -> OperatorError {
    OperatorError::State { operator: operator.to_owned(), source }
}

impl WindowStore {
    pub(super) fn new(backend: Box<dyn StateBackend>, operator: String, max_parallelism: u32) -> Self {
        Self {
            backend,
            entry: StateKey::default(),
            value: Vec::new(),
            operator,
            max_parallelism,
            acc_state: state_id(ACC_STATE),
            sessions_state: state_id(SESSIONS_STATE),
            held: hashbrown::HashMap::default(),
            used: 0,
            budget: eddy_state::WINDOW_CACHE_BYTES,
            complete: false,
        }
    }

    /// A buffer of `bytes` instead of [`eddy_state::WINDOW_CACHE_BYTES`].
    pub(super) fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
    }

    /// `key`'s entries, for reads and writes of its windows.
    pub(super) fn key<'s>(&'s mut self, key: &'s [u8]) -> KeyEntries<'s> {
        let held = match self.held.entry_ref(key) {
            hashbrown::hash_map::EntryRef::Occupied(held) => held.into_mut(),
            hashbrown::hash_map::EntryRef::Vacant(slot) => {
                let fresh = KeyHeld::default();
                self.used += fresh.bytes(key);
                slot.insert(fresh)
            }
        };
        KeyEntries {
            key,
            held,
            backend: self.backend.as_ref(),
            entry: &mut self.entry,
            value: &mut self.value,
            used: &mut self.used,
            operator: &self.operator,
            max_parallelism: self.max_parallelism,
            acc_state: self.acc_state,
            complete: self.complete,
        }
    }

    /// Gives up `key`'s slot once it holds nothing.
    fn forget_if_empty(&mut self, key: &[u8]) {
        if self.held.get(key).is_some_and(KeyHeld::is_empty)
            && let Some((key, held)) = self.held.remove_entry(key)
        {
            self.used = self.used.saturating_sub(held.bytes(&key));
        }
    }

    /// Deletes the window's accumulator: from the buffer, and from the backend if it ever got
    /// it.
    pub(super) fn delete_acc(&mut self, key: &[u8], window: &Window) -> Result<(), OperatorError> {
        let stored = self.key(key).remove_acc(window);
        self.forget_if_empty(key);
        if stored { self.delete_stored_acc(key, window) } else { Ok(()) }
    }

    /// Deletes the window's accumulator from the backend (after [`KeyEntries::remove_acc`]).
    pub(super) fn delete_stored_acc(&mut self, key: &[u8], window: &Window) -> Result<(), OperatorError> {
        let entry =
            self.entry.encode(HashedKey::new(key, self.max_parallelism), self.acc_state, &encode_window(window));
        self.backend.delete(entry).map_err(|e| error(&self.operator, e))
    }

    /// The key's open sessions (session windows only), in start order.
    pub(super) fn sessions(&mut self, key: &[u8]) -> Result<Sessions, OperatorError> {
        if let Some(held) = self.held.get(key).and_then(|h| h.sessions.as_ref()) {
            return Ok(held.value().map(Sessions::from_slice).unwrap_or_default());
        }
        let read = if self.complete {
            Held::absent()
        } else {
            let entry = self.entry.encode(HashedKey::new(key, self.max_parallelism), self.sessions_state, b"");
            Held::read_sessions(self.backend.as_ref(), entry).map_err(|e| error(&self.operator, e))?
        };
        let list = read.value().map(Sessions::from_slice).unwrap_or_default();
        self.used += read.bytes();
        self.key(key).held.sessions = Some(read);
        Ok(list)
    }

    /// Sets the key's open sessions; none deletes the list.
    pub(super) fn put_sessions(&mut self, key: &[u8], sessions: &[Window]) -> Result<(), OperatorError> {
        if sessions.is_empty() {
            let removed = self.held.get_mut(key).and_then(|h| h.sessions.take());
            if let Some(held) = &removed {
                self.used = self.used.saturating_sub(held.bytes());
            }
            self.forget_if_empty(key);
            if matches!(removed, Some(Held { stored: false, .. })) {
                return Ok(());
            }
            let entry = self.entry.encode(HashedKey::new(key, self.max_parallelism), self.sessions_state, b"");
            return self.backend.delete(entry).map_err(|e| error(&self.operator, e));
        }
        self.key(key).put_sessions(sessions);
        Ok(())
    }

    /// Writes every entry the backend lacks to it.
    pub(super) fn write_back(&mut self) -> Result<(), OperatorError> {
        let Self { backend, entry, held, acc_state, sessions_state, max_parallelism, .. } = self;
        let mut written = || -> Result<(), StateError> {
            for (key, held) in held.iter_mut() {
                let hashed = HashedKey::new(key, *max_parallelism);
                for (window, acc) in held.accs.iter_mut().filter(|(_, acc)| acc.dirty) {
                    backend.put(entry.encode(hashed, *acc_state, &encode_window(window)), acc.value.as_slice())?;
                    acc.written();
                }
                if let Some(sessions) = held.sessions.as_mut().filter(|s| s.dirty) {
                    let list: Vec<[u8; 16]> = sessions.value.iter().map(encode_window).collect();
                    backend.put(entry.encode(hashed, *sessions_state, b""), &encode_list(&list))?;
                    sessions.written();
                }
            }
            Ok(())
        };
        written().map_err(|e| error(&self.operator, e))
    }

    /// Between `add` calls (never between a read and the write that follows it, which relies on
    /// the entry staying held): a buffer past its budget is written back and emptied.
    pub(super) fn keep_within_budget(&mut self) -> Result<(), OperatorError> {
        if self.used > self.budget {
            self.write_back()?;
            self.held.clear();
            self.used = 0;
            self.complete = false;
        }
        Ok(())
    }

    /// The memory the buffer holds, counted afresh (tests check the running count against it).
    #[cfg(test)]
    pub(super) fn recount(&self) -> (usize, usize) {
        (self.used, self.held.iter().map(|(key, held)| held.bytes(key)).sum())
    }

    pub(super) fn error(&self, source: StateError) -> OperatorError {
        error(&self.operator, source)
    }

    pub(super) fn corrupt(&self, problem: String) -> OperatorError {
        self.error(StateError::Corrupt(problem))
    }

    /// Every window with an accumulator: (key, window, fired). Learns whether the backend holds
    /// only what the buffer holds ([`Self::complete`]).
    pub(super) fn windows(&mut self) -> Result<Vec<(Vec<u8>, Window, bool)>, OperatorError> {
        self.write_back()?;
        // Written back, the buffer's entries with a value are exactly those the backend got.
        let held: usize = self
            .held
            .values()
            .map(|h| {
                h.accs.iter().filter(|(_, a)| a.stored).count()
                    + usize::from(h.sessions.as_ref().is_some_and(|s| s.stored))
            })
            .sum();
        let mut entries = 0usize;
        let mut found = Vec::new();
        let mut damage: Option<StateError> = None;
        let acc_state = self.acc_state;
        self.backend
            .scan_prefix(b"", &mut |entry, value| {
                entries += 1;
                if damage.is_some() {
                    return;
                }
                let parsed = decode_state_key(entry).and_then(|k| {
                    if k.state != acc_state {
                        return Ok(None);
                    }
                    let window = decode_window(k.namespace)?;
                    match value.first() {
                        Some(&flag @ (NOT_FIRED | FIRED)) => Ok(Some((k.key.to_vec(), window, flag == FIRED))),
                        _ => Err(StateError::Corrupt("window accumulator without a valid flag byte".into())),
                    }
                });
                match parsed {
                    Ok(Some(w)) => found.push(w),
                    Ok(None) => {}
                    Err(e) => damage = Some(e),
                }
            })
            .map_err(|e| self.error(e))?;
        self.complete = entries == held;
        match damage {
            Some(e) => Err(self.error(e)),
            None => Ok(found),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Acc = Held<[u8; INLINE_VALUE]>;

    #[test]
    fn an_inline_value_owns_no_memory_outside_its_entry_and_a_spilled_one_owns_its_allocation() {
        assert_eq!(Acc::fresh(&[7; INLINE_VALUE]).bytes(), 0, "inline, at the limit");
        assert_eq!(Acc::absent().bytes(), 0);
        let spilled = Acc::fresh(&[7; INLINE_VALUE + 1]);
        assert!(spilled.bytes() > INLINE_VALUE, "spilled: {} bytes", spilled.bytes());
        let mut kept = Acc::fresh(&[7; 200]);
        let mut used = kept.bytes();
        kept.set(&[7; 8], &mut used);
        assert!(kept.bytes() >= 200 && used == kept.bytes(), "a spilled value keeps, and counts, its allocation");
    }

    /// Decoded sessions are counted by their memory, not by their encoded size: three
    /// windows spill to the heap, 48 bytes of windows and the allocator's overhead.
    #[test]
    fn a_spilled_session_list_counts_its_windows_memory() {
        let w = |start| Window { start, end: start + 10 };
        assert_eq!(Held::<[Window; 2]>::fresh(&[w(0), w(20)]).bytes(), 0, "inline, at the limit");
        let spilled = Held::<[Window; 2]>::fresh(&[w(0), w(20), w(40)]);
        assert!(spilled.bytes() >= 3 * size_of::<Window>(), "spilled: {} bytes", spilled.bytes());
    }
}

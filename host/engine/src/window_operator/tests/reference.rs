//! A reference window computation written from the definitions, one record at a time, for the
//! differential test. It shares no code with the operator: windows are enumerated by
//! [`oracle_windows`] (not `WindowKind::assign`), sessions are merged here (not by
//! `SessionWindows`), and state is a plain map, not a state backend.
//!
//! The definitions (Flink's event-time windows with the default trigger):
//! - a window fires when the watermark reaches its firing time: `end - 1`, or `end` for a
//!   session (a record at `end` still extends it); it is kept until firing time + allowed
//!   lateness, and purged once the watermark reaches that;
//! - a record goes to every window containing it that is not purged; for a session, the window
//!   is `[t, t + gap)` merged with every kept session of its key it overlaps or touches
//!   (transitively), and the record is late only if that merged window would be purged already;
//! - a record with no such window is late (side output, in arrival order);
//! - a record landing in a window whose firing time the watermark has passed fires that window
//!   at once (a re-fire if it fired before): one result per record and window.

use std::collections::BTreeMap;

use super::{Emitted, Ev, oracle_windows, single};
use eddy_plan::window::{Window, WindowKind};

/// A window's contents: (count, sum of `v`, fired since its last change).
#[derive(Debug, Clone, Copy, Default)]
struct Contents {
    count: i64,
    sum: i64,
    fired: bool,
}

/// The reference operator's state and what it emitted.
#[derive(Debug)]
pub(super) struct Reference {
    kind: WindowKind,
    lateness_ms: i64,
    watermark: i64,
    windows: BTreeMap<(u8, Window), Contents>,
    /// Results in emission order.
    pub emitted: Vec<Emitted>,
    /// Late records in arrival order.
    pub late: Vec<Ev>,
    /// Session records whose own `[t, t + gap)` was already purgeable but that joined a kept
    /// session: the case a per-record lateness check gets wrong.
    pub rescued_by_a_session: usize,
    /// Results emitted from a record rather than a watermark.
    pub fired_by_a_record: usize,
}

impl Reference {
    pub fn new(kind: WindowKind, lateness_ms: i64) -> Self {
        Self {
            kind,
            lateness_ms,
            watermark: i64::MIN,
            windows: BTreeMap::new(),
            emitted: Vec::new(),
            late: Vec::new(),
            rescued_by_a_session: 0,
            fired_by_a_record: 0,
        }
    }

    fn fire_time(&self, w: &Window) -> i64 {
        match self.kind {
            WindowKind::Session { .. } => w.end,
            _ => w.end - 1,
        }
    }

    fn purged_at(&self, w: &Window) -> bool {
        self.fire_time(w).saturating_add(self.lateness_ms) <= self.watermark
    }

    fn emit(&mut self, key: u8, w: Window) {
        let c = self.windows.get_mut(&(key, w)).expect("emitting a kept window");
        c.fired = true;
        let (count, sum) = (c.count, c.sum);
        self.emitted.push(single(count, sum, key, w.start, w.end));
    }

    /// Adds `e` to `w` (creating it) and fires `w` at once if its time has passed.
    fn add(&mut self, e: &Ev, w: Window, before: Contents) {
        let fire_now = self.fire_time(&w) <= self.watermark;
        let c = Contents { count: before.count + 1, sum: before.sum + e.v, fired: false };
        self.windows.insert((e.key, w), c);
        if fire_now {
            self.fired_by_a_record += 1;
            self.emit(e.key, w);
        }
    }

    pub fn on_record(&mut self, e: Ev) {
        match self.kind {
            WindowKind::Session { gap_ms } => self.on_session_record(e, gap_ms),
            _ => {
                let live: Vec<Window> =
                    oracle_windows(self.kind, e.ts).into_iter().filter(|w| !self.purged_at(w)).collect();
                if live.is_empty() {
                    self.late.push(e);
                }
                for w in live {
                    let before = self.windows.get(&(e.key, w)).copied().unwrap_or_default();
                    self.add(&e, w, before);
                }
            }
        }
    }

    fn on_session_record(&mut self, e: Ev, gap_ms: i64) {
        let own = Window { start: e.ts, end: e.ts + gap_ms };
        let mut cover = own;
        let mut absorbed: Vec<Window> = Vec::new();
        // Grow the cover until no kept session of the key overlaps or touches it.
        loop {
            let next = self
                .windows
                .keys()
                .find(|(k, w)| *k == e.key && !absorbed.contains(w) && w.start <= cover.end && cover.start <= w.end);
            let Some(&(_, w)) = next else { break };
            cover = Window { start: cover.start.min(w.start), end: cover.end.max(w.end) };
            absorbed.push(w);
        }
        if self.purged_at(&cover) {
            self.late.push(e);
            return;
        }
        if self.purged_at(&own) {
            self.rescued_by_a_session += 1;
        }
        let mut before = Contents::default();
        for w in absorbed {
            let c = self.windows.remove(&(e.key, w)).expect("absorbed a kept session");
            before.count += c.count;
            before.sum += c.sum;
        }
        self.add(&e, cover, before);
    }

    pub fn on_watermark(&mut self, watermark: i64) {
        if watermark <= self.watermark {
            return;
        }
        self.watermark = watermark;
        let mut due: Vec<(i64, u8, Window)> = self
            .windows
            .iter()
            .filter(|((_, w), c)| !c.fired && self.fire_time(w) <= watermark)
            .map(|(&(key, w), _)| (self.fire_time(&w), key, w))
            .collect();
        due.sort();
        for (_, key, w) in due {
            self.emit(key, w);
        }
        let purged: Vec<(u8, Window)> = self.windows.keys().filter(|(_, w)| self.purged_at(w)).copied().collect();
        for k in purged {
            self.windows.remove(&k);
        }
    }

    /// Whether every window was purged.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

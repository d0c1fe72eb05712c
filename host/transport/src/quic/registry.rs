//! Registrations that accepted streams claim: a receiving subtask's inputs and the handlers of
//! side streams, each registered for the one node that may open it.
//!
//! A stream may arrive before its registration (its upstream part started first), so a claim
//! waits for it, asynchronously and up to a deadline: a waiting stream holds a task, not a
//! thread, and a registration wakes only the streams waiting for that key.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a stream found no registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unregistered {
    /// Nothing was registered under its key by the deadline.
    Missing,
    /// It is registered for another node (named).
    OtherPeer(String),
}

struct Entries<K, T> {
    /// By key: the node that may open the stream, and what takes it.
    registered: HashMap<K, (String, T)>,
    /// By key: what wakes the streams waiting for it.
    waiting: HashMap<K, Arc<Notify>>,
}

/// See the module docs.
pub(super) struct Registry<K, T> {
    entries: Mutex<Entries<K, T>>,
}

impl<K, T> Default for Registry<K, T> {
    fn default() -> Self {
        Self { entries: Mutex::new(Entries { registered: HashMap::new(), waiting: HashMap::new() }) }
    }
}

impl<K: Eq + Hash + Clone, T> Registry<K, T> {
    fn lock(&self) -> MutexGuard<'_, Entries<K, T>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `value` under `key` for node `from`, waking the streams waiting for it.
    pub(super) fn register(&self, key: K, from: &str, value: T) {
        let mut entries = self.lock();
        entries.registered.insert(key.clone(), (from.to_owned(), value));
        if let Some(waiting) = entries.waiting.remove(&key) {
            waiting.notify_waiters();
        }
    }

    /// Forgets every registration whose key fails `keep`.
    pub(super) fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.lock().registered.retain(|k, _| keep(k));
    }

    /// Takes `key`'s registration for `peer`, waiting for it until `deadline`. One registered
    /// for another node stays for that node.
    pub(super) async fn claim(&self, key: &K, peer: &str, deadline: Instant) -> Result<T, Unregistered> {
        loop {
            let notify = {
                let mut entries = self.lock();
                if let Some(taken) = Self::take(&mut entries, key, peer) {
                    return taken;
                }
                entries.waiting.entry(key.clone()).or_default().clone()
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            // From here a registration wakes this wait even if it lands before the first poll.
            notified.as_mut().enable();
            if let Some(taken) = Self::take(&mut self.lock(), key, peer) {
                return taken;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let mut entries = self.lock();
                // The last stream to give up on a key takes its waker along.
                if entries.waiting.get(key).is_some_and(|n| Arc::ptr_eq(n, &notify) && Arc::strong_count(n) == 2) {
                    entries.waiting.remove(key);
                }
                return Self::take(&mut entries, key, peer).unwrap_or(Err(Unregistered::Missing));
            }
        }
    }

    fn take(entries: &mut Entries<K, T>, key: &K, peer: &str) -> Option<Result<T, Unregistered>> {
        match entries.registered.get(key) {
            Some((expected, _)) if expected != peer => Some(Err(Unregistered::OtherPeer(expected.clone()))),
            Some(_) => entries.registered.remove(key).map(|(_, value)| Ok(value)),
            None => None,
        }
    }

    /// Keys streams wait for now (for tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    #[test]
    fn a_registration_wakes_the_stream_waiting_for_it_and_only_for_its_node() {
        runtime().block_on(async {
            let registry = Arc::new(Registry::<u32, &str>::default());
            let deadline = Instant::now() + Duration::from_secs(60);
            let waiter = {
                let registry = registry.clone();
                tokio::spawn(async move { registry.claim(&7, "worker-a", deadline).await })
            };
            while registry.waiting() == 0 {
                tokio::task::yield_now().await;
            }
            registry.register(8, "worker-a", "another key");
            registry.register(7, "worker-a", "the input");
            assert_eq!(waiter.await.expect("claim"), Ok("the input"));
            assert_eq!(registry.waiting(), 0, "nothing left waiting");
            // Registered for worker-c: worker-b is told so, and it stays for worker-c.
            registry.register(9, "worker-c", "c's input");
            assert_eq!(registry.claim(&9, "worker-b", deadline).await, Err(Unregistered::OtherPeer("worker-c".into())));
            assert_eq!(registry.claim(&9, "worker-c", deadline).await, Ok("c's input"));
        });
    }

    #[test]
    fn a_claim_gives_up_at_its_deadline_and_leaves_nothing_behind() {
        runtime().block_on(async {
            let registry = Registry::<u32, ()>::default();
            let deadline = Instant::now() + Duration::from_millis(20);
            assert_eq!(registry.claim(&1, "worker-a", deadline).await, Err(Unregistered::Missing));
            assert_eq!(registry.waiting(), 0);
            registry.register(2, "worker-a", ());
            registry.retain(|k| *k != 2);
            assert_eq!(registry.claim(&2, "worker-a", Instant::now()).await, Err(Unregistered::Missing));
        });
    }
}

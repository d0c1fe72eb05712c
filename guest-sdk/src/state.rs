//! Typed handles to keyed state. Every read and write applies to the key of the record (or
//! timer) being handled right now; the host enforces that scope.
//!
//! Value state is cheap to use per record: values of prefetched states arrive with the batch,
//! and writes are buffered and handed to the host in one crossing at the end of the call.
//!
//! Values (and list items, and map values) are written as record values are: a struct as a
//! row, anything else as JSON, and either is read back, so state written as JSON by an older
//! build or by another language's SDK still reads. Map keys stay JSON: their encoded bytes
//! order a map's entries, and every SDK must encode a key the same way to find it.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::state::{self as wit, StateKind};
use crate::{Result, codec, context};

fn declare(name: &str, kind: StateKind, prefetch: bool) -> u32 {
    wit::declare(name, kind, prefetch)
}

/// One value of type `T` per key.
#[derive(Debug)]
pub struct ValueState<T> {
    id: u32,
    _t: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> ValueState<T> {
    pub(crate) fn declare(name: &str, prefetch: bool) -> Self {
        Self { id: declare(name, StateKind::Value, prefetch), _t: PhantomData }
    }

    /// The value for the current key, if one was set.
    pub fn get(&self) -> Result<Option<T>> {
        context::with_value(self.id, |bytes| bytes.map(codec::decode_value).transpose())
    }

    /// Replaces the value for the current key.
    pub fn set(&self, value: &T) -> Result<()> {
        context::value_set(self.id, |buf| codec::encode_value_into(buf, value))
    }

    /// Removes the value for the current key.
    pub fn clear(&self) -> Result<()> {
        context::value_clear(self.id)
    }
}

/// An ordered list of `T` per key.
#[derive(Debug)]
pub struct ListState<T> {
    id: u32,
    _t: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> ListState<T> {
    pub(crate) fn declare(name: &str) -> Self {
        Self { id: declare(name, StateKind::List, false), _t: PhantomData }
    }

    /// All items for the current key, oldest first. The host hands over at most its
    /// `max_state_read_bytes` (16 MiB by default) in one read and traps beyond it, so keep a
    /// list that grows without end under several keys or trim it with [`replace`](Self::replace).
    pub fn get(&self) -> Result<Vec<T>> {
        let key = context::current_key()?;
        wit::list_get(self.id, key).iter().map(|b| codec::decode_value(b)).collect()
    }

    /// Appends one item for the current key. Costs the same however long the list is: the
    /// host stores each item as its own entry.
    pub fn push(&self, item: &T) -> Result<()> {
        let key = context::current_key()?;
        wit::list_append(self.id, key, &codec::encode_value(item)?);
        Ok(())
    }

    /// Replaces all items for the current key.
    pub fn replace(&self, items: &[T]) -> Result<()> {
        let key = context::current_key()?;
        let encoded = items.iter().map(codec::encode_value).collect::<Result<Vec<_>>>()?;
        wit::list_replace(self.id, key, &encoded);
        Ok(())
    }

    /// Removes every item for the current key.
    pub fn clear(&self) -> Result<()> {
        wit::clear(self.id, context::current_key()?);
        Ok(())
    }
}

/// A map from `K` to `V` per key.
#[derive(Debug)]
pub struct MapState<K, V> {
    id: u32,
    _t: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapState<K, V>
where
    K: Serialize + DeserializeOwned,
    V: Serialize + DeserializeOwned,
{
    pub(crate) fn declare(name: &str) -> Self {
        Self { id: declare(name, StateKind::Map, false), _t: PhantomData }
    }

    /// The value under `map_key` for the current key.
    pub fn get(&self, map_key: &K) -> Result<Option<V>> {
        let key = context::current_key()?;
        wit::map_get(self.id, key, &codec::encode(map_key)?).map(|b| codec::decode_value(&b)).transpose()
    }

    /// Sets the value under `map_key` for the current key.
    pub fn insert(&self, map_key: &K, value: &V) -> Result<()> {
        let key = context::current_key()?;
        wit::map_put(self.id, key, &codec::encode(map_key)?, &codec::encode_value(value)?);
        Ok(())
    }

    /// Removes `map_key` for the current key.
    pub fn remove(&self, map_key: &K) -> Result<()> {
        let key = context::current_key()?;
        wit::map_remove(self.id, key, &codec::encode(map_key)?);
        Ok(())
    }

    /// Every entry for the current key, ordered by the encoded map key. Bounded like
    /// [`ListState::get`]: a map past the host's read bound traps here; use
    /// [`get`](Self::get) for single entries.
    pub fn entries(&self) -> Result<Vec<(K, V)>> {
        let key = context::current_key()?;
        wit::map_entries(self.id, key).iter().map(|(k, v)| Ok((codec::decode(k)?, codec::decode_value(v)?))).collect()
    }

    /// Removes every entry for the current key.
    pub fn clear(&self) -> Result<()> {
        wit::clear(self.id, context::current_key()?);
        Ok(())
    }
}

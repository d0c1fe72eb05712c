//! Read-only views of the records and timers a call received.

use eddy_wire::{Row, Span};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::bindings::types::{TimeDomain as WitTimeDomain, TimerRef};
use crate::codec::FieldName;
use crate::{Error, Result, RowRead, codec};

pub(crate) fn slice(data: &[u8], span: Span) -> Result<&[u8]> {
    span.slice(data).ok_or_else(|| Error::bad_record("record span lies outside its batch"))
}

/// One input record.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    key: Option<&'a [u8]>,
    value: &'a [u8],
    timestamp: Option<i64>,
}

impl<'a> Record<'a> {
    pub(crate) fn from_row(data: &'a [u8], r: &Row) -> Result<Self> {
        Ok(Self {
            key: r.key.map(|k| slice(data, k)).transpose()?,
            value: slice(data, r.value)?,
            timestamp: r.timestamp,
        })
    }

    /// The raw key bytes; `None` on a stream that is not keyed.
    pub fn key_bytes(&self) -> Option<&'a [u8]> {
        self.key
    }

    /// The raw value bytes.
    pub fn value_bytes(&self) -> &'a [u8] {
        self.value
    }

    /// Event time in ms since the Unix epoch, if the record has one.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// The key, decoded.
    pub fn key<K: Deserialize<'a>>(&self) -> Result<K> {
        let key = self.key.ok_or_else(|| Error::bad_record("record has no key (is the stream keyed?)"))?;
        codec::decode(key)
    }

    /// The value, decoded.
    pub fn value<V: Deserialize<'a>>(&self) -> Result<V> {
        codec::decode_value(self.value)
    }

    /// The value as a struct that derives [`Row`](crate::Row): read slot by slot by a layout
    /// resolved once per schema, the same result as [`Self::value`] (which it falls back to
    /// for JSON, for a schema without one of the fields and for a slot of another kind) at a
    /// fraction of the cost.
    pub fn row<V: RowRead + DeserializeOwned>(&self) -> Result<V> {
        crate::row::decode(self.value)
    }

    /// The top-level string field `field` of the value, `None` if there is none or it is not
    /// a string: borrowed from a row in place, without decoding the rest (a filter on a
    /// record's kind), parsed from JSON. `field` is a name (`"type"`) or, for a field read
    /// record after record, a [`Field`](crate::codec::Field) kept in the operator, whose slot
    /// it remembers per schema.
    pub fn value_str(&self, field: impl FieldName) -> Result<Option<std::borrow::Cow<'a, str>>> {
        codec::str_field(self.value, field)
    }

    /// [`Self::value_str`]'s bytes, not checked to be UTF-8: the cheaper way to compare a field
    /// with known text (`record.value_str_bytes("type")?.as_deref() == Some(b"bid")`).
    pub fn value_str_bytes(&self, field: impl FieldName) -> Result<Option<std::borrow::Cow<'a, [u8]>>> {
        codec::str_field_bytes(self.value, field)
    }

    /// The JSON text of the part of the value a JSON pointer (such as `/bidder`) names, `None`
    /// if there is none; a row is read in place, without decoding the rest.
    pub fn value_at(&self, pointer: &str) -> Result<Option<Vec<u8>>> {
        codec::pointer_json(self.value, pointer)
    }
}

/// Which clock a timer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeDomain {
    /// Fires on the watermark.
    EventTime,
    /// Fires on the host's processing-time clock.
    ProcessingTime,
}

impl TimeDomain {
    pub(crate) fn to_wit(self) -> WitTimeDomain {
        match self {
            TimeDomain::EventTime => WitTimeDomain::EventTime,
            TimeDomain::ProcessingTime => WitTimeDomain::ProcessingTime,
        }
    }
}

/// A timer that fired.
#[derive(Debug, Clone, Copy)]
pub struct Timer<'a> {
    key: &'a [u8],
    timestamp: i64,
    domain: TimeDomain,
}

impl<'a> Timer<'a> {
    pub(crate) fn from_wit(data: &'a [u8], t: &TimerRef) -> Result<Self> {
        let domain = match t.domain {
            WitTimeDomain::EventTime => TimeDomain::EventTime,
            WitTimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
        };
        let key = Span { offset: t.key.offset, len: t.key.len };
        Ok(Self { key: slice(data, key)?, timestamp: t.timestamp, domain })
    }

    /// The key the timer was registered for, raw.
    pub fn key_bytes(&self) -> &'a [u8] {
        self.key
    }

    /// The key, decoded.
    pub fn key<K: Deserialize<'a>>(&self) -> Result<K> {
        codec::decode(self.key)
    }

    /// When the timer was set to fire (ms).
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// Event time or processing time.
    pub fn domain(&self) -> TimeDomain {
        self.domain
    }
}

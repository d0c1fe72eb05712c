//! Byte strings back to back: the accumulators and results an aggregate call takes and
//! returns, as one buffer and a range per item instead of a `Vec` per item (an `add` over a
//! batch touches thousands of (key, window) groups).

use std::ops::Range;

use eddy_wire::{Packed, Span, Table};

use crate::bindings::aggregate_world::exports::eddy::dataflow::aggregate::{PackedItemsParam, PackedItemsResult};
use crate::error::Violation;

/// Items in one buffer, each a checked range of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Items {
    data: Vec<u8>,
    ranges: Vec<Range<usize>>,
}

impl Items {
    /// Appends an item.
    pub fn push(&mut self, bytes: &[u8]) {
        let start = self.data.len();
        self.data.extend_from_slice(bytes);
        self.ranges.push(start..self.data.len());
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Item `index`.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.ranges.get(index).map(|r| &self.data[r.clone()])
    }

    /// The last item.
    pub fn last(&self) -> Option<&[u8]> {
        self.ranges.last().map(|r| &self.data[r.clone()])
    }

    /// The items in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.ranges.iter().map(|r| &self.data[r.clone()])
    }

    /// Removes every item, keeping the allocations.
    pub fn clear(&mut self) {
        self.data.clear();
        self.ranges.clear();
    }

    /// What a guest returned, its spans checked against its buffer (which is kept, not copied).
    pub(crate) fn from_wit(packed: PackedItemsResult) -> Result<Self, Violation> {
        let table = Table::<Span>::new(&packed.spans).map_err(Violation::MalformedTable)?;
        let ranges = table
            .iter()
            .enumerate()
            .map(|(index, s)| {
                let start = s.offset as usize;
                match start.checked_add(s.len as usize) {
                    Some(end) if end <= packed.data.len() => Ok(start..end),
                    _ => Err(Violation::BadSpan { what: "returned item", index }),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { data: packed.data, ranges })
    }

    /// The span table of the WIT shape, for handing the items to a guest ([`Self::lend`]).
    pub(crate) fn wit_spans(&self) -> Vec<u8> {
        let mut spans = Vec::with_capacity(self.ranges.len() * Span::BYTES);
        for r in &self.ranges {
            // Host-built items of one batch stay far below 4 GiB.
            Span { offset: r.start as u32, len: (r.end - r.start) as u32 }.write(&mut spans);
        }
        spans
    }

    /// The WIT shape with `spans` from [`Self::wit_spans`]: the items' bytes lent as they are.
    pub(crate) fn lend<'a>(&'a self, spans: &'a [u8]) -> PackedItemsParam<'a> {
        PackedItemsParam { data: &self.data, spans }
    }
}

impl<'a> FromIterator<&'a [u8]> for Items {
    fn from_iter<I: IntoIterator<Item = &'a [u8]>>(iter: I) -> Self {
        let mut items = Items::default();
        for item in iter {
            items.push(item);
        }
        items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_through_the_wit_shape_and_bad_spans_are_refused() {
        let items: Items = [&b"ab"[..], b"", b"cde"].into_iter().collect();
        let spans = items.wit_spans();
        let lent = items.lend(&spans);
        let wit = PackedItemsResult { data: lent.data.to_vec(), spans: lent.spans.to_vec() };
        assert_eq!(Items::from_wit(wit.clone()).expect("well formed"), items);
        assert_eq!(items.iter().collect::<Vec<_>>(), vec![&b"ab"[..], b"", b"cde"]);
        let mut bad = wit.clone();
        bad.data.truncate(4);
        assert!(matches!(Items::from_wit(bad), Err(Violation::BadSpan { index: 2, .. })));
        let mut partial = wit;
        partial.spans.pop();
        assert!(Items::from_wit(partial).is_err());
    }
}

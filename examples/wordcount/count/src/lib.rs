//! Word count, step 2: keyed by word; keeps a running count per word in `ValueState<u64>`
//! and emits `(word, count)` after every record. The value of an input record is how many
//! occurrences it stands for (1 from `split`).

use eddy_sdk::{Context, OpenContext, Operator, Record, Result, ValueState};

/// Counts per key.
#[derive(Debug)]
pub struct Count {
    count: ValueState<u64>,
}

impl Operator for Count {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(Count { count: ctx.value_state("count") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        // String, not &str: a JSON key with escapes cannot be borrowed.
        let word: String = record.key()?;
        let n: u64 = record.value()?;
        let count = self.count.get()?.unwrap_or(0) + n;
        self.count.set(&count)?;
        ctx.emit(&word, &count)
    }
}

eddy_sdk::export_operator!(Count);

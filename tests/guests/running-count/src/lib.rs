//! A stateful keyed operator whose output is fixed by its input alone: for every record it adds
//! one to its key's count (value state) and emits `(key, count)`. Replayed after a failure, it
//! emits a running count twice or skips one unless state and source positions are restored
//! exactly together — which is what the crash tests check.

use eddy_sdk::{Context, OpenContext, Operator, Record, Result, ValueState};

#[derive(Debug)]
pub struct RunningCount {
    count: ValueState<u64>,
}

impl Operator for RunningCount {
    // Any config: the next version (`running-count-v2`) reads options this one ignores.
    type Config = serde_json::Value;

    fn open(_config: serde_json::Value, ctx: &mut OpenContext) -> Result<Self> {
        Ok(RunningCount { count: ctx.value_state("count") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let key: serde_json::Value = record.key()?;
        let count = self.count.get()?.unwrap_or(0) + 1;
        self.count.set(&count)?;
        ctx.emit(&key, &count)
    }
}

eddy_sdk::export_operator!(RunningCount);

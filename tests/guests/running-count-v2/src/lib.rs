//! The running count's next version, for live swaps: it adds two per record to the same value
//! state `count`, so an output shows which code counted it. Its config (which the first version
//! ignores) can make it fail the swap: `trap_in_open` panics in `open`, `count_as_list` declares
//! `count` as a list state, which cannot go on from the first version's value state.

use eddy_sdk::{Context, OpenContext, Operator, Record, Result, ValueState};

#[derive(Debug)]
pub struct RunningCountV2 {
    /// `None` when told to declare `count` as a list (a swap refuses that version).
    count: Option<ValueState<u64>>,
}

impl Operator for RunningCountV2 {
    type Config = serde_json::Value;

    fn open(config: serde_json::Value, ctx: &mut OpenContext) -> Result<Self> {
        assert!(config["trap_in_open"] != true, "running-count-v2 told to trap in open");
        if config["count_as_list"] == true {
            let _list: eddy_sdk::ListState<u64> = ctx.list_state("count");
            return Ok(RunningCountV2 { count: None });
        }
        Ok(RunningCountV2 { count: Some(ctx.value_state("count")) })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let key: serde_json::Value = record.key()?;
        let Some(state) = &mut self.count else {
            return Err(eddy_sdk::Error::new(
                eddy_sdk::ErrorKind::BadConfig,
                "running-count-v2 was opened with `count_as_list`",
            ));
        };
        let count = state.get()?.unwrap_or(0) + 2;
        state.set(&count)?;
        ctx.emit(&key, &count)
    }
}

eddy_sdk::export_operator!(RunningCountV2);

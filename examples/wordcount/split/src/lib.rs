//! Word count, step 1: each input value is a line of text (a JSON string); emits one record
//! per word, keyed by the lower-cased word, with value 1. Not keyed: it runs before `key_by`.

use eddy_sdk::{Context, OpenContext, Operator, Record, Result};

/// Splits lines into words.
#[derive(Debug)]
pub struct Split;

/// The words of `line`: maximal runs of alphanumeric characters, lower-cased.
pub fn words(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase)
}

impl Operator for Split {
    type Config = ();

    fn open(_config: (), _ctx: &mut OpenContext) -> Result<Self> {
        Ok(Split)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let line: String = record.value()?;
        for word in words(&line) {
            ctx.emit(&word, &1u64)?;
        }
        Ok(())
    }
}

eddy_sdk::export_operator!(Split);

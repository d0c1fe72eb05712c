//! Names of prepared transactions and what a restore does with the ones it finds, without a
//! database. A prepared transaction's name (PostgreSQL's `gid`) says which job, sink subtask
//! and checkpoint wrote it: `eddy:<job>:<subtask>:<checkpoint>` (`final` for the job's last).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// What a sink subtask stores in a checkpoint: the transactions it prepared that are not known
/// to be committed yet, oldest first. A restore from that checkpoint commits them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostgresSinkState {
    /// Prepared transaction names.
    pub prepared: Vec<String>,
}

/// The prefix every transaction of `job` starts with.
pub(super) fn job_prefix(job: &str) -> String {
    format!("eddy:{job}:")
}

/// The transaction subtask `subtask` of `job` prepares at checkpoint `checkpoint`'s barrier.
pub(super) fn transaction_name(job: &str, subtask: u32, checkpoint: u64) -> String {
    match checkpoint {
        u64::MAX => format!("{}{subtask}:final", job_prefix(job)),
        n => format!("{}{subtask}:{n}", job_prefix(job)),
    }
}

/// What to do with the transactions found prepared in the database when `job` starts.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Resolution {
    /// Listed by the restored checkpoint: it completed, so they are committed.
    pub(super) commit: Vec<String>,
    /// This job's, listed by no restored state: their rows come again from the sources.
    pub(super) roll_back: Vec<String>,
}

/// Sorts the prepared transactions `found` (of every job in the database) by the restored
/// checkpoint's sink `states`; other jobs' transactions are left alone.
pub(super) fn resolve(job: &str, found: &[String], states: &[PostgresSinkState]) -> Resolution {
    let prefix = job_prefix(job);
    let listed: BTreeSet<&str> = states.iter().flat_map(|s| s.prepared.iter().map(String::as_str)).collect();
    let mut resolution = Resolution::default();
    for gid in found.iter().filter(|g| g.starts_with(&prefix)) {
        if listed.contains(gid.as_str()) {
            resolution.commit.push(gid.clone());
        } else {
            resolution.roll_back.push(gid.clone());
        }
    }
    resolution
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn names_carry_job_subtask_and_checkpoint() {
        assert_eq!(transaction_name("totals", 3, 17), "eddy:totals:3:17");
        assert_eq!(transaction_name("totals", 0, u64::MAX), "eddy:totals:0:final");
    }

    #[test]
    fn a_restore_commits_what_its_checkpoint_lists_and_rolls_back_the_rest_of_its_job_only() {
        let found = names(&[
            "eddy:job:0:4",  // listed: checkpoint 4 completed, its commit had not run
            "eddy:job:0:5",  // prepared for checkpoint 5, which did not complete
            "eddy:job:2:5",  // a subtask the rescaled job no longer has
            "eddy:job2:0:4", // another job whose name starts alike
            "other:thing",   // not Eddy's
        ]);
        let states =
            [PostgresSinkState { prepared: names(&["eddy:job:0:3", "eddy:job:0:4"]) }, PostgresSinkState::default()];
        assert_eq!(
            resolve("job", &found, &states),
            Resolution { commit: names(&["eddy:job:0:4"]), roll_back: names(&["eddy:job:0:5", "eddy:job:2:5"]) }
        );
        // A fresh start (nothing restored) rolls back everything of the job.
        assert_eq!(resolve("job", &found, &[]).roll_back.len(), 3);
    }
}

//! The records the service keeps and the JSON its API answers with.

use eddy_engine::FailureDetail;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A tenant: the owner of artifacts, jobs and their output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    /// `t_` and 16 hex digits.
    pub id: String,
    /// Unique among tenants.
    pub name: String,
    /// When the admin created it (ms since the epoch).
    pub created_ms: i64,
    /// Its quotas, when the admin set them (else the server's defaults).
    #[serde(default)]
    pub quotas: Option<crate::quotas::Quotas>,
}

/// Who a token speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Principal {
    /// The operator of the service: manages tenants, sees no tenant's resources.
    Admin,
    /// One tenant.
    Tenant {
        /// Its id.
        tenant: String,
    },
}

/// A stored token (only its hash is the key; the token itself is never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// A short public id, to list and revoke it by.
    pub id: String,
    /// Who it speaks for.
    pub principal: Principal,
    /// When it was issued.
    pub created_ms: i64,
    /// When it was revoked, if it was.
    pub revoked_ms: Option<i64>,
}

/// Which Eddy world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum World {
    /// `keyed-operator`.
    KeyedOperator,
    /// `window-aggregate`.
    WindowAggregate,
}

impl World {
    /// Its WIT name.
    pub fn name(self) -> &'static str {
        match self {
            World::KeyedOperator => "keyed-operator",
            World::WindowAggregate => "window-aggregate",
        }
    }
}

/// An uploaded component, as one tenant sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    /// `sha256:` and the hex digest of the bytes.
    pub digest: String,
    /// The owning tenant.
    #[serde(skip_serializing)]
    #[serde(default)]
    pub tenant: String,
    /// Size of the `.wasm`.
    pub size: u64,
    /// The world it implements.
    pub world: World,
    /// The names `name@version` given to it at upload.
    pub names: Vec<String>,
    /// When it was first uploaded.
    pub created_ms: i64,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Accepted, about to start (or to resume after a server restart).
    Created,
    /// Its tasks run.
    Running,
    /// A task failed; it restarts from its newest checkpoint after a delay.
    Restarting,
    /// Every source ended and the output is committed.
    Finished,
    /// It failed beyond its restart strategy.
    Failed,
    /// A client cancelled it.
    Canceled,
    /// A client stopped it with a savepoint (its newest savepoint holds its state).
    Stopped,
    /// The server died twice in a row while it ran: it waits for its owner to resume it
    /// (`POST /v1/jobs/{id}/resume`) rather than being started into a crash loop.
    Held,
}

impl JobStatus {
    /// Whether the job will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Finished | JobStatus::Failed | JobStatus::Canceled | JobStatus::Stopped)
    }

    /// Whether it holds slots and memory: it runs, or is about to (not held, not ended).
    pub fn is_active(self) -> bool {
        !self.is_terminal() && self != JobStatus::Held
    }

    /// Its name in the API (`running`, `held`, ...).
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Created => "created",
            JobStatus::Running => "running",
            JobStatus::Restarting => "restarting",
            JobStatus::Finished => "finished",
            JobStatus::Failed => "failed",
            JobStatus::Canceled => "canceled",
            JobStatus::Stopped => "stopped",
            JobStatus::Held => "held",
        }
    }
}

/// One failure of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Failure {
    /// When it happened.
    pub at_ms: i64,
    /// What failed, as the engine put it (naming the task and operator).
    pub message: String,
    /// The host's cause chain, outermost first (task and subtask, operator and call, what
    /// happened); empty for failures that are not the engine's (quotas, lost workers).
    #[serde(default)]
    pub causes: Vec<String>,
    /// What the guest said before it failed (its panic message or stderr tail), if anything.
    #[serde(default)]
    pub guest_message: Option<String>,
}

/// A savepoint a job took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Savepoint {
    /// The checkpoint id it copies.
    pub id: u64,
    /// Its directory, relative to the job's directory.
    pub path: String,
    /// When it was taken.
    pub at_ms: i64,
    /// Why: `requested`, `stop`, `rescale`, `upgrade` or `shutdown`.
    pub reason: String,
}

/// A live upgrade that completed: the step runs the new code from a checkpoint's barrier on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LiveSwap {
    /// Always `live`.
    pub mode: String,
    /// The step that runs the new code.
    pub step: String,
    /// The new artifact, `sha256:<hex>`.
    pub artifact: String,
    /// The checkpoint that carried the swap: records before its barrier went through the old
    /// code, records after it through the new one; a restore from it runs the new code.
    pub checkpoint: u64,
    /// Subtasks of the step that went over.
    pub subtasks: u32,
    /// The longest time one subtask spent opening the new code after its snapshot.
    pub longest_swap_ms: f64,
    /// From the request to the completed checkpoint.
    pub total_ms: f64,
}

/// What rescales and upgrades changed in the submitted spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// Every step's parallelism, after a rescale.
    pub parallelism: Option<u32>,
    /// Step name → the artifact digest it runs instead, after upgrades.
    pub artifacts: std::collections::BTreeMap<String, String>,
}

/// The store key of `tenant`'s job `id` (in [`crate::store::Table::Jobs`] and
/// [`crate::store::Table::JobSpecs`]).
pub fn job_key(tenant: &str, id: &str) -> String {
    format!("{tenant}/{id}")
}

/// A job as stored (its spec is stored apart, under the same key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// `j_` and 16 hex digits.
    pub id: String,
    /// The owning tenant.
    pub tenant: String,
    /// The pipeline's name.
    pub name: String,
    /// The digests of the artifacts its steps run, in step order.
    pub artifacts: Vec<String>,
    /// Slots it holds while it runs.
    pub slots: u32,
    /// The state it may hold at most (see [`crate::quotas::Quotas::state_bytes`]).
    #[serde(default)]
    pub state_bytes: u64,
    /// The linear memory its operator instances may grow to together.
    #[serde(default)]
    pub memory_bytes: u64,
    /// Where it is.
    pub status: JobStatus,
    /// The newest failures, oldest first (at most [`MAX_FAILURES`]).
    pub failures: Vec<Failure>,
    /// Restarts after failures so far, charged to the job's restart strategy (the cluster's
    /// failures, such as a lost worker, are not).
    pub restarts: u32,
    /// Attempts started so far, whatever ended them.
    #[serde(default)]
    pub attempts: u32,
    /// Submitted at.
    pub created_ms: i64,
    /// Last status change.
    pub updated_ms: i64,
    /// Changes to the spec since it was submitted.
    #[serde(default)]
    pub overrides: Overrides,
    /// A live upgrade asked for and not completed yet: (step, artifact digest). Kept here so
    /// an attempt that dies before the swap's checkpoint completes (its restore runs the old
    /// code) swaps again at the next attempt's first checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_upgrade: Option<(String, String)>,
    /// The physical plan as `eddy plan` prints it, for the spec with its overrides.
    #[serde(default)]
    pub plan: String,
    /// Bumped at each restart from a savepoint: each generation checkpoints into its own
    /// directory, so the newest checkpoint is always of the current plan.
    #[serde(default)]
    pub generation: u32,
    /// The savepoint the current generation starts from until it has a checkpoint of its own.
    #[serde(default)]
    pub restore_from: Option<String>,
    /// Savepoints taken, oldest first.
    #[serde(default)]
    pub savepoints: Vec<Savepoint>,
    /// Server starts after a crash (not a clean stop) that found this job running, in a row:
    /// at [`MAX_CRASH_RESUMES`] the job is held instead of resumed.
    #[serde(default)]
    pub crash_resumes: u32,
    /// Attempts in a row that failed soon after they started (see
    /// [`crate::restarts::RestartPolicy`]).
    #[serde(default)]
    pub fast_failures: u32,
    /// When it ended (finished, failed, canceled, stopped): its outputs and checkpoints are
    /// kept for the retention after this, then deleted with the record.
    #[serde(default)]
    pub ended_ms: Option<i64>,
}

/// Crashes of the server in a row that a running job survives before it is held.
pub const MAX_CRASH_RESUMES: u32 = 2;

impl JobRecord {
    /// Its store key.
    pub fn key(&self) -> String {
        job_key(&self.tenant, &self.id)
    }
}

/// A join token (only its hash is the key): lets a worker enroll with the coordinator's CA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    /// A short public id, to list it by.
    pub id: String,
    /// The worker name it may enroll; `None`: any name not issued before.
    pub name: Option<String>,
    /// Enrollments it still allows.
    pub uses_left: u32,
    /// When it stops working (ms since the epoch).
    pub expires_ms: i64,
    /// When the admin issued it.
    pub created_ms: i64,
}

/// A worker name the cluster CA issued a certificate for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedName {
    /// When.
    pub issued_ms: i64,
    /// When that certificate expires.
    pub expires_ms: i64,
    /// The join token's public id it was enrolled with.
    pub token_id: String,
}

/// Failures kept per job.
pub const MAX_FAILURES: usize = 10;

impl JobRecord {
    /// Records a failure, keeping the newest [`MAX_FAILURES`].
    pub fn push_failure(&mut self, message: String, detail: FailureDetail) {
        let FailureDetail { causes, guest_message } = detail;
        self.failures.push(Failure { at_ms: now_ms(), message, causes, guest_message });
        let excess = self.failures.len().saturating_sub(MAX_FAILURES);
        self.failures.drain(..excess);
    }
}

//! Data-plane threads (task threads, a worker's I/O runtime and its links' hand-over threads)
//! run under Linux's `SCHED_BATCH` policy: such a thread, woken by a message, does not preempt
//! the thread running on its core; it waits for that thread to block or for the scheduler tick.
//!
//! Under the default policy a woken thread that has slept a while (a step after a window,
//! woken for each watermark and result batch; a worker's I/O thread, woken per datagram)
//! preempts the running one at once, runs for a few microseconds and sleeps again: q5 at
//! parallelism 2 on two cores switched threads 12 000 times a run, 4 000 of them preempting
//! its busiest window thread (`perf record -e sched:sched_switch`). Each switch costs the
//! preempted thread its caches. These threads hold records in memory and are woken by their
//! inputs, so the tick bounds what waiting adds to a record's latency. A server's and a
//! coordinator's request threads keep the default policy. Needs no privilege; where the policy
//! cannot be set the thread keeps the default one (logged at debug).

/// Puts the calling thread under `SCHED_BATCH`, or leaves it as it is where that fails.
pub fn enter() {
    if !set_batch() {
        tracing::debug!("this thread keeps the default scheduling policy");
    }
}

#[cfg(target_os = "linux")]
fn set_batch() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid, initialized struct that outlives
    // the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn set_batch() -> bool {
    false
}

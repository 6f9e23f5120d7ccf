//! Records each step of a job as it ends: its duration, the job slot (so
//! the `deploy` command prints it at once) and the log.

use serde_json::json;
use tokio::time::Instant;

use super::slot::Slot;
use super::{Failure, StepRecord};

/// Records each step with its duration, publishes it to the job slot and
/// logs it.
#[derive(Debug)]
pub struct Recorder {
    slot: Slot,
    steps: Vec<StepRecord>,
}

impl Recorder {
    /// A recorder publishing to `slot`.
    pub fn new(slot: Slot) -> Recorder {
        Recorder {
            slot,
            steps: Vec::new(),
        }
    }

    /// Marks the start of a step.
    pub fn start(&self) -> Instant {
        Instant::now()
    }

    fn push(&mut self, step: &str, ok: bool, started: Instant, detail: String) {
        let record = StepRecord {
            step: step.to_string(),
            ok,
            ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            detail,
        };
        crate::log::info(
            "deploy_step",
            json!({"step": record.step, "ok": ok, "ms": record.ms, "detail": record.detail}),
        );
        self.slot.push(record.clone());
        self.steps.push(record);
    }

    /// A step that succeeded.
    pub fn done(&mut self, step: &str, started: Instant, detail: String) {
        self.push(step, true, started, detail);
    }

    /// A step that failed.
    pub fn failed(&mut self, started: Instant, f: &Failure) {
        self.push(f.step, false, started, f.reason.clone());
    }

    /// The slot, for a step that reports what it waits for
    /// ([`Slot::wait`]) while it runs.
    pub fn slot(&self) -> Slot {
        self.slot.clone()
    }

    /// The steps recorded so far.
    pub fn steps(&self) -> &[StepRecord] {
        &self.steps
    }

    /// Every step, in order.
    pub fn into_steps(self) -> Vec<StepRecord> {
        self.steps
    }
}

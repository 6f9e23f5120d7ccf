//! The running agent's one deploy slot: the latest job as the control
//! socket shows it ([`JobView`]): its steps so far, what it is waiting on
//! right now, and its result once finished. A cheap handle ([`Slot`] is a
//! shared reference) that the job's [`super::recorder::Recorder`] writes
//! and the control socket reads; it knows nothing of the agent around it.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::{Outcome, StepRecord};

/// A wait in progress: the step and what it waits for, in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// The step that waits (`drain`, `l5`, ...).
    pub step: String,
    /// What it waits for (`draining: 1 call up, 21 s left`).
    pub note: String,
}

/// The latest job, as the control socket shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    /// The agent process running it (a restarted agent has another).
    #[serde(default)]
    pub pid: u32,
    /// Increases with each job of this agent process.
    pub id: u64,
    /// `deploy`, `rollback` or `recover`.
    pub kind: String,
    /// The steps so far.
    pub steps: Vec<StepRecord>,
    /// The wait in progress, if the running step is waiting.
    #[serde(default)]
    pub waiting: Option<Waiting>,
    /// The result, once finished.
    pub result: Option<Outcome>,
}

/// The one job slot (a shared handle: clones are the same slot).
#[derive(Debug, Default, Clone)]
pub struct Slot(Arc<Mutex<Option<JobView>>>);

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Option<JobView>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the slot for a new job of `kind`, unless one is running; the
    /// new job's id.
    pub fn begin(&self, kind: &str) -> Option<u64> {
        let mut slot = self.lock();
        if slot.as_ref().is_some_and(|j| j.result.is_none()) {
            return None;
        }
        let id = slot.as_ref().map_or(1, |j| j.id + 1);
        *slot = Some(JobView {
            pid: std::process::id(),
            id,
            kind: kind.to_string(),
            ..JobView::default()
        });
        Some(id)
    }

    /// Adds a finished step to the running job (its wait, if any, is over).
    pub fn push(&self, step: StepRecord) {
        crate::metrics::global().deploy_step(&step.step, step.ok, step.ms);
        if let Some(j) = self.lock().as_mut() {
            j.waiting = None;
            j.steps.push(step);
        }
    }

    /// Says what the running step is waiting for now.
    pub fn wait(&self, step: &str, note: String) {
        if let Some(j) = self.lock().as_mut() {
            j.waiting = Some(Waiting {
                step: step.to_string(),
                note,
            });
        }
    }

    /// Records the job's result: it is finished.
    pub fn finish(&self, outcome: Outcome) {
        crate::metrics::global().deploy_finished(&outcome.kind, outcome.ok, outcome.restored);
        if let Some(j) = self.lock().as_mut() {
            j.waiting = None;
            j.result = Some(outcome);
        }
    }

    /// True while a job runs.
    pub fn busy(&self) -> bool {
        self.lock().as_ref().is_some_and(|j| j.result.is_none())
    }

    /// The latest job, if any.
    pub fn view(&self) -> Option<JobView> {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str) -> StepRecord {
        StepRecord {
            step: name.into(),
            ok: true,
            ms: 1,
            detail: String::new(),
        }
    }

    #[test]
    fn one_job_at_a_time_and_a_finished_step_ends_its_wait() {
        let slot = Slot::default();
        assert_eq!(slot.begin("deploy"), Some(1));
        assert_eq!(
            slot.clone().begin("rollback"),
            None,
            "clones share the slot"
        );
        slot.wait("drain", "draining: 1 call up, 21 s left".into());
        assert_eq!(slot.view().unwrap().waiting.unwrap().step, "drain");
        slot.push(step("drain"));
        let view = slot.view().unwrap();
        assert_eq!((view.steps.len(), view.waiting), (1, None));
        assert!(slot.busy());
    }
}

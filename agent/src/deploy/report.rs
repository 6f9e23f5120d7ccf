//! What the `deploy` and `rollback` commands print, as an operator reads
//! it: one aligned line per step as it ends (name, `ok` or `FAILED`,
//! duration, detail), a progress line every [`PROGRESS_EVERY`] while a
//! step waits (`draining: 1 call up, 21 s left`), and a final line that
//! says what actually happened (live and verified; nothing switched; the
//! previous release restored and verified; or the restore failed too).
//!
//! Only words and layout live here; the client ([`super::client`]) feeds it
//! the job as the agent shows it.

use std::time::Duration;

use super::slot::JobView;
use super::{Outcome, StepRecord};

/// How often a wait in progress is reported again.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A duration as an operator reads it: `840 ms`, `4.1 s`, `2 m 05 s`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{}.{} s", ms / 1000, ms % 1000 / 100),
        _ => format!("{} m {:02} s", ms / 60_000, ms % 60_000 / 1000),
    }
}

/// One step's line: name, verdict and duration in aligned columns, then
/// the detail.
pub fn step_line(s: &StepRecord) -> String {
    let verdict = if s.ok { "ok" } else { "FAILED" };
    format!(
        "{:<18} {:<6} {:>9}  {}",
        s.step,
        verdict,
        duration(s.ms),
        s.detail
    )
}

/// A progress line for `step`, in the same columns as [`step_line`].
pub fn progress_line(step: &str, note: &str) -> String {
    format!("{:<18} {:<6} {:>9}  {}", step, "...", "", note)
}

/// The drain's progress: how many calls the app still holds and the time
/// left before the deadline.
pub fn drain_note(active_calls: Option<u32>, left: Duration) -> String {
    // Rounded up: "0 s left" would read as over while it is not.
    let left = left.as_millis().div_ceil(1000);
    match active_calls {
        Some(1) => format!("draining: 1 call up, {left} s left"),
        Some(n) => format!("draining: {n} calls up, {left} s left"),
        None => format!("draining: the app does not say how many calls are up, {left} s left"),
    }
}

/// A wait for the edge's L5 probe rate limit.
pub fn probe_limit_note(wait: Duration) -> String {
    format!("waiting {} s for the probe limit", wait.as_secs().max(1))
}

fn sha_or(text: Option<&str>, none: &'static str) -> String {
    text.map_or(none.to_string(), str::to_string)
}

/// The last line: what actually happened, from the job's outcome.
pub fn final_line(out: &Outcome) -> String {
    let live = sha_or(out.live.as_deref(), "no release");
    let total: u64 = out.steps.iter().map(|s| s.ms).sum();
    if out.ok {
        return format!(
            "{} done: {live} is live and verified (mode {}), {} in all",
            out.kind,
            out.mode,
            duration(total)
        );
    }
    let failed = format!(
        "{} failed at {}: {}",
        out.kind,
        out.step.as_deref().unwrap_or("?"),
        out.reason.as_deref().unwrap_or("?")
    );
    if out.restored {
        return format!(
            "{failed}. The previous release {live} is restored and verified (mode {}).",
            out.mode
        );
    }
    if !out.switched {
        return match &out.live {
            Some(live) => format!(
                "{failed}. Nothing was switched: {live} is still live, not restarted (mode {}).",
                out.mode
            ),
            None => format!(
                "{failed}. Nothing was switched (no release was live; mode {}).",
                out.mode
            ),
        };
    }
    let restore = out
        .steps
        .iter()
        .rev()
        .find(|s| !s.ok && s.step.starts_with("restore_"));
    match restore {
        Some(r) => format!(
            "{failed}. The restore failed too, at {}: {}. Live: {live}, mode {}: the node takes no new call until an operator acts.",
            r.step, r.detail, out.mode
        ),
        None => format!(
            "{failed}. The previous release is not verified. Live: {live}, mode {}.",
            out.mode
        ),
    }
}

/// The client's memory of what it has printed of one job.
#[derive(Debug, Default)]
pub struct Printer {
    printed: usize,
    last_progress: Option<(String, Duration)>,
}

impl Printer {
    /// The lines to print for `view`, seen `elapsed` after the job started:
    /// every step not printed yet, then the wait in progress when it is new
    /// or was last printed [`PROGRESS_EVERY`] ago.
    pub fn lines(&mut self, view: &JobView, elapsed: Duration) -> Vec<String> {
        let mut out: Vec<String> = view
            .steps
            .iter()
            .skip(self.printed)
            .map(step_line)
            .collect();
        self.printed = view.steps.len().max(self.printed);
        match &view.waiting {
            None => self.last_progress = None,
            Some(w) => {
                let due = match &self.last_progress {
                    Some((step, at)) => step != &w.step || elapsed >= *at + PROGRESS_EVERY,
                    None => true,
                };
                if due {
                    out.push(progress_line(&w.step, &w.note));
                    self.last_progress = Some((w.step.clone(), elapsed));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deploy::slot::Waiting;

    fn step(name: &str, ok: bool, ms: u64, detail: &str) -> StepRecord {
        StepRecord {
            step: name.into(),
            ok,
            ms,
            detail: detail.into(),
        }
    }

    fn outcome(steps: Vec<StepRecord>) -> Outcome {
        Outcome {
            ok: false,
            kind: "deploy".into(),
            from: Some("a".repeat(40)),
            to: Some("b".repeat(40)),
            live: Some("a".repeat(40)),
            step: Some("drain".into()),
            reason: Some("1 call(s) still up after 5 s (use --shed to hang them up)".into()),
            restored: false,
            switched: false,
            mode: "active".into(),
            steps,
        }
    }

    #[test]
    fn durations_read_as_an_operator_says_them() {
        assert_eq!(duration(840), "840 ms");
        assert_eq!(duration(4_065), "4.0 s");
        assert_eq!(duration(9_450), "9.4 s");
        assert_eq!(duration(125_000), "2 m 05 s");
    }

    #[test]
    fn step_lines_are_aligned_whatever_the_name_and_duration() {
        let a = step_line(&step("validate", true, 12, "detail a"));
        let b = step_line(&step("restore_connector", false, 9_450, "detail b"));
        assert_eq!(a.find("detail"), b.find("detail"), "{a}\n{b}");
        assert!(b.contains("FAILED") && b.contains("9.4 s"), "{b}");
        let p = progress_line("drain", "draining: 1 call up, 21 s left");
        assert_eq!(p.find("draining"), a.find("detail"), "{p}\n{a}");
    }

    #[test]
    fn waits_say_what_they_wait_for() {
        assert_eq!(
            drain_note(Some(1), Duration::from_millis(20_400)),
            "draining: 1 call up, 21 s left"
        );
        assert_eq!(
            drain_note(Some(3), Duration::from_secs(5)),
            "draining: 3 calls up, 5 s left"
        );
        assert_eq!(
            drain_note(None, Duration::from_millis(200)),
            "draining: the app does not say how many calls are up, 1 s left"
        );
        assert_eq!(
            probe_limit_note(Duration::from_secs(4)),
            "waiting 4 s for the probe limit"
        );
    }

    #[test]
    fn a_drain_that_timed_out_before_the_switch_says_nothing_was_switched() {
        let line = final_line(&outcome(vec![step("drain", false, 5_000, "x")]));
        assert!(
            line.starts_with("deploy failed at drain: 1 call(s) still up"),
            "{line}"
        );
        assert!(line.contains("Nothing was switched"), "{line}");
        assert!(!line.contains("restored"), "{line}");
    }

    #[test]
    fn a_failure_after_the_switch_says_restored_or_that_the_restore_failed() {
        let mut restored = outcome(Vec::new());
        (restored.step, restored.switched, restored.restored) = (Some("l5".into()), true, true);
        let line = final_line(&restored);
        assert!(
            line.contains(&format!(
                "The previous release {} is restored and verified",
                "a".repeat(40)
            )),
            "{line}"
        );

        let mut broken = outcome(vec![
            step("health", false, 1_000, "not healthy"),
            step("restore_health", false, 1_000, "still not healthy"),
            step("restore_mode", true, 1, "mode drained"),
        ]);
        (broken.step, broken.switched, broken.mode) =
            (Some("health".into()), true, "drained".into());
        let line = final_line(&broken);
        assert!(
            line.contains("The restore failed too, at restore_health: still not healthy"),
            "{line}"
        );
        assert!(line.contains("mode drained"), "{line}");
    }

    #[test]
    fn success_names_the_live_release_and_the_total_time() {
        let mut ok = outcome(vec![
            step("validate", true, 500, ""),
            step("l5", true, 4_100, ""),
        ]);
        (ok.ok, ok.live) = (true, Some("b".repeat(40)));
        assert_eq!(
            final_line(&ok),
            format!(
                "deploy done: {} is live and verified (mode active), 4.6 s in all",
                "b".repeat(40)
            )
        );
    }

    #[test]
    fn the_printer_prints_each_step_once_and_a_wait_every_few_seconds() {
        let mut p = Printer::default();
        let mut view = JobView {
            steps: vec![step("validate", true, 1, "")],
            ..JobView::default()
        };
        assert_eq!(p.lines(&view, Duration::ZERO).len(), 1);
        assert!(
            p.lines(&view, Duration::from_secs(1)).is_empty(),
            "nothing new"
        );
        view.steps.push(step("journal", true, 1, ""));
        view.waiting = Some(Waiting {
            step: "drain".into(),
            note: "draining: 1 call up, 21 s left".into(),
        });
        let lines = p.lines(&view, Duration::from_secs(2));
        assert_eq!(lines.len(), 2, "the new step and the wait: {lines:?}");
        assert!(
            p.lines(&view, Duration::from_secs(4)).is_empty(),
            "not yet again"
        );
        let again = p.lines(&view, Duration::from_secs(2) + PROGRESS_EVERY);
        assert_eq!(again.len(), 1, "{again:?}");
        view.waiting = None;
        view.steps.push(step("drain", true, 9_000, "no call left"));
        assert_eq!(
            p.lines(&view, Duration::from_secs(9)),
            [step_line(&view.steps[2])]
        );
    }
}

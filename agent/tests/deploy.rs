//! `deploy` as an operator sees it (SPEC §14), against the real agent
//! process and the real `deploy` command: each step's line is printed as
//! the step ends (not when the job ends), a wait prints progress, and the
//! final line says what happened.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::deploy::deployable;
use common::*;

/// Runs `deploy args...` (text output) and returns each stdout line with
/// the time it arrived after the start, the time the command exited, and
/// whether it succeeded.
fn deploy_lines(node: &Node, args: &[&str]) -> (Vec<(Duration, String)>, Duration, bool) {
    let began = Instant::now();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&node.config)
        .arg("deploy")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| (began.elapsed(), l.unwrap()))
        .collect();
    let status = child.wait().unwrap();
    (lines, began.elapsed(), status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_stream_as_steps_end_and_a_drain_timeout_before_the_switch_says_nothing_was_switched()
{
    let d = deployable("build_can_read_keys = true").await;
    d.node.set_mode("active");
    // A call stays up for the whole drain.
    d.seen.active_calls.store(1, Ordering::SeqCst);
    let deadline_s = 6;
    let sha = d.main_sha.clone();
    let node = &d.node;
    let (lines, ended, ok) = deploy_lines(node, &["--sha", &sha, "--deadline", "6s"]);
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    let all = text.join("\n");
    assert!(!ok, "{all}");

    // Streamed: the steps before the drain were on stdout while the drain
    // still had most of its deadline to go, long before the command ended.
    let at = |prefix: &str| {
        lines
            .iter()
            .find(|(_, l)| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in\n{all}\n{}", node.log()))
            .0
    };
    for step in [
        "validate ",
        "build_user ",
        "allowed_shas ",
        "fetch ",
        "branch ",
        "checkout ",
        "build ",
        "journal ",
    ] {
        assert!(
            at(step) + Duration::from_secs(deadline_s - 2) < ended,
            "{step}arrived at {:?}, the command ended at {ended:?}:\n{all}",
            at(step)
        );
    }

    // The wait printed progress, every few seconds, with the calls up.
    let progress: Vec<_> = lines
        .iter()
        .filter(|(_, l)| l.starts_with("drain ") && l.contains("draining: 1 call up,"))
        .collect();
    assert!(progress.len() >= 2, "progress lines:\n{all}");
    assert!(
        progress[1].0 >= progress[0].0 + Duration::from_secs(4),
        "{all}"
    );
    assert!(progress[0].1.contains(" s left"), "{all}");

    // The drain failed, nothing was switched, and the last line says so.
    let drain = text
        .iter()
        .find(|l| l.starts_with("drain ") && l.contains("FAILED"))
        .unwrap_or_else(|| panic!("no failed drain line:\n{all}"));
    assert!(drain.contains("1 call(s) still up after 6 s"), "{drain}");
    assert!(!text.iter().any(|l| l.starts_with("switch ")), "{all}");
    let last = text.last().unwrap();
    assert!(
        last.starts_with("deploy failed at drain: 1 call(s) still up"),
        "{last}"
    );
    assert!(last.contains("Nothing was switched"), "{last}");
    assert!(!last.contains("restored"), "{last}");
    assert!(
        std::fs::symlink_metadata(d.node.dir.join("current")).is_err(),
        "no current symlink was made"
    );

    // The machine-readable outcome agrees.
    d.seen.active_calls.store(1, Ordering::SeqCst);
    let out = node.cmd(&["deploy", "--sha", &sha, "--deadline", "1s", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let outcome: serde_json::Value =
        serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    assert_eq!(outcome["step"], "drain", "{outcome}");
    assert_eq!(outcome["restored"], false, "{outcome}");
    assert_eq!(outcome["switched"], false, "{outcome}");
    assert_eq!(node.cmd(&["mode", "get"]).stdout, b"active\n");
}

//! `callfence-agent`: the node agent binary. See the library crate
//! (`callfence_agent`) for the design; this file only parses the command
//! line and hands over.
//!
//! # Layout
//!
//! - `keygen --out PATH`: a new node key (0600); prints its id and public key.
//! - `run`: heartbeats, origin proxy, local API ([`callfence_agent::run`]).
//! - `heartbeat --once`: one beat; prints the edge's verdict.
//! - `mode get` / `mode set active|shadow|drained` ([`callfence_agent::mode`]).
//! - `drain [--deadline 30m] [--shed]` ([`callfence_agent::drain`]).
//! - `status`: the node's own view ([`callfence_agent::status`]).
//! - `deploy --sha`, `rollback`, `job`, `releases` ([`callfence_agent::deploy`]),
//!   the first three through the running agent's control socket
//!   ([`callfence_agent::control`]).

use std::path::PathBuf;
use std::process::ExitCode;

use callfence_agent::config::{self, DEFAULT_PATH};
use callfence_agent::mode::{self, NodeMode};
use callfence_agent::{deploy, drain, heartbeat, keys, status, AgentError};
use clap::{Parser, Subcommand, ValueEnum};

/// callfence node agent: signed heartbeats, the verifying origin proxy in
/// front of the voice app, the answer-fence client, and the node's
/// persisted fail-closed mode.
#[derive(Debug, Parser)]
#[command(name = "callfence-agent", version, about, long_about = None)]
struct Cli {
    /// The agent's TOML configuration (see agent.example.toml).
    #[arg(long, global = true, default_value = DEFAULT_PATH, value_name = "PATH")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a new node private key (mode 0600) and print the key id and
    /// public key to add to the node registry.
    Keygen {
        /// Where to write the key; an existing file is never overwritten.
        #[arg(long, value_name = "PATH")]
        out: PathBuf,
    },
    /// Run the agent: heartbeats every 5 s, the origin proxy and the local API.
    Run,
    /// Send heartbeats by hand.
    Heartbeat {
        /// Send exactly one beat and print the edge's answer (eligible, reasons).
        #[arg(long, required = true)]
        once: bool,
        /// Print the full record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read or change the node's persisted mode.
    Mode {
        #[command(subcommand)]
        action: ModeAction,
    },
    /// Stop taking new calls, wait for active calls to end, report what remains.
    Drain {
        /// How long to wait for active calls to reach 0 (e.g. 30m, 90s, 2h).
        #[arg(long, default_value = "30m")]
        deadline: String,
        /// At the deadline, hang up the calls that remain (Telnyx hangup with command_ids).
        #[arg(long)]
        shed: bool,
    },
    /// Show the node's own view: mode, SHA, clean, capacity, last beat, verdict, clock skew.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Deploy one full commit of the voice app: fetch, clean checkout, build,
    /// drain, switch, restart, verify (health, connector, L5); restores the
    /// previous release by itself on any failure. Runs inside the agent.
    Deploy {
        /// The commit: 40 lowercase hex digits.
        #[arg(long)]
        sha: String,
        #[command(flatten)]
        switch: SwitchArgs,
    },
    /// Go back to the previous verified release, with the same drain and checks.
    Rollback {
        #[command(flatten)]
        switch: SwitchArgs,
    },
    /// Print the running agent's latest deploy, rollback or recovery
    /// (steps and result) as JSON, asked over its control socket.
    Job,
    /// List the kept releases: SHA, when deployed, result, which is current.
    Releases {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// What `deploy` and `rollback` share.
#[derive(Debug, clap::Args)]
struct SwitchArgs {
    /// Drain deadline (default: deploy.drain_deadline).
    #[arg(long)]
    deadline: Option<String>,
    /// Hang up calls still up at the drain deadline.
    #[arg(long)]
    shed: bool,
    /// Print one JSON result instead of the steps.
    #[arg(long)]
    json: bool,
}

impl SwitchArgs {
    /// Asks the running agent over its control socket to run `op` (with
    /// `sha` for a deploy).
    fn run(
        self,
        config_path: &std::path::Path,
        op: &str,
        sha: Option<String>,
    ) -> Result<ExitCode, AgentError> {
        let state_dir = config::load_state_dir(config_path)?;
        let request =
            serde_json::json!({"op": op, "sha": sha, "deadline": self.deadline, "shed": self.shed});
        runtime()?.block_on(deploy::client::run(&state_dir, request, self.json))
    }
}

#[derive(Debug, Subcommand)]
enum ModeAction {
    /// Print the mode (a missing or invalid mode file reads as drained; the reason goes to stderr).
    Get,
    /// Persist a new mode atomically; the running agent applies it at once.
    Set {
        /// The new mode.
        mode: ModeArg,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    /// Takes new calls.
    Active,
    /// Running and observing; takes no new calls.
    Shadow,
    /// Takes no new calls; admitted calls continue.
    Drained,
}

impl From<ModeArg> for NodeMode {
    fn from(m: ModeArg) -> NodeMode {
        match m {
            ModeArg::Active => NodeMode::Active,
            ModeArg::Shadow => NodeMode::Shadow,
            ModeArg::Drained => NodeMode::Drained,
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, AgentError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| AgentError::new(format!("runtime: {e}")))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("callfence-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> Result<ExitCode, AgentError> {
    let offset = callfence_agent::clock::init_from_env()?;
    if offset != 0 {
        callfence_agent::log::warn(
            "test_clock_offset",
            serde_json::json!({"offset_ms": offset, "variable": callfence_agent::clock::TEST_OFFSET_VAR,
                               "note": "test-only: this process's clock is shifted"}),
        );
    }
    match cli.command {
        Command::Keygen { out } => {
            let g = keys::keygen(&out)?;
            println!("wrote {} (mode 0600)", out.display());
            println!("key_id: {}", g.key_id);
            println!("public_key: {}", g.public_key);
            println!(
                "registry: \"keys\": {{\"{}\": \"{}\"}}",
                g.key_id, g.public_key
            );
            println!(
                "config: [key] id = \"{}\", path = \"{}\"",
                g.key_id,
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Mode { action } => {
            let state_dir = config::load_state_dir(&cli.config)?;
            match action {
                ModeAction::Get => {
                    let r = mode::read(&state_dir);
                    println!("{}", r.mode);
                    if let Some(note) = r.fallback {
                        eprintln!("note: {note}");
                    }
                }
                ModeAction::Set { mode: m } => {
                    let m = NodeMode::from(m);
                    mode::write(&state_dir, m)?;
                    println!("{m}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run => {
            let config = config::load(&cli.config)?;
            runtime()?.block_on(callfence_agent::run::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Heartbeat { once: _, json } => {
            let config = config::load(&cli.config)?;
            let rec = runtime()?.block_on(async {
                let agent = callfence_agent::context::Agent::new(config)?;
                Ok::<_, AgentError>(
                    heartbeat::beat_once(&agent.config, &agent.http, &agent.keys, &agent.edge)
                        .await,
                )
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rec).unwrap_or_default());
            } else {
                println!(
                    "seq {} signed with {}",
                    rec.seq,
                    rec.key_id.as_deref().unwrap_or("-")
                );
                match rec.outcome.as_str() {
                    "accepted" => {
                        println!(
                            "accepted: eligible {}",
                            rec.eligible.map_or("-".into(), |e| e.to_string())
                        );
                        if !rec.reasons.is_empty() {
                            println!("reasons: {}", rec.reasons.join(", "));
                        }
                        if let Some(skew) = rec.clock_skew_ms {
                            println!("clock skew: {skew} ms");
                        }
                    }
                    other => println!(
                        "{other}: {} (http {})",
                        rec.refused.as_deref().unwrap_or("-"),
                        rec.http_status.map_or("-".into(), |s| s.to_string())
                    ),
                }
            }
            Ok(if rec.outcome == "accepted" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            })
        }
        Command::Drain { deadline, shed } => {
            let config = config::load(&cli.config)?;
            let deadline = callfence_agent::duration::parse(&deadline)?;
            let report = runtime()?.block_on(drain::drain(&config, deadline, shed, |_, _| {}))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
            let clean =
                report.drained || (shed && report.shed.iter().all(|s| s.result.starts_with('2')));
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            })
        }
        Command::Deploy { sha, switch } => switch.run(&cli.config, "deploy", Some(sha)),
        Command::Rollback { switch } => switch.run(&cli.config, "rollback", None),
        Command::Job => {
            let state_dir = config::load_state_dir(&cli.config)?;
            let view = runtime()?.block_on(deploy::client::show(&state_dir))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&view).unwrap_or_default()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Releases { json } => {
            let config = config::load(&cli.config)?;
            let d = config
                .deploy
                .as_ref()
                .ok_or_else(|| AgentError::new("no [deploy] table in the configuration"))?;
            let list = deploy::releases::listing(d, &config.state_dir);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&list).unwrap_or_default()
                );
            } else {
                for r in list["releases"].as_array().into_iter().flatten() {
                    println!(
                        "{} {}  {}  {}",
                        if r["current"] == true { "*" } else { " " },
                        r["sha"].as_str().unwrap_or_default(),
                        r["deployed_at"].as_str().unwrap_or_default(),
                        r["result"].as_str().unwrap_or_default()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { json } => {
            let config = config::load(&cli.config)?;
            let view = runtime()?.block_on(async {
                let http = callfence_agent::net::client()?;
                Ok::<_, AgentError>(
                    status::gather(&config, &http, callfence_agent::clock::now_ms()).await,
                )
            })?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&view).unwrap_or_default()
                );
            } else {
                print!("{}", status::render(&view));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

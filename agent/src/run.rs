//! The `run` command: the origin proxy, the local API, the metrics listener
//! when `listen.metrics_listen` is set ([`crate::metrics`]) and the control
//! socket (each bounded: [`crate::serve`], [`crate::local_auth`],
//! [`crate::control`]), the heartbeat loop
//! (every `timing.heartbeat_interval_ms`), re-delivery of `received` ledger
//! entries left by a previous process, and upkeep (ledger pruning and
//! re-delivery of entries whose delivery failed). Stops on SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::clock::now_ms;
use crate::config::Config;
use crate::context::Agent;
use crate::heartbeat::beat_once;
use crate::local_auth::{token_path, Gate, LocalToken};
use crate::serve::{self, LOCAL_MAX_CONNECTIONS, METRICS_MAX_CONNECTIONS};
use crate::{control, local_api, mode, proxy, AgentError};

async fn bind(addr: std::net::SocketAddr, what: &str) -> Result<TcpListener, AgentError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| AgentError::new(format!("{what} cannot listen on {addr}: {e}")))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// Runs the agent until a signal stops it.
pub async fn run(config: Config) -> Result<(), AgentError> {
    let open_files = serve::open_file_limit()?;
    serve::check_descriptor_budget(config.max_connections, open_files)?;
    let agent = Agent::new(config)?;
    let cfg = &agent.config;
    let reading = mode::read(&cfg.state_dir);
    let token = LocalToken::load_or_create(&cfg.state_dir)?;
    let own_uid = crate::identity::own().map_err(AgentError::new)?.uid;
    let origin = bind(cfg.listen_origin, "origin proxy").await?;
    let local = bind(cfg.listen_local, "local API").await?;
    let local_addr = local
        .local_addr()
        .map_err(|e| AgentError::new(format!("local API: {e}")))?;
    let metrics = match cfg.listen_metrics {
        Some(addr) => Some(bind(addr, "metrics listener").await?),
        None => None,
    };
    let control_socket = control::bind(&cfg.state_dir)?;
    crate::log::info(
        "agent_started",
        json!({"node": cfg.node, "version": crate::AGENT_VERSION, "mode": reading.mode.as_str(),
               "mode_note": reading.fallback, "origin": origin.local_addr().ok().map(|a| a.to_string()),
               "local": local_addr.to_string(), "metrics": metrics.as_ref().and_then(|m| m.local_addr().ok()).map(|a| a.to_string()),
               "signing_key_id": agent.keys.current().kid,
               "edge": cfg.edge_url.as_str(), "max_connections": cfg.max_connections, "open_files": open_files,
               "local_api_token": token_path(&cfg.state_dir).display().to_string(),
               "control_socket": control::socket_path(&cfg.state_dir).display().to_string()}),
    );
    if let Some(note) = &reading.fallback {
        crate::log::warn("mode_fallback", json!({"mode": "drained", "why": note}));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let read_timeout = Duration::from_millis(cfg.timing.request_read_timeout_ms);
    let origin_srv = tokio::spawn(serve::serve(
        origin,
        proxy::router(agent.clone()),
        cfg.max_connections,
        read_timeout,
        stop_rx.clone(),
        "origin",
    ));
    let local_srv = tokio::spawn(serve::serve(
        local,
        local_api::router(agent.clone(), Gate::new(local_addr, token)),
        LOCAL_MAX_CONNECTIONS,
        read_timeout,
        stop_rx.clone(),
        "local",
    ));
    let metrics_srv = metrics.map(|listener| {
        tokio::spawn(serve::serve(
            listener,
            crate::scrape::router(agent.clone()),
            METRICS_MAX_CONNECTIONS,
            read_timeout,
            stop_rx.clone(),
            "metrics",
        ))
    });
    let control_srv = tokio::spawn(control::serve(
        control_socket,
        agent.clone(),
        own_uid,
        stop_rx.clone(),
    ));
    let notifier = crate::notify::Notifier::from_env().map(Arc::new);
    let watchdog = match (&notifier, crate::notify::watchdog_interval()) {
        (Some(n), Some(every)) => Some(tokio::spawn(crate::notify::watchdog(n.clone(), every))),
        _ => None,
    };
    // An unfinished deploy is restored first; the node stays drained until then.
    crate::deploy::job::recover_at_start(&agent);
    if let Some(n) = &notifier {
        n.send("READY=1\nSTATUS=serving");
    }
    let resumed = proxy::resume(&agent, true).await;
    if resumed > 0 {
        crate::log::info("ledger_resumed", json!({"events": resumed}));
    }
    let beats = tokio::spawn(heartbeat_loop(agent.clone(), stop_rx.clone()));
    let upkeep = tokio::spawn(upkeep_loop(agent.clone(), stop_rx.clone()));
    shutdown_signal().await;
    crate::log::info("agent_stopping", json!({}));
    if let Some(n) = &notifier {
        n.send("STOPPING=1");
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = origin_srv.await;
        let _ = local_srv.await;
        if let Some(m) = metrics_srv {
            let _ = m.await;
        }
    })
    .await;
    control_srv.abort();
    let _ = std::fs::remove_file(control::socket_path(&cfg.state_dir));
    beats.abort();
    upkeep.abort();
    if let Some(w) = watchdog {
        w.abort();
    }
    Ok(())
}

async fn heartbeat_loop(agent: Arc<Agent>, stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(
        agent.config.timing.heartbeat_interval_ms,
    ));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut previous: Option<(String, Option<bool>, Vec<String>)> = None;
    while !*stop.borrow() {
        tick.tick().await;
        let rec = beat_once(&agent.config, &agent.http, &agent.keys, &agent.edge).await;
        crate::metrics::global().beat(&rec);
        let verdict = (rec.outcome.clone(), rec.eligible, rec.reasons.clone());
        if rec.outcome == "accepted" && previous.as_ref() != Some(&verdict) {
            crate::log::info(
                "beat_verdict",
                json!({"seq": rec.seq, "eligible": rec.eligible, "reasons": rec.reasons, "clock_skew_ms": rec.clock_skew_ms}),
            );
        }
        previous = Some(verdict);
        agent.set_last_beat(rec);
    }
}

async fn upkeep_loop(agent: Arc<Agent>, stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(
        agent.config.timing.upkeep_interval_ms,
    ));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    while !*stop.borrow() {
        tick.tick().await;
        let ledger = agent.ledger.clone();
        let retention =
            i64::try_from(agent.config.timing.ledger_retention_s).unwrap_or(i64::MAX / 2000) * 1000;
        match tokio::task::spawn_blocking(move || ledger.prune(now_ms(), retention)).await {
            Ok(Ok(n)) if n > 0 => crate::log::info("ledger_pruned", json!({"events": n})),
            Ok(Err(e)) => crate::log::error("ledger_failed", json!({"error": e.0})),
            _ => {}
        }
        proxy::resume(&agent, false).await;
    }
}

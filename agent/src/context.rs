//! The handles the running agent shares between its tasks (the origin
//! proxy, the local API, the heartbeat loop and upkeep): configuration, the
//! HTTP client, keys, the edge and Telnyx clients, the ledger, the last
//! beat, and the deliveries in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::edge::EdgeClient;
use crate::forward::Delivery;
use crate::heartbeat::BeatRecord;
use crate::keys::KeyRing;
use crate::ledger::Ledger;
use crate::telnyx_api::TelnyxApi;
use crate::AgentError;

/// Everything a running agent's tasks share.
#[derive(Debug)]
pub struct Agent {
    /// The validated configuration.
    pub config: Config,
    /// The process's HTTP client.
    pub http: reqwest::Client,
    /// Node keys and rotation state.
    pub keys: KeyRing,
    /// Signed requests to the edge.
    pub edge: EdgeClient,
    /// The durable webhook ledger.
    pub ledger: Arc<Ledger>,
    /// The Telnyx API, when configured.
    pub telnyx: Option<TelnyxApi>,
    /// The last beat's record.
    pub last_beat: Mutex<Option<BeatRecord>>,
    /// Deliveries to the app in flight, by event id: duplicates wait on these.
    pub inflight: Mutex<HashMap<String, watch::Receiver<Option<Delivery>>>>,
    /// The deploy job slot (one deploy, rollback or recovery at a time).
    pub deploy: crate::deploy::slot::Slot,
}

impl Agent {
    /// Loads keys, opens the ledger and builds the clients.
    pub fn new(config: Config) -> Result<Arc<Agent>, AgentError> {
        crate::files::ensure_state_dir(&config.state_dir)?;
        let http = crate::net::client()?;
        let keys = KeyRing::load(&config)?;
        let edge = EdgeClient::new(
            http.clone(),
            config.edge_url.clone(),
            config.node.clone(),
            Duration::from_millis(config.timing.edge_timeout_ms),
        );
        let ledger = Arc::new(Ledger::open(&config.state_dir)?);
        let telnyx = config
            .telnyx_api
            .as_ref()
            .map(|t| {
                TelnyxApi::from_config(
                    http.clone(),
                    t,
                    Duration::from_millis(config.timing.telnyx_resend_ms),
                    Duration::from_millis(config.timing.telnyx_timeout_ms),
                )
            })
            .transpose()?;
        let last_beat = Mutex::new(crate::heartbeat::load(&config.state_dir));
        Ok(Arc::new(Agent {
            config,
            http,
            keys,
            edge,
            ledger,
            telnyx,
            last_beat,
            inflight: Mutex::new(HashMap::new()),
            deploy: crate::deploy::slot::Slot::default(),
        }))
    }

    /// The last beat's record.
    pub fn last_beat(&self) -> Option<BeatRecord> {
        self.last_beat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the last beat's record.
    pub fn set_last_beat(&self, record: BeatRecord) {
        *self.last_beat.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
    }
}

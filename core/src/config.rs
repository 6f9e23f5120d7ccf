//! The Dispatcher's configuration: the origin forward budget, the accepted
//! connections, the row caps and the timing of background work, shared by
//! the directory and every call shard.

/// Timing of the Dispatcher's background work. The defaults are the
/// contract's; tests may shorten them (documented as test-only in docs/operations.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// How long a parked event is re-evaluated before it is rejected (10 s).
    pub pending_window_ms: i64,
    /// How often a parked event is re-evaluated (1 s).
    pub pending_retry_ms: i64,
    /// Extra lease beyond the forward budget (500 ms).
    pub lease_grace_ms: i64,
    /// Delays of the alarm's re-drives of an unknown event after its lease
    /// (0, then 1, 2, 4, 8 s).
    pub redrive_backoff_ms: Vec<i64>,
    /// A session whose owner's beat has been stale this long is `node_lost` (120 s).
    pub node_lost_after_ms: i64,
    /// A session older than this is settled as `max_duration` (4 h).
    pub max_duration_ms: i64,
    /// Rows untouched this long are pruned (24 h).
    pub retention_ms: i64,
    /// How often the alarm sweeps while calls are open (30 s).
    pub sweep_interval_ms: i64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            pending_window_ms: 10_000,
            pending_retry_ms: 1_000,
            lease_grace_ms: 500,
            redrive_backoff_ms: vec![0, 1_000, 2_000, 4_000, 8_000],
            node_lost_after_ms: 120_000,
            max_duration_ms: 4 * 3_600_000,
            retention_ms: 24 * 3_600_000,
            sweep_interval_ms: 30_000,
        }
    }
}

impl Timing {
    /// How long a session's records may be kept after it was created: the
    /// longest call, then the retention. A map that was in force this long
    /// ago may still have a session held where it placed it (SPEC §16).
    pub fn holding_horizon_ms(&self) -> i64 {
        self.max_duration_ms + self.retention_ms
    }
}

/// The Dispatcher's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The origin forward budget (`FORWARD_TIMEOUT_MS`, default 1500).
    pub forward_timeout_ms: i64,
    /// `TELNYX_CONNECTION_IDS`: events of other connections are `ignored`.
    pub connection_ids: Option<Vec<String>>,
    /// `ORIGIN_ALLOW_PLAINTEXT`: accept `http://` origins in the registry.
    pub allow_plaintext: bool,
    /// Background timing.
    pub timing: Timing,
    /// `SESSION_CAP`: the sessions table's row cap (SPEC §9), at least 1.
    /// The legs' and events' caps are [`ROWS_PER_SESSION`](crate::shard::ROWS_PER_SESSION) times it.
    pub session_cap: i64,
}

/// `SESSION_CAP` when unset.
pub const DEFAULT_SESSION_CAP: i64 = 100_000;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            forward_timeout_ms: 1_500,
            connection_ids: None,
            allow_plaintext: false,
            timing: Timing::default(),
            session_cap: DEFAULT_SESSION_CAP,
        }
    }
}

//! The model's database: the real rusqlite [`SqliteStore`] behind a thin
//! [`Store`] wrapper that notes which tables each statement writes (its
//! triggers' tables included), can run a planted bug
//! ([`crate::plants`]), and lets the search return to an earlier state.
//!
//! Returning is by savepoints: the search opens one before each action and
//! rolls back to it to undo the action, so the database undoes exactly the
//! pages the action wrote and every prepared statement stays valid. The
//! engine's own atomic units are nested savepoints too
//! ([`ModelStore::atomically`]).
//!
//! A state's tables are known by one 128-bit hash per table; after an action
//! only the tables it wrote are read back and hashed again. A table's hash
//! covers every column that can change a decision, in primary-key order;
//! columns that are only bookkeeping (see [`IGNORED`]) are left out so that
//! states equal in everything that matters are explored once.

use crate::plants::{Plant, Rewrite, Stmt, Verb};
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, Row, Store, StoreError, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

/// Columns that change no decision of the engine: times kept for pruning
/// after 24 h (the model's horizon is far shorter; a session's `updated_at`
/// is hashed when a small row cap makes it the eviction order) and views, copies of the
/// raw body and headers, stored answers, writer fingerprints.
pub const IGNORED: &[(&str, &str)] = &[
    ("documents", "written_at"),
    ("documents", "writer_fp"),
    ("heartbeats", "body_sha256"),
    ("heartbeats", "answer"),
    ("sessions", "updated_at"),
    ("sessions", "settled_at"),
    ("legs", "updated_at"),
    ("events", "body"),
    ("events", "headers"),
    ("events", "received_at"),
    ("events", "updated_at"),
    ("events", "result_body"),
];

/// Counters that change no decision (decision ids, the last webhook's time).
pub const IGNORED_COUNTERS: &[&str] = &["decision", "last_webhook_at"];

/// The decisions table is not part of a state: the model reads each action's
/// new decisions for the checker and then empties it.
pub const DECISIONS: &str = "decisions";

struct Table {
    name: String,
    /// Reads the hashed columns in primary-key order.
    select: String,
    /// The tables written by this table's triggers, as dirty bits.
    triggers: u64,
}

/// Per table, the hash of its decision-relevant content.
pub type TableHashes = Rc<[u128]>;

/// The database and its bookkeeping.
pub struct Db {
    sqlite: SqliteStore,
    tables: Vec<Table>,
    dirty: Cell<u64>,
    decisions: Cell<bool>,
    parsed: RefCell<HashMap<String, Rc<Stmt>>>,
    /// The armed plants, each with how many statements it rewrote.
    plants: Vec<(&'static Plant, Cell<u64>)>,
}

/// The [`Store`] the engine is given: a handle on the shared [`Db`].
#[derive(Clone)]
pub struct ModelStore(pub Rc<Db>);

const ALL: u64 = u64::MAX;

/// The database's page size (SQLite's default is 4096).
const PAGE_SIZE: u32 = 1024;

fn texts(rows: Vec<Row>, column: usize) -> Vec<String> {
    rows.into_iter()
        .filter_map(|r| r.into_iter().nth(column).and_then(Value::into_text))
        .collect()
}

impl Db {
    /// A fresh in-memory database, migrated, with `plant` armed. With
    /// `ages`, the sessions' `updated_at` is hashed too: the row cap's
    /// eviction takes the oldest settled session first.
    pub fn new(plant: Option<&'static Plant>, now_ms: i64, ages: bool) -> Rc<Self> {
        let sqlite = SqliteStore::in_memory().expect("sqlite");
        // Small pages: a rollback copies back fewer bytes per page touched.
        sqlite
            .exec(&format!("PRAGMA page_size = {PAGE_SIZE}"), &[])
            .expect("page size");
        migrate(&sqlite, now_ms).expect("migrate");
        let names = texts(
            sqlite
                .exec(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
                     AND name NOT IN ('schema_migrations', ?) ORDER BY name",
                    &[DECISIONS.into()],
                )
                .expect("tables"),
            0,
        );
        assert!(names.len() <= 64, "one dirty bit per table");
        let triggers = sqlite
            .exec(
                "SELECT tbl_name, sql FROM sqlite_master WHERE type = 'trigger'",
                &[],
            )
            .expect("triggers");
        let tables = names
            .iter()
            .map(|name| {
                let info = sqlite
                    .exec(&format!("PRAGMA table_info({name})"), &[])
                    .expect("columns");
                let column = |r: &Row| r.get(1).and_then(Value::as_text).unwrap_or("").to_owned();
                let hashed: Vec<String> = info
                    .iter()
                    .map(column)
                    .filter(|c| {
                        let aged =
                            ages && (name.as_str(), c.as_str()) == ("sessions", "updated_at");
                        aged || !IGNORED.contains(&(name.as_str(), c.as_str()))
                    })
                    .collect();
                let mut keys: Vec<(i64, String)> = info
                    .iter()
                    .filter_map(|r| Some((r.get(5)?.as_int().filter(|k| *k > 0)?, column(r))))
                    .collect();
                keys.sort();
                assert!(!keys.is_empty(), "{name} has a primary key");
                let keys: Vec<String> = keys.into_iter().map(|(_, c)| c).collect();
                let only = if name == "counters" {
                    let skip: Vec<String> =
                        IGNORED_COUNTERS.iter().map(|c| format!("'{c}'")).collect();
                    format!(" WHERE name NOT IN ({})", skip.join(", "))
                } else {
                    String::new()
                };
                // The tables a trigger on this one writes.
                let mut bits = 0;
                for trigger in triggers
                    .iter()
                    .filter(|t| t.first().and_then(Value::as_text) == Some(name))
                {
                    let sql = trigger.get(1).and_then(Value::as_text).unwrap_or("");
                    let body = &sql[sql
                        .to_ascii_uppercase()
                        .find("BEGIN")
                        .expect("trigger body")..];
                    let written: u64 = names
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| body.contains(&format!(" {t} ")))
                        .map(|(i, _)| 1 << i)
                        .sum();
                    assert!(written != 0, "a trigger on {name} writes a known table");
                    bits |= written;
                }
                Table {
                    select: format!(
                        "SELECT {} FROM {name}{only} ORDER BY {}",
                        hashed.join(", "),
                        keys.join(", ")
                    ),
                    triggers: bits,
                    name: name.clone(),
                }
            })
            .collect();
        Rc::new(Self {
            sqlite,
            tables,
            dirty: Cell::new(0),
            decisions: Cell::new(false),
            parsed: RefCell::new(HashMap::new()),
            plants: plant
                .map(|p| p.armed().into_iter().map(|p| (p, Cell::new(0))).collect())
                .unwrap_or_default(),
        })
    }

    /// The statement parsed in full (cached): only a plant needs that.
    fn stmt(&self, sql: &str) -> Rc<Stmt> {
        if let Some(s) = self.parsed.borrow().get(sql) {
            return s.clone();
        }
        let s = Rc::new(Stmt::parse(sql));
        self.parsed.borrow_mut().insert(sql.to_owned(), s.clone());
        s
    }

    fn mark(&self, verb: Verb, table: &str) {
        let bits = match verb {
            Verb::Select => 0,
            Verb::Other => {
                self.decisions.set(true);
                ALL
            }
            Verb::Insert | Verb::Update | Verb::Delete => {
                match self.tables.iter().position(|t| t.name == table) {
                    Some(i) => (1 << i) | self.tables[i].triggers,
                    None if table == DECISIONS => {
                        self.decisions.set(true);
                        0
                    }
                    None => ALL,
                }
            }
        };
        self.dirty.set(self.dirty.get() | bits);
    }

    /// The tables written since the last call, as one bit per table.
    pub fn take_dirty(&self) -> u64 {
        self.dirty.replace(0)
    }

    /// True when a table of `dirty` is named `name`.
    pub fn wrote(&self, dirty: u64, name: &str) -> bool {
        self.tables
            .iter()
            .position(|t| t.name == name)
            .is_some_and(|i| dirty & (1 << i) != 0)
    }

    /// The table hashes after writes to the `dirty` tables, given the hashes
    /// before them (`None`: every table is read).
    pub fn hash_tables(&self, before: Option<&TableHashes>, dirty: u64) -> TableHashes {
        self.tables
            .iter()
            .enumerate()
            .map(|(i, table)| match before {
                Some(b) if dirty & (1 << i) == 0 => b[i],
                _ => {
                    let mut h = Wide::new();
                    table.name.hash(&mut h);
                    for row in self.sqlite.exec(&table.select, &[]).expect("read table") {
                        for value in &row {
                            hash_value(value, &mut h);
                        }
                        0xffu8.hash(&mut h);
                    }
                    h.finish128()
                }
            })
            .collect()
    }

    /// Opens a savepoint: [`Db::rollback`] returns to what is stored now.
    pub fn savepoint(&self) {
        self.sqlite
            .exec("SAVEPOINT model_step", &[])
            .expect("savepoint");
    }

    /// Undoes everything since the newest open [`Db::savepoint`] and closes it.
    pub fn rollback(&self) {
        self.sqlite
            .exec("ROLLBACK TO model_step", &[])
            .expect("rollback");
        self.sqlite
            .exec("RELEASE model_step", &[])
            .expect("release");
        self.dirty.set(0);
        self.decisions.set(false);
    }

    /// True (once) when the engine wrote decisions since the last call.
    pub fn take_decisions(&self) -> bool {
        self.decisions.replace(false)
    }

    /// Empties the decisions table (its rows were read for the checker).
    pub fn clear_decisions(&self) {
        self.sqlite
            .exec(&format!("DELETE FROM {DECISIONS}"), &[])
            .expect("clear decisions");
    }

    /// How many statements the least used armed plant rewrote (0 when a
    /// plant never matched; `u64::MAX` with none armed).
    pub fn fired(&self) -> u64 {
        self.plants
            .iter()
            .map(|(_, n)| n.get())
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The underlying store, for reads that bypass the plant.
    pub fn sqlite(&self) -> &SqliteStore {
        &self.sqlite
    }
}

/// A 128-bit hash from two differently seeded SipHashers.
pub struct Wide(
    std::collections::hash_map::DefaultHasher,
    std::collections::hash_map::DefaultHasher,
);

impl Wide {
    pub fn new() -> Self {
        let mut h = Wide(Default::default(), Default::default());
        h.1.write_u8(0x5a);
        h
    }

    pub fn finish128(&self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

impl Hasher for Wide {
    fn finish(&self) -> u64 {
        self.0.finish()
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }
}

fn hash_value(value: &Value, state: &mut impl Hasher) {
    match value {
        Value::Null => 0u8.hash(state),
        Value::Int(i) => {
            1u8.hash(state);
            i.hash(state);
        }
        Value::Real(f) => {
            2u8.hash(state);
            f.to_bits().hash(state);
        }
        Value::Text(t) => {
            3u8.hash(state);
            t.hash(state);
        }
    }
}

impl Store for ModelStore {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        let db = &self.0;
        let (verb, table) = Stmt::head(sql);
        db.mark(verb, &table);
        for (plant, fired) in &db.plants {
            if let Some(rewrite) = plant.apply(&db.stmt(sql), sql, params) {
                fired.set(fired.get() + 1);
                return match rewrite {
                    Rewrite::Drop => Ok(Vec::new()),
                    Rewrite::Run(sql, params) => db.sqlite.exec(&sql, &params),
                };
            }
        }
        db.sqlite.exec(sql, params)
    }

    /// A savepoint, so that a unit nests inside the search's savepoints;
    /// a failed unit is rolled back as a transaction would be.
    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let sqlite = &self.0.sqlite;
        sqlite.exec("SAVEPOINT unit", &[])?;
        match work() {
            Ok(value) => {
                sqlite.exec("RELEASE unit", &[])?;
                Ok(value)
            }
            Err(e) => {
                sqlite.exec("ROLLBACK TO unit", &[])?;
                sqlite.exec("RELEASE unit", &[])?;
                Err(e)
            }
        }
    }
}

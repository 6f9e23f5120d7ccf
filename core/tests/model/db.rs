//! The model's database: the real rusqlite [`SqliteStore`] behind a thin
//! [`Store`] wrapper that notes which tables each statement writes, can run
//! one planted bug ([`crate::plants`]), and snapshots and restores the tables
//! so that every explored state continues from exactly its own data.
//!
//! Snapshots are the tables' rows read back through SQL (tables untouched by
//! an action share their rows with the parent state); a restore rewrites only
//! the tables that differ. The state hash covers every column that can change
//! a decision; columns that are only bookkeeping (see [`IGNORED`]) are left
//! out so that states equal in everything that matters are explored once.

use crate::plants::{Plant, Rewrite, Stmt, Verb};
use callfence_core::store::sqlite::SqliteStore;
use callfence_core::store::{migrate, Row, Store, StoreError, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

/// Columns that change no decision of the engine: times kept for pruning
/// after 24 h (the model's horizon is far shorter) and views, copies of the
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
    columns: usize,
    /// Per column: part of the state hash.
    hashed: Vec<bool>,
}

/// Every table's rows, in primary-key order.
#[derive(Clone, Default)]
pub struct Tables(pub Vec<Rc<Vec<Row>>>);

/// The database and its bookkeeping.
pub struct Db {
    sqlite: SqliteStore,
    tables: Vec<Table>,
    dirty: Cell<u64>,
    parsed: RefCell<HashMap<String, Rc<Stmt>>>,
    plant: Option<&'static Plant>,
    /// How many statements the plant rewrote or dropped.
    pub fired: Cell<u64>,
}

/// The [`Store`] the engine is given: a handle on the shared [`Db`].
#[derive(Clone)]
pub struct ModelStore(pub Rc<Db>);

const ALL: u64 = u64::MAX;

impl Db {
    /// A fresh in-memory database, migrated, with `plant` armed.
    pub fn new(plant: Option<&'static Plant>, now_ms: i64) -> Rc<Self> {
        let sqlite = SqliteStore::in_memory().expect("sqlite");
        migrate(&sqlite, now_ms).expect("migrate");
        let names: Vec<String> = sqlite
            .exec(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
                 AND name NOT IN ('schema_migrations', ?) ORDER BY name",
                &[DECISIONS.into()],
            )
            .expect("tables")
            .into_iter()
            .filter_map(|r| r.into_iter().next().and_then(Value::into_text))
            .collect();
        assert!(names.len() <= 64, "one dirty bit per table");
        let tables = names
            .into_iter()
            .map(|name| {
                let columns: Vec<String> = sqlite
                    .exec(&format!("PRAGMA table_info({name})"), &[])
                    .expect("columns")
                    .into_iter()
                    .filter_map(|r| r.get(1).and_then(Value::as_text).map(str::to_owned))
                    .collect();
                let hashed = columns
                    .iter()
                    .map(|c| !IGNORED.contains(&(name.as_str(), c.as_str())))
                    .collect();
                Table {
                    columns: columns.len(),
                    hashed,
                    name,
                }
            })
            .collect();
        Rc::new(Self {
            sqlite,
            tables,
            dirty: Cell::new(0),
            parsed: RefCell::new(HashMap::new()),
            plant,
            fired: Cell::new(0),
        })
    }

    fn stmt(&self, sql: &str) -> Rc<Stmt> {
        if let Some(s) = self.parsed.borrow().get(sql) {
            return s.clone();
        }
        let s = Rc::new(Stmt::parse(sql));
        self.parsed.borrow_mut().insert(sql.to_owned(), s.clone());
        s
    }

    fn mark(&self, stmt: &Stmt) {
        let bits = match stmt.verb {
            Verb::Select => 0,
            Verb::Other => ALL,
            Verb::Insert | Verb::Update | Verb::Delete => self
                .tables
                .iter()
                .position(|t| t.name == stmt.table)
                .map_or(if stmt.table == DECISIONS { 0 } else { ALL }, |i| 1 << i),
        };
        self.dirty.set(self.dirty.get() | bits);
    }

    fn read(&self, i: usize) -> Rc<Vec<Row>> {
        let sql = format!("SELECT * FROM {} ORDER BY 1, 2", self.tables[i].name);
        Rc::new(self.sqlite.exec(&sql, &[]).expect("read table"))
    }

    /// Every table as stored now.
    pub fn capture_all(&self) -> Tables {
        self.dirty.set(0);
        Tables((0..self.tables.len()).map(|i| self.read(i)).collect())
    }

    /// The tables after an action from `before`: the ones it wrote are read
    /// back, the others shared.
    pub fn capture(&self, before: &Tables) -> Tables {
        let dirty = self.dirty.replace(0);
        Tables(
            before
                .0
                .iter()
                .enumerate()
                .map(|(i, rows)| {
                    if dirty & (1 << i) != 0 {
                        let now = self.read(i);
                        if now == *rows {
                            rows.clone()
                        } else {
                            now
                        }
                    } else {
                        rows.clone()
                    }
                })
                .collect(),
        )
    }

    /// Makes the database hold `target`, given that it holds `live`.
    /// Returns true when the documents table was rewritten.
    pub fn restore(&self, live: &Tables, target: &Tables) -> bool {
        let mut documents = false;
        self.sqlite
            .atomically(|| {
                for (i, table) in self.tables.iter().enumerate() {
                    let (a, b) = (&live.0[i], &target.0[i]);
                    if Rc::ptr_eq(a, b) || a == b {
                        continue;
                    }
                    documents |= table.name == "documents";
                    self.sqlite
                        .exec(&format!("DELETE FROM {}", table.name), &[])?;
                    let marks = vec!["?"; table.columns].join(", ");
                    let insert = format!("INSERT INTO {} VALUES ({marks})", table.name);
                    for row in b.iter() {
                        self.sqlite.exec(&insert, row)?;
                    }
                }
                Ok::<_, StoreError>(())
            })
            .expect("restore");
        self.dirty.set(0);
        documents
    }

    /// Feeds the decision-relevant content of `tables` to `state`.
    pub fn hash(&self, tables: &Tables, state: &mut impl Hasher) {
        for (table, rows) in self.tables.iter().zip(&tables.0) {
            table.name.hash(state);
            for row in rows.iter() {
                if table.name == "counters"
                    && row
                        .first()
                        .and_then(Value::as_text)
                        .is_some_and(|n| IGNORED_COUNTERS.contains(&n))
                {
                    continue;
                }
                for (value, hashed) in row.iter().zip(&table.hashed) {
                    if *hashed {
                        hash_value(value, state);
                    }
                }
                0xffu8.hash(state);
            }
        }
    }

    /// Empties the decisions table (its rows were read for the checker).
    pub fn clear_decisions(&self) {
        self.sqlite
            .exec(&format!("DELETE FROM {DECISIONS}"), &[])
            .expect("clear decisions");
    }

    /// The underlying store, for reads that bypass the plant.
    pub fn sqlite(&self) -> &SqliteStore {
        &self.sqlite
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
        let stmt = db.stmt(sql);
        db.mark(&stmt);
        if let Some(plant) = db.plant {
            if let Some(rewrite) = plant.apply(&stmt, sql, params, &db.sqlite) {
                db.fired.set(db.fired.get() + 1);
                return match rewrite {
                    Rewrite::Drop => Ok(Vec::new()),
                    Rewrite::Run(sql, params) => db.sqlite.exec(&sql, &params),
                };
            }
        }
        db.sqlite.exec(sql, params)
    }

    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.0.sqlite.atomically(work)
    }
}

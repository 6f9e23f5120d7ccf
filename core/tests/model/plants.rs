//! Planted bugs: the one table of statement matchers the checker's tests use
//! to break the real engine without forking it.
//!
//! Each [`Plant`] names a statement by stable fragments only (the verb, the
//! table, a column it assigns and, where needed, the value it assigns) and
//! says what the faulty store does with it instead of running it. Statement
//! texts may change when the engine's SQL moves; a matcher that no longer
//! matches anything makes its test fail (`fired == 0`), it never passes
//! silently.

use callfence_core::store::Value;

/// What a statement does, as far as the table and the dirty-table tracking
/// care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Select,
    Insert,
    Update,
    Delete,
    /// Anything else (schema, pragmas, `WITH`): treated as touching every table.
    Other,
}

/// One right-hand side of an assignment or a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// A `?`, with its position among the statement's parameters.
    Param(usize),
    /// A literal or expression, as written.
    Text(String),
}

/// A statement, parsed just enough to match on table and column names.
#[derive(Debug)]
pub struct Stmt {
    pub verb: Verb,
    pub table: String,
    /// `SET` items of an UPDATE, or column/value pairs of an INSERT.
    pub assigns: Vec<(String, Operand)>,
    /// `column = operand` conditions of the WHERE clause (joined by AND).
    pub filters: Vec<(String, Operand)>,
}

impl Stmt {
    /// Its verb and the table it writes (or reads first), from its first
    /// words only.
    pub fn head(sql: &str) -> (Verb, String) {
        let mut words = sql.split_whitespace();
        let mut next = || words.next().unwrap_or("");
        let (verb, skip) = match next().to_ascii_uppercase().as_str() {
            "SELECT" => (Verb::Select, None),
            "INSERT" | "REPLACE" => (Verb::Insert, Some("INTO")),
            "UPDATE" => (Verb::Update, None),
            "DELETE" => (Verb::Delete, Some("FROM")),
            _ => (Verb::Other, None),
        };
        let table = match verb {
            Verb::Insert | Verb::Delete => loop {
                let w = next();
                if w.is_empty() || skip.is_some_and(|s| w.eq_ignore_ascii_case(s)) {
                    break next();
                }
            },
            Verb::Update => match next() {
                w if w.eq_ignore_ascii_case("OR") => {
                    next();
                    next()
                }
                w => w,
            },
            Verb::Select | Verb::Other => "",
        };
        let table = table.split('(').next().unwrap_or("").to_ascii_lowercase();
        (verb, table)
    }

    pub fn parse(sql: &str) -> Self {
        let s = sql.trim_start();
        let upper = s.to_ascii_uppercase();
        let words: Vec<&str> = upper.split_whitespace().collect();
        let word = |i: usize| words.get(i).copied().unwrap_or("");
        let (verb, table_word) = match word(0) {
            "SELECT" => (
                Verb::Select,
                words.iter().position(|w| *w == "FROM").map(|i| i + 1),
            ),
            "INSERT" | "REPLACE" => {
                let at = words.iter().position(|w| *w == "INTO").map(|i| i + 1);
                (Verb::Insert, at)
            }
            "UPDATE" if word(1) == "OR" => (Verb::Update, Some(3)),
            "UPDATE" => (Verb::Update, Some(1)),
            "DELETE" if word(1) == "FROM" => (Verb::Delete, Some(2)),
            _ => (Verb::Other, None),
        };
        let table = table_word
            .map(|i| word(i).split('(').next().unwrap_or("").to_ascii_lowercase())
            .unwrap_or_default();
        let mut stmt = Stmt {
            verb,
            table,
            assigns: Vec::new(),
            filters: Vec::new(),
        };
        match verb {
            Verb::Update => {
                let set = find(&upper, " SET ").map(|i| i + 5);
                let wh = find(&upper, " WHERE ");
                if let Some(set) = set {
                    let end = wh.filter(|w| *w > set).unwrap_or(s.len());
                    stmt.assigns = pairs(s, set, end, ",");
                }
                if let Some(wh) = wh {
                    stmt.filters = pairs(s, wh + 7, s.len(), " AND ");
                }
            }
            Verb::Insert => stmt.assigns = insert_pairs(s, &upper),
            Verb::Delete => {
                if let Some(wh) = find(&upper, " WHERE ") {
                    stmt.filters = pairs(s, wh + 7, s.len(), " AND ");
                }
            }
            Verb::Select | Verb::Other => {}
        }
        stmt
    }

    /// The operand assigned to `column`, if the statement assigns it.
    pub fn assigned(&self, column: &str) -> Option<&Operand> {
        self.assigns
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, o)| o)
    }

    /// The operand `column` is compared to in the WHERE clause.
    pub fn filtered(&self, column: &str) -> Option<&Operand> {
        self.filters
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, o)| o)
    }
}

fn find(upper: &str, needle: &str) -> Option<usize> {
    upper.find(needle)
}

fn operand(sql: &str, start: usize, text: &str) -> Operand {
    let t = text.trim();
    if t == "?" {
        let at = start + text.find('?').unwrap_or(0);
        Operand::Param(sql[..at].matches('?').count())
    } else {
        Operand::Text(t.trim_matches('\'').to_owned())
    }
}

/// Splits `sql[from..to]` at `sep` outside parentheses into `lhs = rhs` pairs.
fn pairs(sql: &str, from: usize, to: usize, sep: &str) -> Vec<(String, Operand)> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = from;
    let bytes = sql.as_bytes();
    let mut i = from;
    let upper = sql.to_ascii_uppercase();
    while i <= to {
        let at_end = i == to;
        if !at_end {
            match bytes[i] {
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ => {}
            }
        }
        if at_end || (depth == 0 && upper[i..to].starts_with(sep)) {
            let item = &sql[start..i];
            if let Some(eq) = item.find('=') {
                let lhs = item[..eq].trim().trim_start_matches('(');
                if !lhs.ends_with('!') && !lhs.ends_with('<') && !lhs.ends_with('>') {
                    out.push((
                        lhs.to_ascii_lowercase(),
                        operand(sql, start + eq + 1, &item[eq + 1..]),
                    ));
                }
            }
            if at_end {
                break;
            }
            i += sep.len();
            start = i;
            continue;
        }
        i += 1;
    }
    out
}

/// `INSERT INTO t (a, b) VALUES (?, 'x')` as `[(a, ?0), (b, 'x')]`.
fn insert_pairs(sql: &str, upper: &str) -> Vec<(String, Operand)> {
    let (Some(open), Some(values)) = (sql.find('('), find(upper, "VALUES")) else {
        return Vec::new();
    };
    let Some(close) = sql[open..].find(')').map(|c| open + c) else {
        return Vec::new();
    };
    let Some(vopen) = sql[values..].find('(').map(|c| values + c + 1) else {
        return Vec::new();
    };
    let Some(vclose) = sql[vopen..].find(')').map(|c| vopen + c) else {
        return Vec::new();
    };
    let columns = sql[open + 1..close]
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase());
    let mut offset = vopen;
    let mut out = Vec::new();
    for (column, value) in columns.zip(sql[vopen..vclose].split(',')) {
        out.push((column, operand(sql, offset, value)));
        offset += value.len() + 1;
    }
    out
}

/// What a faulty store does with a matched statement.
#[derive(Debug, Clone, Copy)]
pub enum Effect {
    /// Skips it: the write is lost.
    Drop,
    /// Runs it without the `SET` items that assign these columns (and
    /// without their parameters): the guard and the `RETURNING` row stay, the
    /// write of those columns is lost.
    DropAssigns(&'static [&'static str]),
    /// Runs it with `from` replaced by `to` (not fired when `from` is absent).
    Replace {
        from: &'static str,
        to: &'static str,
    },
    /// Overwrites the newest row instead of adding one: `INSERT OR REPLACE`
    /// with the assigned column one lower.
    OverwritePrevious,
}

/// One planted bug: a matcher on stable fragments and its effect.
#[derive(Debug)]
pub struct Plant {
    /// The bug, as a test name fragment.
    pub name: &'static str,
    /// The violation kind the model check must find.
    pub finds: &'static str,
    pub verb: Verb,
    pub table: &'static str,
    /// A column the statement must assign (`None` for a read: matched on
    /// its verb, table and the effect's fragment only).
    pub column: Option<&'static str>,
    /// The value it must assign to `column` (a literal or a parameter), if any.
    pub value: Option<&'static str>,
    pub effect: Effect,
    /// Another plant armed with this one: a bug that only shows behind a
    /// second fault (the checker's tests say why).
    pub with: Option<&'static str>,
}

/// Every planted bug. The model's tests run each one.
pub const PLANTS: &[Plant] = &[
    Plant {
        name: "fence_grant_not_recorded",
        finds: "SecondFence",
        verb: Verb::Update,
        table: "sessions",
        column: Some("fence_node"),
        value: None,
        effect: Effect::DropAssigns(&["fence_node", "fence_epoch", "fence_at", "command_id"]),
        with: None,
    },
    Plant {
        name: "ambiguous_mark_forgotten",
        finds: "MovedAfterAmbiguous",
        verb: Verb::Update,
        table: "sessions",
        column: Some("ambiguous_epoch"),
        value: None,
        effect: Effect::Drop,
        with: None,
    },
    Plant {
        name: "delivery_not_recorded",
        finds: "ForwardedAfterDelivery",
        verb: Verb::Update,
        table: "events",
        column: Some("state"),
        value: Some("delivered"),
        effect: Effect::Drop,
        with: None,
    },
    Plant {
        name: "heartbeat_updates_lost",
        finds: "IneligibleChosen",
        verb: Verb::Insert,
        table: "heartbeats",
        column: Some("node"),
        value: None,
        // The upsert keeps the new seq and loses the rest of the beat.
        effect: Effect::DropAssigns(&["body", "body_sha256", "received_at", "signed_at", "answer"]),
        with: None,
    },
    Plant {
        name: "revision_not_bumped",
        finds: "StaleWriteChangedState",
        verb: Verb::Insert,
        table: "documents",
        column: Some("revision"),
        value: None,
        effect: Effect::OverwritePrevious,
        with: None,
    },
    Plant {
        name: "epoch_counter_not_advanced",
        finds: "EpochNotIncreasing",
        verb: Verb::Insert,
        table: "counters",
        column: Some("name"),
        value: Some("epoch"),
        // The other counters of the statement still advance.
        effect: Effect::Replace {
            from: "value = value + 1",
            to: "value = value + (name IS NOT 'epoch')",
        },
        with: None,
    },
    Plant {
        name: "report_epoch_unchecked",
        finds: "StaleReportChangedState",
        verb: Verb::Select,
        table: "events",
        column: None,
        value: None,
        // The report's epoch guard, in the read every report starts with,
        // made always true (the parameter stays bound).
        effect: Effect::Replace {
            from: "(s.epoch IS ?2 AND e.epoch IS ?2)",
            to: "(?2 IS ?2)",
        },
        with: Some("ambiguous_mark_forgotten"),
    },
    Plant {
        name: "eviction_ignores_liveness",
        finds: "LivePruned",
        verb: Verb::Delete,
        table: "sessions",
        column: None,
        value: None,
        // The row cap's eviction with its `settled!` clause made always true:
        // the oldest session goes, live or not.
        effect: Effect::Replace {
            from: "WHERE (state = 'ended' OR (state IN ('node_lost', 'max_duration') AND fence_node IS NULL)) ORDER BY updated_at",
            to: "WHERE 1 ORDER BY updated_at",
        },
        with: None,
    },
];

/// What the faulty store runs instead of a statement.
pub enum Rewrite {
    Drop,
    Run(String, Vec<Value>),
}

fn param<'a>(params: &'a [Value], operand: Option<&Operand>) -> Option<&'a Value> {
    match operand? {
        Operand::Param(i) => params.get(*i),
        Operand::Text(_) => None,
    }
}

impl Plant {
    /// This plant and the one it is armed with.
    pub fn armed(&'static self) -> Vec<&'static Plant> {
        let mut out = vec![self];
        out.extend(
            self.with
                .map(|name| PLANTS.iter().find(|p| p.name == name).expect("a plant")),
        );
        out
    }

    /// The rewrite of `sql`, or `None` when the plant leaves it alone.
    pub fn apply(&self, stmt: &Stmt, sql: &str, params: &[Value]) -> Option<Rewrite> {
        if stmt.verb != self.verb || stmt.table != self.table {
            return None;
        }
        let assigned = match self.column {
            Some(column) => Some(stmt.assigned(column)?),
            None => None,
        };
        if let (Some(want), Some(assigned)) = (self.value, assigned) {
            let matches = match assigned {
                Operand::Text(t) => t == want,
                Operand::Param(_) => {
                    param(params, Some(assigned)).and_then(Value::as_text) == Some(want)
                }
            };
            if !matches {
                return None;
            }
        }
        match self.effect {
            Effect::Drop => Some(Rewrite::Drop),
            Effect::DropAssigns(columns) => {
                let (sql, params) = drop_assigns(sql, params, columns)?;
                Some(Rewrite::Run(sql, params))
            }
            Effect::Replace { from, to } => sql
                .contains(from)
                .then(|| Rewrite::Run(sql.replace(from, to), params.to_vec())),
            Effect::OverwritePrevious => {
                let Some(Operand::Param(at)) = assigned else {
                    return None;
                };
                let mut params = params.to_vec();
                let previous = params[*at].as_int()? - 1;
                if previous < 1 {
                    return None;
                }
                params[*at] = Value::Int(previous);
                let body = sql.trim_start();
                let rest = body.get(6..)?; // after "INSERT"
                Some(Rewrite::Run(format!("INSERT OR REPLACE{rest}"), params))
            }
        }
    }
}

/// `sql` without the items of its (first) `SET` clause that assign one of
/// `columns`, and `params` without the `?`s of those items; `None` when it
/// assigns none of them.
fn drop_assigns(sql: &str, params: &[Value], columns: &[&str]) -> Option<(String, Vec<Value>)> {
    let upper = sql.to_ascii_uppercase();
    let set = find(&upper, " SET ")? + 5;
    let end = find(&upper[set..], " WHERE ").map_or(sql.len(), |w| set + w);
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, set);
    for (i, b) in sql.bytes().enumerate().take(end).skip(set) {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b',' if depth == 0 => {
                items.push(start..i);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(start..end);
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    let mut removed = 0;
    for item in items {
        let text = &sql[item.clone()];
        let lhs = text
            .split('=')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if columns.contains(&lhs.as_str()) {
            removed += 1;
            let before = sql[..item.start].matches('?').count();
            dropped.extend(before..before + text.matches('?').count());
        } else {
            kept.push(text.trim());
        }
    }
    if removed == 0 {
        return None;
    }
    let rewritten = format!("{}{}{}", &sql[..set], kept.join(", "), &sql[end..]);
    let params = params
        .iter()
        .enumerate()
        .filter(|(i, _)| !dropped.contains(i))
        .map(|(_, v)| v.clone())
        .collect();
    Some((rewritten, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_parse_into_tables_and_columns() {
        let s = Stmt::parse("UPDATE sessions SET state = 'assigned', owner = ?, epoch = ?, origin_url = ? WHERE call_session_id = ?");
        assert_eq!((s.verb, s.table.as_str()), (Verb::Update, "sessions"));
        assert_eq!(s.assigned("epoch"), Some(&Operand::Param(1)));
        assert_eq!(s.assigned("state"), Some(&Operand::Text("assigned".into())));
        assert_eq!(s.filtered("call_session_id"), Some(&Operand::Param(3)));
        assert_eq!(s.assigned("ambiguous_epoch"), None);
        let s = Stmt::parse("INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value");
        assert_eq!((s.verb, s.table.as_str()), (Verb::Insert, "counters"));
        assert_eq!(s.assigned("value"), Some(&Operand::Param(1)));
        let s = Stmt::parse("INSERT INTO legs (call_control_id, call_session_id, state, updated_at) VALUES (?, ?, 'open', ?)");
        assert_eq!(s.assigned("state"), Some(&Operand::Text("open".into())));
        assert_eq!(s.assigned("updated_at"), Some(&Operand::Param(2)));
        let s = Stmt::parse("DELETE FROM documents WHERE kind = ? AND revision <= ?");
        assert_eq!((s.verb, s.table.as_str()), (Verb::Delete, "documents"));
        assert_eq!(s.filtered("kind"), Some(&Operand::Param(0)));
        let s = Stmt::parse("UPDATE sessions SET fence_node = ?, state = CASE WHEN state = 'assigned' THEN 'answered' ELSE state END, updated_at = ? WHERE call_session_id = ? AND fence_node IS NULL AND owner = ?");
        assert_eq!(s.filtered("owner"), Some(&Operand::Param(3)));
        assert_eq!(Stmt::parse("SELECT 1 FROM events").verb, Verb::Select);
        for sql in [
            "INSERT INTO counters (name, value) VALUES (?, 1)",
            "INSERT OR REPLACE INTO counters(name) VALUES (?)",
            "UPDATE counters SET value = 1",
            "UPDATE OR IGNORE counters SET value = 1",
            "DELETE FROM counters WHERE name = ?",
            "SELECT 1 FROM counters",
            "WITH x AS (SELECT 1) UPDATE counters SET value = 1",
        ] {
            let parsed = Stmt::parse(sql);
            let (verb, table) = Stmt::head(sql);
            assert_eq!(verb, parsed.verb, "{sql}");
            if verb != Verb::Select {
                assert_eq!(table, parsed.table, "{sql}");
            }
        }
        assert_eq!(
            Stmt::parse("WITH x AS (SELECT 1) UPDATE events SET a = 1").verb,
            Verb::Other
        );
    }
}

//! Reads that span call shards (SPEC §16): the Worker asks every shard
//! `0..N` (N the widest map within retention) and merges their answers here.
//!
//! A shard's answer is used only if it has the shape its endpoint gives
//! (below); an answer that does not (not JSON, a decision without an integer
//! `decision_id` or an RFC 3339 `at`) is treated as unreachable, since an
//! answer the edge cannot read is no more use to a client than none. If two
//! reads name the same shard, the first is used.
//!
//! Every merged answer carries `"shards_unreachable":[k,...]`, ascending, and
//! always, `[]` when every shard answered: SPEC §13 lets objects carry more
//! fields, `GET /v1/health` always lists `shards.unreachable` the same way,
//! and a client that checks completeness then never mistakes an absent key
//! for "all answered" (absent means a release before v1.4: one object,
//! complete). Apart from that key (and status's `shard_open_calls`),
//! merging one shard's answer returns it unchanged.
//!
//! `GET /v1/decisions` ([`merge_decisions`]): `{"decisions":[...]}`.
//! - Newest first (no `after`): by `at`, ties by shard index then
//!   `decision_id`, all descending; at most `limit`. Each shard's own order
//!   is kept (a k-way merge of its heads), so one shard comes back as sent.
//! - Paged (`after`, a decision id): every shard answers its oldest decisions
//!   with `decision_id > after` and a `next` cursor; the merge is ascending
//!   by `decision_id` (unique across the deployment), and the merged `next`
//!   is the smallest of the last kept `decision_id` (when the limit dropped
//!   any) and every shard's non-null `next`; null when there is none. A
//!   shard's unread decisions all lie above its `next`, and above the last
//!   kept id when the limit cut, so the next page skips nothing (it may
//!   repeat some only when a shard's `next` is below what was kept).
//!   A page that names unreachable shards skipped theirs: retry it.
//!
//! `GET /v1/calls` and `GET /v1/events` ([`merge_pages`]):
//! `{"calls":[...],"next":id|null}` ascending by `call_session_id`, and
//! `{"events":[...],"next":seq|null}` ascending by `seq` (unique across
//! shards: shard k's carry k above bit 40); the merged page stops at the
//! smallest `next` a shard gave, so paging repeats and skips nothing.
//!
//! `GET /v1/status` ([`merge_status`]) starts from the *base*, the answer
//! of the lowest reachable shard (shard 0, the directory, when it answers;
//! every shard sees the same directory view):
//!
//! | field | merged |
//! |---|---|
//! | `counts.*` (`open_calls`, `pending`, `unroutable`, `ignored`, `sessions`, `session_cap`, `storage_full`, `claims_*`): every integer | sum (each shard has its own tables, cap and refusal counters) |
//! | `nodes[].capacity.open_calls` | sum of that `node`'s entries |
//! | `engine.last_webhook_at` | latest |
//! | `engine.operative` | true if any shard's is |
//! | `recent_decisions` | merged newest first, at most 10 |
//! | `shard_open_calls` (added) | each answering shard's `counts.open_calls`, by shard index (`{"0":2,"3":1}`): what the panel shows per shard |
//! | `policy_revision`, `nodes_revision`, `routing_hash`, `lines`, `overrides`, the rest of `nodes` (beats, `active_calls`, `max_calls`, `eligible`, `reasons`) and any other field | the base's |

use crate::shard::STATUS_DECISIONS;
use crate::time::parse_ms;
use serde_json::{json, Map, Value as Json};

/// One shard's answer to a spanning read: its index and its JSON body, or
/// `None` when it could not be reached.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardRead {
    /// The shard index `k` (0 is `global`).
    pub shard: u32,
    /// Its answer, `None` when unreachable.
    pub answer: Option<Json>,
}

/// Which `GET /v1/decisions` read was asked of every shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionRead {
    /// No `after`: newest first.
    NewestFirst,
    /// With `after`: ascending by `decision_id`, with a `next` cursor.
    After,
}

/// A decision's merge key: the greatest key is taken first.
type Key = (i64, i64, i64);

/// The reads by ascending shard, one per shard.
fn by_shard(reads: &[ShardRead]) -> Vec<&ShardRead> {
    let mut sorted: Vec<&ShardRead> = reads.iter().collect();
    sorted.sort_by_key(|r| r.shard);
    sorted.dedup_by_key(|r| r.shard);
    sorted
}

/// A shard's decision list with each decision's key; `None` if malformed.
fn keyed(list: &Json, shard: u32, read: DecisionRead) -> Option<Vec<(Key, &Json)>> {
    let shard = i64::from(shard);
    list.as_array()?
        .iter()
        .map(|d| {
            let id = d.get("decision_id")?.as_i64().filter(|id| *id >= 0)?;
            let at = parse_ms(d.get("at")?.as_str()?)?;
            let key = match read {
                DecisionRead::NewestFirst => (at, shard, id),
                DecisionRead::After => (-id, -shard, 0),
            };
            Some((key, d))
        })
        .collect()
}

/// Merges sorted lists by taking the greatest head until `limit`; also
/// whether the limit dropped any.
fn merge<'a>(pages: &[Vec<(Key, &'a Json)>], limit: usize) -> (Vec<(Key, &'a Json)>, bool) {
    let mut heads = vec![0; pages.len()];
    let mut out = Vec::new();
    while out.len() < limit {
        let best = (0..pages.len())
            .filter_map(|p| Some((pages[p].get(heads[p])?.0, p)))
            .max();
        let Some((_, p)) = best else { break };
        out.push(pages[p][heads[p]]);
        heads[p] += 1;
    }
    let cut = pages.iter().map(Vec::len).sum::<usize>() > out.len();
    (out, cut)
}

fn bodies(list: &[(Key, &Json)]) -> Json {
    Json::Array(list.iter().map(|(_, d)| (*d).clone()).collect())
}

/// Merges every shard's `GET /v1/decisions` answer, each asked with the same
/// `limit` (the shard's clamped limit; at least 1 is kept) and `read`.
pub fn merge_decisions(reads: &[ShardRead], limit: usize, read: DecisionRead) -> Json {
    let (mut pages, mut nexts, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    for r in by_shard(reads) {
        let page = r.answer.as_ref().and_then(|a| {
            let next = match (read, a.get("next")) {
                (DecisionRead::After, Some(n)) if !n.is_null() => Some(n.as_i64()?),
                _ => None,
            };
            Some((keyed(a.get("decisions")?, r.shard, read)?, next))
        });
        match page {
            Some((page, next)) => {
                pages.push(page);
                nexts.extend(next);
            }
            None => missing.push(r.shard),
        }
    }
    let (list, cut) = merge(&pages, limit.max(1));
    let mut out = json!({ "decisions": bodies(&list) });
    if read == DecisionRead::After {
        let last = list.last().filter(|_| cut).map(|((id, _, _), _)| -id);
        out["next"] = nexts
            .into_iter()
            .chain(last)
            .min()
            .map_or(Json::Null, Json::from);
    }
    out["shards_unreachable"] = json!(missing);
    out
}

/// A paged read whose pages [`merge_pages`] merges: its list, and the
/// field of each item its cursor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paged {
    /// `GET /v1/calls`: whole calls by `call_session_id`.
    Calls,
    /// `GET /v1/events`: the ledger by `seq`.
    Events,
}

impl Paged {
    fn list(self) -> &'static str {
        match self {
            Paged::Calls => "calls",
            Paged::Events => "events",
        }
    }

    /// An item's cursor value (`None`: malformed).
    fn key(self, item: &Json) -> Option<PageKey<'_>> {
        match self {
            Paged::Calls => self.cursor(item.get("call_session_id")?),
            Paged::Events => self.cursor(item.get("seq")?),
        }
    }

    /// A cursor as the read gives it (`None`: not of this read's kind).
    fn cursor(self, value: &Json) -> Option<PageKey<'_>> {
        match self {
            Paged::Calls => Some(PageKey::Text(value.as_str()?)),
            Paged::Events => Some(PageKey::Number(value.as_u64()?)),
        }
    }
}

/// A cursor value; one read's are all of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum PageKey<'a> {
    Number(u64),
    Text(&'a str),
}

impl PageKey<'_> {
    fn json(self) -> Json {
        match self {
            PageKey::Number(n) => Json::from(n),
            PageKey::Text(t) => Json::from(t),
        }
    }
}

/// Merges every shard's page of a paged read, each asked with the same
/// `after` and `limit` (the clamped limit): ascending by cursor, at most
/// `limit`, and never past the smallest `next` a shard gave (its unread
/// items all lie above it). The merged `next` is the last item kept when
/// any was left out or a shard has more, so the page that follows repeats
/// none and skips none.
pub fn merge_pages(reads: &[ShardRead], paged: Paged, limit: usize) -> Json {
    let (mut items, mut bound, mut missing) = (Vec::new(), None, Vec::new());
    for r in by_shard(reads) {
        let page = r.answer.as_ref().and_then(|a| {
            let listed: Option<Vec<(PageKey, &Json)>> = a
                .get(paged.list())?
                .as_array()?
                .iter()
                .map(|item| Some((paged.key(item)?, item)))
                .collect();
            let next = match a.get("next") {
                Some(Json::Null) | None => None,
                Some(next) => Some(paged.cursor(next)?),
            };
            Some((listed?, next))
        });
        match page {
            Some((listed, next)) => {
                items.extend(listed);
                bound = match (bound, next) {
                    (Some(b), Some(n)) => Some(std::cmp::min(b, n)),
                    (b, n) => b.or(n),
                };
            }
            None => missing.push(r.shard),
        }
    }
    items.sort_by_key(|(key, _)| *key);
    items.dedup_by_key(|(key, _)| *key);
    let kept: Vec<&(PageKey, &Json)> = items
        .iter()
        .filter(|(key, _)| bound.is_none_or(|b| *key <= b))
        .take(limit.max(1))
        .collect();
    let more = kept.len() < items.len() || bound.is_some();
    let next = match kept.last() {
        Some((last, _)) if more => last.json(),
        _ => Json::Null,
    };
    let list: Vec<Json> = kept.iter().map(|(_, item)| (*item).clone()).collect();
    let mut out = json!({ "next": next, "shards_unreachable": missing });
    out[paged.list()] = Json::Array(list);
    out
}

/// A node's open calls in one shard's status.
fn open_calls_of(status: &Map<String, Json>, node: &str) -> Option<i64> {
    let nodes = status.get("nodes")?.as_array()?;
    let entry = nodes
        .iter()
        .find(|n| n.get("node").and_then(Json::as_str) == Some(node))?;
    entry.pointer("/capacity/open_calls")?.as_i64()
}

/// Merges every shard's `GET /v1/status` answer (see the module's table).
/// `None` when no shard gave a usable answer: there is nothing to show.
pub fn merge_status(reads: &[ShardRead]) -> Option<Json> {
    let (mut usable, mut recents, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_shard = Map::new();
    for r in by_shard(reads) {
        let status = r.answer.as_ref().and_then(|a| {
            let obj = a
                .as_object()
                .filter(|o| o.get("counts").is_some_and(Json::is_object))?;
            let recent = keyed(
                obj.get("recent_decisions")?,
                r.shard,
                DecisionRead::NewestFirst,
            )?;
            Some((obj, recent))
        });
        match status {
            Some((obj, recent)) => {
                let open = obj.get("counts").and_then(|c| c.get("open_calls"));
                per_shard.insert(r.shard.to_string(), open.cloned().unwrap_or(Json::Null));
                usable.push(obj);
                recents.push(recent);
            }
            None => missing.push(r.shard),
        }
    }
    let (base, rest) = usable.split_first()?;
    let mut out = (*base).clone();
    let sum = |mine: i64, get: &dyn Fn(&Map<String, Json>) -> Option<i64>| {
        rest.iter()
            .filter_map(|o| get(o))
            .fold(mine, i64::saturating_add)
    };
    if let Some(Json::Object(counts)) = out.get_mut("counts") {
        for (name, value) in counts.iter_mut() {
            if let Some(mine) = value.as_i64() {
                *value = sum(mine, &|o| o.get("counts")?.get(name)?.as_i64()).into();
            }
        }
    }
    if let Some(Json::Array(nodes)) = out.get_mut("nodes") {
        for node in nodes.iter_mut() {
            let Some(name) = node.get("node").and_then(Json::as_str).map(str::to_owned) else {
                continue;
            };
            if let Some(open) = node.pointer_mut("/capacity/open_calls") {
                if let Some(mine) = open.as_i64() {
                    *open = sum(mine, &|o| open_calls_of(o, &name)).into();
                }
            }
        }
    }
    let engines: Vec<&Json> = usable.iter().filter_map(|o| o.get("engine")).collect();
    if let Some(Json::Object(engine)) = out.get_mut("engine") {
        let latest = engines
            .iter()
            .filter_map(|e| e.get("last_webhook_at")?.as_str())
            .filter_map(|t| Some((parse_ms(t)?, t)))
            .max();
        if let Some((_, at)) = latest {
            engine.insert("last_webhook_at".into(), at.into());
        }
        if engine.get("operative").is_some_and(Json::is_boolean) {
            let any = engines
                .iter()
                .any(|e| e.get("operative") == Some(&Json::Bool(true)));
            engine.insert("operative".into(), any.into());
        }
    }
    out.insert(
        "recent_decisions".into(),
        bodies(&merge(&recents, STATUS_DECISIONS as usize).0),
    );
    out.insert("shard_open_calls".into(), Json::Object(per_shard));
    out.insert("shards_unreachable".into(), json!(missing));
    Some(Json::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: i64, at: &str) -> Json {
        json!({"decision_id": id, "at": format!("2026-12-01T00:00:{at}Z"), "outcome": "assigned"})
    }

    fn read(shard: u32, answer: Json) -> ShardRead {
        ShardRead {
            shard,
            answer: Some(answer),
        }
    }

    fn ids(merged: &Json) -> Vec<i64> {
        let list = merged["decisions"].as_array().unwrap();
        list.iter()
            .map(|d| d["decision_id"].as_i64().unwrap())
            .collect()
    }

    fn with_unreachable(mut answer: Json, missing: Json) -> Json {
        answer["shards_unreachable"] = missing;
        answer
    }

    #[test]
    fn one_shard_comes_back_as_sent_in_both_reads() {
        // Its own order is kept even where `at` disagrees with it.
        let page = json!({"decisions": [d(9, "05.000"), d(8, "06.000"), d(7, "01.000")]});
        let merged = merge_decisions(&[read(0, page.clone())], 50, DecisionRead::NewestFirst);
        assert_eq!(merged, with_unreachable(page, json!([])));
        for next in [json!(3), Json::Null] {
            let page = json!({"decisions": [d(2, "01.000"), d(3, "02.000")], "next": next});
            let merged = merge_decisions(&[read(0, page.clone())], 2, DecisionRead::After);
            assert_eq!(merged, with_unreachable(page, json!([])));
        }
    }

    #[test]
    fn shards_interleave_newest_first_within_the_limit_and_ties_are_total() {
        let a = json!({"decisions": [d(5, "09.000"), d(3, "04.000"), d(1, "01.000")]});
        let b = json!({"decisions": [d(6, "07.000"), d(4, "04.000"), d(2, "04.000")]});
        let reads = [read(1, b), read(0, a)];
        let merged = merge_decisions(&reads, 4, DecisionRead::NewestFirst);
        // At 04.000: shard 1 before shard 0, then the higher decision id.
        assert_eq!(ids(&merged), [5, 6, 4, 2]);
        assert_eq!(merged["shards_unreachable"], json!([]));
        assert_eq!(merged.get("next"), None);
    }

    #[test]
    fn unreachable_and_malformed_shards_are_named_and_the_rest_merge() {
        let reads = [
            read(3, json!({"decisions": [d(4, "04.000")]})),
            ShardRead {
                shard: 2,
                answer: None,
            },
            read(
                1,
                json!({"decisions": [{"decision_id": 9, "at": "yesterday"}]}),
            ),
            read(0, json!({"decisions": [d(1, "01.000")]})),
        ];
        let merged = merge_decisions(&reads, 50, DecisionRead::NewestFirst);
        assert_eq!(ids(&merged), [4, 1]);
        assert_eq!(merged["shards_unreachable"], json!([1, 2]));
    }

    #[test]
    fn paged_reads_merge_ascending_and_the_cursor_skips_nothing() {
        let a =
            json!({"decisions": [d(10, "01.000"), d(12, "01.000"), d(14, "01.000")], "next": 14});
        let b = json!({"decisions": [d(11, "01.000")], "next": null});
        let merged = merge_decisions(
            &[read(0, a.clone()), read(1, b.clone())],
            3,
            DecisionRead::After,
        );
        assert_eq!(
            (ids(&merged), &merged["next"]),
            (vec![10, 11, 12], &json!(12))
        );
        let c = json!({"decisions": [d(20, "01.000")], "next": null});
        let merged = merge_decisions(&[read(0, b), read(1, c)], 3, DecisionRead::After);
        assert_eq!((ids(&merged), &merged["next"]), (vec![11, 20], &Json::Null));
    }

    fn status(open: i64, m1_open: i64, beat_age: i64, last: &str, recent: Json) -> Json {
        json!({
            "engine": {"operative": true, "last_webhook_at": format!("2026-12-01T00:00:{last}Z")},
            "policy_revision": 3, "routing_hash": "h",
            "nodes": [{"node": "M1", "heartbeat_age_s": beat_age, "eligible": true, "reasons": [],
                       "capacity": {"max_calls": 4, "active_calls": 1, "open_calls": m1_open}}],
            "counts": {"open_calls": open, "pending": 1, "sessions": 5, "session_cap": 100,
                       "storage_full": 0, "claims_rate_limited": 2},
            "recent_decisions": recent,
        })
    }

    #[test]
    fn one_status_comes_back_as_sent() {
        let one = status(2, 2, 7, "01.000", json!([d(1, "01.000")]));
        let merged = merge_status(&[read(0, one.clone())]);
        let mut expected = with_unreachable(one, json!([]));
        expected["shard_open_calls"] = json!({"0": 2});
        assert_eq!(merged, Some(expected));
        assert_eq!(
            merge_status(&[ShardRead {
                shard: 0,
                answer: None
            }]),
            None
        );
    }

    #[test]
    fn status_sums_counts_and_keeps_the_directory_facts_of_the_lowest_reachable_shard() {
        let mut s0 = status(2, 2, 7, "03.000", json!([d(3, "03.000")]));
        s0["engine"] = json!({"operative": false, "last_webhook_at": null});
        let s1 = status(3, 1, 99, "05.000", json!([d(4, "05.000"), d(2, "02.000")]));
        let s2 = status(4, 0, 42, "01.000", json!([]));
        let merged =
            merge_status(&[read(2, s2.clone()), read(0, s0), read(1, s1.clone())]).unwrap();
        assert_eq!(
            merged["counts"],
            json!({"open_calls": 9, "pending": 3, "sessions": 15, "session_cap": 300,
                   "storage_full": 0, "claims_rate_limited": 6})
        );
        let m1 = &merged["nodes"][0];
        assert_eq!(
            (&m1["capacity"]["open_calls"], &m1["heartbeat_age_s"]),
            (&json!(3), &json!(7))
        );
        assert_eq!(m1["capacity"]["active_calls"], json!(1));
        let engine = json!({"operative": true, "last_webhook_at": "2026-12-01T00:00:05.000Z"});
        assert_eq!(merged["engine"], engine);
        let recent: Vec<&Json> = merged["recent_decisions"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(
            recent
                .iter()
                .map(|d| d["decision_id"].clone())
                .collect::<Vec<_>>(),
            [4, 3, 2]
        );
        assert_eq!(merged["shards_unreachable"], json!([]));
        assert_eq!(merged["shard_open_calls"], json!({"0": 2, "1": 3, "2": 4}));

        let unreachable = ShardRead {
            shard: 0,
            answer: None,
        };
        let merged = merge_status(&[read(2, s2), unreachable, read(1, s1)]).unwrap();
        assert_eq!(merged["nodes"][0]["heartbeat_age_s"], json!(99));
        assert_eq!(merged["counts"]["open_calls"], json!(7));
        assert_eq!(merged["shards_unreachable"], json!([0]));
        assert_eq!(merged["shard_open_calls"], json!({"1": 3, "2": 4}));
    }

    fn calls(ids: &[&str], next: Option<&str>) -> Json {
        let list: Vec<Json> = ids
            .iter()
            .map(|id| json!({"call_session_id": id}))
            .collect();
        json!({"calls": list, "next": next})
    }

    fn call_ids(merged: &Json) -> Vec<&str> {
        merged["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["call_session_id"].as_str().unwrap())
            .collect()
    }

    /// Pages of 2 walk every shard's calls once, ascending, however the
    /// ids interleave: the merged page stops at a full shard's cursor.
    #[test]
    fn calls_page_across_shards_without_repeat_or_gap() {
        let shards: [Vec<&str>; 3] = [
            vec!["a", "d", "e", "h"],
            vec!["b", "c"],
            vec!["f", "g", "i"],
        ];
        let (mut walked, mut after) = (Vec::new(), String::new());
        for _ in 0..20 {
            let reads: Vec<ShardRead> = shards
                .iter()
                .enumerate()
                .map(|(k, all)| {
                    let page: Vec<&str> = all
                        .iter()
                        .copied()
                        .filter(|id| *id > after.as_str())
                        .take(2)
                        .collect();
                    let next = (page.len() == 2).then(|| page[1]);
                    read(k as u32, calls(&page, next))
                })
                .collect();
            let merged = merge_pages(&reads, Paged::Calls, 2);
            walked.extend(call_ids(&merged).into_iter().map(str::to_owned));
            match merged["next"].as_str() {
                Some(next) => after = next.to_owned(),
                None => break,
            }
        }
        assert_eq!(walked, ["a", "b", "c", "d", "e", "f", "g", "h", "i"]);
        // One shard with a full page: more may follow.
        let one = merge_pages(&[read(0, calls(&["a", "b"], Some("b")))], Paged::Calls, 2);
        assert_eq!(one["next"], "b");
    }

    /// Events page by `seq`, a number: shard 1's carry 1 above bit 40.
    #[test]
    fn events_page_by_seq_across_shards() {
        let shard1 = 1u64 << 40;
        let events = |seqs: &[u64], next: Option<u64>| {
            let list: Vec<Json> = seqs.iter().map(|s| json!({"seq": s})).collect();
            json!({"events": list, "next": next})
        };
        let reads = [
            read(0, events(&[3, 9], Some(9))),
            read(1, events(&[shard1 + 1], None)),
        ];
        let merged = merge_pages(&reads, Paged::Events, 2);
        assert_eq!(merged["events"], json!([{"seq": 3}, {"seq": 9}]));
        assert_eq!(merged["next"], 9);
        let reads = [
            read(0, events(&[12], None)),
            read(1, events(&[shard1 + 1], None)),
        ];
        let merged = merge_pages(&reads, Paged::Events, 2);
        assert_eq!(merged["events"], json!([{"seq": 12}, {"seq": shard1 + 1}]));
        assert_eq!(merged["next"], Json::Null);
    }

    #[test]
    fn a_calls_page_names_an_unreachable_shard_and_keeps_the_rest() {
        let reads = [
            read(0, calls(&["a"], None)),
            ShardRead {
                shard: 1,
                answer: None,
            },
            read(2, json!({"calls": "nope"})),
        ];
        let merged = merge_pages(&reads, Paged::Calls, 50);
        assert_eq!(call_ids(&merged), ["a"]);
        assert_eq!(merged["next"], Json::Null);
        assert_eq!(merged["shards_unreachable"], json!([1, 2]));
    }
}

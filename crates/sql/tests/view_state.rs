//! View semantics, exactly: definitions parsed from SQL, events fed to the view state one by
//! one with chosen event and arrival times, and the changes it emits compared in full. Each
//! window kind, out-of-order and late events, grace, wall-clock closing of quiet keys, the emit
//! modes, and a checkpoint taken halfway giving the same result as a run straight through.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use onehop_engine::view::checkpoint;
use onehop_engine::view::state::{Applied, Change, ViewState};
use onehop_engine::view::{Input, ViewDef};
use onehop_log::NewRecord;
use onehop_sql::{Statement, parse};
use serde_json::{Value, json};

fn view(sql: &str) -> ViewDef {
    match parse(sql).unwrap().remove(0) {
        Statement::CreateView { def, .. } => def,
        other => panic!("not a view: {other:?}"),
    }
}

/// A view state and the changes it emitted so far.
struct Run {
    def: ViewDef,
    state: ViewState,
    changes: Vec<Change>,
    offset: u64,
}

impl Run {
    fn new(sql: &str) -> Run {
        Run { def: view(sql), state: ViewState::default(), changes: Vec::new(), offset: 0 }
    }

    /// An event arriving at `arrival` (its record timestamp), with `value` as its JSON.
    fn event(&mut self, arrival: i64, value: Value) -> Applied {
        let input = Input { timestamp_ms: arrival, offset: self.offset, ..Input::row(&value) };
        self.offset += 1;
        // As the runtime does: what closed before the record arrived closes first.
        self.state.advance(&self.def, arrival - 1, &mut self.changes);
        self.state.apply(&self.def, &input, arrival, &mut self.changes)
    }

    /// The wall clock reaches `now` with nothing arriving.
    fn tick(&mut self, now: i64) {
        self.state.advance(&self.def, now, &mut self.changes);
    }

    /// The changes since the last call, as `(key, final, removed, row)`.
    fn take(&mut self) -> Vec<(String, bool, bool, Value)> {
        self.changes
            .drain(..)
            .map(|change| (change.key, change.is_final, change.removed, std::sync::Arc::unwrap_or_clone(change.row)))
            .collect()
    }
}

fn change(key: &str, row: Value) -> (String, bool, bool, Value) {
    (key.to_string(), false, false, row)
}

fn final_(key: &str, row: Value) -> (String, bool, bool, Value) {
    (key.to_string(), true, false, row)
}

#[test]
fn tumbling_windows_take_late_events_within_grace_and_close_on_time() {
    let mut run = Run::new(
        "CREATE VIEW clicks WITH (grace = '1s', emit = 'changes,final') AS \
         SELECT player, COUNT(*) AS n, SUM(amount) AS total \
         FROM TUMBLE(s, t, INTERVAL '5' SECOND) GROUP BY player",
    );
    let window = |start: i64, n: u64, total: Value| json!({"player": "a", "n": n, "total": total, "window_start": start, "window_end": start + 5000});
    assert_eq!(run.event(1000, json!({"player": "a", "t": 1000, "amount": 2})), Applied::Counted);
    assert_eq!(run.take(), [change("a", window(0, 1, json!(2)))]);
    // Out of order, after the window's end but within its grace: still counted.
    assert_eq!(run.event(5500, json!({"player": "a", "t": 4000, "amount": 3})), Applied::Counted);
    assert_eq!(run.take(), [change("a", window(0, 2, json!(5)))]);
    assert_eq!(run.event(5600, json!({"player": "a", "t": 5200, "amount": 1.5})), Applied::Counted);
    assert_eq!(run.take(), [change("a", window(5000, 1, json!(1.5)))]);
    // Past end + grace (6000): the first window closes, and this event is late for it.
    assert_eq!(run.event(6500, json!({"player": "a", "t": 4500, "amount": 100})), Applied::Late);
    assert_eq!(run.take(), [final_("a", window(0, 2, json!(5)))]);
    assert_eq!(run.state.late_events, 1);
    // Nothing arrives: the wall clock closes the quiet key's window at its end + grace.
    run.tick(10_999);
    assert!(run.take().is_empty(), "not before 11000");
    run.tick(11_000);
    assert_eq!(run.take(), [final_("a", window(5000, 1, json!(1.5)))]);
    // Closed windows stay readable, newest first, flagged final.
    let rows = run.state.rows(&run.def, "a");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["window_start"], 5000);
    assert_eq!(rows[0]["final"], true);
}

#[test]
fn hopping_windows_count_an_event_in_each_window_it_falls_in() {
    let mut run = Run::new(
        "CREATE VIEW h WITH (emit = 'final') AS SELECT player, COUNT(*) AS n \
         FROM HOP(s, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND) GROUP BY player",
    );
    assert_eq!(run.event(7000, json!({"player": "a", "t": 7000})), Applied::Counted);
    assert_eq!(run.event(8000, json!({"player": "a", "t": 12_000})), Applied::Counted);
    assert!(run.take().is_empty(), "emit = final pushes nothing before a window closes");
    run.tick(20_000);
    let row = |start: i64, n: u64| json!({"player": "a", "n": n, "window_start": start, "window_end": start + 10_000});
    assert_eq!(run.take(), [final_("a", row(0, 1)), final_("a", row(5000, 2)), final_("a", row(10_000, 1))]);
}

#[test]
fn sessions_grow_merge_and_close_after_the_gap() {
    let mut run = Run::new(
        "CREATE VIEW sessions WITH (emit = 'changes,final') AS SELECT player, COUNT(*) AS n, \
         MIN(t) AS first_t, MAX(t) AS last_t FROM SESSION(s, t, INTERVAL '3' SECOND) GROUP BY player",
    );
    let row = |start: i64, end: i64, n: u64, first: i64, last: i64| json!({"player": "a", "n": n, "first_t": first, "last_t": last, "window_start": start, "window_end": end});
    run.event(1000, json!({"player": "a", "t": 1000}));
    run.event(2000, json!({"player": "a", "t": 2000}));
    run.event(2100, json!({"player": "a", "t": 7500}));
    assert_eq!(
        run.take(),
        [
            change("a", row(1000, 4000, 1, 1000, 1000)),
            change("a", row(1000, 5000, 2, 1000, 2000)),
            change("a", row(7500, 10_500, 1, 7500, 7500)),
        ]
    );
    // 4800 is less than 3 s from 2000 and from 7500: the two sessions become one.
    run.event(2200, json!({"player": "a", "t": 4800}));
    assert_eq!(
        run.take(),
        [
            (String::from("a"), false, true, row(7500, 10_500, 1, 7500, 7500)),
            change("a", row(1000, 10_500, 4, 1000, 7500)),
        ]
    );
    run.tick(10_499);
    assert!(run.take().is_empty());
    run.tick(10_500);
    assert_eq!(run.take(), [final_("a", row(1000, 10_500, 4, 1000, 7500))]);
    // A late event that would have joined the closed session is dropped.
    assert_eq!(run.event(14_000, json!({"player": "a", "t": 9000})), Applied::Late);
    assert!(run.take().is_empty());
}

#[test]
fn sliding_windows_let_old_events_fall_out() {
    let mut run = Run::new(
        "CREATE VIEW recent AS SELECT player, COUNT(*) AS n, AVG(ms) AS avg_ms \
         FROM SLIDING(s, t, INTERVAL '10' SECOND) GROUP BY player",
    );
    let row = |end: i64, n: u64, avg: Value| json!({"player": "a", "n": n, "avg_ms": avg, "window_start": end - 10_000, "window_end": end});
    run.event(1000, json!({"player": "a", "t": 1000, "ms": 10}));
    run.event(5000, json!({"player": "a", "t": 5000, "ms": 20}));
    run.event(12_000, json!({"player": "a", "t": 12_000, "ms": 30}));
    // The event at 1000 fell out at 11000, before the one at 12000 came.
    assert_eq!(
        run.take(),
        [
            change("a", row(1000, 1, json!(10.0))),
            change("a", row(5000, 2, json!(15.0))),
            change("a", row(11_000, 1, json!(20.0))),
            change("a", row(12_000, 2, json!(25.0))),
        ]
    );
    run.tick(16_000);
    assert_eq!(run.take(), [change("a", row(15_000, 1, json!(30.0)))]);
    run.tick(23_000);
    assert_eq!(run.take(), [(String::from("a"), false, true, row(22_000, 0, Value::Null))]);
    assert!(run.state.rows(&run.def, "a").is_empty());
}

#[test]
fn running_totals_without_a_window_and_every_aggregate() {
    let mut run = Run::new(
        "CREATE VIEW totals AS SELECT sku, COUNT(*) AS n, COUNT(DISTINCT customer) AS customers, \
         SUM(qty) AS qty, AVG(price) AS avg_price, MIN(price) AS low, MAX(price) AS high, \
         FIRST(customer) AS first_customer, LAST(customer) AS last_customer, COUNT(note) AS notes \
         FROM orders WHERE qty > 0 GROUP BY sku",
    );
    run.event(3000, json!({"sku": "x", "customer": "c2", "qty": 2, "price": 10.0}));
    run.event(1000, json!({"sku": "x", "customer": "c1", "qty": 1, "price": 4.0, "note": "gift"}));
    assert_eq!(run.event(2000, json!({"sku": "x", "customer": "c3", "qty": 0, "price": 1.0})), Applied::Filtered);
    run.event(4000, json!({"sku": "x", "customer": "c2", "qty": 3, "price": 7.0}));
    let changes = run.take();
    assert_eq!(changes.len(), 3);
    assert_eq!(
        changes[2].3,
        json!({"sku": "x", "n": 3, "customers": 2, "qty": 6, "avg_price": 7.0, "low": 4.0, "high": 10.0,
               "first_customer": "c1", "last_customer": "c2", "notes": 1})
    );
    // A running total never closes.
    run.tick(i64::MAX / 2);
    assert!(run.take().is_empty());
    assert_eq!(run.state.rows(&run.def, "x").len(), 1);
}

#[test]
fn an_event_time_that_is_not_a_time_is_counted_and_dropped() {
    let mut run = Run::new(
        "CREATE VIEW v AS SELECT player, COUNT(*) AS n FROM TUMBLE(s, t, INTERVAL '1' MINUTE) GROUP BY player",
    );
    assert_eq!(run.event(1000, json!({"player": "a", "t": "yesterday"})), Applied::Invalid);
    assert_eq!(run.event(1000, json!({"player": "a", "t": "2026-11-21T10:00:00Z"})), Applied::Counted);
    assert_eq!(run.state.invalid_events, 1);
    assert_eq!(run.take()[0].3["window_start"], 1_795_255_200_000i64);
}

#[test]
fn a_checkpoint_taken_midway_continues_exactly_as_a_run_straight_through() {
    let sql = "CREATE VIEW v WITH (grace = '500ms', emit = 'changes,final') AS SELECT player, COUNT(*) AS n, \
               SUM(amount) AS total, COUNT(DISTINCT item) AS items FROM TUMBLE(s, t, INTERVAL '2' SECOND) GROUP BY player";
    // A seeded stream of events: three users, out of order by up to 1.5 s, some late.
    let mut seed = 42u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    };
    let events: Vec<(i64, Value)> = (0..2000)
        .map(|i| {
            let arrival = 1000 + i * 10;
            let t = arrival - (next() % 1500) as i64;
            let player = ["a", "b", "c"][(next() % 3) as usize];
            (arrival, json!({"player": player, "t": t, "amount": next() % 100, "item": next() % 7}))
        })
        .collect();
    let mut straight = Run::new(sql);
    for (arrival, value) in &events {
        straight.event(*arrival, value.clone());
    }
    let mut first = Run::new(sql);
    for (arrival, value) in &events[..1234] {
        first.event(*arrival, value.clone());
    }
    let saved = serde_json::to_string(&first.state).unwrap();
    let mut resumed = Run {
        def: view(sql),
        state: serde_json::from_str(&saved).unwrap(),
        changes: std::mem::take(&mut first.changes),
        offset: first.offset,
    };
    for (arrival, value) in &events[1234..] {
        resumed.event(*arrival, value.clone());
    }
    assert_eq!(resumed.state, straight.state);
    assert_eq!(resumed.take(), straight.take(), "the same changes, in the same order");
    assert!(straight.state.late_events > 0, "the stream had late events");
}

/// One step of a run: an event arriving, or the clock moving on with nothing arriving.
#[derive(Clone)]
enum Step {
    Event(i64, Value),
    Tick(i64),
}

impl Run {
    fn step(&mut self, step: &Step) {
        match step {
            Step::Event(arrival, value) => {
                self.event(*arrival, value.clone());
            }
            Step::Tick(now) => self.tick(*now),
        }
    }
}

/// A compacted topic as a map: each record replaces its key's value, a tombstone deletes it.
fn store(stored: &mut HashMap<String, Bytes>, records: Vec<NewRecord>) {
    for record in records {
        let key = String::from_utf8(record.key.unwrap().to_vec()).unwrap();
        match record.value {
            Some(value) => stored.insert(key, value),
            None => stored.remove(&key),
        };
    }
}

#[test]
fn incremental_checkpoints_taken_as_it_goes_restore_exactly_the_state_at_each() {
    let views = [
        "CREATE VIEW v WITH (grace = '300ms', emit = 'changes,final', retention = '3s') AS SELECT player, \
         COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS top, LAST(item) AS item \
         FROM TUMBLE(s, t, INTERVAL '1' SECOND) GROUP BY player",
        "CREATE VIEW v WITH (grace = '200ms', emit = 'final', retention = '2s') AS SELECT player, COUNT(*) AS n, \
         COUNT(DISTINCT item) AS items FROM HOP(s, t, INTERVAL '500' MILLISECOND, INTERVAL '1500' MILLISECOND) \
         GROUP BY player",
        "CREATE VIEW v WITH (grace = '100ms', retention = '2s') AS SELECT player, COUNT(*) AS n, \
         FIRST(item) AS first FROM SESSION(s, t, INTERVAL '400' MILLISECOND) GROUP BY player",
        "CREATE VIEW v AS SELECT player, COUNT(*) AS n, MIN(amount) AS low \
         FROM SLIDING(s, t, INTERVAL '700' MILLISECOND) GROUP BY player",
        "CREATE VIEW v AS SELECT player, COUNT(*) AS n, SUM(amount) AS total FROM s GROUP BY player",
    ];
    // Seeded: 1 500 events over 30 s from eight players (some of whom go quiet for a while), out
    // of order by up to a second, some late; the clock ticking on between some of them.
    let mut seed = 7u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    };
    let mut steps = Vec::new();
    for i in 0..1500i64 {
        let arrival = 1000 + i * 20;
        if next() % 5 == 0 {
            steps.push(Step::Tick(arrival - 7));
        }
        let t = arrival - (next() % 1000) as i64;
        let players = if (i / 300) % 2 == 0 { 8 } else { 3 };
        let player = format!("p{}", next() % players);
        steps.push(Step::Event(arrival, json!({"player": player, "t": t, "amount": next() % 100, "item": next() % 5})));
    }
    steps.push(Step::Tick(40_000));
    for sql in views {
        let mut straight = Run::new(sql);
        straight.state.track_unsaved(false);
        let mut stored = HashMap::new();
        // (steps done, the topic then, the offset then, changes emitted then)
        let mut checkpoints = Vec::new();
        for (done, step) in steps.iter().enumerate() {
            if done % 97 == 0 {
                let delta = straight.state.take_unsaved();
                store(&mut stored, checkpoint::records("v", 7, vec![straight.offset], None, &delta));
                checkpoints.push((done, stored.clone(), straight.offset, straight.changes.len()));
            }
            straight.step(step);
        }
        let changes = straight.take();
        assert!(straight.state.late_events > 0 || !sql.contains("TUMBLE"), "{sql}: the stream had late events");
        for (done, stored, offset, emitted) in checkpoints {
            let mut left = stored.clone();
            let restored = checkpoint::restore(&view(sql), &mut left).expect("a checkpoint");
            // Every record is the view's: none a stray while its incarnation is live, all of
            // them once another one is.
            assert!(checkpoint::strays(&left, &[("v".into(), 7)]).is_empty(), "{sql}: {:?}", left.keys());
            assert_eq!(checkpoint::strays(&left, &[("v".into(), 8)]).len(), left.len(), "{sql}");
            assert_eq!(restored.positions, [offset]);
            let mut resumed = Run { def: view(sql), state: restored.state, changes: Vec::new(), offset };
            for step in &steps[done..] {
                resumed.step(step);
            }
            assert!(resumed.state == straight.state, "{sql}: restored after {done} steps");
            // Each key's changes in the same order (keys whose windows close at the same
            // moment come in the order of a hash map).
            let by_key = |changes: &[(String, bool, bool, Value)]| {
                let mut keys: BTreeMap<String, Vec<(bool, bool, Value)>> = BTreeMap::new();
                for (key, is_final, removed, row) in changes {
                    keys.entry(key.clone()).or_default().push((*is_final, *removed, row.clone()));
                }
                keys
            };
            assert!(
                by_key(&resumed.take()) == by_key(&changes[emitted..]),
                "{sql}: the same changes after {done} steps"
            );
        }
        // What the topic holds is the state and nothing more: forgotten windows and keys were
        // deleted, not left behind.
        let delta = straight.state.take_unsaved();
        store(&mut stored, checkpoint::records("v", 7, vec![straight.offset], None, &delta));
        let whole = straight.state.everything();
        assert_eq!(stored.len(), whole.keys.len() + whole.closed.len() + 1, "{sql}");
        let restored = checkpoint::restore(&view(sql), &mut stored.clone()).unwrap();
        assert!(restored.state == straight.state, "{sql}");
    }
}

#[test]
fn a_whole_state_checkpoint_of_the_earlier_format_is_restored_and_then_written_whole() {
    let sql = "CREATE VIEW v WITH (grace = '0s') AS SELECT player, COUNT(*) AS n \
               FROM TUMBLE(s, t, INTERVAL '1' SECOND) GROUP BY player";
    let mut run = Run::new(sql);
    for i in 0..50 {
        run.event(1000 + i * 100, json!({"player": format!("p{}", i % 3), "t": 1000 + i * 100}));
    }
    let old = json!({"version": 1, "positions": [50], "state": run.state});
    let mut stored = HashMap::from([("v".to_string(), Bytes::from(old.to_string()))]);
    let mut restored = checkpoint::restore(&view(sql), &mut stored).unwrap();
    assert!(restored.write_everything);
    assert_eq!((restored.positions.as_slice(), &restored.state), ([50].as_slice(), &run.state));
    // Written whole in the new form, it restores to the same state.
    restored.state.track_unsaved(true);
    let delta = restored.state.take_unsaved();
    assert_eq!(delta.keys.len(), 3);
    assert!(!delta.closed.is_empty());
    let mut stored = HashMap::new();
    store(&mut stored, checkpoint::records("v", 9, vec![50], None, &delta));
    assert_eq!(checkpoint::restore(&view(sql), &mut stored).unwrap().state, run.state);
}

/// A view over a table: each row change as the runtime feeds it, the old row and the new one.
fn row_change(run: &mut Run, before: Option<Value>, after: Option<Value>) -> Applied {
    let offset = run.offset;
    run.offset += 1;
    let input = |value| Input { offset, ..Input::row(value) };
    let (before, after) = (before.as_ref().map(input), after.as_ref().map(input));
    run.state.apply_row_change(&run.def, before.as_ref(), after.as_ref(), &mut run.changes)
}

fn removed(key: &str, row: Value) -> (String, bool, bool, Value) {
    (key.to_string(), false, true, row)
}

#[test]
fn a_view_over_a_table_follows_rows_joining_moving_and_leaving_groups() {
    let mut run = Run::new(
        "CREATE VIEW stock AS SELECT category, COUNT(*) AS n, SUM(qty) AS qty, AVG(price) AS price, \
         MIN(price) AS low, MAX(name) AS last_name, COUNT(DISTINCT supplier) AS suppliers \
         FROM products WHERE qty IS NOT NULL GROUP BY category",
    );
    let p1 = json!({"category": "tea", "qty": 5, "price": 4, "name": "assam", "supplier": "x"});
    let p2 = json!({"category": "tea", "qty": 2, "price": 2.5, "name": "sencha", "supplier": "x"});
    let p3 = json!({"category": "tea", "qty": 1, "price": 9, "name": "matcha", "supplier": "y"});
    let row = |n: u64, qty: Value, price: Value, low: Value, last: &str, suppliers: u64| json!({"category": "tea", "n": n, "qty": qty, "price": price, "low": low, "last_name": last, "suppliers": suppliers});
    assert_eq!(row_change(&mut run, None, Some(p1.clone())), Applied::Counted);
    assert_eq!(row_change(&mut run, None, Some(p2.clone())), Applied::Counted);
    assert_eq!(row_change(&mut run, None, Some(p3.clone())), Applied::Counted);
    assert_eq!(
        run.take(),
        [
            change("tea", row(1, json!(5), json!(4.0), json!(4), "assam", 1)),
            change("tea", row(2, json!(7), json!(3.25), json!(2.5), "sencha", 1)),
            change("tea", row(3, json!(8), json!(5.166666666666667), json!(2.5), "sencha", 2)),
        ]
    );
    // The cheapest leaves: the minimum is the next one; the greatest name goes too.
    assert_eq!(row_change(&mut run, Some(p2.clone()), None), Applied::Counted);
    assert_eq!(run.take(), [change("tea", row(2, json!(6), json!(6.5), json!(4), "matcha", 2))]);
    // A row moves to another group: one change for each, in the order out, in.
    let mut moved = p3.clone();
    moved["category"] = json!("coffee");
    assert_eq!(row_change(&mut run, Some(p3.clone()), Some(moved.clone())), Applied::Counted);
    let coffee =
        json!({"category": "coffee", "n": 1, "qty": 1, "price": 9.0, "low": 9, "last_name": "matcha", "suppliers": 1});
    assert_eq!(
        run.take(),
        [change("tea", row(1, json!(5), json!(4.0), json!(4), "assam", 1)), change("coffee", coffee)]
    );
    // A row the WHERE clause stops taking leaves its group; the last row out removes the group.
    let mut unstocked = p1.clone();
    unstocked["qty"] = Value::Null;
    assert_eq!(row_change(&mut run, Some(p1.clone()), Some(unstocked.clone())), Applied::Counted);
    let empty =
        json!({"category": "tea", "n": 0, "qty": null, "price": null, "low": null, "last_name": null, "suppliers": 0});
    assert_eq!(run.take(), [removed("tea", empty)]);
    assert_eq!(run.state.rows(&run.def, "tea"), Vec::<Value>::new());
    assert_eq!(row_change(&mut run, Some(unstocked), None), Applied::Filtered);
    assert!(run.take().is_empty());
    // Updating in place: out and in again, one change.
    let mut cheaper = moved.clone();
    cheaper["price"] = json!(7);
    assert_eq!(row_change(&mut run, Some(moved), Some(cheaper)), Applied::Counted);
    let coffee =
        json!({"category": "coffee", "n": 1, "qty": 1, "price": 7.0, "low": 7, "last_name": "matcha", "suppliers": 1});
    assert_eq!(run.take(), [change("coffee", coffee)]);
    assert_eq!(run.state.key_count(), 1);
}

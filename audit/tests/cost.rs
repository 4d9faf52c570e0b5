//! The log's CPU charged to whoever its records are for (`Record::cost`, cost.rs): the writer's
//! and syncer's CPU per batch is split over the batch's tags by bytes; untagged records and an
//! idle tag are charged nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use audit::{Cost, CostTag, Durability, Log, Record};
use common::*;

#[derive(Default)]
struct Sum(AtomicU64);

impl Cost for Sum {
    fn charge(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::Relaxed);
    }
}

fn big(agent: &str, i: u64) -> Record {
    gate(agent, i).detail(serde_json::json!({"tool": "web.fetch", "i": i, "pad": "x".repeat(4000)}))
}

/// Lazy records wait for the urgent one at the end, so all go in one batch: the writer's (and
/// syncer's) CPU for it is split by bytes, about 20:1 for `a`'s 4 kB records against `b`'s
/// 0.2 kB ones; the daemon's own (untagged) records and the idle tag cost nobody.
#[test]
fn the_writers_cpu_per_batch_is_split_over_the_tags_by_bytes() {
    for durability in [Durability::GroupCommit, Durability::NoSync] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts();
        o.durability = durability;
        o.checkpoint_records = 100_000;
        o.lazy_delay = Duration::from_secs(3600);
        let log = Log::open(dir.path(), o).unwrap();
        let (a, b, idle) = (
            Arc::new(Sum::default()),
            Arc::new(Sum::default()),
            Arc::new(Sum::default()),
        );
        let (ta, tb) = (CostTag::new(a.clone()), CostTag::new(b.clone()));
        let _idle = CostTag::new(idle.clone());
        for i in 0..200 {
            log.try_append_lazy(big("a", i).cost(ta.clone()), |r| {
                r.unwrap();
            })
            .unwrap();
            log.try_append_lazy(gate("b", i).cost(tb.clone()), |r| {
                r.unwrap();
            })
            .unwrap();
            log.try_append_lazy(gate("", i), |r| {
                r.unwrap();
            })
            .unwrap();
        }
        log.append_wait(gate("", 0)).unwrap();
        log.close().unwrap();
        let (a, b) = (a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed));
        eprintln!("{durability:?}: a {a} ns, b {b} ns for 200 records each");
        assert!(b > 0, "{durability:?}: b's records were charged nothing");
        assert!(a > 10 * b, "{durability:?}: a {a} ns is not ~20× b {b} ns");
        assert_eq!(idle.0.load(Ordering::Relaxed), 0, "an idle tag is charged");
    }
}

/// Records queued one by one, each waited for (a batch each, mostly): every tag that wrote is
/// charged, the idle one is not.
#[test]
fn every_tag_that_wrote_is_charged() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let (a, idle) = (Arc::new(Sum::default()), Arc::new(Sum::default()));
    let ta = CostTag::new(a.clone());
    let _idle = CostTag::new(idle.clone());
    for i in 0..50 {
        log.append(gate("a", i).cost(ta.clone()))
            .unwrap()
            .wait()
            .unwrap();
    }
    log.close().unwrap();
    assert!(a.0.load(Ordering::Relaxed) > 0);
    assert_eq!(idle.0.load(Ordering::Relaxed), 0);
}

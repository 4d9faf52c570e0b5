//! Deficit round robin over agents (issue 15, "Isolation measured"): the order in which the
//! ring thread handles the completions it reaped (ring/mod.rs). A flooding agent has a
//! completion for each of its 16 connections' receives and sends in every batch, and handling
//! one costs up to a 64 KiB receive parsed; first come, first served, another agent's one
//! completion waits behind all of them. Here each agent has its own queue and the agents take
//! turns: an agent's turn lasts while its deficit (a quantum of CPU per round, minus what its
//! completions cost, measured after each) is positive, then the next agent's comes. So
//! another agent's completion waits at most one quantum (and one completion) of each agent
//! ahead of it, whatever their backlog. The daemon's own completions (its eventfd, timers)
//! come before any agent's. Pure: no syscalls, the cost is the caller's measurement.
//!
//! Memory: one queue per agent with items queued, dropped when it empties; the items are the
//! caller's (the ring's completions, bounded by its completion queue).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// The default quantum: CPU (ns) an agent's completions may take in one turn.
pub const QUANTUM: u64 = 200_000;

#[derive(Debug)]
struct Flow<T> {
    items: VecDeque<T>,
    deficit: i64,
}

/// Items queued per key (an agent), served in deficit round robin; unkeyed items first.
#[derive(Debug)]
pub struct Drr<K, T> {
    own: VecDeque<T>,
    flows: HashMap<K, Flow<T>>,
    /// Keys with items, in turn order (the front one is being served).
    order: VecDeque<K>,
    quantum: i64,
}

impl<K: Eq + Hash + Clone, T> Drr<K, T> {
    pub fn new(quantum: u64) -> Drr<K, T> {
        Drr {
            own: VecDeque::new(),
            flows: HashMap::new(),
            order: VecDeque::new(),
            quantum: i64::try_from(quantum.max(1)).unwrap_or(i64::MAX),
        }
    }

    /// Queue `item` for `key` (None: the daemon's own, served first).
    pub fn push(&mut self, key: Option<K>, item: T) {
        let Some(k) = key else {
            self.own.push_back(item);
            return;
        };
        let quantum = self.quantum;
        let f = self.flows.entry(k.clone()).or_insert_with(|| Flow {
            items: VecDeque::new(),
            deficit: quantum,
        });
        if f.items.is_empty() {
            self.order.push_back(k);
        }
        f.items.push_back(item);
    }

    /// The next item, and its key.
    pub fn pop(&mut self) -> Option<(Option<K>, T)> {
        if let Some(t) = self.own.pop_front() {
            return Some((None, t));
        }
        loop {
            let k = self.order.front()?.clone();
            let Some(f) = self.flows.get_mut(&k) else {
                self.order.pop_front();
                continue;
            };
            if f.deficit <= 0 {
                // Its turn is over: the next round gives it a quantum more (alone, a fresh
                // one: nobody is waiting for its debt to be paid).
                f.deficit = if self.order.len() == 1 {
                    self.quantum
                } else {
                    f.deficit.saturating_add(self.quantum)
                };
                self.order.rotate_left(1);
                continue;
            }
            let Some(t) = f.items.pop_front() else {
                self.order.pop_front();
                self.flows.remove(&k);
                continue;
            };
            if f.items.is_empty() {
                // Nothing more queued: its turn ends, and what is left of its deficit with it.
                self.order.pop_front();
                self.flows.remove(&k);
            }
            return Some((Some(k), t));
        }
    }

    /// The item just popped for `key` cost `cost` (ns of CPU).
    pub fn charge(&mut self, key: &K, cost: u64) {
        if let Some(f) = self.flows.get_mut(key) {
            f.deficit = f
                .deficit
                .saturating_sub(i64::try_from(cost).unwrap_or(i64::MAX));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.own.is_empty() && self.order.is_empty()
    }

    /// Items queued for `key`.
    pub fn queued(&self, key: &K) -> usize {
        self.flows.get(key).map_or(0, |f| f.items.len())
    }

    /// Agents with items queued.
    pub fn agents(&self) -> usize {
        self.flows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pops everything, charging each item its cost; the keys in the order served.
    fn drain(d: &mut Drr<&'static str, u64>) -> Vec<Option<&'static str>> {
        let mut out = Vec::new();
        while let Some((k, cost)) = d.pop() {
            if let Some(k) = k {
                d.charge(&k, cost);
            }
            out.push(k);
        }
        out
    }

    #[test]
    fn a_polite_item_waits_one_quantum_of_a_flood_not_its_backlog() {
        let mut d = Drr::new(100);
        // The flood came first: 50 items of 60 ns each, then one polite item.
        for _ in 0..50 {
            d.push(Some("flood"), 60);
        }
        d.push(Some("polite"), 60);
        let order = drain(&mut d);
        let at = order.iter().position(|k| *k == Some("polite")).unwrap();
        // The flood's turn: 100 ns of quantum, so two items (60 + 60 > 100), then the polite.
        assert_eq!(at, 2, "{order:?}");
        assert_eq!(order.len(), 51, "nothing lost");
    }

    #[test]
    fn first_come_first_served_would_have_made_it_wait_for_all() {
        // The control: one key for both (what the ring did before) serves it last.
        let mut d = Drr::new(100);
        for _ in 0..50 {
            d.push(Some("ring"), 60);
        }
        d.push(Some("ring"), 0);
        let order: Vec<_> = std::iter::from_fn(|| d.pop()).map(|(_, c)| c).collect();
        assert_eq!(order.iter().position(|&c| c == 0), Some(50));
    }

    #[test]
    fn two_floods_share_by_cost_not_by_count() {
        let mut d = Drr::new(1_000);
        // "dear" items cost 10× the "cheap" ones; both always have work.
        for _ in 0..1_000 {
            d.push(Some("dear"), 500);
            d.push(Some("cheap"), 50);
        }
        let mut spent = HashMap::new();
        for _ in 0..1_100 {
            let (k, c) = d.pop().unwrap();
            let k = k.unwrap();
            d.charge(&k, c);
            *spent.entry(k).or_insert(0u64) += c;
        }
        let (a, b) = (spent["dear"] as f64, spent["cheap"] as f64);
        assert!((a / b - 1.0).abs() < 0.1, "dear {a} ns, cheap {b} ns");
    }

    #[test]
    fn nobody_starves_and_the_daemons_own_come_first() {
        let mut d = Drr::new(10);
        for i in 0..20 {
            d.push(Some("a"), 1_000_000); // each item far over the quantum
            d.push(Some("b"), 1);
            if i % 5 == 0 {
                d.push(None, 0);
            }
        }
        let first = d.pop().unwrap();
        assert_eq!(first.0, None);
        let order = drain(&mut d);
        assert_eq!(order.iter().filter(|k| **k == Some("a")).count(), 20);
        assert_eq!(order.iter().filter(|k| **k == Some("b")).count(), 20);
        assert_eq!(order.iter().filter(|k| k.is_none()).count(), 3);
        // "a" overdraws by far: "b" is served until the rounds have paid that debt or "b" has
        // nothing left, and then "a" again; both finish.
        let first_b_done = order.iter().rposition(|k| *k == Some("b")).unwrap();
        assert!(
            order[..first_b_done]
                .iter()
                .filter(|k| **k == Some("a"))
                .count()
                <= 2
        );
        assert!(d.is_empty());
    }

    #[test]
    fn memory_is_what_is_queued() {
        let mut d = Drr::new(10);
        for i in 0..100u64 {
            d.push(Some(i), i);
        }
        assert_eq!(d.agents(), 100);
        while let Some((k, c)) = d.pop() {
            d.charge(&k.unwrap(), c);
        }
        assert_eq!(d.agents(), 0, "a queue is dropped once it empties");
        assert!(d.flows.capacity() < 1024);
    }
}

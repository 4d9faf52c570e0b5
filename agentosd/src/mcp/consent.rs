//! Calls held for operator consent (`security.consent_for`): a request waits here until an
//! operator answers over D-Bus (`agentctl consent approve|deny ID`) or its time runs out.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, oneshot};

/// One pending request, as `agentctl consent list` shows it (a wire type).
pub use agentos_api::ConsentRequest as Request;

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Approved by the operator with this uid.
    Approved { by_uid: u32 },
    /// Refused by the operator with this uid.
    Denied { by_uid: u32 },
    /// Nobody answered within the timeout.
    Expired,
    /// The daemon is shutting down or the agent went away.
    Withdrawn,
}

/// Requests one agent may have waiting at once; more are refused without asking anyone, so an
/// agent cannot bury the operators (or the D-Bus signal) in requests.
pub const MAX_PENDING_PER_AGENT: usize = 16;

/// Why a request was not made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AskError {
    #[error(
        "agent {agent} already has {n} calls waiting for consent (the limit); answer or let them expire first"
    )]
    TooMany { agent: String, n: usize },
}

/// Why an answer was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("no pending consent request {0} (answered already, expired, or never asked)")]
    NoSuchRequest(u64),
}

struct Pending {
    req: Request,
    tx: oneshot::Sender<Answer>,
}

/// The pending requests.
pub struct Consents {
    pending: Mutex<BTreeMap<u64, Pending>>,
    next: AtomicU64,
    timeout: Duration,
    /// New requests, for the D-Bus signal `ConsentRequested`.
    announce: broadcast::Sender<Request>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Consents {
    /// Requests expire after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let (announce, _) = broadcast::channel(256);
        Consents {
            pending: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            timeout,
            announce,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// New requests as they are made (for the D-Bus signal).
    pub fn subscribe(&self) -> broadcast::Receiver<Request> {
        self.announce.subscribe()
    }

    /// Registers a request; returns it (with its id) and a future answer. The caller awaits
    /// [`Consents::wait`] with it.
    pub fn ask(
        &self,
        agent: &str,
        tool: &str,
        capability: &str,
        arguments: serde_json::Value,
    ) -> Result<(Request, oneshot::Receiver<Answer>), AskError> {
        let mut pending = lock(&self.pending);
        let n = pending.values().filter(|p| p.req.agent == agent).count();
        if n >= MAX_PENDING_PER_AGENT {
            return Err(AskError::TooMany {
                agent: agent.to_string(),
                n,
            });
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let now = now_us();
        let req = Request {
            id,
            agent: agent.to_string(),
            tool: tool.to_string(),
            capability: capability.to_string(),
            arguments,
            requested_us: now,
            expires_us: now + self.timeout.as_micros() as u64,
        };
        let (tx, rx) = oneshot::channel();
        pending.insert(
            id,
            Pending {
                req: req.clone(),
                tx,
            },
        );
        drop(pending);
        let _ = self.announce.send(req.clone());
        Ok((req, rx))
    }

    /// Waits for the answer to request `id`; after the timeout the request is removed and the
    /// answer is [`Answer::Expired`]. Dropping this future (the call was cancelled) withdraws it.
    pub async fn wait(&self, id: u64, rx: oneshot::Receiver<Answer>) -> Answer {
        let guard = Withdraw { consents: self, id };
        let answer = match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => Answer::Withdrawn,
            Err(_) => Answer::Expired,
        };
        drop(guard);
        answer
    }

    /// The pending requests, oldest first.
    pub fn list(&self) -> Vec<Request> {
        lock(&self.pending)
            .values()
            .map(|p| p.req.clone())
            .collect()
    }

    /// An operator's answer.
    pub fn answer(&self, id: u64, approve: bool, by_uid: u32) -> Result<Request, AnswerError> {
        let p = lock(&self.pending)
            .remove(&id)
            .ok_or(AnswerError::NoSuchRequest(id))?;
        let a = if approve {
            Answer::Approved { by_uid }
        } else {
            Answer::Denied { by_uid }
        };
        // The waiter may have just timed out; the request is gone either way.
        let _ = p.tx.send(a);
        Ok(p.req)
    }

    /// Withdraws every request of `agent` (it stopped).
    pub fn withdraw_agent(&self, agent: &str) {
        let mut p = lock(&self.pending);
        let ids: Vec<u64> = p
            .iter()
            .filter(|(_, v)| v.req.agent == agent)
            .map(|(k, _)| *k)
            .collect();
        for id in ids {
            if let Some(x) = p.remove(&id) {
                let _ = x.tx.send(Answer::Withdrawn);
            }
        }
    }
}

/// Removes a request that is no longer waited for (answered, expired or cancelled).
struct Withdraw<'a> {
    consents: &'a Consents,
    id: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        lock(&self.consents.pending).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn approve_deny_and_expiry() {
        let c = std::sync::Arc::new(Consents::new(Duration::from_millis(300)));
        let mut sig = c.subscribe();
        let (req, rx) = c
            .ask("t/a", "pay.charge", "pay.charge", json!({"amount": 3}))
            .unwrap();
        assert_eq!(sig.recv().await.unwrap(), req);
        assert_eq!(c.list(), vec![req.clone()]);
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.wait(req.id, rx).await });
        c.answer(req.id, true, 1000).unwrap();
        assert_eq!(waiter.await.unwrap(), Answer::Approved { by_uid: 1000 });
        assert!(c.list().is_empty());
        // A second answer finds nothing.
        assert_eq!(
            c.answer(req.id, false, 0),
            Err(AnswerError::NoSuchRequest(req.id))
        );

        let (req, rx) = c.ask("t/a", "x", "x", json!({})).unwrap();
        c.answer(req.id, false, 0).unwrap();
        assert_eq!(c.wait(req.id, rx).await, Answer::Denied { by_uid: 0 });

        let (req, rx) = c.ask("t/a", "x", "x", json!({})).unwrap();
        assert_eq!(c.wait(req.id, rx).await, Answer::Expired);
        assert!(c.list().is_empty(), "an expired request is not listed");
        assert!(c.answer(req.id, true, 0).is_err());
    }

    #[tokio::test]
    async fn a_cancelled_wait_withdraws_the_request_and_stopping_an_agent_withdraws_its_own() {
        let c = Consents::new(Duration::from_secs(60));
        let (req, rx) = c.ask("t/a", "x", "x", json!({})).unwrap();
        let _ = tokio::time::timeout(Duration::from_millis(20), c.wait(req.id, rx)).await;
        assert!(c.list().is_empty());
        let (a, rx_a) = c.ask("t/a", "x", "x", json!({})).unwrap();
        let (_b, _rx_b) = c.ask("t/b", "x", "x", json!({})).unwrap();
        c.withdraw_agent("t/a");
        assert_eq!(c.list().len(), 1);
        assert_eq!(c.wait(a.id, rx_a).await, Answer::Withdrawn);
    }

    #[test]
    fn one_agent_cannot_flood_the_operators() {
        let c = Consents::new(Duration::from_secs(60));
        let mut held = Vec::new();
        for _ in 0..MAX_PENDING_PER_AGENT {
            held.push(c.ask("t/a", "x", "x", json!({})).unwrap());
        }
        assert!(matches!(
            c.ask("t/a", "x", "x", json!({})),
            Err(AskError::TooMany { .. })
        ));
        // Another agent is not affected; an answer makes room again.
        assert!(c.ask("t/b", "x", "x", json!({})).is_ok());
        c.answer(held[0].0.id, false, 0).unwrap();
        assert!(c.ask("t/a", "x", "x", json!({})).is_ok());
    }
}

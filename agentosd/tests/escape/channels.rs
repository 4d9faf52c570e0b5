//! Exec by any route (class 2) and cross-agent and host channels (class 5).

use crate::{Attempt, Ctx};

/// The attempts of this class and a fixture (listeners, files) kept alive while they run.
pub fn attempts(_ctx: &Ctx) -> (Vec<Attempt>, Box<dyn std::any::Any>) {
    (Vec::new(), Box::new(()))
}

/// Run attempt `name` inside the agent; `None` when this module does not know it.
pub fn probe(name: &str, _args: &[String]) -> Option<Result<String, i32>> {
    match name {
        _ => None,
    }
}

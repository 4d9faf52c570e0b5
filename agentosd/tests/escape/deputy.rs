//! The daemon as a confused deputy on files (issue 12, class 1): links, renames and hardlinks
//! an agent plants in what it can write, then a restart, re-adoption or cleanup by the root
//! daemon.

use crate::{Ctx, common};

/// Run the deputy attempts (they need daemon and agent restarts, so they are not plain
/// attempts); returns how many ran and the failures.
pub fn run(_ctx: &Ctx, _d: &mut common::Daemon, _filter: Option<&str>) -> (usize, Vec<String>) {
    (0, Vec::new())
}

/// Run attempt `name` inside the agent; `None` when this module does not know it.
pub fn probe(name: &str, _args: &[String]) -> Option<Result<String, i32>> {
    match name {
        _ => None,
    }
}

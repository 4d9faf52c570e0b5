//! What each agent's stub answered recently: address → the name the agent asked for, kept
//! [`REMEMBER_FOR`] after the answer (past its TTL: a connect refused because the answer expired
//! is the case that most needs the name), at most [`PER_AGENT`] addresses per agent (the oldest
//! goes first). The audit trail reads it to name the name in a refused connect's record.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long after an answer its addresses still name the name in refusals.
pub const REMEMBER_FOR: Duration = Duration::from_secs(600);
/// Addresses remembered per agent.
pub const PER_AGENT: usize = 1024;

/// The memory of all agents, keyed by the cgroup whose `net_names` entries the answers filled.
#[derive(Debug, Default)]
pub struct Answered {
    agents: HashMap<u64, HashMap<IpAddr, (String, Instant)>>,
}

/// An IPv4-mapped IPv6 address is its IPv4 address (as the programs check and report it).
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        a => a,
    }
}

impl Answered {
    /// Remember that cgroup `cgroup_id`'s stub answered `name` with `addr` at `now` (a later
    /// answer of another name for the same address replaces it: the name asked last).
    pub fn remember(&mut self, cgroup_id: u64, addr: IpAddr, name: &str, now: Instant) {
        let m = self.agents.entry(cgroup_id).or_default();
        let addr = canonical(addr);
        if !m.contains_key(&addr) && m.len() >= PER_AGENT {
            m.retain(|_, (_, at)| now.saturating_duration_since(*at) < REMEMBER_FOR);
            if m.len() >= PER_AGENT
                && let Some(oldest) = m.iter().min_by_key(|(_, (_, at))| *at).map(|(a, _)| *a)
            {
                m.remove(&oldest);
            }
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        m.insert(addr, (name, now));
    }

    /// The name cgroup `cgroup_id` last got `addr` for, if that was less than [`REMEMBER_FOR`]
    /// before `now`.
    pub fn name_of(&self, cgroup_id: u64, addr: IpAddr, now: Instant) -> Option<String> {
        let (name, at) = self.agents.get(&cgroup_id)?.get(&canonical(addr))?;
        (now.saturating_duration_since(*at) < REMEMBER_FOR).then(|| name.clone())
    }

    /// Forget an agent (its stub stopped).
    pub fn forget(&mut self, cgroup_id: u64) {
        self.agents.remove(&cgroup_id);
    }

    /// Addresses remembered for cgroup `cgroup_id`.
    pub fn len_of(&self, cgroup_id: u64) -> usize {
        self.agents.get(&cgroup_id).map_or(0, HashMap::len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn names_outlive_the_ttl_but_not_the_window() {
        let mut a = Answered::default();
        let t0 = Instant::now();
        a.remember(7, ip("198.18.0.10"), "WWW.Example.test.", t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            a.name_of(7, ip("198.18.0.10"), later).as_deref(),
            Some("www.example.test")
        );
        // The v4-mapped form is the same address; another agent's cgroup knows nothing.
        assert_eq!(
            a.name_of(7, ip("::ffff:198.18.0.10"), later).as_deref(),
            Some("www.example.test")
        );
        assert_eq!(a.name_of(8, ip("198.18.0.10"), later), None);
        assert_eq!(a.name_of(7, ip("198.18.0.11"), later), None);
        assert_eq!(a.name_of(7, ip("198.18.0.10"), t0 + REMEMBER_FOR), None);
        // The name asked last wins.
        a.remember(7, ip("198.18.0.10"), "cdn.example.test", later);
        assert_eq!(
            a.name_of(7, ip("198.18.0.10"), later).as_deref(),
            Some("cdn.example.test")
        );
        a.forget(7);
        assert_eq!(a.name_of(7, ip("198.18.0.10"), later), None);
    }

    #[test]
    fn bounded_per_agent_oldest_first() {
        let mut a = Answered::default();
        let t0 = Instant::now();
        for i in 0..PER_AGENT + 10 {
            let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i as u32));
            a.remember(
                1,
                addr,
                &format!("n{i}.example.test"),
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(a.len_of(1), PER_AGENT);
        let now = t0 + Duration::from_secs(1);
        assert_eq!(a.name_of(1, ip("10.0.0.0"), now), None, "the oldest went");
        assert_eq!(
            a.name_of(1, ip("10.0.4.9"), now).as_deref(),
            Some(format!("n{}.example.test", 0x409).as_str())
        );
    }
}

//! Admission math for HRT (SCHED_DEADLINE) reservations.
//!
//! Each admitted reservation sits on one CPU. A new reservation fits on a CPU when the sum of
//! the bandwidths there, plus its own, stays within the utilisation bound. Bandwidth is computed
//! like the kernel's `to_ratio()`: `(runtime << 20) / period`, so the test agrees with the
//! kernel's `__dl_overflow()` per CPU. The default bound is the kernel's default RT share,
//! `sched_rt_runtime_us / sched_rt_period_us` = 950000 / 1000000.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::DeadlineParams;
use crate::validate::MIN_RUNTIME_NS;

/// Fixed-point shift of the kernel's bandwidth ratios (`BW_SHIFT`).
pub const BW_SHIFT: u32 = 20;
const BW_UNIT: u128 = 1 << BW_SHIFT;

/// `(runtime << 20) / period`, like the kernel's `to_ratio()`.
pub fn bandwidth(runtime: u64, period: u64) -> u64 {
    if period == 0 {
        return u64::MAX;
    }
    u64::try_from((u128::from(runtime) << BW_SHIFT) / u128::from(period)).unwrap_or(u64::MAX)
}

fn ratio_text(bw: u64) -> String {
    format!("{:.3}", bw as f64 / BW_UNIT as f64)
}

/// Which per-CPU test to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdmissionTest {
    /// Sum of runtime/period within the bound: what the kernel checks (necessary for EDF).
    #[default]
    Utilisation,
    /// Sum of runtime/min(deadline, period) within the bound: a sufficient EDF test for
    /// constrained deadlines (stricter).
    Density,
}

/// Admission configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionConfig {
    /// `sched_rt_runtime_us`; `None` means unlimited (the sysctl's `-1`).
    pub rt_runtime_us: Option<u64>,
    /// `sched_rt_period_us`.
    pub rt_period_us: u64,
    /// Smallest and largest period accepted (`sched_deadline_period_min_us`/`_max_us`).
    pub period_min_us: u64,
    pub period_max_us: u64,
    pub test: AdmissionTest,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            rt_runtime_us: Some(950_000),
            rt_period_us: 1_000_000,
            period_min_us: 100,
            period_max_us: 1 << 22,
            test: AdmissionTest::Utilisation,
        }
    }
}

impl AdmissionConfig {
    /// From the values of `/proc/sys/kernel/sched_rt_runtime_us` (may be `-1`) and
    /// `sched_rt_period_us`.
    pub fn from_sysctl(rt_runtime_us: i64, rt_period_us: u64) -> Self {
        AdmissionConfig {
            rt_runtime_us: u64::try_from(rt_runtime_us).ok(),
            rt_period_us: rt_period_us.max(1),
            ..Default::default()
        }
    }

    /// The per-CPU bound as a bandwidth; `None` when unlimited.
    pub fn bound(&self) -> Option<u64> {
        self.rt_runtime_us
            .map(|r| bandwidth(r, self.rt_period_us.max(1)))
    }

    fn bound_text(&self) -> String {
        match self.rt_runtime_us {
            Some(r) => format!(
                "{} (sched_rt_runtime_us/sched_rt_period_us = {r}/{})",
                self.bound().map_or_else(String::new, ratio_text),
                self.rt_period_us
            ),
            None => "unlimited".to_string(),
        }
    }

    fn demand(&self, p: &DeadlineParams) -> u64 {
        match self.test {
            AdmissionTest::Utilisation => bandwidth(p.runtime_ns, p.period_ns),
            AdmissionTest::Density => bandwidth(p.runtime_ns, p.deadline_ns.min(p.period_ns)),
        }
    }
}

/// Why a reservation was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{reason}")]
pub struct AdmissionError {
    /// The CPU considered, when the failure is about one CPU's load.
    pub cpu: Option<u32>,
    pub reason: String,
}

/// An admitted reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reservation {
    pub id: String,
    pub cpu: u32,
    pub params: DeadlineParams,
    pub bandwidth: u64,
}

/// The admitted deadline reservations of a host, per CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionSet {
    config: AdmissionConfig,
    cpus: BTreeMap<u32, Vec<Reservation>>,
}

impl AdmissionSet {
    /// An empty set over `cpus` (the CPUs where SCHED_DEADLINE tasks may run).
    pub fn new(cpus: impl IntoIterator<Item = u32>, config: AdmissionConfig) -> Self {
        AdmissionSet {
            config,
            cpus: cpus.into_iter().map(|c| (c, Vec::new())).collect(),
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Bandwidth used on `cpu` (fixed point, `1 << 20` = one full CPU).
    pub fn used(&self, cpu: u32) -> u64 {
        self.cpus
            .get(&cpu)
            .map_or(0, |v| v.iter().map(|r| r.bandwidth).sum())
    }

    /// Utilisation of `cpu` as a fraction.
    pub fn utilisation(&self, cpu: u32) -> f64 {
        self.used(cpu) as f64 / BW_UNIT as f64
    }

    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.cpus.values().flatten()
    }

    /// Check the parameters themselves: runtime <= deadline <= period, kernel limits.
    pub fn check_params(&self, p: &DeadlineParams) -> Result<(), AdmissionError> {
        let err = |reason: String| Err(AdmissionError { cpu: None, reason });
        if p.runtime_ns < MIN_RUNTIME_NS {
            return err(format!(
                "runtime {} ns is below the kernel minimum of {MIN_RUNTIME_NS} ns",
                p.runtime_ns
            ));
        }
        if p.runtime_ns > p.deadline_ns || p.deadline_ns > p.period_ns {
            return err(format!(
                "needs runtime <= deadline <= period, got {}/{}/{} ns",
                p.runtime_ns, p.deadline_ns, p.period_ns
            ));
        }
        let us = p.period_ns / 1000;
        if us < self.config.period_min_us || us > self.config.period_max_us {
            return err(format!(
                "period {} us is outside the kernel's range {}..={} us (sched_deadline_period_min_us/max_us)",
                us, self.config.period_min_us, self.config.period_max_us
            ));
        }
        Ok(())
    }

    /// Whether `p` fits on `cpu`, with the reason when it does not.
    pub fn fits(&self, p: &DeadlineParams, cpu: u32) -> Result<(), AdmissionError> {
        self.check_params(p)?;
        if !self.cpus.contains_key(&cpu) {
            return Err(AdmissionError {
                cpu: Some(cpu),
                reason: format!("CPU {cpu} is not available for deadline tasks"),
            });
        }
        let Some(bound) = self.config.bound() else {
            return Ok(());
        };
        let used = self.used(cpu);
        let need = self.config.demand(p);
        if u128::from(used) + u128::from(need) > u128::from(bound) {
            let what = match self.config.test {
                AdmissionTest::Utilisation => "utilisation",
                AdmissionTest::Density => "density",
            };
            return Err(AdmissionError {
                cpu: Some(cpu),
                reason: format!(
                    "does not fit on CPU {cpu}: {what} {} + {} = {} exceeds the bound {}",
                    ratio_text(used),
                    ratio_text(need),
                    ratio_text(used.saturating_add(need)),
                    self.config.bound_text()
                ),
            });
        }
        Ok(())
    }

    /// The CPU a reservation would go to: among `allowed` (all CPUs when empty), the least
    /// loaded one where it fits (lowest number on ties).
    pub fn find_cpu(&self, p: &DeadlineParams, allowed: &[u32]) -> Result<u32, AdmissionError> {
        self.check_params(p)?;
        let candidates: Vec<u32> = if allowed.is_empty() {
            self.cpus.keys().copied().collect()
        } else {
            allowed.to_vec()
        };
        if candidates.is_empty() {
            return Err(AdmissionError {
                cpu: None,
                reason: "no CPU is available for deadline tasks".to_string(),
            });
        }
        let mut best: Option<(u64, u32)> = None;
        let mut last_err = None;
        for cpu in candidates {
            match self.fits(p, cpu) {
                Ok(()) => {
                    let u = self.used(cpu);
                    if best.is_none_or(|(bu, bc)| (u, cpu) < (bu, bc)) {
                        best = Some((u, cpu));
                    }
                }
                Err(e) => last_err = Some(e),
            }
        }
        match (best, last_err) {
            (Some((_, cpu)), _) => Ok(cpu),
            (None, Some(e)) if allowed.len() == 1 => Err(e),
            (None, _) => Err(AdmissionError {
                cpu: None,
                reason: format!(
                    "no CPU has room for runtime {} ns every {} ns (bandwidth {}) under the bound {}",
                    p.runtime_ns,
                    p.period_ns,
                    ratio_text(self.config.demand(p)),
                    self.config.bound_text()
                ),
            }),
        }
    }

    /// Admit a reservation under `id` on a CPU chosen by [`AdmissionSet::find_cpu`].
    pub fn admit(
        &mut self,
        id: &str,
        p: DeadlineParams,
        allowed: &[u32],
    ) -> Result<u32, AdmissionError> {
        if self.reservations().any(|r| r.id == id) {
            return Err(AdmissionError {
                cpu: None,
                reason: format!("\"{id}\" already holds a reservation"),
            });
        }
        let cpu = self.find_cpu(&p, allowed)?;
        let bandwidth = self.config.demand(&p);
        if let Some(v) = self.cpus.get_mut(&cpu) {
            v.push(Reservation {
                id: id.to_string(),
                cpu,
                params: p,
                bandwidth,
            });
        }
        Ok(cpu)
    }

    /// Release `id`'s reservation; false when it had none.
    pub fn release(&mut self, id: &str) -> bool {
        for v in self.cpus.values_mut() {
            if let Some(i) = v.iter().position(|r| r.id == id) {
                v.remove(i);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(r: u64, d: u64, per: u64) -> DeadlineParams {
        DeadlineParams {
            runtime_ns: r * 1_000_000,
            deadline_ns: d * 1_000_000,
            period_ns: per * 1_000_000,
        }
    }

    #[test]
    fn kernel_ratio() {
        assert_eq!(bandwidth(950_000, 1_000_000), 996_147);
        assert_eq!(bandwidth(1, 2), 1 << 19);
        assert_eq!(AdmissionConfig::default().bound(), Some(996_147));
        assert_eq!(AdmissionConfig::from_sysctl(-1, 1_000_000).bound(), None);
    }

    #[test]
    fn fits_until_the_bound() {
        let mut s = AdmissionSet::new([0], AdmissionConfig::default());
        assert_eq!(s.admit("a", p(5, 10, 10), &[]), Ok(0));
        assert_eq!(s.admit("b", p(4, 10, 10), &[]), Ok(0));
        let e = s.admit("c", p(1, 10, 10), &[]).unwrap_err();
        assert!(e.reason.contains("no CPU has room"), "{}", e.reason);
        let e = s.fits(&p(1, 10, 10), 0).unwrap_err();
        assert_eq!(
            e.reason,
            "does not fit on CPU 0: utilisation 0.900 + 0.100 = 1.000 exceeds the bound 0.950 (sched_rt_runtime_us/sched_rt_period_us = 950000/1000000)"
        );
        assert!(s.release("b"));
        assert!(!s.release("b"));
        assert_eq!(s.admit("c", p(1, 10, 10), &[]), Ok(0));
    }

    #[test]
    fn spreads_over_cpus_and_respects_pinning() {
        let mut s = AdmissionSet::new([0, 1], AdmissionConfig::default());
        assert_eq!(s.admit("a", p(6, 10, 10), &[]), Ok(0));
        assert_eq!(s.admit("b", p(6, 10, 10), &[]), Ok(1));
        assert!(
            s.admit("c", p(6, 10, 10), &[0])
                .unwrap_err()
                .reason
                .contains("CPU 0")
        );
        assert!(
            s.admit("a", p(1, 10, 10), &[])
                .unwrap_err()
                .reason
                .contains("already")
        );
        assert!(
            s.fits(&p(1, 10, 10), 7)
                .unwrap_err()
                .reason
                .contains("not available")
        );
    }

    #[test]
    fn density_is_stricter() {
        let cfg = AdmissionConfig {
            test: AdmissionTest::Density,
            ..Default::default()
        };
        let s = AdmissionSet::new([0], cfg);
        // runtime 3, deadline 5, period 10: utilisation 0.3, density 0.6
        let mut s2 = s.clone();
        assert!(s2.admit("a", p(3, 5, 10), &[]).is_ok());
        assert!(s2.fits(&p(3, 5, 10), 0).is_err());
        let mut u = AdmissionSet::new([0], AdmissionConfig::default());
        assert!(u.admit("a", p(3, 5, 10), &[]).is_ok());
        assert!(u.fits(&p(3, 5, 10), 0).is_ok());
    }

    #[test]
    fn parameter_checks() {
        let s = AdmissionSet::new([0], AdmissionConfig::default());
        assert!(s.fits(&p(6, 5, 10), 0).is_err());
        assert!(s.fits(&p(1, 10, 5), 0).is_err());
        assert!(
            s.fits(&p(1, 10, 10_000), 0)
                .unwrap_err()
                .reason
                .contains("outside")
        );
        let tiny = DeadlineParams {
            runtime_ns: 10,
            deadline_ns: 1_000_000,
            period_ns: 1_000_000,
        };
        assert!(s.fits(&tiny, 0).unwrap_err().reason.contains("minimum"));
    }

    #[test]
    fn unlimited_bound() {
        let mut s = AdmissionSet::new([0], AdmissionConfig::from_sysctl(-1, 1_000_000));
        assert!(s.admit("a", p(10, 10, 10), &[]).is_ok());
        assert!(s.admit("b", p(10, 10, 10), &[]).is_ok());
    }
}

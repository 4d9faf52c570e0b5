//! The reserve arithmetic, pure: how much free space a file system must keep, whether a reading
//! is below it, and the hysteresis that keeps the state from flapping at the edge.

/// The free space the daemon keeps on its audit and state file systems (`--storage-reserve`,
/// `--storage-reserve-percent`): the larger of the two.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reserve {
    /// At least this many bytes free.
    pub min_bytes: u64,
    /// At least this share of the file system's size free, in percent (0 to 50).
    pub min_percent: f64,
}

impl Default for Reserve {
    /// 64 MiB or 1 %, whichever is larger: 64 MiB holds about 100 000 audit records (~600 bytes
    /// each) — minutes of tool calls of every other agent at the rates measured in
    /// docs/benchmarks.md — plus a rotation of a few agent journals; 1 % scales it on large
    /// file systems, where other writers fill faster, without taking more than a sliver.
    fn default() -> Self {
        Reserve {
            min_bytes: DEFAULT_RESERVE_BYTES,
            min_percent: DEFAULT_RESERVE_PERCENT,
        }
    }
}

/// Default of `--storage-reserve`.
pub const DEFAULT_RESERVE_BYTES: u64 = 64 << 20;
/// Default of `--storage-reserve-percent`.
pub const DEFAULT_RESERVE_PERCENT: f64 = 1.0;

/// The state leaves "low" only once free space is this share of the reserve above it (and at
/// least [`MIN_HYSTERESIS`]), so a file system hovering at the edge does not flip the state at
/// every check.
const HYSTERESIS_DIVISOR: u64 = 8;
/// The smallest hysteresis (bytes).
const MIN_HYSTERESIS: u64 = 1 << 20;

/// One file system's numbers from `statvfs(3)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Size in bytes (`f_blocks * f_frsize`).
    pub total: u64,
    /// Free for unprivileged writers, as `df` shows it (`f_bavail * f_frsize`): the daemon keeps
    /// its reserve counted from what everyone else may still use, so it is never the root-only
    /// blocks that it lives on.
    pub avail: u64,
}

impl Reserve {
    /// The reserve in bytes on a file system of `total` bytes: the larger of the byte and the
    /// percent figure, never more than the file system.
    pub fn bytes_for(&self, total: u64) -> u64 {
        let pct = self.min_percent.clamp(0.0, 100.0);
        let by_percent = ((total as f64) * pct / 100.0).ceil() as u64;
        self.min_bytes.max(by_percent).min(total)
    }

    /// Whether a file system with `space` is low, given whether it was low at the last check:
    /// it becomes low below the reserve and stays low until free space is the reserve plus the
    /// hysteresis.
    pub fn is_low(&self, space: Space, was_low: bool) -> bool {
        let reserve = self.bytes_for(space.total);
        if was_low {
            space.avail < reserve.saturating_add(hysteresis(reserve))
        } else {
            space.avail < reserve
        }
    }
}

/// How far above the reserve free space must climb to leave the low state.
pub fn hysteresis(reserve: u64) -> u64 {
    (reserve / HYSTERESIS_DIVISOR).max(MIN_HYSTERESIS)
}

/// Bytes as an operator reads them: `12.0 MiB`, `1.5 GiB`, `512 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn the_larger_of_bytes_and_percent_never_more_than_the_file_system() {
        let r = Reserve::default();
        // Small file systems: 64 MiB wins (1 % of 1 GiB is ~10 MiB).
        assert_eq!(r.bytes_for(GIB), 64 * MIB);
        // 1 % of 100 GiB is 1 GiB, which wins.
        assert_eq!(r.bytes_for(100 * GIB), GIB);
        // Never more than the file system itself (a 24 MiB tmpfs).
        assert_eq!(r.bytes_for(24 * MIB), 24 * MIB);
        // Percent rounds up: 1 % of 1001 bytes is 10.01 → 11.
        let p = Reserve {
            min_bytes: 0,
            min_percent: 1.0,
        };
        assert_eq!(p.bytes_for(1001), 11);
        // Out-of-range percents are clamped, not trusted.
        let wild = Reserve {
            min_bytes: 0,
            min_percent: 250.0,
        };
        assert_eq!(wild.bytes_for(1000), 1000);
        let neg = Reserve {
            min_bytes: 5,
            min_percent: -3.0,
        };
        assert_eq!(neg.bytes_for(1000), 5);
    }

    #[test]
    fn low_below_the_reserve_and_back_only_past_the_hysteresis() {
        let r = Reserve {
            min_bytes: 16 * MIB,
            min_percent: 0.0,
        };
        let at = |avail| Space { total: GIB, avail };
        assert!(
            !r.is_low(at(16 * MIB), false),
            "exactly the reserve is not low"
        );
        assert!(r.is_low(at(16 * MIB - 1), false));
        // Once low: 16 MiB + max(2 MiB, 1 MiB) = 18 MiB to leave.
        assert_eq!(hysteresis(16 * MIB), 2 * MIB);
        assert!(r.is_low(at(17 * MIB), true));
        assert!(r.is_low(at(18 * MIB - 1), true));
        assert!(!r.is_low(at(18 * MIB), true));
        // A tiny reserve still gets 1 MiB of hysteresis.
        assert_eq!(hysteresis(100), MIB);
        // A full file system is low whatever was before.
        assert!(r.is_low(at(0), false));
        assert!(r.is_low(at(0), true));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(64 * MIB), "64.0 MiB");
        assert_eq!(human(3 * GIB / 2), "1.5 GiB");
    }
}

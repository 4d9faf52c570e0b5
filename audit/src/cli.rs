//! `agentctl audit verify` and `agentctl audit show`, reading the files directly (no daemon).
//!
//! The CLI parses its flags and calls these; they print to the given writers and return the exit
//! code: 0 success, 1 the log does not verify (or `show` met a bad line), 2 usage error (a bad
//! `--since`), 3 a file cannot be read.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::reader::{Filter, ReadError, Reader};
use crate::verify::VerifyError;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: the log does not verify.
pub const EXIT_BAD: i32 = 1;
/// Exit code: usage error.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: a file cannot be read.
pub const EXIT_NO_FILE: i32 = 3;

/// `agentctl audit verify [--log PATH] [--key PATH.pub]`: prints a summary on success, or the
/// first bad record on `err`.
pub fn verify(log: &Path, public_key: &Path, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let key = match crate::key::load_public(public_key) {
        Ok(k) => k,
        Err(e) => {
            let _ = writeln!(err, "agentctl: {e}");
            return EXIT_NO_FILE;
        }
    };
    match crate::verify::verify(log, &key) {
        Ok(r) => {
            let _ = writeln!(
                out,
                "{}: OK: {} records (seq 1..{}), {} signed checkpoints{}, head file {}; {} records after the last checkpoint",
                log.display(),
                r.records,
                r.last_seq,
                r.checkpoints,
                r.last_checkpoint_seq
                    .map(|s| format!(" (last at seq {s})"))
                    .unwrap_or_default(),
                r.head_seq
                    .map(|s| format!("at seq {s}"))
                    .unwrap_or_else(|| {
                        "absent (truncation past the last checkpoint cannot be detected)".into()
                    }),
                r.unsigned_tail,
            );
            if let Some((offset, len)) = r.incomplete_tail {
                let _ = writeln!(
                    out,
                    "{}: a partial last line of {len} bytes at byte {offset} (a write in progress, or a crash the next start will recover from)",
                    log.display()
                );
            }
            EXIT_OK
        }
        Err(e @ (VerifyError::Io { .. } | VerifyError::Head(_))) => {
            let _ = writeln!(err, "agentctl: {e}");
            EXIT_NO_FILE
        }
        Err(e) => {
            let _ = writeln!(err, "agentctl: {e}");
            if let Some(seq) = e.seq() {
                let _ = writeln!(err, "agentctl: first bad record: seq {seq}");
            }
            EXIT_BAD
        }
    }
}

/// Options of `agentctl audit show`.
#[derive(Debug, Clone, Default)]
pub struct ShowOptions {
    /// `--agent NAME`.
    pub agent: Option<String>,
    /// `--since WHEN` (see [`parse_since`]).
    pub since: Option<String>,
    /// `-f`, `--follow`.
    pub follow: bool,
    /// `--json`: the stored lines as they are.
    pub json: bool,
}

/// `agentctl audit show [--agent NAME] [--since WHEN] [-f] [--json]`. With `follow`, returns
/// only on an error (or a closed `out`).
pub fn show(log: &Path, opts: &ShowOptions, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let since_us = match opts.since.as_deref().map(|s| parse_since(s, now_us())) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            let _ = writeln!(err, "agentctl: --since: {e}");
            return EXIT_USAGE;
        }
    };
    let filter = Filter {
        agent: opts.agent.clone(),
        since_us,
        kind: None,
    };
    let mut reader = match Reader::open(log, filter) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "agentctl: {e}");
            return EXIT_NO_FILE;
        }
    };
    if opts.follow {
        reader = reader.follow(Duration::from_millis(200));
    }
    let mut code = EXIT_OK;
    for item in reader {
        let res = match item {
            Ok(e) if opts.json => writeln!(out, "{}", e.line),
            Ok(e) => writeln!(out, "{}", human(&e.record)),
            Err(e @ ReadError::BadLine { .. }) => {
                let _ = writeln!(err, "agentctl: {e}");
                code = EXIT_BAD;
                Ok(())
            }
            Err(e) => {
                let _ = writeln!(err, "agentctl: {e}");
                return EXIT_NO_FILE;
            }
        };
        if res.is_err() || (opts.follow && out.flush().is_err()) {
            // The reader went away (`| head`): not an error.
            return code;
        }
    }
    code
}

/// One record for people: `TIME SEQ KIND TENANT/AGENT DECISION DETAIL`.
pub fn human(r: &crate::StoredRecord) -> String {
    let who = match (r.tenant.as_str(), r.agent.as_str()) {
        ("", "") => "-".to_string(),
        ("", a) => a.to_string(),
        (t, a) => format!("{t}/{a}"),
    };
    format!(
        "{} {:>8} {:<10} {} {} {}",
        format_time_us(r.time_us),
        r.seq,
        r.kind.as_str(),
        who,
        r.decision.map_or("-", |d| d.as_str()),
        r.detail
    )
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `2026-11-22T22:10:53.123456Z`.
pub fn format_time_us(us: u64) -> String {
    let secs = (us / 1_000_000) as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        us % 1_000_000
    )
}

/// Parses `--since`: a UTC date `YYYY-MM-DD`, `YYYY-MM-DD HH:MM[:SS]` or
/// `YYYY-MM-DDTHH:MM[:SS][Z]`; `@SECONDS` since the epoch; or a span before now: `90s`, `15m`,
/// `2h`, `7d` (also `-15m`, `15m ago`). Returns µs since the epoch.
pub fn parse_since(s: &str, now_us: u64) -> Result<u64, String> {
    let s = s.trim();
    let bad = || {
        format!(
            "cannot read {s:?}: use YYYY-MM-DD[ HH:MM[:SS]] (UTC), @UNIX_SECONDS, or a span before now such as 15m, 2h, 7d"
        )
    };
    if let Some(secs) = s.strip_prefix('@') {
        let secs: u64 = secs.parse().map_err(|_| bad())?;
        return Ok(secs.saturating_mul(1_000_000));
    }
    let rel = s.trim_start_matches('-').trim_end_matches(" ago").trim();
    if let Some(unit) = rel.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let n = &rel[..rel.len() - 1];
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            let n: u64 = n.parse().map_err(|_| bad())?;
            let unit_s = match unit {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad()),
            };
            return Ok(now_us.saturating_sub(n.saturating_mul(unit_s * 1_000_000)));
        }
    }
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t.trim_end_matches('Z'))),
        None => (s, None),
    };
    let num = |x: &str, lo: i64, hi: i64| -> Result<i64, String> {
        let v: i64 = x.parse().map_err(|_| bad())?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(bad())
        }
    };
    let dp: Vec<&str> = date.split('-').collect();
    let [y, mo, d] = dp.as_slice() else {
        return Err(bad());
    };
    let (y, mo, d) = (num(y, 1970, 9999)?, num(mo, 1, 12)?, num(d, 1, 31)?);
    let mut secs = days_from_civil(y, mo, d) * 86_400;
    if let Some(t) = time {
        let tp: Vec<&str> = t.split(':').collect();
        let (h, mi, se) = match tp.as_slice() {
            [h, mi] => (num(h, 0, 23)?, num(mi, 0, 59)?, 0),
            [h, mi, se] => (num(h, 0, 23)?, num(mi, 0, 59)?, num(se, 0, 60)?),
            _ => return Err(bad()),
        };
        secs += h * 3600 + mi * 60 + se;
    }
    Ok(secs as u64 * 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(format_time_us(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(parse_since("2026-11-22", 0).unwrap(), 1_795_305_600_000_000);
        let t = parse_since("2026-11-22 22:10:53", 0).unwrap();
        assert_eq!(format_time_us(t + 5), "2026-11-22T22:10:53.000005Z");
        assert_eq!(parse_since("2026-11-22T22:10:53Z", 0).unwrap(), t);
        assert_eq!(
            parse_since("2026-11-22", 0).unwrap(),
            t - (22 * 3600 + 10 * 60 + 53) * 1_000_000
        );
        assert_eq!(parse_since("@10", 0).unwrap(), 10_000_000);
        assert_eq!(parse_since("15m", 3_600_000_000).unwrap(), 2_700_000_000);
        assert_eq!(parse_since("-1h", 7_200_000_000).unwrap(), 3_600_000_000);
        assert_eq!(parse_since("2d ago", 0).unwrap(), 0);
        assert!(parse_since("yesterday", 0).is_err());
        assert!(parse_since("2026-13-01", 0).is_err());
    }
}

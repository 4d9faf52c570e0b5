//! Times as `agentctl logs --since/--until` take them, like journalctl: `2026-11-25 22:40:00`,
//! `2026-11-25T22:40`, `2026-11-25` (UTC, the journal's times are UTC), `@UNIX_SECONDS`, `now`,
//! `today`, `yesterday`, and relative `-30s`, `-5m`, `-2h`, `-1d` or `5 min ago`.

use agentos_api::wire::days_from_civil;

const SEC: u64 = 1_000_000;

/// µs since the epoch for `s`, relative to `now_us`.
pub fn parse(s: &str, now_us: u64) -> Result<u64, String> {
    let t = s.trim();
    let day0 = now_us / (86_400 * SEC) * 86_400 * SEC;
    match t {
        "now" => return Ok(now_us),
        "today" => return Ok(day0),
        "yesterday" => return Ok(day0.saturating_sub(86_400 * SEC)),
        "tomorrow" => return Ok(day0 + 86_400 * SEC),
        _ => {}
    }
    if let Some(secs) = t.strip_prefix('@') {
        return secs
            .parse::<f64>()
            .map(|s| (s.max(0.0) * 1e6) as u64)
            .map_err(|_| bad(s));
    }
    let rel = t
        .strip_prefix('-')
        .or_else(|| t.strip_suffix("ago").map(str::trim));
    if let Some(r) = rel {
        return span(r)
            .map(|d| now_us.saturating_sub(d))
            .ok_or_else(|| bad(s));
    }
    if let Some(r) = t.strip_prefix('+') {
        return span(r).map(|d| now_us + d).ok_or_else(|| bad(s));
    }
    absolute(t).ok_or_else(|| bad(s))
}

fn bad(s: &str) -> String {
    format!(
        "cannot read {s:?} as a time: use YYYY-MM-DD [HH:MM[:SS]] (UTC), @UNIX_SECONDS, now, \
         today, yesterday, or -5m / \"5 min ago\""
    )
}

/// `30s`, `5m`, `5 min`, `2h`, `1d`, `1h30m` → µs.
fn span(s: &str) -> Option<u64> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut num = String::new();
    let mut unit = String::new();
    let mut flush = |num: &mut String, unit: &mut String| -> Option<()> {
        let n: f64 = num.parse().ok()?;
        let mult = match unit.as_str() {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 604_800.0,
            _ => return None,
        };
        total += n * mult;
        num.clear();
        unit.clear();
        Some(())
    };
    for c in s.chars() {
        if c.is_ascii_digit() || c == '.' {
            if !unit.is_empty() {
                flush(&mut num, &mut unit)?;
            }
            num.push(c);
        } else if num.is_empty() {
            return None;
        } else {
            unit.push(c);
        }
    }
    flush(&mut num, &mut unit)?;
    Some((total * 1e6) as u64)
}

/// `YYYY-MM-DD[( |T)HH:MM[:SS[.frac]]][Z]`.
fn absolute(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = match s.split_once([' ', 'T']) {
        Some((d, t)) => (d, Some(t.trim())),
        None => (s, None),
    };
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut secs = 0f64;
    if let Some(t) = time {
        let mut p = t.split(':');
        let h: u32 = p.next()?.parse().ok()?;
        let mi: u32 = p.next()?.parse().ok()?;
        let se: f64 = p.next().map_or(Some(0.0), |x| x.parse().ok())?;
        if p.next().is_some() || h > 23 || mi > 59 || !(0.0..61.0).contains(&se) {
            return None;
        }
        secs = f64::from(h * 3600 + mi * 60) + se;
    }
    let days = days_from_civil(y, m, day);
    if days < 0 {
        return None;
    }
    Some(days as u64 * 86_400 * SEC + (secs * 1e6) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journalctl_like_times() {
        let now = absolute("2026-11-25 22:40:00").unwrap();
        assert_eq!(parse("now", now), Ok(now));
        assert_eq!(parse("-5m", now), Ok(now - 300 * SEC));
        assert_eq!(parse("5 min ago", now), Ok(now - 300 * SEC));
        assert_eq!(parse("-1h30m", now), Ok(now - 5400 * SEC));
        assert_eq!(
            parse("today", now),
            absolute("2026-11-25").ok_or(String::new())
        );
        assert_eq!(
            parse("yesterday", now),
            absolute("2026-11-24").ok_or(String::new())
        );
        assert_eq!(parse("2026-11-25T22:39:30Z", now), Ok(now - 30 * SEC));
        assert_eq!(parse("@1", now), Ok(SEC));
        for bad in [
            "",
            "soon",
            "2026-13-01",
            "2026-11-25 25:00",
            "-5x",
            "5 parsecs ago",
        ] {
            assert!(parse(bad, now).is_err(), "{bad:?} was accepted");
        }
    }
}

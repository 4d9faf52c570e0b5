//! Units: CPU quantities, memory sizes, token counts and milliseconds.
//!
//! All parsing is exact (decimal strings, no floating point) and overflow-checked.

/// Most CPU accepted: 4096 cores.
pub const MAX_CPU_MILLIS: u64 = 4096 * 1000;
/// Most memory accepted: 64 TiB.
pub const MAX_MEMORY_BYTES: u64 = 64 << 40;

/// Parse a non-negative decimal `int[.frac]` scaled by `10^scale_digits`; `None` when it does
/// not parse or is not a whole number after scaling, `Err` text when it overflows.
fn decimal_scaled(s: &str, scale: u64) -> Result<u64, &'static str> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return Err("not a number");
    }
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err("not a number");
    }
    if int.len() > 30 || frac.len() > 30 {
        return Err("too large");
    }
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| "too large")?
    };
    let mut total = int_v.checked_mul(u128::from(scale)).ok_or("too large")?;
    // fractional part: frac / 10^len * scale must be whole
    if !frac.is_empty() {
        let f: u128 = frac.parse().map_err(|_| "too large")?;
        let denom = 10u128
            .checked_pow(u32::try_from(frac.len()).map_err(|_| "too large")?)
            .ok_or("too large")?;
        let num = f.checked_mul(u128::from(scale)).ok_or("too large")?;
        if num % denom != 0 {
            return Err("too precise");
        }
        total = total.checked_add(num / denom).ok_or("too large")?;
    }
    u64::try_from(total).map_err(|_| "too large")
}

/// CPU: `"1"` = 1000 millicores, `"0.5"` = 500, `"500m"` = 500; numbers `1`, `0.5` too.
pub fn parse_cpu(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, scale) = match s.strip_suffix('m') {
        Some(n) => (n, 1),
        None => (s, 1000),
    };
    let v = decimal_scaled(num, scale).map_err(|e| match e {
        "too precise" => format!("cpu \"{s}\" is finer than 1m (one millicore)"),
        "too large" => format!(
            "cpu \"{s}\" is too large (at most {} cores)",
            MAX_CPU_MILLIS / 1000
        ),
        _ => format!("cpu \"{s}\" is not a CPU quantity (write \"1\", \"0.5\" or \"500m\")"),
    })?;
    if v > MAX_CPU_MILLIS {
        return Err(format!(
            "cpu \"{s}\" is too large (at most {} cores)",
            MAX_CPU_MILLIS / 1000
        ));
    }
    Ok(v)
}

/// Format millicores the way `parse_cpu` reads them: whole cores as `"2"`, else `"500m"`.
pub fn format_cpu(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        format!("{}", millis / 1000)
    } else {
        format!("{millis}m")
    }
}

const MEMORY_UNITS: &[(&str, u64)] = &[
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("kB", 1_000),
    ("KB", 1_000),
    ("B", 1),
];

/// Memory: `"2GiB"`, `"512MiB"`, `"1.5GiB"`, `"100MB"`, `"4096"` or `4096` (bytes).
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit, mult) = MEMORY_UNITS
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim_end(), *u, *m)))
        .unwrap_or((t, "", 1));
    let v = decimal_scaled(num, mult).map_err(|e| match e {
        "too precise" => format!("memory \"{s}\" is not a whole number of bytes"),
        "too large" => format!("memory \"{s}\" is too large (at most 64TiB)"),
        _ => {
            let near = crate::diag::suggest(
                t.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.').trim(),
                MEMORY_UNITS.iter().map(|(u, _)| *u),
            );
            match near {
                Some(u) if !unit.is_empty() || !num.is_empty() => format!(
                    "memory \"{s}\" has an unknown unit (did you mean \"{u}\"? units: B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
                ),
                _ => format!(
                    "memory \"{s}\" is not a size (write \"2GiB\", \"512MiB\" or a number of bytes)"
                ),
            }
        }
    })?;
    if v > MAX_MEMORY_BYTES {
        return Err(format!("memory \"{s}\" is too large (at most 64TiB)"));
    }
    Ok(v)
}

/// Format bytes with the largest binary unit that divides them exactly (`2147483648` → `2GiB`).
pub fn format_memory(bytes: u64) -> String {
    for (u, m) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= m && bytes.is_multiple_of(m) {
            return format!("{}{u}", bytes / m);
        }
    }
    format!("{bytes}B")
}

/// Token counts: `16000`, `"50k"`, `"2M"`, `"1G"` (decimal multipliers).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix(['k', 'K']) {
        (n, 1_000)
    } else if let Some(n) = t.strip_suffix('M') {
        (n, 1_000_000)
    } else if let Some(n) = t.strip_suffix('G') {
        (n, 1_000_000_000)
    } else {
        (t, 1)
    };
    decimal_scaled(num, mult).map_err(|e| match e {
        "too large" => format!("\"{s}\" is too large"),
        "too precise" => format!("\"{s}\" is not a whole number"),
        _ => format!("\"{s}\" is not a count (write 50000 or \"50k\")"),
    })
}

/// Milliseconds as a decimal string (`"10"`, `"2.5"`) to nanoseconds.
pub fn parse_ms(s: &str) -> Result<u64, String> {
    decimal_scaled(s.trim(), 1_000_000).map_err(|e| match e {
        "too large" => format!("{s} ms is too large"),
        "too precise" => format!("{s} ms is finer than 1 ns"),
        _ => format!("\"{s}\" is not a number of milliseconds"),
    })
}

/// Nanoseconds as milliseconds text (`2500000` → `"2.5"`).
pub fn format_ms(ns: u64) -> String {
    let whole = ns / 1_000_000;
    let frac = ns % 1_000_000;
    if frac == 0 {
        whole.to_string()
    } else {
        let f = format!("{frac:06}");
        format!("{whole}.{}", f.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpu() {
        assert_eq!(parse_cpu("1"), Ok(1000));
        assert_eq!(parse_cpu("0.5"), Ok(500));
        assert_eq!(parse_cpu("500m"), Ok(500));
        assert_eq!(parse_cpu(".25"), Ok(250));
        assert_eq!(parse_cpu("2.0"), Ok(2000));
        assert!(parse_cpu("0.0005").unwrap_err().contains("finer than 1m"));
        assert!(parse_cpu("1e3").is_err());
        assert!(parse_cpu("-1").is_err());
        assert!(parse_cpu("").is_err());
        assert!(
            parse_cpu("99999999999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_cpu("5000").unwrap_err().contains("too large"));
    }

    #[test]
    fn memory() {
        assert_eq!(parse_memory("2GiB"), Ok(2 << 30));
        assert_eq!(parse_memory("512MiB"), Ok(512 << 20));
        assert_eq!(parse_memory("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_memory("100MB"), Ok(100_000_000));
        assert_eq!(parse_memory("4096"), Ok(4096));
        assert_eq!(parse_memory("4096B"), Ok(4096));
        assert!(
            parse_memory("2GIB")
                .unwrap_err()
                .contains("did you mean \"GiB\"")
        );
        assert!(parse_memory("1.5B").unwrap_err().contains("whole number"));
        assert!(parse_memory("100TiB").unwrap_err().contains("too large"));
        assert!(parse_memory("lots").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_cpu(1000), "1");
        assert_eq!(format_cpu(500), "500m");
        assert_eq!(format_memory(2 << 30), "2GiB");
        assert_eq!(format_memory(1000), "1000B");
        assert_eq!(format_ms(2_500_000), "2.5");
        assert_eq!(format_ms(10_000_000), "10");
        assert_eq!(parse_count("50k"), Ok(50_000));
        assert_eq!(parse_ms("2.5"), Ok(2_500_000));
    }

    proptest! {
        #[test]
        fn cpu_round_trips(m in 1u64..=MAX_CPU_MILLIS) {
            prop_assert_eq!(parse_cpu(&format_cpu(m)), Ok(m));
        }

        #[test]
        fn memory_round_trips(b in 1u64..=MAX_MEMORY_BYTES) {
            prop_assert_eq!(parse_memory(&format_memory(b)), Ok(b));
        }

        #[test]
        fn memory_units_round_trip(n in 1u64..4096, u in 0usize..4) {
            let unit = ["KiB", "MiB", "GiB", "TiB"][u];
            let bytes = n << (10 * (u as u32 + 1));
            prop_assume!(bytes <= MAX_MEMORY_BYTES);
            prop_assert_eq!(parse_memory(&format!("{n}{unit}")), Ok(bytes));
        }

        #[test]
        fn ms_round_trips(ns in 0u64..u64::MAX / 2) {
            prop_assert_eq!(parse_ms(&format_ms(ns)), Ok(ns));
        }

        #[test]
        fn unit_parsers_never_panic(s in ".{0,40}") {
            let _ = parse_cpu(&s);
            let _ = parse_memory(&s);
            let _ = parse_count(&s);
            let _ = parse_ms(&s);
        }
    }
}

//! Parsing the text of audit records (pure).

use super::{AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN, AUDIT_SECCOMP};

/// `audit(SECONDS.MILLIS:SERIAL)`: when the kernel made the record, and its serial number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    pub time_ms: u64,
    pub serial: u64,
}

/// `AUDIT_SECCOMP`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeccompRecord {
    pub stamp: Stamp,
    pub pid: u32,
    pub uid: Option<u32>,
    pub comm: String,
    pub exe: String,
    pub arch: u32,
    pub syscall: i64,
    pub sig: i64,
    /// The filter's action (`SECCOMP_RET_*` without its data: the errno is not logged).
    pub code: u32,
}

/// `AUDIT_LANDLOCK_ACCESS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockAccess {
    pub stamp: Stamp,
    pub domain: u64,
    /// `fs.read_file`, `net.connect_tcp`, `scope.signal`, …
    pub blockers: Vec<String>,
    /// What the kernel said about the object (`path`, `dev`, `ino`, `daddr`, `dest`, `opid`…).
    pub object: Vec<(String, String)>,
}

/// `AUDIT_LANDLOCK_DOMAIN`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockDomain {
    pub stamp: Stamp,
    pub domain: u64,
    /// `allocated` (with the creator) or `deallocated` (with the denial count).
    pub status: String,
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub exe: Option<String>,
    pub comm: Option<String>,
    pub denials: Option<u64>,
}

/// An audit record this module understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Seccomp(SeccompRecord),
    LandlockAccess(LandlockAccess),
    LandlockDomain(LandlockDomain),
}

/// Parse the text of one audit record of netlink message type `msg_type`; `None` for the types
/// this module does not use and for records it cannot read.
pub fn parse(msg_type: u16, text: &str) -> Option<Event> {
    let text = text.trim_end_matches(['\0', '\n']);
    let (stamp, rest) = parse_stamp(text)?;
    let f = fields(rest);
    let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let num = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
    let unum = |k: &str| get(k).and_then(|v| v.parse::<u32>().ok());
    let hex =
        |k: &str| get(k).and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    match msg_type {
        AUDIT_SECCOMP => Some(Event::Seccomp(SeccompRecord {
            stamp,
            pid: unum("pid")?,
            uid: unum("uid"),
            comm: get("comm").unwrap_or("").to_string(),
            exe: get("exe").unwrap_or("").to_string(),
            arch: get("arch")
                .and_then(|v| u32::from_str_radix(v, 16).ok())
                .unwrap_or(0),
            syscall: num("syscall")?,
            sig: num("sig").unwrap_or(0),
            code: hex("code")? as u32,
        })),
        AUDIT_LANDLOCK_ACCESS => {
            let domain = hex("domain")?;
            let blockers = get("blockers")
                .unwrap_or("")
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let object = f
                .iter()
                .filter(|(k, _)| k != "domain" && k != "blockers")
                .cloned()
                .collect();
            Some(Event::LandlockAccess(LandlockAccess {
                stamp,
                domain,
                blockers,
                object,
            }))
        }
        AUDIT_LANDLOCK_DOMAIN => Some(Event::LandlockDomain(LandlockDomain {
            stamp,
            domain: hex("domain")?,
            status: get("status").unwrap_or("").to_string(),
            pid: unum("pid"),
            uid: unum("uid"),
            exe: get("exe").map(str::to_string),
            comm: get("comm").map(str::to_string),
            denials: get("denials").and_then(|v| v.parse().ok()),
        })),
        _ => None,
    }
}

fn parse_stamp(text: &str) -> Option<(Stamp, &str)> {
    let rest = text.strip_prefix("audit(")?;
    let (inner, rest) = rest.split_once("):")?;
    let (time, serial) = inner.split_once(':')?;
    let (sec, ms) = time.split_once('.').unwrap_or((time, "0"));
    let time_ms = sec.parse::<u64>().ok()? * 1000 + ms.parse::<u64>().ok()?;
    Some((
        Stamp {
            time_ms,
            serial: serial.parse().ok()?,
        },
        rest,
    ))
}

/// `key=value` pairs. A value is either `"quoted"` (no escapes: the kernel quotes only strings
/// without special characters) or a bare token; the kernel writes untrusted strings that need
/// escaping (a path with a space, a comm with a quote) as bare hex, which is decoded for the
/// keys that hold such strings.
fn fields(text: &str) -> Vec<(String, String)> {
    const UNTRUSTED: &[&str] = &["comm", "exe", "path", "ocomm", "name", "cwd"];
    let mut out = Vec::new();
    let mut s = text.trim_start();
    while !s.is_empty() {
        let Some(eq) = s.find('=') else { break };
        let key = s[..eq].trim();
        let after = &s[eq + 1..];
        let (value, rest) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            let raw = &after[..end];
            let v = if UNTRUSTED.contains(&key) {
                decode_hex(raw).unwrap_or_else(|| raw.to_string())
            } else {
                raw.to_string()
            };
            (v, &after[end..])
        };
        if !key.is_empty() {
            out.push((key.to_string(), value));
        }
        s = rest.trim_start();
    }
    out
}

fn decode_hex(s: &str) -> Option<String> {
    if s.is_empty() || !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

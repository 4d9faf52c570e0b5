//! `net.connect` scopes that declare a content check against domain fronting:
//! `https://NAME[:PORT]` (TLS: the ClientHello's SNI must be a name the grant matches, default
//! port 443) and `http://NAME[:PORT]` (HTTP/1: the request's `Host` must, default port 80).
//! NAME is a host name or a `*.SUFFIX` wildcard, never an address, prefix or `*` (an address
//! grant names no name to compare with). The daemon (`agentosd::enforce::net`) parses scopes
//! with [`checked_scope`] too, so `agentctl validate` and the daemon agree.

/// What a checked grant's connections must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// `https://`: a TLS ClientHello whose `server_name` the grant matches.
    Tls,
    /// `http://`: an HTTP/1 request whose `Host` header the grant matches.
    Http,
}

impl Check {
    /// The scheme that declares it (`https://`, `http://`).
    pub fn scheme(self) -> &'static str {
        match self {
            Check::Tls => HTTPS_SCHEME,
            Check::Http => HTTP_SCHEME,
        }
    }

    /// The port a scope without one means.
    pub fn default_port(self) -> u16 {
        match self {
            Check::Tls => 443,
            Check::Http => 80,
        }
    }
}

/// The prefix of a TLS-checked name grant.
pub const HTTPS_SCHEME: &str = "https://";
/// The prefix of an HTTP-checked name grant.
pub const HTTP_SCHEME: &str = "http://";

/// A checked scope, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedScope<'a> {
    pub check: Check,
    /// A name or `*.SUFFIX`, as written (case kept).
    pub host: &'a str,
    pub port: u16,
}

/// `s` parsed as `https://NAME[:PORT]` or `http://NAME[:PORT]`: `None` when it has neither
/// prefix (another scope form), else the scope or what is wrong with it (a message quoting `s`,
/// for the caller to prefix with its field).
pub fn checked_scope(s: &str) -> Option<Result<CheckedScope<'_>, String>> {
    let (check, rest) = if let Some(r) = s.strip_prefix(HTTPS_SCHEME) {
        (Check::Tls, r)
    } else if let Some(r) = s.strip_prefix(HTTP_SCHEME) {
        (Check::Http, r)
    } else {
        return None;
    };
    let scheme = check.scheme();
    let bad = |why: &str| {
        Err(format!(
            "\"{s}\": {why} ({scheme}NAME or {scheme}NAME:PORT, NAME a host name or *.SUFFIX: \"{scheme}api.example.com\", \"{scheme}*.example.com:8443\")"
        ))
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => (h, Some(p)),
        _ => (rest, None),
    };
    let port = match port {
        None => check.default_port(),
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Some(bad(
                    "the port must be 1-65535 (no \"*\": the check names one service)",
                ));
            }
        },
    };
    if host.contains('/') || host.contains('?') || host.contains('#') || host.contains('@') {
        return Some(bad(
            "no path, query or user: the grant is a host and a port",
        ));
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if host == "*" || bare.parse::<std::net::IpAddr>().is_ok() {
        return Some(bad(
            "the check compares the name the connection carries with a granted name: an address or \"*\" names none",
        ));
    }
    if host.contains('*') {
        if let Some(e) = crate::decode::wildcard_error(host) {
            return Some(Err(format!("\"{s}\": {e}")));
        }
    } else if !name_ok(host.strip_suffix('.').unwrap_or(host)) {
        return Some(bad(
            "NAME is not a DNS name (labels of 1-63 letters, digits, '-' and '_', 253 bytes in all)",
        ));
    }
    Some(Ok(CheckedScope { check, host, port }))
}

/// A host name: labels of 1-63 letters, digits, `-` (not at a label's ends) and `_`, 253 bytes
/// in all.
fn name_ok(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn forms() {
        fn ok(s: &str) -> CheckedScope<'_> {
            checked_scope(s).unwrap().unwrap()
        }
        assert_eq!(
            ok("https://api.example.test"),
            CheckedScope {
                check: Check::Tls,
                host: "api.example.test",
                port: 443
            }
        );
        assert_eq!(ok("https://*.example.test:8443").port, 8443);
        assert_eq!(ok("https://*.example.test:8443").host, "*.example.test");
        assert_eq!(ok("http://plain.example.test").port, 80);
        assert_eq!(ok("http://plain.example.test").check, Check::Http);
        assert!(checked_scope("api.example.test:443").is_none());
        assert!(checked_scope("udp://api.example.test:443").is_none());
        for bad in [
            "https://",
            "https://10.0.0.1",
            "https://10.0.0.1:443",
            "https://[2001:db8::1]:443",
            "https://*",
            "https://*:443",
            "https://api.example.test:*",
            "https://api.example.test:0",
            "https://api.example.test:99999",
            "https://api.example.test/",
            "https://api.example.test/v1",
            "https://user@api.example.test",
            "https://*.test",
            "https://a.*.example.test",
            "http://-bad.example.test",
            "http://bad..example.test",
            "http://sp ace.example.test",
        ] {
            let e = checked_scope(bad).unwrap().unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}

//! The names a connection carries, read from its first bytes by hand-written parsers that never
//! trust a length: the `server_name` of a TLS ClientHello (across as many records and segments as
//! it was split into, at most [`HELLO_MAX`] bytes) and the `Host` of an HTTP/1 request head (at
//! most [`HEAD_MAX`] bytes). Both answer `Ok(None)` while more bytes are needed. Anything
//! unusual is an error: the SNI/Host proxy refuses what it cannot read (`dns::sni`).

/// Bytes of TLS records the proxy reads for one ClientHello.
pub const HELLO_MAX: usize = 16 * 1024;
/// Bytes of an HTTP request head.
pub const HEAD_MAX: usize = 8 * 1024;

/// `encrypted_client_hello` (ECH): the real name is encrypted, the outer one is the CDN's.
const EXT_ECH: u16 = 0xfe0d;
const EXT_SERVER_NAME: u16 = 0;

/// Why the first bytes of a connection are refused, as the audit record's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SniffError {
    #[error("not-tls")]
    NotTls,
    #[error("malformed")]
    Malformed(&'static str),
    #[error("no-sni")]
    NoSni,
    #[error("ech")]
    Ech,
    #[error("too-large")]
    TooLarge,
    #[error("not-http")]
    NotHttp,
    #[error("http2")]
    Http2,
    #[error("connect-method")]
    Connect,
    #[error("no-host")]
    NoHost,
}

impl SniffError {
    /// What was wrong, for the record's `detail`.
    pub fn detail(&self) -> &'static str {
        match self {
            SniffError::NotTls => "the first bytes are not a TLS handshake record",
            SniffError::Malformed(why) => why,
            SniffError::NoSni => "the ClientHello has no server_name (an address literal?)",
            SniffError::Ech => "the ClientHello offers Encrypted Client Hello: the name is hidden",
            SniffError::TooLarge => "the ClientHello or request head is over the proxy's bound",
            SniffError::NotHttp => "the first bytes are not an HTTP/1 request line",
            SniffError::Http2 => "HTTP/2 with prior knowledge (the proxy reads HTTP/1 only)",
            SniffError::Connect => "CONNECT (a tunnel to another host) is never let through",
            SniffError::NoHost => "the request has no Host header, or more than one",
        }
    }
}

/// A bounded reader over a byte slice: every length is checked against what is left.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SniffError> {
        if self.b.len() < n {
            return Err(SniffError::Malformed(
                "a ClientHello length runs past its end",
            ));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn u8(&mut self) -> Result<usize, SniffError> {
        Ok(self.take(1)?[0].into())
    }

    fn u16(&mut self) -> Result<usize, SniffError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn vec8(&mut self) -> Result<&'a [u8], SniffError> {
        let n = self.u8()?;
        self.take(n)
    }

    fn vec16(&mut self) -> Result<&'a [u8], SniffError> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// A host name as the check compares it: ASCII letters, digits, `-` and `_` in labels of 1-63
/// bytes, at most 253 in all, lower-cased; no trailing dot, no address literal.
fn host_name(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?;
    let ok = (1..=253).contains(&s.len())
        && s.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        && s.parse::<std::net::IpAddr>().is_err();
    ok.then(|| s.to_ascii_lowercase())
}

/// The SNI of the ClientHello at the start of `buf` (TLS records as the client sent them):
/// `Ok(None)` while more bytes are needed.
pub fn client_hello_sni(buf: &[u8]) -> Result<Option<String>, SniffError> {
    let mut hs: Vec<u8> = Vec::new();
    let mut pos = 0;
    loop {
        let Some(h) = buf.get(pos..pos + 5) else {
            // A first byte that cannot start a handshake record needs no more bytes to refuse.
            if buf.get(pos).is_some_and(|t| *t != 0x16) {
                return Err(if pos == 0 {
                    SniffError::NotTls
                } else {
                    SniffError::Malformed("a record other than a handshake inside the ClientHello")
                });
            }
            return if buf.len() > HELLO_MAX + 5 {
                Err(SniffError::TooLarge)
            } else {
                Ok(None)
            };
        };
        if h[0] != 0x16 || h[1] != 3 {
            return Err(if pos == 0 {
                SniffError::NotTls
            } else {
                SniffError::Malformed("a record other than a handshake inside the ClientHello")
            });
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if len == 0 || len > 16384 {
            return Err(SniffError::Malformed(
                "a TLS record of length 0 or over 2^14",
            ));
        }
        if pos + 5 + len > HELLO_MAX + 5 * 64 {
            return Err(SniffError::TooLarge);
        }
        let Some(payload) = buf.get(pos + 5..pos + 5 + len) else {
            return Ok(None);
        };
        hs.extend_from_slice(payload);
        pos += 5 + len;
        if hs.len() < 4 {
            continue;
        }
        if hs[0] != 1 {
            return Err(SniffError::Malformed(
                "the first handshake message is not a ClientHello",
            ));
        }
        let hlen = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
        if hlen > HELLO_MAX {
            return Err(SniffError::TooLarge);
        }
        if hs.len() < 4 + hlen {
            continue;
        }
        if hs.len() > 4 + hlen {
            // Another handshake message in the same flight: a client sends nothing else
            // before the server's answer.
            return Err(SniffError::Malformed(
                "bytes after the ClientHello in its records",
            ));
        }
        return hello_sni(&hs[4..]).map(Some);
    }
}

/// The SNI of a ClientHello body (after the handshake header).
fn hello_sni(body: &[u8]) -> Result<String, SniffError> {
    let mut c = Cursor { b: body };
    c.take(2 + 32)?; // legacy_version, random
    if c.vec8()?.len() > 32 {
        return Err(SniffError::Malformed("a session id over 32 bytes"));
    }
    let suites = c.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(SniffError::Malformed("cipher suites of odd or zero length"));
    }
    if c.vec8()?.is_empty() {
        return Err(SniffError::Malformed("no compression method"));
    }
    if c.b.is_empty() {
        return Err(SniffError::NoSni); // no extensions at all
    }
    let mut exts = Cursor { b: c.vec16()? };
    if !c.b.is_empty() {
        return Err(SniffError::Malformed("bytes after the extensions"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut sni = None;
    while !exts.b.is_empty() {
        let ty = exts.u16()? as u16;
        let data = exts.vec16()?;
        if !seen.insert(ty) {
            return Err(SniffError::Malformed("an extension twice"));
        }
        match ty {
            EXT_ECH => return Err(SniffError::Ech),
            EXT_SERVER_NAME => sni = Some(server_name(data)?),
            _ => {}
        }
    }
    sni.ok_or(SniffError::NoSni)
}

/// The one `host_name` of a `server_name` extension's data.
fn server_name(data: &[u8]) -> Result<String, SniffError> {
    let mut c = Cursor { b: data };
    let mut list = Cursor { b: c.vec16()? };
    if !c.b.is_empty() {
        return Err(SniffError::Malformed("bytes after the server_name list"));
    }
    let mut name = None;
    while !list.b.is_empty() {
        if list.u8()? != 0 || name.is_some() {
            return Err(SniffError::Malformed(
                "a server_name that is not one host_name",
            ));
        }
        name = Some(list.vec16()?);
    }
    let raw = name.ok_or(SniffError::NoSni)?;
    host_name(raw).ok_or(SniffError::Malformed(
        "a server_name that is not a DNS name",
    ))
}

/// An HTTP/1 request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The Host header's name, lower case (an address literal is kept as written: it matches
    /// no grant).
    pub host: String,
    /// The Host header's port, if it has one.
    pub port: Option<u16>,
    /// Bytes of the request line, without its CRLF.
    pub line_len: usize,
    /// Bytes of the whole head, with the blank line.
    pub head_len: usize,
}

fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The head of the HTTP/1 request at the start of `buf`: `Ok(None)` while more bytes are
/// needed. Lines end in CRLF (a bare CR or LF anywhere is refused: servers that take a bare LF
/// as a line end would see headers this parser does not); exactly one Host; an absolute-form
/// target must name the same authority.
pub fn request_head(buf: &[u8]) -> Result<Option<RequestHead>, SniffError> {
    const H2: &[u8] = b"PRI * HTTP/2.0";
    let n = buf.len().min(H2.len());
    if buf[..n] == H2[..n] {
        return if n == H2.len() {
            Err(SniffError::Http2)
        } else {
            Ok(None)
        };
    }
    // A method is a token and a space: anything else needs no more bytes to refuse.
    if let Some(b) = buf.iter().position(|b| !tchar(*b))
        && (b == 0 || buf[b] != b' ')
    {
        return Err(SniffError::NotHttp);
    }
    let Some(end) = buf.windows(4).take(HEAD_MAX).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= HEAD_MAX {
            Err(SniffError::TooLarge)
        } else {
            Ok(None)
        };
    };
    let head = &buf[..end];
    let all = split_crlf(head);
    if all.iter().any(|l| l.contains(&b'\r') || l.contains(&b'\n')) {
        return Err(SniffError::Malformed("a bare CR or LF in the request head"));
    }
    let mut lines = all.into_iter();
    let line = lines.next().unwrap_or_default();
    let parts: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(SniffError::NotHttp);
    };
    if method.is_empty() || !method.iter().all(|b| tchar(*b)) {
        return Err(SniffError::NotHttp);
    }
    match version {
        b"HTTP/1.1" | b"HTTP/1.0" => {}
        b"HTTP/2.0" | b"HTTP/2" => return Err(SniffError::Http2),
        _ => return Err(SniffError::NotHttp),
    }
    if method == b"CONNECT" {
        return Err(SniffError::Connect);
    }
    let mut host = None;
    for l in lines {
        let Some(colon) = l.iter().position(|b| *b == b':') else {
            return Err(SniffError::Malformed("a header line without ':'"));
        };
        let (name, value) = (&l[..colon], &l[colon + 1..]);
        if name.is_empty() || !name.iter().all(|b| tchar(*b)) {
            return Err(SniffError::Malformed(
                "a header name that is not a token (or a folded line)",
            ));
        }
        if name.eq_ignore_ascii_case(b"host") {
            if host.is_some() {
                return Err(SniffError::NoHost);
            }
            host = Some(value.trim_ascii());
        }
    }
    let (name, port) = authority(host.ok_or(SniffError::NoHost)?)?;
    // An absolute-form target (`GET http://other/ HTTP/1.1`) wins over Host at the server.
    if !target.starts_with(b"/") && target != b"*" {
        let lower = target.to_ascii_lowercase();
        let rest = lower.strip_prefix(b"http://").ok_or(SniffError::Malformed(
            "a request target that is neither a path nor http://",
        ))?;
        let auth = &rest[..rest
            .iter()
            .position(|b| *b == b'/' || *b == b'?')
            .unwrap_or(rest.len())];
        if authority(auth)? != (name.clone(), port) {
            return Err(SniffError::Malformed(
                "the request target names another host than Host",
            ));
        }
    }
    Ok(Some(RequestHead {
        host: name,
        port,
        line_len: line.len(),
        head_len: end + 4,
    }))
}

/// `head` cut at each CRLF.
fn split_crlf(head: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = head;
    while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
        out.push(&rest[..i]);
        rest = &rest[i + 2..];
    }
    out.push(rest);
    out
}

/// `NAME` or `NAME:PORT` of a Host header or an absolute target; an address literal is kept
/// as written (lower case) and matches no grant.
fn authority(a: &[u8]) -> Result<(String, Option<u16>), SniffError> {
    let bad = SniffError::Malformed("a Host that is not NAME or NAME:PORT");
    if a.contains(&b'@') {
        return Err(bad);
    }
    let (h, p) = match a.iter().rposition(|b| *b == b':') {
        Some(i) if !a.ends_with(b"]") => (&a[..i], Some(&a[i + 1..])),
        _ => (a, None),
    };
    let port = match p {
        None => None,
        Some(p) => Some(
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or(bad)?,
        ),
    };
    let h = h.strip_suffix(b".").unwrap_or(h);
    match host_name(h) {
        Some(n) => Ok((n, port)),
        None if h.starts_with(b"[")
            || std::str::from_utf8(h).is_ok_and(|s| s.parse::<std::net::IpAddr>().is_ok()) =>
        {
            Ok((String::from_utf8_lossy(h).to_ascii_lowercase(), port))
        }
        None => Err(bad),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A ClientHello with these extensions (type, data), in one record.
    pub(crate) fn hello(exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(32);
        body.extend([1u8; 32]);
        body.extend([0, 4, 0x13, 0x01, 0x13, 0x02]);
        body.extend([1, 0]);
        let mut e = Vec::new();
        for (t, d) in exts {
            e.extend(t.to_be_bytes());
            e.extend((d.len() as u16).to_be_bytes());
            e.extend(d);
        }
        body.extend((e.len() as u16).to_be_bytes());
        body.extend(e);
        let mut hs = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        hs.extend(body);
        records(&hs, 16384)
    }

    /// Handshake bytes `hs` in TLS records of at most `max` bytes each.
    pub(crate) fn records(hs: &[u8], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for c in hs.chunks(max) {
            out.extend([0x16, 3, 1]);
            out.extend((c.len() as u16).to_be_bytes());
            out.extend(c);
        }
        out
    }

    pub(crate) fn sni(name: &str) -> (u16, Vec<u8>) {
        let n = name.as_bytes();
        let mut d = ((n.len() + 3) as u16).to_be_bytes().to_vec();
        d.push(0);
        d.extend((n.len() as u16).to_be_bytes());
        d.extend(n);
        (0, d)
    }

    #[test]
    fn sni_of_a_client_hello_whole_split_and_byte_by_byte() {
        let h = hello(&[
            (10, vec![0, 2, 0, 29]),
            sni("API.Example.test"),
            (43, vec![2, 3, 4]),
        ]);
        assert_eq!(client_hello_sni(&h), Ok(Some("api.example.test".into())));
        // Every prefix asks for more; never an early verdict.
        for i in 0..h.len() {
            assert_eq!(client_hello_sni(&h[..i]), Ok(None), "prefix {i}");
        }
        // The same handshake in 7-byte records (the client's choice) reads the same.
        let hs: Vec<u8> = {
            let mut v = Vec::new();
            let mut p = 0;
            while p < h.len() {
                let l = usize::from(u16::from_be_bytes([h[p + 3], h[p + 4]]));
                v.extend(&h[p + 5..p + 5 + l]);
                p += 5 + l;
            }
            v
        };
        let split = records(&hs, 7);
        assert_eq!(
            client_hello_sni(&split),
            Ok(Some("api.example.test".into()))
        );
    }

    #[test]
    fn refusals() {
        use SniffError::*;
        assert_eq!(client_hello_sni(b"G"), Err(NotTls));
        assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n"), Err(NotTls));
        assert_eq!(client_hello_sni(&[0x17, 3, 3, 0, 1, 0]), Err(NotTls));
        assert_eq!(
            client_hello_sni(&hello(&[(10, vec![0, 2, 0, 29])])),
            Err(NoSni)
        );
        assert_eq!(client_hello_sni(&hello(&[])), Err(NoSni));
        assert_eq!(
            client_hello_sni(&hello(&[sni("a.test"), (0xfe0d, vec![0; 8])])),
            Err(Ech)
        );
        assert!(matches!(
            client_hello_sni(&hello(&[sni("a.test"), sni("b.test")])),
            Err(Malformed(_))
        ));
        assert!(matches!(
            client_hello_sni(&hello(&[sni("10.0.0.1")])),
            Err(Malformed(_))
        ));
        assert!(matches!(
            client_hello_sni(&hello(&[sni("a.test.")])),
            Err(Malformed(_))
        ));
        assert!(matches!(
            client_hello_sni(&hello(&[sni("a b.test")])),
            Err(Malformed(_))
        ));
        // Two host_names in one list.
        let mut two = sni("a.test").1;
        two.extend([0, 0, 6]);
        two.extend(b"b.test");
        let l = (two.len() - 2) as u16;
        two[..2].copy_from_slice(&l.to_be_bytes());
        assert!(matches!(
            client_hello_sni(&hello(&[(0, two)])),
            Err(Malformed(_))
        ));
        // A length that runs past the end.
        let mut h = hello(&[sni("a.test")]);
        let last = h.len() - 1;
        h[last - 8] = 0xff;
        assert!(matches!(client_hello_sni(&h), Err(Malformed(_))));
        // A handshake that is not a ClientHello; a hello claiming 1 MiB.
        assert!(matches!(
            client_hello_sni(&records(&[2, 0, 0, 1, 0], 100)),
            Err(Malformed(_))
        ));
        assert_eq!(
            client_hello_sni(&records(&[1, 0x10, 0, 0], 100)),
            Err(TooLarge)
        );
        // An application-data record in the middle of a split hello.
        let mut mid = records(&hello(&[sni("a.test")])[5..20], 100);
        mid.extend([0x17, 3, 3, 0, 1, 0]);
        assert!(matches!(client_hello_sni(&mid), Err(Malformed(_))));
    }

    #[test]
    fn host_of_a_request_head() {
        let r = b"GET /x HTTP/1.1\r\nUser-Agent: t\r\nhost: Plain.Example.test:8080\r\n\r\nbody";
        let h = request_head(r).unwrap().unwrap();
        assert_eq!(h.host, "plain.example.test");
        assert_eq!(h.port, Some(8080));
        assert_eq!(h.line_len, 15);
        assert_eq!(&r[h.head_len..], b"body");
        for i in 0..r.len() - 4 {
            assert_eq!(request_head(&r[..i]), Ok(None), "prefix {i}");
        }
        let abs = b"GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n";
        assert_eq!(request_head(abs).unwrap().unwrap().host, "a.test");
        let v6 = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n";
        assert_eq!(request_head(v6).unwrap().unwrap().host, "[2001:db8::1]");
    }

    #[test]
    fn request_refusals() {
        use SniffError::*;
        let e = |r: &[u8]| request_head(r).unwrap_err();
        assert_eq!(e(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Http2);
        assert_eq!(request_head(b"PRI * HT"), Ok(None));
        assert_eq!(e(&[0x16, 3, 1, 0, 5]), NotHttp);
        assert_eq!(e(b"\x00\x01binary"), NotHttp);
        assert_eq!(e(b"GET / HTTP/2.0\r\nHost: a.test\r\n\r\n"), Http2);
        assert_eq!(e(b"GET / SMTP\r\nHost: a.test\r\n\r\n"), NotHttp);
        assert_eq!(
            e(b"CONNECT b.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            Connect
        );
        assert_eq!(e(b"GET / HTTP/1.1\r\nX: y\r\n\r\n"), NoHost);
        assert_eq!(
            e(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            NoHost
        );
        for bad in [
            &b"GET / HTTP/1.1\r\nX: y\nHost: b.test\r\nHost: a.test\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a.test\r\n b.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : a.test\r\n\r\n",
            b"GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
            b"GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: u@a.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.test:x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\rb.test\r\n\r\n",
        ] {
            assert!(
                matches!(e(bad), Malformed(_)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(e(&vec![b'A'; HEAD_MAX + 1]), TooLarge);
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.extend(vec![b'a'; HEAD_MAX]);
        assert_eq!(e(&long), TooLarge);
    }
}

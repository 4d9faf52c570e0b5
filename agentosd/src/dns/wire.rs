//! The DNS wire format, as much as the stub needs (RFC 1035, EDNS RFC 6891, Extended DNS Errors
//! RFC 8914): parse an agent's query, build the stub's answers, build the upstream query, and
//! read the upstream's answer (A, AAAA and CNAME records; compression pointers followed with a
//! bound). Nothing here trusts its input: every read is bounds-checked and a name is at most
//! 255 bytes on the wire after at most [`MAX_POINTERS`] jumps.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
const TYPE_OPT: u16 = 41;
pub const CLASS_IN: u16 = 1;

pub const NOERROR: u8 = 0;
pub const FORMERR: u8 = 1;
pub const SERVFAIL: u8 = 2;
pub const NXDOMAIN: u8 = 3;
pub const REFUSED: u8 = 5;

/// EDNS option code of an Extended DNS Error (RFC 8914).
const OPT_EDE: u16 = 15;
/// EDE info-code 18, "Prohibited".
pub const EDE_PROHIBITED: u16 = 18;
/// The UDP payload size the stub advertises and asks for (the usual safe value).
pub const EDNS_PAYLOAD: u16 = 1232;
/// Compression pointers followed in one name.
const MAX_POINTERS: usize = 32;

/// An agent's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Recursion desired (echoed).
    pub rd: bool,
    /// The name as text, labels joined by dots, without the root's dot, case as asked.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The query had an OPT record: the answer may carry one (and an EDE).
    pub edns: bool,
    /// The UDP payload size its OPT record advertised (0 without one).
    pub payload: u16,
    /// The question section as it came (name, type, class): echoed, and sent upstream.
    pub question: Vec<u8>,
}

/// Why a query is not answered normally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("shorter than a DNS header")]
    Short,
    #[error("malformed query: {0}")]
    Malformed(&'static str),
    #[error("label over 63 bytes or name over 253")]
    TooLong,
    #[error("a byte outside letters, digits, '-' and '_' in a label")]
    BadLabel,
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

/// The id of a message (to answer even one that does not parse), if it has a header.
pub fn id_of(buf: &[u8]) -> Option<u16> {
    u16_at(buf, 0)
}

/// Parse a query: one question, an uncompressed name of letters, digits, `-` and `_` (the
/// only names the stub forwards, so the name it matches is the name the upstream sees).
pub fn parse_query(buf: &[u8]) -> Result<Query, QueryError> {
    if buf.len() < 12 {
        return Err(QueryError::Short);
    }
    let flags = u16_at(buf, 2).ok_or(QueryError::Short)?;
    if flags & 0x8000 != 0 || (flags >> 11) & 0xf != 0 {
        return Err(QueryError::Malformed("not a standard query"));
    }
    if u16_at(buf, 4) != Some(1) || u16_at(buf, 6) != Some(0) {
        return Err(QueryError::Malformed("not exactly one question"));
    }
    let arcount = u16_at(buf, 10).unwrap_or(0);
    let mut pos = 12;
    let mut labels: Vec<String> = Vec::new();
    let mut wire_len = 1;
    loop {
        let len = *buf
            .get(pos)
            .ok_or(QueryError::Malformed("name runs off the end"))? as usize;
        pos += 1;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            if len & 0xc0 == 0xc0 {
                return Err(QueryError::Malformed("compressed name in a question"));
            }
            return Err(QueryError::TooLong);
        }
        let label = buf
            .get(pos..pos + len)
            .ok_or(QueryError::Malformed("name runs off the end"))?;
        if !label
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return Err(QueryError::BadLabel);
        }
        wire_len += len + 1;
        // 253 characters of text is 255 bytes on the wire.
        if wire_len > 255 {
            return Err(QueryError::TooLong);
        }
        labels.push(String::from_utf8_lossy(label).into_owned());
        pos += len;
    }
    let qtype = u16_at(buf, pos).ok_or(QueryError::Malformed("no type"))?;
    let qclass = u16_at(buf, pos + 2).ok_or(QueryError::Malformed("no class"))?;
    let question = buf[12..pos + 4].to_vec();
    let payload = if arcount > 0 {
        opt_payload(buf, pos + 4, arcount)
    } else {
        None
    };
    let edns = payload.is_some();
    Ok(Query {
        id: u16_at(buf, 0).unwrap_or(0),
        rd: flags & 0x0100 != 0,
        name: labels.join("."),
        qtype,
        qclass,
        edns,
        payload: payload.unwrap_or(0),
        question,
    })
}

/// The UDP payload size of the OPT record among the records from `pos` (the additional
/// section of a query), if there is one.
fn opt_payload(buf: &[u8], mut pos: usize, count: u16) -> Option<u16> {
    for _ in 0..count {
        let (_, next) = read_name(buf, pos)?;
        let (rtype, rdlen) = (u16_at(buf, next)?, u16_at(buf, next + 8)?);
        if rtype == TYPE_OPT {
            return u16_at(buf, next + 2);
        }
        pos = next + 10 + rdlen as usize;
    }
    None
}

/// How many bytes an answer to `q` over UDP may have: 512 without EDNS (RFC 1035), else the
/// size the query advertised, between 512 and [`EDNS_PAYLOAD`] (the stub never sends more in
/// one datagram; a larger answer goes with TC set and the resolver asks again over TCP).
pub fn udp_limit(q: &Query) -> usize {
    if q.edns {
        usize::from(q.payload.clamp(512, EDNS_PAYLOAD))
    } else {
        512
    }
}

/// `response` with the TC flag: the answer did not fit, ask again over TCP (no records).
pub fn truncated_response(q: &Query, rcode: u8) -> Vec<u8> {
    let mut out = response(q, rcode, &[], None);
    out[2] |= 0x02;
    out
}

/// A name at `pos` (compression followed, bounded) as uncompressed wire bytes, and the
/// position after it in the message.
fn read_name(buf: &[u8], mut pos: usize) -> Option<(Vec<u8>, usize)> {
    let mut out = Vec::new();
    let mut end = None;
    for _ in 0..MAX_POINTERS {
        loop {
            let len = *buf.get(pos)? as usize;
            if len & 0xc0 == 0xc0 {
                let target = (u16_at(buf, pos)? & 0x3fff) as usize;
                end.get_or_insert(pos + 2);
                // Only backwards: a pointer never leads forward (no loops of forward jumps).
                if target >= pos {
                    return None;
                }
                pos = target;
                break;
            }
            if len & 0xc0 != 0 {
                return None;
            }
            out.extend_from_slice(buf.get(pos..pos + 1 + len)?);
            if out.len() > 255 {
                return None;
            }
            pos += 1 + len;
            if len == 0 {
                return Some((out, end.unwrap_or(pos)));
            }
        }
    }
    None
}

/// Wire name bytes as lower-case text (for comparing names).
fn name_text(wire: &[u8]) -> String {
    let mut labels = Vec::new();
    let mut i = 0;
    while let Some(&len) = wire.get(i) {
        if len == 0 {
            break;
        }
        let l = wire.get(i + 1..i + 1 + len as usize).unwrap_or_default();
        labels.push(String::from_utf8_lossy(l).to_ascii_lowercase());
        i += 1 + len as usize;
    }
    labels.join(".")
}

/// A record of an answer the stub passes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Owner name, uncompressed wire bytes.
    pub name: Vec<u8>,
    pub ttl: u32,
    pub data: RData,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    /// The target, uncompressed wire bytes.
    Cname(Vec<u8>),
}

impl Record {
    /// Its length in an answer (uncompressed).
    fn wire_len(&self) -> usize {
        let data = match &self.data {
            RData::A(_) => 4,
            RData::Aaaa(_) => 16,
            RData::Cname(n) => n.len(),
        };
        self.name.len() + 10 + data
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.name);
        let (rtype, data): (u16, Vec<u8>) = match &self.data {
            RData::A(a) => (TYPE_A, a.octets().to_vec()),
            RData::Aaaa(a) => (TYPE_AAAA, a.octets().to_vec()),
            RData::Cname(n) => (TYPE_CNAME, n.clone()),
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&self.ttl.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&data);
    }
}

/// The stub's answer to `q`: `rcode`, `records` in the answer section, and, when the query had
/// EDNS, an OPT record carrying `ede` (info-code, text) if given.
pub fn response(q: &Query, rcode: u8, records: &[Record], ede: Option<(u16, &str)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, opcode 0, AA 0, RD as asked, RA 1, rcode.
    let flags: u16 = 0x8000 | if q.rd { 0x0100 } else { 0 } | 0x0080 | u16::from(rcode & 0xf);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&u16::from(q.edns).to_be_bytes());
    out.extend_from_slice(&q.question);
    for r in records {
        r.write(&mut out);
    }
    if q.edns {
        write_opt(&mut out, ede);
    }
    out
}

/// How many of `records` (from the first) fit in a [`response`] to `q` of at most `limit` bytes.
pub fn records_within(q: &Query, records: &[Record], limit: usize) -> usize {
    let mut len = 12 + q.question.len() + if q.edns { 11 } else { 0 };
    records
        .iter()
        .take_while(|r| {
            len += r.wire_len();
            len <= limit
        })
        .count()
}

/// An answer to a message that is not a query the stub takes (REFUSED, FORMERR): the header
/// only, no question.
pub fn bare_response(id: u16, rcode: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(0x8080u16 | u16::from(rcode & 0xf)).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

fn write_opt(out: &mut Vec<u8>, ede: Option<(u16, &str)>) {
    out.push(0); // root
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&EDNS_PAYLOAD.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // extended rcode, version 0, flags
    match ede {
        Some((code, text)) => {
            let text = &text.as_bytes()[..text.len().min(400)];
            let len = 2 + text.len();
            out.extend_from_slice(&((4 + len) as u16).to_be_bytes());
            out.extend_from_slice(&OPT_EDE.to_be_bytes());
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.extend_from_slice(&code.to_be_bytes());
            out.extend_from_slice(text);
        }
        None => out.extend_from_slice(&0u16.to_be_bytes()),
    }
}

/// The query the stub sends upstream for `q`: a fresh `id`, recursion desired, the agent's
/// question as asked, and EDNS with the stub's payload size.
pub fn upstream_query(id: u16, q: &Query) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + q.question.len() + 11);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 1]);
    out.extend_from_slice(&q.question);
    write_opt(&mut out, None);
    out
}

/// What the upstream answered: its rcode and the A, AAAA and CNAME records of class IN in its
/// answer section (every other record, and the other sections, are left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub rcode: u8,
    pub truncated: bool,
    pub records: Vec<Record>,
}

/// Read the upstream's answer to the query with `id` for `q`; `None` when it is not that
/// answer (another id, not a response, another question) or does not parse.
pub fn parse_answer(buf: &[u8], id: u16, q: &Query) -> Option<Answer> {
    if u16_at(buf, 0)? != id {
        return None;
    }
    let flags = u16_at(buf, 2)?;
    if flags & 0x8000 == 0 || u16_at(buf, 4)? != 1 {
        return None;
    }
    let ancount = u16_at(buf, 6)?;
    let (qname, mut pos) = read_name(buf, 12)?;
    let asked = parse_query_name(&q.question)?;
    if name_text(&qname) != name_text(&asked)
        || u16_at(buf, pos)? != q.qtype
        || u16_at(buf, pos + 2)? != q.qclass
    {
        return None;
    }
    pos += 4;
    let mut records = Vec::new();
    for _ in 0..ancount {
        let (name, next) = read_name(buf, pos)?;
        let rtype = u16_at(buf, next)?;
        let class = u16_at(buf, next + 2)?;
        let ttl = u32_at(buf, next + 4)?;
        let rdlen = u16_at(buf, next + 8)? as usize;
        let rd = next + 10;
        let rdata = buf.get(rd..rd + rdlen)?;
        pos = rd + rdlen;
        if class != CLASS_IN {
            continue;
        }
        let data = match (rtype, rdlen) {
            (TYPE_A, 4) => RData::A(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3])),
            (TYPE_AAAA, 16) => RData::Aaaa(Ipv6Addr::from(<[u8; 16]>::try_from(rdata).ok()?)),
            (TYPE_CNAME, _) => RData::Cname(read_name(buf, rd)?.0),
            _ => continue,
        };
        records.push(Record { name, ttl, data });
    }
    Some(Answer {
        rcode: (flags & 0xf) as u8,
        truncated: flags & 0x0200 != 0,
        records,
    })
}

/// The name of a question section.
fn parse_query_name(question: &[u8]) -> Option<Vec<u8>> {
    read_name(question, 0).map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A query as glibc sends it (`edns`: with an OPT record).
    pub(crate) fn query(id: u16, name: &str, qtype: u16, edns: bool) -> Vec<u8> {
        let mut b = id.to_be_bytes().to_vec();
        b.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, u8::from(edns)]);
        for l in name.split('.') {
            b.push(l.len() as u8);
            b.extend_from_slice(l.as_bytes());
        }
        b.push(0);
        b.extend_from_slice(&qtype.to_be_bytes());
        b.extend_from_slice(&CLASS_IN.to_be_bytes());
        if edns {
            b.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0]);
        }
        b
    }

    #[test]
    fn parses_a_query() {
        let q = parse_query(&query(0x1234, "Api.Example.test", TYPE_AAAA, true)).unwrap();
        assert_eq!(q.id, 0x1234);
        assert!(q.rd && q.edns);
        assert_eq!(q.payload, 1232);
        assert_eq!(udp_limit(&q), 1232);
        assert_eq!(q.name, "Api.Example.test");
        assert_eq!(q.qtype, TYPE_AAAA);
        assert_eq!(q.question.len(), 18 + 4);
        let q = parse_query(&query(1, "a.b", TYPE_A, false)).unwrap();
        assert!(!q.edns);
        assert_eq!(udp_limit(&q), 512);
        // An advertised size is capped at the stub's and never below 512.
        let mut big = query(1, "a.b", TYPE_A, true);
        let at = big.len() - 8;
        big[at..at + 2].copy_from_slice(&65000u16.to_be_bytes());
        assert_eq!(udp_limit(&parse_query(&big).unwrap()), 1232);
        big[at..at + 2].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(udp_limit(&parse_query(&big).unwrap()), 512);
        let t = truncated_response(&parse_query(&big).unwrap(), NOERROR);
        assert_eq!(t[2] & 0x02, 0x02);
        assert_eq!(u16_at(&t, 6), Some(0));
    }

    #[test]
    fn refuses_long_labels_names_and_odd_bytes() {
        let long_label = "a".repeat(64);
        assert_eq!(
            parse_query(&query(1, &format!("{long_label}.test"), TYPE_A, false)),
            Err(QueryError::TooLong)
        );
        let ok_label = "a".repeat(63);
        assert!(parse_query(&query(1, &format!("{ok_label}.test"), TYPE_A, false)).is_ok());
        // 4 labels of 63 + 3 dots = 255 characters: over 253.
        let long_name = [ok_label.as_str(); 4].join(".");
        assert_eq!(
            parse_query(&query(1, &long_name, TYPE_A, false)),
            Err(QueryError::TooLong)
        );
        let just = format!("{}.{}", [ok_label.as_str(); 3].join("."), "a".repeat(61));
        assert_eq!(just.len(), 253);
        assert!(parse_query(&query(1, &just, TYPE_A, false)).is_ok());
        assert_eq!(
            parse_query(&query(1, "a\u{7}b.test", TYPE_A, false)),
            Err(QueryError::BadLabel)
        );
        let mut resp = query(1, "a.test", TYPE_A, false);
        resp[2] |= 0x80;
        assert!(matches!(parse_query(&resp), Err(QueryError::Malformed(_))));
        assert_eq!(parse_query(&[0; 5]), Err(QueryError::Short));
        // Truncated in the name.
        let q = query(1, "abc.test", TYPE_A, false);
        assert!(parse_query(&q[..15]).is_err());
    }

    #[test]
    fn nxdomain_carries_an_extended_error_with_edns() {
        let q = parse_query(&query(7, "x.evil", TYPE_A, true)).unwrap();
        let r = response(&q, NXDOMAIN, &[], Some((EDE_PROHIBITED, "contract c")));
        assert_eq!(u16_at(&r, 0), Some(7));
        assert_eq!(u16_at(&r, 2).unwrap() & 0x800f, 0x8003);
        assert_eq!(u16_at(&r, 10), Some(1));
        let opt = 12 + q.question.len();
        assert_eq!(r[opt], 0);
        assert_eq!(u16_at(&r, opt + 1), Some(TYPE_OPT));
        assert_eq!(u16_at(&r, opt + 9), Some(4 + 2 + 10));
        assert_eq!(u16_at(&r, opt + 11), Some(OPT_EDE));
        assert_eq!(u16_at(&r, opt + 15), Some(EDE_PROHIBITED));
        assert_eq!(&r[opt + 17..], b"contract c");
        // Without EDNS: no OPT at all.
        let q = parse_query(&query(7, "x.evil", TYPE_A, false)).unwrap();
        let r = response(&q, NXDOMAIN, &[], Some((EDE_PROHIBITED, "contract c")));
        assert_eq!(r.len(), 12 + q.question.len());
        assert_eq!(
            bare_response(9, REFUSED),
            [0, 9, 0x80, 0x85, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    /// An upstream answer with compression: CNAME to another name, then its A and AAAA, a TXT
    /// that is left out.
    fn upstream_answer(id: u16, q: &[u8]) -> Vec<u8> {
        let qlen = q.len() - 12;
        let mut b = id.to_be_bytes().to_vec();
        b.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 4, 0, 0, 0, 0]);
        b.extend_from_slice(&q[12..12 + qlen]);
        // CNAME: owner = pointer to the question name (offset 12), target "cdn" + pointer.
        b.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 6, 3, b'c', b'd', b'n']);
        let cdn = b.len() - 4;
        b.extend_from_slice(&[0xc0, 12]);
        for (t, data) in [(TYPE_A, vec![198, 18, 0, 7]), (16u16, b"\x03txt".to_vec())] {
            b.extend_from_slice(&[0xc0, cdn as u8]);
            b.extend_from_slice(&t.to_be_bytes());
            b.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
            b.extend_from_slice(&(data.len() as u16).to_be_bytes());
            b.extend_from_slice(&data);
        }
        b.extend_from_slice(&[0xc0, cdn as u8, 0, 28, 0, 1, 0, 0, 0, 5, 0, 16]);
        b.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        b
    }

    #[test]
    fn reads_an_upstream_answer_with_compression() {
        let raw = query(3, "Www.Example.test", TYPE_A, false);
        let q = parse_query(&raw).unwrap();
        let up = upstream_query(0xbeef, &q);
        assert_eq!(u16_at(&up, 0), Some(0xbeef));
        assert_eq!(u16_at(&up, 10), Some(1));
        let ans = upstream_answer(0xbeef, &raw);
        let a = parse_answer(&ans, 0xbeef, &q).unwrap();
        assert_eq!(a.rcode, NOERROR);
        assert_eq!(a.records.len(), 3, "{a:?}");
        assert_eq!(name_text(&a.records[0].name), "www.example.test");
        let cdn = RData::Cname(b"\x03cdn\x03Www\x07Example\x04test\x00".to_vec());
        assert_eq!(a.records[0].data, cdn);
        assert_eq!(a.records[1].data, RData::A(Ipv4Addr::new(198, 18, 0, 7)));
        assert_eq!(a.records[1].ttl, 30);
        assert_eq!(
            a.records[2].data,
            RData::Aaaa("2001:db8::9".parse().unwrap())
        );
        // Another id, or an answer to another question, is not it.
        assert!(parse_answer(&ans, 0xbeee, &q).is_none());
        let other = parse_query(&query(3, "other.test", TYPE_A, false)).unwrap();
        assert!(parse_answer(&ans, 0xbeef, &other).is_none());
        // What the stub sends back parses as a response with the same records.
        let back = response(&q, a.rcode, &a.records, None);
        assert_eq!(records_within(&q, &a.records, back.len()), 3);
        assert_eq!(records_within(&q, &a.records, back.len() - 1), 2);
        let again = parse_answer(&back, 3, &q).unwrap();
        assert_eq!(again.records, a.records);
    }

    #[test]
    fn pointer_loops_and_truncation_are_refused() {
        let raw = query(3, "a.test", TYPE_A, false);
        let q = parse_query(&raw).unwrap();
        let mut ans = upstream_answer(1, &raw);
        // The first answer's owner points at itself.
        let at = 12 + q.question.len();
        ans[at + 1] = at as u8;
        assert!(parse_answer(&ans, 1, &q).is_none());
        let ans = upstream_answer(1, &raw);
        for cut in 0..ans.len() {
            let _ = parse_answer(&ans[..cut], 1, &q);
        }
        assert!(parse_answer(&ans[..ans.len() - 3], 1, &q).is_none());
    }
}

//! Strings an agent (or its contract) chose, made safe for an operator's terminal. The daemon
//! escapes what it puts in errors and listings; agentctl escapes everything it prints.

/// Text for a terminal: control characters (C0, DEL, C1), and the Unicode bidi controls
/// an agent could use to reorder what an operator reads, are written as `\xNN` / `\u{NNNN}`;
/// a backslash is doubled so that the escapes cannot be forged.
pub fn escape_control(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\u{{{:04x}}}", c as u32))
            }
            c if matches!(c as u32, 0x200e | 0x200f | 0x202a..=0x202e | 0x2066..=0x2069) => {
                out.push_str(&format!("\\u{{{:04x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// [`escape_control`] without a copy when nothing in `s` needs escaping (printable ASCII other
/// than `\\`: the usual agent name, state or result; `agentctl list` of 10 000 agents).
pub fn escape_control_cow(s: &str) -> std::borrow::Cow<'_, str> {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'\\') {
        std::borrow::Cow::Borrowed(s)
    } else {
        std::borrow::Cow::Owned(escape_control(s))
    }
}

/// [`escape_control`] line by line: the newlines of a multi-line message (a contract's
/// diagnostics) stay, everything else is escaped.
pub fn escape_lines(s: &str) -> String {
    s.split('\n')
        .map(escape_control)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls() {
        assert_eq!(escape_control("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(escape_control("x\ny\r\u{7}"), "x\\ny\\r\\x07");
        assert_eq!(escape_control("\u{9b}31m"), "\\u{009b}31m");
        assert_eq!(escape_control("\u{202e}abc"), "\\u{202e}abc");
        assert_eq!(escape_control("a\\x1b"), "a\\\\x1b");
        assert_eq!(escape_control("héllo ✓"), "héllo ✓");
        for s in [
            "plain-name_1.2 x",
            "a\x1b[2Jb",
            "a\\b",
            "héllo",
            "\u{202e}x",
            "\x7f",
            "",
        ] {
            assert_eq!(escape_control_cow(s), escape_control(s), "{s:?}");
        }
        assert!(matches!(
            escape_control_cow("default/agent-1"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape_lines("a\x1b]0;x\x07\nb\r"), "a\\x1b]0;x\\x07\nb\\r");
    }
}

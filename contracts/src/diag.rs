//! Diagnostics: positioned, actionable messages, and did-you-mean suggestions.

use std::fmt;

use serde::Serialize;

/// How serious a diagnostic is. Errors make a contract invalid; warnings do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    #[default]
    Error,
    Warning,
}

/// One problem found in a contract, with its position.
///
/// `line` and `column` are 1-based and count characters; `0:0` means "no position" (for example
/// a file that cannot be read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// Dotted field path, e.g. `class.slo.deadline_ms` or `capabilities[1]`.
    pub field: Option<String>,
    /// The message, without position; it already contains the suggestion text if any.
    pub message: String,
    /// The suggested replacement for a near-miss name (`"fs.read"` for `"fs.reed"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    pub severity: Severity,
}

impl Diagnostic {
    /// An error diagnostic.
    pub fn error(file: &str, line: usize, column: usize, message: impl Into<String>) -> Self {
        Diagnostic {
            file: file.to_string(),
            line,
            column,
            field: None,
            message: message.into(),
            suggestion: None,
            severity: Severity::Error,
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)
    }
}

/// All problems found in one contract; `Display` prints one `FILE:LINE:COL: message` per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ContractError {
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for ContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl ContractError {
    /// A single error without position (e.g. an unreadable file).
    pub fn single(d: Diagnostic) -> Self {
        ContractError {
            diagnostics: vec![d],
        }
    }
}

/// Edit distance with adjacent transpositions (optimal string alignment), over chars.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=m).collect();
    #[allow(clippy::needless_range_loop)] // the recurrence reads three rows
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[n][m]
}

/// The closest candidate to `name` if it is near enough to be a typo: case-insensitive equality,
/// or an edit distance of at most a third of the candidate's length (at least 1).
pub(crate) fn suggest<'c>(
    name: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    if name.chars().count() > 128 {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let d = if c.eq_ignore_ascii_case(name) {
            0
        } else {
            edit_distance(&lower, &c.to_ascii_lowercase())
        };
        let limit = (c.chars().count() / 3).max(1);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance() {
        assert_eq!(edit_distance("fs.reed", "fs.read"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("nmae", "name"), 1);
    }

    #[test]
    fn suggestions() {
        let caps = ["fs.read", "fs.write", "net.connect"];
        assert_eq!(suggest("fs.reed", caps), Some("fs.read"));
        assert_eq!(suggest("FS.READ", caps), Some("fs.read"));
        assert_eq!(suggest("net.conect", caps), Some("net.connect"));
        assert_eq!(suggest("translate", caps), None);
        assert_eq!(
            suggest("model_policy", ["modelPolicy", "memory"]),
            Some("modelPolicy")
        );
    }

    #[test]
    fn display_lines() {
        let e = ContractError {
            diagnostics: vec![
                Diagnostic::error("a.yaml", 1, 2, "first"),
                Diagnostic {
                    severity: Severity::Warning,
                    ..Diagnostic::error("a.yaml", 3, 4, "second")
                },
            ],
        };
        assert_eq!(
            e.to_string(),
            "a.yaml:1:2: first\na.yaml:3:4: warning: second"
        );
    }
}

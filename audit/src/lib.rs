//! The agentos audit trail. Being written (issue 6).

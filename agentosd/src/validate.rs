//! `agentctl validate`: checks contract files without a daemon. Being written.

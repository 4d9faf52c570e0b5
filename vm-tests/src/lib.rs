//! Helpers for the end-to-end tests that run inside the guest VM.

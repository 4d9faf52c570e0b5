//! agentos-mcp as a program, outside an agent: it names what is missing. (Forwarding is tested
//! against a real agentosd socket in agentosd's tests/ipc.rs and tests/mcp.rs.)

#![allow(clippy::unwrap_used)]

use std::process::Command;

const BRIDGE: &str = env!("CARGO_BIN_EXE_agentos-mcp");

#[test]
fn outside_an_agent_it_says_which_socket_is_missing() {
    let out = Command::new(BRIDGE)
        .env_remove("AGENTOS_SOCKET")
        .env_remove("AGENTOS_SOCKET_FD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("AGENTOS_SOCKET is not set") && stderr.contains("--socket PATH"),
        "{stderr}"
    );
}

#[test]
fn version_and_help() {
    let out = Command::new(BRIDGE).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("agentos-mcp "));
    let out = Command::new(BRIDGE).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("AGENTOS_SOCKET_FD"));
}

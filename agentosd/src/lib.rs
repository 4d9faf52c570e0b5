//! agentosd: the agentos daemon. Modules are named for what they manage.

pub mod audit_trail;
pub mod authz;
pub mod cgroup;
pub mod cli;
pub mod conf;
pub mod daemon;
pub mod dbus;
pub mod dns;
pub mod enforce;
pub mod ipc;
pub mod logs;
pub mod mcp;
pub mod models;
pub mod polkit;
pub mod probe;
pub mod safe_fs;
pub mod sandbox;
pub mod sched;
pub mod scx;
pub mod spawn;
pub mod spec;
pub mod state;
pub mod supervisor;
pub mod sys;
pub mod telemetry;
pub mod tools;

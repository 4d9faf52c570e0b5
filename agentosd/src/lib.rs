//! agentosd: the agentos daemon. Modules are named for what they manage.

pub mod probe;
pub mod validate;

//! Host capability probe (`agentosd check`). Being written.

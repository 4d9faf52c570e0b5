//! Shared by the audit targets: a scratch directory per fuzzing process and one host key. The
//! directory is under `$AGENTOS_FUZZ_SCRATCH` (`cargo xtask fuzz` sets it and removes it after
//! the run), else under /dev/shm (so a run does not wear a disk) or the temporary directory.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A directory of this process's own, made on first use.
pub fn scratch() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = match std::env::var_os("AGENTOS_FUZZ_SCRATCH") {
            Some(d) => PathBuf::from(d),
            None if shm.is_dir() => shm.to_path_buf(),
            None => std::env::temp_dir(),
        };
        let d = base.join(format!("agentos-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch directory");
        d
    })
}

/// The signing key of the logs this process writes (made once).
pub fn key() -> &'static audit::key::SigningKey {
    static K: OnceLock<audit::key::SigningKey> = OnceLock::new();
    K.get_or_init(|| audit::key::create(&scratch().join("audit.key")).expect("host key"))
}

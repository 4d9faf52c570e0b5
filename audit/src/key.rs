//! The host's audit signing key.
//!
//! The private key file holds the raw 32-byte ed25519 seed, mode 0600. The public key file beside
//! it (`<path>.pub`) holds the 32-byte public key as 64 lowercase hex characters and a newline,
//! mode 0644, so operators and `audit verify` can read it without the private key.

use std::fs::{self, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

pub use ed25519_dalek::{SigningKey, VerifyingKey};

/// Errors about key files.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A file could not be read or written.
    #[error("audit key {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file does not hold a key.
    #[error("audit key {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The private key is readable by others.
    #[error(
        "audit key {path}: mode {mode:04o} lets others read the private key; run `chmod 600 {path}`"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where the public key of a private key file lives: the same path with `.pub` appended.
pub fn public_path(private: &Path) -> PathBuf {
    let mut s = private.as_os_str().to_os_string();
    s.push(".pub");
    PathBuf::from(s)
}

/// Loads the signing key at `path`, or creates it (0600, seed from the kernel's random source)
/// together with its public key file when it does not exist. Refuses a private key file that
/// group or others can access.
pub fn load_or_create(path: &Path) -> Result<SigningKey, KeyError> {
    match load(path) {
        Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            create(path)
        }
        other => other,
    }
}

/// Loads the signing key at `path` (and rewrites a missing public key file).
pub fn load(path: &Path) -> Result<SigningKey, KeyError> {
    let mut f = fs::File::open(path).map_err(io(path))?;
    let mode = f.metadata().map_err(io(path))?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).map_err(io(path))?;
    let seed: [u8; 32] = buf.as_slice().try_into().map_err(|_| KeyError::Invalid {
        path: path.to_path_buf(),
        reason: format!("expected a 32-byte ed25519 seed, found {} bytes", buf.len()),
    })?;
    let key = SigningKey::from_bytes(&seed);
    let pubp = public_path(path);
    if !pubp.exists() {
        write_public(&pubp, &key.verifying_key())?;
    }
    Ok(key)
}

/// Creates a new key at `path`; fails if the file exists.
pub fn create(path: &Path) -> Result<SigningKey, KeyError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut seed = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut r| r.read_exact(&mut seed))
        .map_err(io(Path::new("/dev/urandom")))?;
    let key = SigningKey::from_bytes(&seed);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    f.write_all(&seed).map_err(io(path))?;
    f.sync_all().map_err(io(path))?;
    write_public(&public_path(path), &key.verifying_key())?;
    Ok(key)
}

fn write_public(path: &Path, key: &VerifyingKey) -> Result<(), KeyError> {
    let tmp = {
        let mut s = path.as_os_str().to_os_string();
        s.push(".tmp");
        PathBuf::from(s)
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(io(&tmp))?;
    writeln!(f, "{}", hex::encode(key.as_bytes())).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))?;
    Ok(())
}

/// Loads a public key file (64 hex characters).
pub fn load_public(path: &Path) -> Result<VerifyingKey, KeyError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    parse_public(text.trim()).map_err(|reason| KeyError::Invalid {
        path: path.to_path_buf(),
        reason,
    })
}

/// Parses a public key from 64 hex characters.
pub fn parse_public(hex_text: &str) -> Result<VerifyingKey, String> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut bytes)
        .map_err(|e| format!("expected 64 hex characters of an ed25519 public key: {e}"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("not an ed25519 public key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_load() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys/audit.key");
        let k = load_or_create(&p).unwrap();
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let k2 = load_or_create(&p).unwrap();
        assert_eq!(k.to_bytes(), k2.to_bytes());
        let pubk = load_public(&public_path(&p)).unwrap();
        assert_eq!(pubk, k.verifying_key());
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(load(&p), Err(KeyError::Permissions { .. })));
    }
}
